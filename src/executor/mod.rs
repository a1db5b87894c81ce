//! Executors: the child processes that do device work, one per device, and
//! the front's side of them.
//!
//! - [`protocol`]: the framing of the internal protocol.
//! - [`link`]: the front's typed calls, one per executor operation.
//! - [`child`]: the executor process's request loop, its one dispatcher, and
//!   the [`child::Backend`] trait (one method per operation) that a device
//!   backend implements.
//! - [`host`]: the host (CPU) backend over POSIX shared memory.
//! - [`fd_inbox`]: how a descriptor a client passed reaches its executor.
//! - [`sigbus`]: the SIGBUS handler that lets a host launch survive a client
//!   shrinking its shared-memory object under it.
//! - [`cuda`]: the CUDA backend.
//! - [`kernel_timeouts`]: launches that ran past their budget, per session.
//! - [`supervisor`]: spawns executors, assigns device generations, notices
//!   death, respawns and re-opens buffers.

pub mod channel;
pub mod child;
pub mod cuda;
pub mod fd_inbox;
pub mod host;
pub mod kernel_cache;
pub mod kernel_timeouts;
pub mod layout;
pub mod link;
pub mod protocol;
pub mod ring;
pub mod sigbus;
pub mod spin_input;
pub mod supervisor;

use std::collections::BTreeMap;

use ptxd_proto::executor::{Failure, FailureKind};

/// A failed request to an executor, as the front sees it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecutorError {
    /// The device's executor is down or restarting.
    #[error("the executor of device {device} is unavailable: {cause}")]
    Unavailable { device: String, cause: String },
    /// The executor answered with a typed failure.
    #[error("{message}")]
    Failed {
        kind: FailureKind,
        message: String,
        metadata: BTreeMap<String, String>,
    },
    /// The executor answered with a reply of the wrong shape.
    #[error("the executor answered {0} with an unexpected reply")]
    UnexpectedReply(&'static str),
}

impl From<Failure> for ExecutorError {
    fn from(failure: Failure) -> Self {
        ExecutorError::Failed {
            kind: FailureKind::try_from(failure.kind).unwrap_or(FailureKind::Internal),
            message: failure.message,
            metadata: failure.metadata.into_iter().collect(),
        }
    }
}
