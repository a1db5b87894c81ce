//! The transports: how requests reach the front and answers leave it, one
//! module per transport, each named for what it carries.
//!
//! - [`grpc`]: every `ptxd.v1.Ptxd` RPC, as gRPC over HTTP/2 (Unix socket
//!   or TCP), with what a request may hold before it is whole
//!   ([`grpc::requests`]).
//! - [`packet`]: the packet socket (`<socket>.fds`, `SOCK_SEQPACKET`):
//!   descriptors for `posix_fd` buffers and `by_fd` rings, and unary
//!   `Launch` and `LoadKernel` calls, one `FdAttach` packet each.
//! - The launch ring is the third transport, and it has no module here by
//!   design: it is opened through one of the two above (`OpenRing`, then
//!   the ring's memfd on the packet socket when `by_fd`) and the front
//!   ([`crate::front`]'s ring verbs), and then served inside the executor
//!   child ([`crate::executor::ring`], on [`ptxd_ipc::ring`]'s layout)
//!   without passing this process at all. Its refusals are the same
//!   reasons, written into the ring's completion words.
//!
//! Invariants:
//! - A transport only decodes, converts and answers: it turns its wire
//!   message into the front's own request type, calls the front, and turns
//!   the result back. A call more than one transport carries (`Launch`,
//!   `LoadKernel`, a registration's answer) is converted and run in one
//!   place, [`calls`], so the two cannot drift.
//! - Every refusal either transport sends is logged and counted exactly
//!   once, by [`refusals::record`], under the one metrics label
//!   (`ptxd_refusals_total{reason}`): the gRPC layer records what it reads
//!   from a call's final status, and the paths no status leaves through
//!   (a `LaunchStream` message, a packet) record where they make the
//!   refusal. Which transport carried it is a log field, not a label.
//! - No transport imports another: what two need sits here, below both.

pub mod calls;
pub mod grpc;
pub mod packet;
pub mod refusals;
