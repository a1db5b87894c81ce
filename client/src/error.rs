//! The SDK's error type and the decoding of ptxd's refusals.
//!
//! ptxd refuses a request with a gRPC status whose details carry a
//! `google.rpc.ErrorInfo` of domain `"ptxd"` and a reason from the closed list
//! in `ptxd.v1.Reason`. A refusal becomes [`Error::Refused`] with one
//! [`Refusal`] variant per reason, keeping the message, the status code and the
//! ErrorInfo metadata (which names the offending operand, param, limit, ...).
//!
//! Invariants:
//! - The mapping from the wire reason to [`Refusal`] is one exhaustive `match`
//!   over `ptxd_proto::v1::Reason`: a reason added to the proto does not
//!   compile until it has a variant here.
//! - A status without a ptxd ErrorInfo, or with a reason this SDK does not
//!   know (a newer daemon), is kept whole as [`Error::Status`]: nothing the
//!   daemon said is dropped or guessed.

use std::collections::BTreeMap;

use ptxd_proto::v1::{LaunchError, Reason};
use tonic_types::StatusExt;

/// Everything an SDK call can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// ptxd refused the request with one of its documented reasons.
    #[error("{0}")]
    Refused(Refusal),
    /// The connection to ptxd could not be made or broke (the cause is the
    /// error's `source`).
    #[error("the connection to ptxd failed")]
    Transport(#[from] tonic::transport::Error),
    /// A gRPC status without a ptxd refusal in its details (e.g. the
    /// connection dropped mid-call, or a reason newer than this SDK).
    #[error("status {}: {}", .0.code(), .0.message())]
    Status(tonic::Status),
    /// The session's lease ended (closed, or the daemon went away) before or
    /// while the call was made.
    #[error("the session is closed")]
    SessionClosed,
    /// The daemon answered with something this SDK cannot use (e.g. no
    /// session id on a fresh lease).
    #[error("unexpected response from ptxd: {0}")]
    Protocol(String),
    /// The caller's input cannot be turned into a request.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The launch ring's executor is gone (it restarted, or the session
    /// ended): the SDK released the ring's pending semaphore signals itself
    /// (see [`LaunchRing::orphaned`](crate::LaunchRing::orphaned)) and the
    /// ring takes no more launches. Open a new ring after the restart, or a
    /// new session.
    #[error("the launch ring is orphaned: {0}")]
    RingOrphaned(crate::OrphanCause),
    /// The default socket's directory is not safe to trust (another user
    /// owns it or may write into it, or it is a symlink).
    #[error(transparent)]
    UnsafeSocketDir(#[from] ptxd_ipc::socket_dir::SocketDirError),
    /// A CUDA call in this process failed (e.g. enqueueing a launch ring's
    /// semaphore operation on the session's own stream).
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    Cuda(#[from] crate::cuda::CudaError),
}

impl Error {
    /// The refusal, when ptxd refused the request.
    pub fn refusal(&self) -> Option<&Refusal> {
        match self {
            Error::Refused(refusal) => Some(refusal),
            _ => None,
        }
    }

    /// A short name for what went wrong: the refusal's wire reason (e.g.
    /// `"STALE_KERNEL"`), or the kind of failure for anything else.
    pub fn reason_name(&self) -> &'static str {
        match self {
            Error::Refused(refusal) => refusal.wire_name(),
            Error::Transport(_) => "TRANSPORT",
            Error::Status(_) => "STATUS",
            Error::SessionClosed => "SESSION_CLOSED",
            Error::Protocol(_) => "PROTOCOL",
            Error::InvalidInput(_) => "INVALID_INPUT",
            Error::RingOrphaned(_) => "RING_ORPHANED",
            Error::UnsafeSocketDir(_) => "UNSAFE_SOCKET_DIR",
            #[cfg(feature = "cuda")]
            Error::Cuda(_) => "CUDA",
        }
    }
}

impl From<tonic::Status> for Error {
    fn from(status: tonic::Status) -> Self {
        let Some(info) = status.get_details_error_info() else {
            return Error::Status(status);
        };
        if info.domain != ptxd_proto::ERROR_DOMAIN {
            return Error::Status(status);
        }
        let details = RefusalDetails {
            code: status.code(),
            message: status.message().to_owned(),
            metadata: info.metadata.into_iter().collect(),
        };
        match Refusal::from_wire(&info.reason, details) {
            Some(refusal) => Error::Refused(refusal),
            None => Error::Status(status),
        }
    }
}

/// What ptxd said along with a refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusalDetails {
    /// The gRPC status code the refusal came with.
    pub code: tonic::Code,
    /// The human-readable message.
    pub message: String,
    /// The ErrorInfo metadata: which operand, param, slot or limit.
    pub metadata: BTreeMap<String, String>,
}

