//! The shared-memory launch ring: the fast path from a session to its
//! device's executor, beside gRPC.
//!
//! This module holds the records that the SDK and the daemon share: the
//! fixed-size submission descriptor ([`Descriptor`]) and completion record
//! ([`Completion`]). Each is an explicit little-endian encoding with a
//! canonical form: decoding accepts exactly the bytes encoding produces,
//! returns a typed error for every malformed field, never panics and never
//! allocates.

mod completion;
mod descriptor;

pub use completion::{Completion, CompletionError, CompletionStatus, COMPLETION_SIZE};
pub use descriptor::{
    Descriptor, DescriptorError, OperandRef, SemaphoreOp, SemaphoreRole, SemaphoreWidth,
    DESCRIPTOR_SIZE, MAX_INPUTS, MAX_SCALARS,
};
