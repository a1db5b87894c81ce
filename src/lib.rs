//! ptxd: an out-of-process kernel-loader daemon.
//!
//! Sessions send JIT-synthesized CUDA kernels (PTX, cubin) and launch
//! requests over gRPC; their tensors stay in their own GPU memory and reach
//! ptxd as CUDA IPC handles (or POSIX shared memory on the host backend).
//! ptxd owns the device contexts, in supervised executor child processes, and
//! a bounded slot table of loaded kernels; it compiles each distinct kernel
//! once and checks every launch before it reaches the device.

pub mod activation;
pub mod buffers;
pub mod cli;
pub mod config;
pub mod connections;
pub mod error;
pub mod executor;
pub mod fd_socket;
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
pub mod refusals;
pub mod requests;
pub mod server;
pub mod service;
pub mod sessions;
pub mod slots;
pub mod spin;
pub mod untrusted;