/// Declares [`Refusal`] with one variant per `ptxd.v1.Reason`, and the one
/// exhaustive mapping from the proto enum to it.
macro_rules! refusals {
    ($( $(#[$doc:meta])* $variant:ident ),+ $(,)?) => {
        /// A refusal from ptxd: one variant per reason of the closed list in
        /// `ptxd.v1.Reason`, each with the message and metadata ptxd sent.
        #[derive(Debug, Clone, PartialEq, Eq)]
        #[non_exhaustive]
        pub enum Refusal {
            $( $(#[$doc])* $variant(RefusalDetails), )+
        }

        impl Refusal {
            fn from_proto(reason: Reason, details: RefusalDetails) -> Option<Self> {
                match reason {
                    Reason::Unspecified => None,
                    $( Reason::$variant => Some(Refusal::$variant(details)), )+
                }
            }

            fn proto_reason(&self) -> Reason {
                match self {
                    $( Refusal::$variant(_) => Reason::$variant, )+
                }
            }

            /// What ptxd said with the refusal.
            pub fn details(&self) -> &RefusalDetails {
                match self {
                    $( Refusal::$variant(details) => details, )+
                }
            }
        }
    };
}

refusals! {
    /// The kernel does not follow the scalar ABI.
    NonScalarAbi,
    /// An operand sits on another device or device generation than the kernel.
    DeviceMismatch,
    /// The kernel handle is stale (slot reused, dead generation, earlier
    /// boot): reload the kernel.
    StaleKernel,
    /// The buffer handle was released, is from an earlier boot, or could not
    /// be re-opened after an executor restart.
    StaleBuffer,
    /// Every kernel slot is held by a live kernel.
    SlotBankFull,
    /// An operand's range exceeds its registered size.
    BufferTooSmall,
    /// No device with that UUID or ordinal.
    UnknownDevice,
    /// The artifact has no entry with that symbol.
    SymbolNotFound,
    /// The artifact does not parse or does not compile.
    InvalidArtifact,
    /// The artifact kind cannot be loaded here.
    UnsupportedArtifact,
    /// A CUDA IPC handle or shared-memory name does not open.
    InvalidHandle,
    /// The session was opened by another caller (uid, transport or connection).
    NotOwner,
    /// A configured limit was reached.
    LimitExceeded,
    /// The kernel faulted on the device; its executor restarts.
    KernelFault,
    /// The device's executor is down or restarting: retry shortly.
    ExecutorUnavailable,
    /// The host backend cannot run this.
    UnsupportedOnHost,
    /// The kernel's ABI or the launch's counts do not match what was declared.
    AbiMismatch,
    /// No open session with that id.
    UnknownSession,
    /// A request field is malformed or missing.
    InvalidArgument,
    /// The daemon is shutting down.
    Draining,
    /// A fault inside ptxd itself.
    Internal,
    /// The launch ran past the daemon's per-launch budget.
    KernelTimeout,
    /// Machine code (cubin, fatbin) from a caller not trusted with
    /// unverified artifacts: load PTX instead.
    UnverifiedArtifact,
    /// The request needs a caller identity (e.g. host shared memory) and the
    /// connection has none (TCP): use the Unix socket.
    IdentityRequired,
    /// A memfd passed as a buffer lacks `F_SEAL_SHRINK`: seal it first
    /// ([`HostMemfd`](crate::HostMemfd) does).
    FdNotSealed,
    /// The fd token is unknown, used or expired (metadata `why`): register
    /// the buffer again.
    StaleFdToken,
    /// The launch's typed scalar args do not match the kernel's scalar
    /// params (metadata `what`: count, type or both; for a type `index`,
    /// `param`, `expected`, `given`).
    ScalarArgsMismatch,
}

impl Refusal {
    /// The refusal for a wire reason name (as in `ErrorInfo.reason`), or
    /// `None` for a name this SDK does not know.
    pub fn from_wire(name: &str, details: RefusalDetails) -> Option<Self> {
        Self::from_proto(Reason::from_wire_name(name)?, details)
    }

    /// The reason's wire name, e.g. `"STALE_KERNEL"`.
    pub fn wire_name(&self) -> &'static str {
        self.proto_reason().wire_name()
    }

    /// The message ptxd sent.
    pub fn message(&self) -> &str {
        &self.details().message
    }

    /// The ErrorInfo metadata ptxd sent.
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.details().metadata
    }

    /// The gRPC status code the refusal came with.
    pub fn code(&self) -> tonic::Code {
        self.details().code
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.wire_name(), self.message())?;
        let metadata = self.metadata();
        if !metadata.is_empty() {
            let pairs: Vec<String> = metadata.iter().map(|(k, v)| format!("{k}={v}")).collect();
            write!(f, " [{}]", pairs.join(", "))?;
        }
        Ok(())
    }
}

/// The error of one launch on a `LaunchStream`, where a refusal travels in
/// the response instead of the status.
pub(crate) fn from_launch_error(error: LaunchError) -> Error {
    let code = tonic::Code::from_i32(error.code);
    let details = RefusalDetails {
        code,
        message: error.message,
        metadata: error.metadata.into_iter().collect(),
    };
    match Refusal::from_wire(&error.reason, details.clone()) {
        Some(refusal) => Error::Refused(refusal),
        None => Error::Status(tonic::Status::new(
            code,
            format!("{}: {}", error.reason, details.message),
        )),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::collections::HashMap;

    use tonic_types::ErrorDetails;

    use super::*;

    fn every_reason() -> Vec<Reason> {
        let reasons: Vec<Reason> = (1..)
            .map_while(|value| Reason::try_from(value).ok())
            .collect();
        assert_eq!(reasons.len(), 27, "the proto's reason list changed");
        reasons
    }

    fn refusal_status(code: tonic::Code, reason: &str, domain: &str) -> tonic::Status {
        let metadata = HashMap::from([
            ("operand".to_owned(), "in1".to_owned()),
            ("reason_echo".to_owned(), reason.to_owned()),
        ]);
        tonic::Status::with_error_details(
            code,
            format!("refused because {reason}"),
            ErrorDetails::with_error_info(reason, domain, metadata),
        )
    }

    #[test]
    fn every_reason_decodes_to_its_own_variant_with_message_and_metadata() {
        for reason in every_reason() {
            let name = reason.wire_name();
            let error = Error::from(refusal_status(
                tonic::Code::FailedPrecondition,
                name,
                "ptxd",
            ));
            let refusal = error
                .refusal()
                .unwrap_or_else(|| panic!("{name} did not decode: {error:?}"));
            assert_eq!(refusal.wire_name(), name);
            assert_eq!(refusal.proto_reason(), reason);
            assert_eq!(refusal.code(), tonic::Code::FailedPrecondition);
            assert_eq!(refusal.message(), format!("refused because {name}"));
            assert_eq!(
                refusal.metadata().get("operand").map(String::as_str),
                Some("in1")
            );
            assert_eq!(
                refusal.metadata().get("reason_echo").map(String::as_str),
                Some(name)
            );
            assert_eq!(error.reason_name(), name);
        }
    }

    #[test]
    fn named_variants_match_their_wire_names() {
        let details = || RefusalDetails {
            code: tonic::Code::Ok,
            message: String::new(),
            metadata: BTreeMap::new(),
        };
        let cases = [
            ("STALE_KERNEL", Refusal::StaleKernel(details())),
            ("NON_SCALAR_ABI", Refusal::NonScalarAbi(details())),
            ("DEVICE_MISMATCH", Refusal::DeviceMismatch(details())),
            ("BUFFER_TOO_SMALL", Refusal::BufferTooSmall(details())),
            ("UNSUPPORTED_ON_HOST", Refusal::UnsupportedOnHost(details())),
            ("INTERNAL", Refusal::Internal(details())),
            ("KERNEL_TIMEOUT", Refusal::KernelTimeout(details())),
        ];
        for (name, expected) in cases {
            assert_eq!(Refusal::from_wire(name, details()), Some(expected));
        }
    }

    #[test]
    fn status_without_ptxd_error_info_stays_a_status() {
        let plain = tonic::Status::unavailable("connection reset");
        assert!(
            matches!(Error::from(plain), Error::Status(s) if s.message() == "connection reset")
        );

        let foreign = refusal_status(tonic::Code::NotFound, "STALE_KERNEL", "example.com");
        assert!(matches!(Error::from(foreign), Error::Status(_)));

        let unknown = refusal_status(tonic::Code::Internal, "SOMETHING_NEW", "ptxd");
        assert!(matches!(Error::from(unknown), Error::Status(_)));

        let unspecified = refusal_status(tonic::Code::Internal, "UNSPECIFIED", "ptxd");
        assert!(matches!(Error::from(unspecified), Error::Status(_)));
    }

    #[test]
    fn launch_error_decodes_like_a_status() {
        for reason in every_reason() {
            let error = from_launch_error(LaunchError {
                code: tonic::Code::OutOfRange as i32,
                reason: reason.wire_name().to_owned(),
                message: "too small".to_owned(),
                metadata: HashMap::from([("needed_bytes".to_owned(), "64".to_owned())]),
            });
            let refusal = error.refusal().expect("a known reason decodes");
            assert_eq!(refusal.proto_reason(), reason);
            assert_eq!(refusal.code(), tonic::Code::OutOfRange);
            assert_eq!(refusal.message(), "too small");
            assert_eq!(
                refusal.metadata().get("needed_bytes").map(String::as_str),
                Some("64")
            );
        }
        let unknown = from_launch_error(LaunchError {
            code: tonic::Code::Internal as i32,
            reason: "NEWER".to_owned(),
            message: "m".to_owned(),
            metadata: HashMap::new(),
        });
        assert!(matches!(unknown, Error::Status(s) if s.code() == tonic::Code::Internal));
    }

    #[test]
    fn display_names_reason_message_and_metadata() {
        let error = Error::from(refusal_status(
            tonic::Code::NotFound,
            "UNKNOWN_DEVICE",
            "ptxd",
        ));
        let text = error.to_string();
        assert!(
            text.starts_with("UNKNOWN_DEVICE: refused because UNKNOWN_DEVICE"),
            "{text}"
        );
        assert!(text.contains("operand=in1"), "{text}");
    }
}
