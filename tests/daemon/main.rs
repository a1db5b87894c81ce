//! The real `ptxd` daemon on the host backend, one module per subject: its
//! life cycle and every refusal reachable without a GPU, several tenants,
//! the shared executor under hostile sessions, grpcurl, and `ptxd bench`.

#[path = "../support/mod.rs"]
mod support;

mod bench;
mod broadcast;
mod executor_limits;
mod grpcurl;
mod lifecycle;
mod recovery;
mod strided;
mod tenants;
mod triton_attacks;
mod typed_args;
