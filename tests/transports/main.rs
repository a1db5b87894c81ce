//! Each way a request reaches the daemon, against the real daemon on the
//! host backend: the HTTP/2 gRPC transport under hostile clients, the SDK's
//! launch lane, the packet socket (unary launches and descriptors), and the
//! shared-memory launch ring.

#[path = "../support/mod.rs"]
mod support;

mod fd_buffers;
mod fd_lane;
mod grpc;
mod launch_lane;
mod refusals;
mod ring;
mod ring_contracts;
mod ring_floor;
mod ring_review;
mod ring_strided;
