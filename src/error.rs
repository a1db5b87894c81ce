//! ptxd's one error type and the one place it becomes a gRPC status.
//!
//! Each module has its own error enum; [`Error`] rolls them up with the
//! request-level refusals, and [`Error::refusal`] maps every case, with no
//! catch-all arm, to a gRPC code, a [`Reason`] from the closed list and the
//! `google.rpc.ErrorInfo` metadata naming the offending operand, param, slot
//! or limit. Client mistakes never map to INTERNAL; faults inside ptxd never
//! map to a client-error code.

use std::collections::{BTreeMap, HashMap};

use ptxd_proto::executor::FailureKind;
use ptxd_proto::v1::{LaunchError, Reason};
use ptxd_proto::ERROR_DOMAIN;
use tonic::Code;
use tonic_types::{ErrorDetails, StatusExt};

use crate::buffers::{ObjectKind, RegistryError};
use crate::executor::ExecutorError;
use crate::handles::MalformedHandle;
use crate::ptx::PtxError;
use crate::sessions::SessionError;
use crate::slots::SlotError;
use crate::untrusted::escape;

/// Every way a request can fail.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Ptx(#[from] PtxError),
    #[error(transparent)]
    Slot(#[from] SlotError),
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Executor(#[from] ExecutorError),
    #[error(transparent)]
    MalformedHandle(#[from] MalformedHandle),
    #[error("invalid {field}: {message}")]
    InvalidArgument {
        field: &'static str,
        message: String,
    },
    /// A request message that is not valid protobuf for its method.
    #[error("undecodable request: {message}")]
    Undecodable { field: String, message: String },
    #[error("limit {limit} ({value}) reached")]
    LimitExceeded { limit: &'static str, value: u64 },
    #[error("no device {device}")]
    UnknownDevice { device: String },
    #[error("operand {operand} is on {operand_device}, the kernel on {kernel_device}")]
    DeviceMismatch {
        operand: String,
        kernel_device: String,
        operand_device: String,
    },
    #[error("operand {operand} needs {needed_bytes} bytes but its buffer holds {buffer_bytes}")]
    BufferTooSmall {
        operand: String,
        needed_bytes: u128,
        buffer_bytes: u64,
    },
    /// A precondition of the kernel's launch contract is false at the
    /// launch's values (see `crate::launch::LaunchRefusal::PreconditionFailed`).
    #[error("invalid launch: precondition {precondition} ({condition}) does not hold at {values}")]
    LaunchPrecondition {
        precondition: &'static str,
        condition: String,
        values: String,
    },
    /// The launch's scalar arguments do not match the kernel's scalar
    /// params (see `crate::launch::LaunchRefusal::ScalarArgsMismatch`).
    #[error("{message}")]
    ScalarArgsMismatch {
        what: &'static str,
        index: u32,
        param: String,
        expected: String,
        given: String,
        message: String,
    },
    #[error("the kernel takes {expected} {what}, the launch gives {found}")]
    LaunchArity {
        what: &'static str,
        expected: u32,
        found: u32,
    },
    #[error("{message}")]
    UnsupportedArtifact { message: String },
    /// Machine code (cubin, fatbin) from a caller the operator does not
    /// trust with unverified artifacts (`--trust-unverified-artifacts`).
    #[error("a {kind} cannot be verified and this caller is not trusted with unverified machine code; load PTX instead")]
    UnverifiedArtifact { kind: &'static str },
    /// A resource whose access depends on the caller's identity, asked for
    /// by a caller without peer credentials (TCP).
    #[error("{resource} needs a caller identity; a caller without peer credentials (TCP) cannot register it: connect over the Unix socket")]
    IdentityRequired { resource: &'static str },
    /// An fd-socket token that is not (or no longer) waiting for a
    /// descriptor.
    #[error("fd token {why}: register the buffer again")]
    StaleFdToken { why: FdTokenState },
    /// A descriptor sent over the fd socket by another uid than the one that
    /// registered the token.
    #[error("the descriptor was sent by another user than the one that registered the buffer")]
    FdWrongPeer,
    /// A host shared-memory object that the caller's uid does not own. The
    /// refusal names the object, never its owner.
    #[error("shared memory {name:?} belongs to another user than the session's")]
    ShmNotOwned { name: String },
    #[error("ptxd is draining; reconnect to its successor")]
    Draining,
    #[error("internal error: {message}")]
    Internal { message: String },
}

/// Why an fd token cannot take a descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FdTokenState {
    /// Never issued (or issued by an earlier daemon).
    Unknown,
    /// A descriptor already came with it.
    Used,
    /// Its time ran out before a descriptor came.
    Expired,
}

impl FdTokenState {
    pub fn as_str(self) -> &'static str {
        match self {
            FdTokenState::Unknown => "unknown",
            FdTokenState::Used => "used",
            FdTokenState::Expired => "expired",
        }
    }
}

impl std::fmt::Display for FdTokenState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// True for the executor's refusal to map an object another uid owns
/// (it opens with the daemon's rights, so it checks the owner itself and
/// says EACCES).
fn is_foreign_object(metadata: &BTreeMap<String, String>) -> bool {
    metadata.get("os_error").map(String::as_str) == Some("EACCES")
}

/// A refusal as it goes on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: Code,
    pub reason: Reason,
    pub message: String,
    pub metadata: BTreeMap<String, String>,
}

fn meta<const N: usize>(pairs: [(&str, String); N]) -> BTreeMap<String, String> {
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

impl Error {
    /// The reason and code of this error: the one mapping to the wire.
    pub fn refusal(&self) -> Refusal {
        let message = match self {
            // The executor's own ownership check (the front checks first,
            // so this answers only a race with a chown): its words name the
            // owner's uid, which another user must not learn.
            Error::Executor(ExecutorError::Failed { metadata, .. })
                if is_foreign_object(metadata) =>
            {
                "the object belongs to another user than the session's".to_string()
            }
            _ => self.to_string(),
        };
        let (code, reason, metadata) = match self {
            Error::Ptx(e) => {
                let (code, reason) = match e {
                    PtxError::Parse { .. } => (Code::InvalidArgument, Reason::InvalidArtifact),
                    PtxError::SymbolNotFound { .. } => (Code::NotFound, Reason::SymbolNotFound),
                    PtxError::NonScalarAbi { .. } => (Code::InvalidArgument, Reason::NonScalarAbi),
                    PtxError::AbiMismatch { .. } => (Code::InvalidArgument, Reason::AbiMismatch),
                    PtxError::UnsupportedOnHost { .. } => {
                        (Code::FailedPrecondition, Reason::UnsupportedOnHost)
                    }
                };
                (code, reason, e.metadata())
            }
            Error::Slot(e) => match e {
                SlotError::Stale { handle, why } => (
                    Code::FailedPrecondition,
                    Reason::StaleKernel,
                    meta([
                        ("kernel", handle.clone()),
                        ("why", why.as_str().to_string()),
                    ]),
                ),
                SlotError::BankFull { capacity } => (
                    Code::ResourceExhausted,
                    Reason::SlotBankFull,
                    meta([("capacity", capacity.to_string())]),
                ),
            },
            Error::Session(e) => match e {
                SessionError::Unknown { session } => (
                    Code::NotFound,
                    Reason::UnknownSession,
                    meta([("session", session.clone())]),
                ),
                // Names no uid: one user must not learn another's.
                SessionError::WrongPeer { session } => (
                    Code::PermissionDenied,
                    Reason::NotOwner,
                    meta([("session", session.clone())]),
                ),
            },
            Error::Registry(e) => {
                let (code, reason) = match e.kind() {
                    ObjectKind::Buffer => (Code::FailedPrecondition, Reason::StaleBuffer),
                    ObjectKind::Event => (Code::InvalidArgument, Reason::InvalidArgument),
                };
                (
                    code,
                    reason,
                    meta([
                        (e.kind().as_str(), e.handle().to_string()),
                        ("why", e.why().to_string()),
                    ]),
                )
            }
            Error::Executor(e) => match e {
                ExecutorError::Unavailable { device, cause } => (
                    Code::Unavailable,
                    Reason::ExecutorUnavailable,
                    meta([("device", device.clone()), ("cause", cause.clone())]),
                ),
                ExecutorError::Failed { metadata, .. } if is_foreign_object(metadata) => {
                    (Code::PermissionDenied, Reason::NotOwner, BTreeMap::new())
                }
                ExecutorError::Failed { kind, metadata, .. } => {
                    let (code, reason) = match (kind, metadata.get("object").map(String::as_str)) {
                        // A buffer released (or lost in a restart) between
                        // the front's check and the launch.
                        (FailureKind::UnknownObject, Some("buffer")) => {
                            (Code::FailedPrecondition, Reason::StaleBuffer)
                        }
                        // The executor ran out of descriptors or memory: the
                        // server's exhaustion, never the client's mistake.
                        _ if server_exhaustion(metadata).is_some() => {
                            (Code::ResourceExhausted, Reason::LimitExceeded)
                        }
                        _ => failure_code(*kind),
                    };
                    let mut metadata = metadata.clone();
                    if let Some(limit) = server_exhaustion(&metadata) {
                        metadata.insert("limit".into(), limit.into());
                    }
                    (code, reason, metadata)
                }
                ExecutorError::UnexpectedReply(what) => (
                    Code::Internal,
                    Reason::Internal,
                    meta([("request", what.to_string())]),
                ),
            },
            Error::MalformedHandle(e) => (
                Code::InvalidArgument,
                Reason::InvalidArgument,
                meta([("field", e.kind.to_string()), ("value", e.text.clone())]),
            ),
            Error::InvalidArgument { field, .. } => (
                Code::InvalidArgument,
                Reason::InvalidArgument,
                meta([("field", field.to_string())]),
            ),
            Error::Undecodable { field, .. } => (
                Code::InvalidArgument,
                Reason::InvalidArgument,
                if field.is_empty() {
                    BTreeMap::new()
                } else {
                    meta([("field", field.clone())])
                },
            ),
            Error::LimitExceeded { limit, value } => (
                Code::ResourceExhausted,
                Reason::LimitExceeded,
                meta([("limit", limit.to_string()), ("value", value.to_string())]),
            ),
            Error::LaunchPrecondition {
                precondition,
                condition,
                values,
            } => (
                Code::InvalidArgument,
                Reason::InvalidArgument,
                meta([
                    ("field", "launch".to_string()),
                    ("precondition", precondition.to_string()),
                    ("condition", condition.clone()),
                    ("values", values.clone()),
                ]),
            ),
            Error::ScalarArgsMismatch {
                what,
                index,
                param,
                expected,
                given,
                ..
            } => {
                let mut metadata = meta([
                    ("what", what.to_string()),
                    ("expected", expected.clone()),
                    ("given", given.clone()),
                ]);
                if *what == "type" {
                    metadata.insert("index".into(), index.to_string());
                    metadata.insert("param".into(), param.clone());
                }
                (Code::InvalidArgument, Reason::ScalarArgsMismatch, metadata)
            }
            Error::UnknownDevice { device } => (
                Code::NotFound,
                Reason::UnknownDevice,
                meta([("device", device.clone())]),
            ),
            Error::DeviceMismatch {
                operand,
                kernel_device,
                operand_device,
            } => (
                Code::FailedPrecondition,
                Reason::DeviceMismatch,
                meta([
                    ("operand", operand.clone()),
                    ("kernel_device", kernel_device.clone()),
                    ("operand_device", operand_device.clone()),
                ]),
            ),
            Error::BufferTooSmall {
                operand,
                needed_bytes,
                buffer_bytes,
            } => (
                Code::OutOfRange,
                Reason::BufferTooSmall,
                meta([
                    ("operand", operand.clone()),
                    ("needed_bytes", needed_bytes.to_string()),
                    ("buffer_bytes", buffer_bytes.to_string()),
                ]),
            ),
            Error::LaunchArity {
                what,
                expected,
                found,
            } => (
                Code::InvalidArgument,
                Reason::AbiMismatch,
                meta([
                    ("what", what.to_string()),
                    ("expected", expected.to_string()),
                    ("found", found.to_string()),
                ]),
            ),
            Error::UnsupportedArtifact { .. } => (
                Code::InvalidArgument,
                Reason::UnsupportedArtifact,
                BTreeMap::new(),
            ),
            Error::UnverifiedArtifact { kind } => (
                Code::PermissionDenied,
                Reason::UnverifiedArtifact,
                meta([("kind", kind.to_string())]),
            ),
            Error::IdentityRequired { resource } => (
                Code::Unauthenticated,
                Reason::IdentityRequired,
                meta([("resource", resource.to_string())]),
            ),
            Error::StaleFdToken { why } => (
                Code::FailedPrecondition,
                Reason::StaleFdToken,
                meta([("why", why.as_str().to_string())]),
            ),
            // Names no uid, like NOT_OWNER for a session.
            Error::FdWrongPeer => (Code::PermissionDenied, Reason::NotOwner, BTreeMap::new()),
            // Names the object, not its owner's uid.
            Error::ShmNotOwned { name } => (
                Code::PermissionDenied,
                Reason::NotOwner,
                meta([("host_shm", name.chars().take(256).collect())]),
            ),
            Error::Draining => (Code::Unavailable, Reason::Draining, BTreeMap::new()),
            Error::Internal { .. } => (Code::Internal, Reason::Internal, BTreeMap::new()),
        };
        // Messages and metadata quote what the client sent: escape it once,
        // here, for the wire and for every log line built from a refusal.
        Refusal {
            code,
            reason,
            message: escape(&message).into_owned(),
            metadata: metadata
                .into_iter()
                .map(|(k, v)| (k, escape(&v).into_owned()))
                .collect(),
        }
    }

    /// This error as a gRPC status with its `google.rpc.ErrorInfo`.
    pub fn to_status(&self) -> tonic::Status {
        let refusal = self.refusal();
        let metadata: HashMap<String, String> = refusal.metadata.into_iter().collect();
        tonic::Status::with_error_details(
            refusal.code,
            refusal.message,
            ErrorDetails::with_error_info(refusal.reason.wire_name(), ERROR_DOMAIN, metadata),
        )
    }

    /// This error as a `LaunchStream` per-request error.
    pub fn to_launch_error(&self) -> LaunchError {
        let refusal = self.refusal();
        LaunchError {
            code: refusal.code as i32,
            reason: refusal.reason.wire_name().to_string(),
            message: refusal.message,
            metadata: refusal.metadata.into_iter().collect(),
        }
    }
}

/// The resource an executor failure says the server ran out of, from its
/// `os_error` or `cuda_error` metadata: file descriptors (EMFILE, ENFILE),
/// memory (ENOMEM, CUDA_ERROR_OUT_OF_MEMORY).
fn server_exhaustion(metadata: &BTreeMap<String, String>) -> Option<&'static str> {
    match metadata.get("os_error").map(String::as_str) {
        Some("EMFILE") => return Some("open_files"),
        Some("ENFILE") => return Some("system_open_files"),
        Some("ENOMEM") => return Some("memory"),
        _ => {}
    }
    match metadata.get("cuda_error").map(String::as_str) {
        Some("CUDA_ERROR_OUT_OF_MEMORY") => Some("device_memory"),
        _ => None,
    }
}

/// The code and reason of an executor's typed failure.
fn failure_code(kind: FailureKind) -> (Code, Reason) {
    match kind {
        FailureKind::InvalidArtifact => (Code::InvalidArgument, Reason::InvalidArtifact),
        FailureKind::UnsupportedArtifact => (Code::InvalidArgument, Reason::UnsupportedArtifact),
        FailureKind::SymbolNotFound => (Code::NotFound, Reason::SymbolNotFound),
        FailureKind::AbiMismatch => (Code::InvalidArgument, Reason::AbiMismatch),
        FailureKind::InvalidHandle => (Code::InvalidArgument, Reason::InvalidHandle),
        FailureKind::DeviceMismatch => (Code::FailedPrecondition, Reason::DeviceMismatch),
        FailureKind::KernelFault => (Code::Aborted, Reason::KernelFault),
        FailureKind::UnsupportedOnHost => (Code::FailedPrecondition, Reason::UnsupportedOnHost),
        FailureKind::NonScalarAbi => (Code::InvalidArgument, Reason::NonScalarAbi),
        // The front checked every object and bound before sending: if the
        // executor disagrees, the object went stale in between (released or
        // restarted), which the client must treat as stale.
        FailureKind::UnknownObject => (Code::FailedPrecondition, Reason::StaleKernel),
        FailureKind::OutOfBounds => (Code::OutOfRange, Reason::BufferTooSmall),
        FailureKind::KernelTimeout => (Code::DeadlineExceeded, Reason::KernelTimeout),
        FailureKind::FdNotSealed => (Code::FailedPrecondition, Reason::FdNotSealed),
        // The executor stopped (the drain's deadline) before the launch
        // started: DRAINING, whose promise is that the call did not run.
        FailureKind::NotRun => (Code::Unavailable, Reason::Draining),
        // The executor was exiting when the request reached it: its
        // absence, retryable once the supervisor has replaced it (the link
        // reports it as `ExecutorError::Unavailable`; this arm is for a
        // failure that reaches the funnel some other way).
        FailureKind::ExecutorExiting => (Code::Unavailable, Reason::ExecutorUnavailable),
        FailureKind::Internal | FailureKind::Unspecified => (Code::Internal, Reason::Internal),
    }
}

/// The launch checks' refusals, as the daemon's errors: the same variants
/// (and so the same reasons on the wire) the checks returned before they had
/// an enum of their own.
impl From<crate::launch::LaunchRefusal> for Error {
    fn from(refusal: crate::launch::LaunchRefusal) -> Self {
        use crate::launch::LaunchRefusal;
        match refusal {
            LaunchRefusal::Arity {
                what,
                expected,
                found,
            } => Error::LaunchArity {
                what,
                expected,
                found,
            },
            LaunchRefusal::NoOutput => Error::InvalidArgument {
                field: "output",
                message: refusal.to_string(),
            },
            LaunchRefusal::CountTooLarge => Error::InvalidArgument {
                field: "n",
                message: refusal.to_string(),
            },
            LaunchRefusal::Misaligned { .. } => Error::InvalidArgument {
                field: "offset",
                message: refusal.to_string(),
            },
            LaunchRefusal::BufferTooSmall {
                operand,
                needed_bytes,
                buffer_bytes,
            } => Error::BufferTooSmall {
                operand,
                needed_bytes,
                buffer_bytes,
            },
            LaunchRefusal::DeviceMismatch {
                operand,
                kernel_device,
                operand_device,
            } => Error::DeviceMismatch {
                operand,
                kernel_device,
                operand_device,
            },
            LaunchRefusal::PreconditionFailed {
                precondition,
                condition,
                values,
            } => Error::LaunchPrecondition {
                precondition,
                condition,
                values,
            },
            LaunchRefusal::ScalarArgsMismatch {
                what,
                index,
                ref param,
                ref expected,
                ref given,
            } => Error::ScalarArgsMismatch {
                what,
                index,
                param: param.clone(),
                expected: expected.clone(),
                given: given.clone(),
                message: refusal.to_string(),
            },
            LaunchRefusal::Internal(message) => Error::Internal {
                message: message.into(),
            },
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_launch_the_executor_never_started_is_draining() {
        let error = Error::Executor(ExecutorError::Failed {
            kind: FailureKind::NotRun,
            message: "stopped before it started".into(),
            metadata: BTreeMap::new(),
        });
        let refusal = error.refusal();
        assert_eq!(
            (refusal.code, refusal.reason),
            (Code::Unavailable, Reason::Draining)
        );
    }

    #[test]
    fn a_request_that_met_an_exiting_executor_is_executor_unavailable_not_a_fault() {
        let error = Error::Executor(ExecutorError::Failed {
            kind: FailureKind::ExecutorExiting,
            message: "the executor was exiting".into(),
            metadata: [(
                "cuda_error".to_string(),
                "CUDA_ERROR_DEINITIALIZED".to_string(),
            )]
            .into(),
        });
        let refusal = error.refusal();
        assert_eq!(
            (refusal.code, refusal.reason),
            (Code::Unavailable, Reason::ExecutorUnavailable)
        );
    }

    #[test]
    fn another_users_object_names_no_uid() {
        let executor = Error::Executor(ExecutorError::Failed {
            kind: FailureKind::InvalidHandle,
            message: "shared memory \"/x\" belongs to uid 4242, not to the session's uid 7".into(),
            metadata: [("os_error".to_string(), "EACCES".to_string())].into(),
        });
        let front = Error::ShmNotOwned { name: "/x".into() };
        for error in [executor, front] {
            let refusal = error.refusal();
            assert_eq!(
                (refusal.code, refusal.reason),
                (Code::PermissionDenied, Reason::NotOwner)
            );
            assert!(!refusal.message.contains("4242") && !refusal.message.contains(" 7"));
            assert!(refusal.metadata.values().all(|v| !v.contains("4242")));
        }
    }

    #[test]
    fn a_status_carries_error_info_with_the_reason_and_metadata() {
        let error = Error::BufferTooSmall {
            operand: "input 1".into(),
            needed_bytes: 4096,
            buffer_bytes: 1024,
        };
        let status = error.to_status();
        assert_eq!(status.code(), Code::OutOfRange);
        let info = status.get_details_error_info().unwrap();
        assert_eq!(info.reason, "BUFFER_TOO_SMALL");
        assert_eq!(info.domain, "ptxd");
        assert_eq!(info.metadata.get("operand").unwrap(), "input 1");
        assert_eq!(info.metadata.get("needed_bytes").unwrap(), "4096");
    }

    #[test]
    fn descriptor_exhaustion_in_an_executor_is_the_servers_not_the_clients() {
        for (errno, limit) in [("EMFILE", "open_files"), ("ENFILE", "system_open_files")] {
            let error = Error::Executor(ExecutorError::Failed {
                kind: FailureKind::InvalidHandle,
                message: "shm_open: too many open files".into(),
                metadata: meta([("os_error", errno.to_string())]),
            });
            let refusal = error.refusal();
            assert_eq!(refusal.code, Code::ResourceExhausted, "{errno}");
            assert_eq!(refusal.reason, Reason::LimitExceeded, "{errno}");
            assert_eq!(refusal.metadata.get("limit").unwrap(), limit);
            assert_eq!(refusal.metadata.get("os_error").unwrap(), errno);
        }
        let enoent = Error::Executor(ExecutorError::Failed {
            kind: FailureKind::InvalidHandle,
            message: "x".into(),
            metadata: meta([("os_error", "ENOENT".to_string())]),
        });
        assert_eq!(enoent.refusal().reason, Reason::InvalidHandle);
    }

    #[test]
    fn refusals_escape_what_the_client_sent() {
        let refusal = Error::UnknownDevice {
            device: "GPU-1\nline\n2024-01-01 INFO forged".into(),
        }
        .refusal();
        assert!(!refusal.message.contains('\n'), "{}", refusal.message);
        assert!(
            refusal.message.contains("GPU-1\\nline"),
            "{}",
            refusal.message
        );
        assert!(!refusal.metadata["device"].contains('\n'));
    }

    #[test]
    fn client_mistakes_never_map_to_internal() {
        let client_errors = [
            Error::InvalidArgument {
                field: "n",
                message: "x".into(),
            },
            Error::Draining,
            Error::UnknownDevice { device: "7".into() },
            Error::LaunchArity {
                what: "inputs",
                expected: 2,
                found: 1,
            },
            Error::Ptx(PtxError::Parse {
                line: 1,
                column: 1,
                message: "x".into(),
            }),
            Error::Executor(ExecutorError::Failed {
                kind: FailureKind::InvalidHandle,
                message: "x".into(),
                metadata: BTreeMap::new(),
            }),
        ];
        for error in client_errors {
            let refusal = error.refusal();
            assert_ne!(refusal.code, Code::Internal, "{error:?}");
            assert_ne!(refusal.reason, Reason::Internal, "{error:?}");
        }
        assert_eq!(
            Error::Internal {
                message: "x".into()
            }
            .refusal()
            .code,
            Code::Internal
        );
    }
}
