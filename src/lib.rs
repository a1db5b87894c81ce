//! ptxd: an out-of-process kernel-loader daemon.
//!
//! Sessions send JIT-synthesized CUDA kernels (PTX, cubin) and launch
//! requests over gRPC; their tensors stay in their own GPU memory and reach
//! ptxd as CUDA IPC handles (or POSIX shared memory on the host backend).
//! ptxd owns the device contexts, in supervised executor child processes, and
//! a bounded slot table of loaded kernels; it compiles each distinct kernel
//! once and checks every launch before it reaches the device.
//!
//! # Module map
//!
//! By role, from the wire down to the device. Each module's own doc states
//! the invariants it keeps. No modules import each other in a circle: a
//! module that two others need sits below both (the `import_circles` unit
//! test reads `src/` and fails on any circle).
//!
//! **Transport**: how requests arrive and answers leave.
//! - [`transport`]: one module per transport, each converting its wire
//!   messages into the front's requests and answering through one refusal
//!   path:
//!   - [`transport::grpc`]: every RPC as gRPC over HTTP/2 (decode, call the
//!     front, map the result), and [`transport::grpc::requests`]: what a
//!     request may hold before it is whole (sizes, budgets, the
//!     `LaunchStream` codec);
//!   - [`transport::packet`]: the packet socket, which carries descriptors
//!     and unary launches and loads;
//!   - [`transport::calls`]: the calls both carry, converted and run one
//!     way;
//!   - [`transport::refusals`]: the one place a refusal is counted and
//!     logged, and the tower layer that feeds it gRPC's statuses;
//!   - the launch ring, the third transport, is served in the executor
//!     child ([`executor::ring`], on `ptxd_ipc::ring`'s layout).
//! - [`server`]: the running daemon: listeners, the gRPC router, the drain.
//! - [`activation`]: systemd socket activation.
//! - [`connections`]: connection and descriptor limits per peer.
//! - [`metrics`]: the Prometheus counters and their HTTP endpoint.
//!
//! **State**: what the daemon holds, owned by one place.
//! - [`front`]: the one owner of the state below; every verb goes through
//!   it (sessions, kernels, buffers, rings, executor supervision).
//! - [`sessions`]: who holds what, and who may act in a session.
//! - [`lease`]: a session's lease events, queued for its lease stream.
//! - [`slots`]: the bounded table of loaded kernels.
//! - [`buffers`]: the buffer and event registry.
//! - [`fd_tokens`]: one-time tokens pairing a request with its descriptor.
//! - [`handles`]: the opaque handles ptxd gives out and their identities.
//!
//! **Policy**: what may happen, and how it is said.
//! - [`config`]: every `ptxd serve` flag, its `PTXD_*` variable and limit.
//! - [`launch`]: the one launch check, used by every path to the device.
//! - [`error`]: the one error type and the one map to a gRPC status.
//! - [`spin`]: the daemon-wide bound on spinning waits.
//! - [`untrusted`]: client text on its way into a log line or a refusal.
//! - [`observe`]: what the daemon reports about its work (metrics, logs).
//!
//! **Execution**: the device work, in child processes.
//! - [`executor`]: the supervised executor children, the typed link to
//!   them ([`executor::link`]), their one dispatcher, the host and CUDA
//!   backends, and the launch ring's server.
//!
//! **PTX**: what a kernel may be.
//! - [`ptx`]: the parser, the scalar-ABI verifier and the host interpreter;
//!   a leaf that imports nothing else of the crate.
//!
//! And [`cli`]: the client subcommands of the `ptxd` binary.

pub mod activation;
pub mod buffers;
pub mod cli;
pub mod config;
pub mod connections;
pub mod error;
pub mod executor;
pub mod fd_tokens;
pub mod front;
pub mod handles;
#[cfg(test)]
mod import_circles;
pub mod launch;
pub mod lease;
pub mod metrics;
pub mod observe;
pub mod ptx;
pub mod ring_check;
pub mod server;
pub mod sessions;
pub mod slots;
pub mod spin;
pub mod transport;
pub mod untrusted;
