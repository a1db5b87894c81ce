//! The records a [`LaunchRing`](crate::LaunchRing) sends: a launch
//! [`Descriptor`] with its operands and semaphore operations.
//!
//! The ring itself (its byte layout, the shared mapping, both ends, the
//! daemon's server) lives in the `ptxd-ipc` crate, below the SDK and the
//! daemon; these are the parts a session builds or reads.
//!
//! Invariants: these are `ptxd-ipc`'s own types, re-exported, so the SDK
//! and the daemon encode and decode one definition of the format.

pub use ptxd_ipc::ring::{
    Descriptor, DescriptorError, OperandRef, SemaphoreOp, SemaphoreRole, SemaphoreWidth, TypedArg,
    MAX_ARGS, MAX_INPUTS, MAX_SCALARS,
};
