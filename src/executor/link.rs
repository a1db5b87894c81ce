//! The typed client over an executor link: one call per executor
//! operation, each with its own request and reply type.
//!
//! The front never builds a protocol `Op` nor reads a reply variant itself:
//! it calls [`ExecutorLink::load_module`], [`ExecutorLink::launch`], ... with
//! the operation's request message and gets the operation's reply (or
//! `()` for an operation that answers with no payload).
//!
//! Invariants:
//! - Each request type names the one reply variant that answers it
//!   ([`Operation::accept`]); this module is the only place that turns a
//!   reply of the wrong shape into [`ExecutorError::UnexpectedReply`].
//! - A dead executor is [`ExecutorError::Unavailable`] naming the link's own
//!   device (the uuid its Hello reported, the one the front knows it by).
//! - Only the executor module sends a protocol `Op` on a link
//!   (`ExecutorLink::call` is private to the executor module): a request
//!   reaches an executor only as a typed [`Operation`] or a [`CleanUp`] made
//!   from one.

use ptxd_proto::executor::{self as exec, reply, request::Op};

use super::supervisor::{DownCause, ExecutorLink, LinkError};
use super::ExecutorError;

/// One executor operation: its request message, the `Op` it travels as and
/// the reply that answers it.
pub trait Operation: Send {
    /// What a success answers with.
    type Reply: Send;
    /// The operation's name, as an unexpected reply names it.
    const NAME: &'static str;
    /// The request as it travels on the wire.
    fn into_op(self) -> Op;
    /// Reads the executor's answer: the operation's own success reply, or
    /// its failure, or an unexpected reply.
    fn accept(reply: reply::Result) -> Result<Self::Reply, ExecutorError>;
}

/// Reads a failure, or else names the reply as unexpected for `name`.
fn refused(name: &'static str, reply: reply::Result) -> ExecutorError {
    match reply {
        reply::Result::Failure(failure) => ExecutorError::from(failure),
        _ => ExecutorError::UnexpectedReply(name),
    }
}

/// Operations whose success carries no payload.
macro_rules! empty_reply {
    ($($request:ident),* $(,)?) => {$(
        impl Operation for exec::$request {
            type Reply = ();
            const NAME: &'static str = stringify!($request);
            fn into_op(self) -> Op {
                Op::$request(self)
            }
            fn accept(reply: reply::Result) -> Result<(), ExecutorError> {
                match reply {
                    reply::Result::Ok(_) => Ok(()),
                    other => Err(refused(Self::NAME, other)),
                }
            }
        }
    )*};
}

empty_reply!(
    UnloadModule,
    CloseBuffer,
    OpenEvent,
    CloseEvent,
    Launch,
    CloseStream,
    OpenRing,
    CloseRing,
    RingGrant,
    Ping,
    Shutdown,
);

impl Operation for exec::LoadModule {
    type Reply = exec::LoadModuleOk;
    const NAME: &'static str = "LoadModule";
    fn into_op(self) -> Op {
        Op::LoadModule(self)
    }
    fn accept(reply: reply::Result) -> Result<exec::LoadModuleOk, ExecutorError> {
        match reply {
            reply::Result::LoadModule(loaded) => Ok(loaded),
            other => Err(refused(Self::NAME, other)),
        }
    }
}

impl Operation for exec::OpenBuffer {
    type Reply = exec::OpenBufferOk;
    const NAME: &'static str = "OpenBuffer";
    fn into_op(self) -> Op {
        Op::OpenBuffer(self)
    }
    fn accept(reply: reply::Result) -> Result<exec::OpenBufferOk, ExecutorError> {
        match reply {
            reply::Result::OpenBuffer(opened) => Ok(opened),
            other => Err(refused(Self::NAME, other)),
        }
    }
}

/// A clean-up request: the close, unload or revoke of something an
/// executor holds, sent after the front let go of it. Made only from an
/// operation that answers with no payload, so a list of clean-ups can hold
/// several kinds.
#[derive(Debug, Clone, PartialEq)]
pub struct CleanUp(Op);

impl CleanUp {
    /// The clean-up that sends `operation`.
    pub fn new<O: Operation<Reply = ()>>(operation: O) -> Self {
        CleanUp(operation.into_op())
    }
}

impl Operation for CleanUp {
    type Reply = ();
    const NAME: &'static str = "clean-up";
    fn into_op(self) -> Op {
        self.0
    }
    /// A clean-up asks only whether the executor refused it: any other
    /// reply is taken as done.
    fn accept(reply: reply::Result) -> Result<(), ExecutorError> {
        match reply {
            reply::Result::Failure(failure) => Err(ExecutorError::from(failure)),
            _ => Ok(()),
        }
    }
}

impl LinkError {
    /// This failure as the front reports it for `device`.
    pub fn unavailable(self, device: &str) -> ExecutorError {
        let LinkError::Down(cause) = self;
        let cause = match cause {
            DownCause::Fault { error_name, .. } => format!("device fault {error_name}"),
            other => other.to_string(),
        };
        ExecutorError::Unavailable {
            device: device.to_string(),
            cause,
        }
    }
}

/// An executor's answer that it was exiting when the request reached it
/// (`FailureKind::ExecutorExiting`) is the executor's absence, as a closed
/// channel is: [`ExecutorError::Unavailable`] naming `device`, so that every
/// caller (a launch answered EXECUTOR_UNAVAILABLE, a re-open counted as
/// lost, not failed) treats it alike. Any other error is kept.
fn absent_if_exiting(error: ExecutorError, device: &str) -> ExecutorError {
    match error {
        ExecutorError::Failed {
            kind: exec::FailureKind::ExecutorExiting,
            message,
            ..
        } => ExecutorError::Unavailable {
            device: device.to_string(),
            cause: message,
        },
        other => other,
    }
}

impl ExecutorLink {
    /// The uuid of the device this executor serves, as its Hello named it.
    pub fn device_uuid(&self) -> &str {
        self.hello
            .devices
            .first()
            .map_or("", |device| device.uuid.as_str())
    }

    /// Sends one operation and reads its own reply.
    pub async fn request<O: Operation>(&self, operation: O) -> Result<O::Reply, ExecutorError> {
        let reply = self
            .call(operation.into_op())
            .await
            .map_err(|e| e.unavailable(self.device_uuid()))?;
        O::accept(reply).map_err(|e| absent_if_exiting(e, self.device_uuid()))
    }

    /// Compiles or loads a module.
    pub async fn load_module(
        &self,
        load: exec::LoadModule,
    ) -> Result<exec::LoadModuleOk, ExecutorError> {
        self.request(load).await
    }

    /// Unloads a module.
    pub async fn unload_module(&self, unload: exec::UnloadModule) -> Result<(), ExecutorError> {
        self.request(unload).await
    }

    /// Maps a client's buffer.
    pub async fn open_buffer(
        &self,
        open: exec::OpenBuffer,
    ) -> Result<exec::OpenBufferOk, ExecutorError> {
        self.request(open).await
    }

    /// Unmaps a buffer.
    pub async fn close_buffer(&self, close: exec::CloseBuffer) -> Result<(), ExecutorError> {
        self.request(close).await
    }

    /// Opens a client's IPC event.
    pub async fn open_event(&self, open: exec::OpenEvent) -> Result<(), ExecutorError> {
        self.request(open).await
    }

    /// Closes an event.
    pub async fn close_event(&self, close: exec::CloseEvent) -> Result<(), ExecutorError> {
        self.request(close).await
    }

    /// Runs a checked launch.
    pub async fn launch(&self, launch: exec::Launch) -> Result<(), ExecutorError> {
        self.request(launch).await
    }

    /// Ends a session's stream once its queued work is done.
    pub async fn close_stream(&self, close: exec::CloseStream) -> Result<(), ExecutorError> {
        self.request(close).await
    }

    /// Starts serving a session's launch ring.
    pub async fn open_ring(&self, open: exec::OpenRing) -> Result<(), ExecutorError> {
        self.request(open).await
    }

    /// Stops a session's launch ring.
    pub async fn close_ring(&self, close: exec::CloseRing) -> Result<(), ExecutorError> {
        self.request(close).await
    }

    /// Grants (or revokes) ring indices.
    pub async fn ring_grant(&self, grant: exec::RingGrant) -> Result<(), ExecutorError> {
        self.request(grant).await
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use ptxd_proto::executor::{Empty, Failure, FailureKind};

    #[test]
    fn each_operation_accepts_its_own_reply_and_names_itself_on_another() {
        let ok = || reply::Result::Ok(Empty {});
        let loaded = exec::LoadModuleOk {
            block_size: 128,
            info_log: "log".into(),
        };
        let opened = exec::OpenBufferOk {
            device_uuid: "GPU-x".into(),
        };
        assert_eq!(exec::Launch::accept(ok()), Ok(()));
        assert_eq!(
            exec::LoadModule::accept(reply::Result::LoadModule(loaded.clone())),
            Ok(loaded)
        );
        assert_eq!(
            exec::OpenBuffer::accept(reply::Result::OpenBuffer(opened.clone())),
            Ok(opened.clone())
        );
        assert_eq!(
            exec::LoadModule::accept(ok()),
            Err(ExecutorError::UnexpectedReply("LoadModule"))
        );
        assert_eq!(
            exec::RingGrant::accept(reply::Result::OpenBuffer(opened)),
            Err(ExecutorError::UnexpectedReply("RingGrant"))
        );
        assert_eq!(
            exec::OpenRing::accept(ok()),
            Ok(()),
            "an empty success is OpenRing's reply"
        );
    }

    #[test]
    fn a_failure_reply_is_the_executors_failure_for_every_operation() {
        let failure = || {
            reply::Result::Failure(Failure {
                kind: FailureKind::UnknownObject as i32,
                message: "module 7 is not loaded".into(),
                metadata: [("object".to_string(), "module".to_string())].into(),
            })
        };
        let expected = ExecutorError::Failed {
            kind: FailureKind::UnknownObject,
            message: "module 7 is not loaded".into(),
            metadata: [("object".to_string(), "module".to_string())].into(),
        };
        assert_eq!(exec::Launch::accept(failure()), Err(expected.clone()));
        assert_eq!(exec::LoadModule::accept(failure()), Err(expected.clone()));
        assert_eq!(exec::OpenBuffer::accept(failure()), Err(expected));
    }

    #[test]
    fn each_request_travels_as_its_own_op() {
        let grant = exec::RingGrant {
            stream: 9,
            revoke_buffers: vec![1, 2],
            ..Default::default()
        };
        assert_eq!(grant.clone().into_op(), Op::RingGrant(grant));
        let close = exec::CloseRing { stream: 3 };
        assert_eq!(close.into_op(), Op::CloseRing(close));
        let load = exec::LoadModule {
            module_id: 5,
            ..Default::default()
        };
        assert_eq!(load.clone().into_op(), Op::LoadModule(load));
    }

    #[test]
    fn an_exiting_executors_answer_is_its_absence_and_nothing_else_is() {
        let exiting = exec::Launch::accept(reply::Result::Failure(Failure {
            kind: FailureKind::ExecutorExiting as i32,
            message: "the executor was exiting".into(),
            metadata: [(
                "cuda_error".to_string(),
                "CUDA_ERROR_DEINITIALIZED".to_string(),
            )]
            .into(),
        }))
        .unwrap_err();
        assert_eq!(
            absent_if_exiting(exiting, "GPU-1"),
            ExecutorError::Unavailable {
                device: "GPU-1".into(),
                cause: "the executor was exiting".into(),
            }
        );
        let fault = ExecutorError::Failed {
            kind: FailureKind::KernelFault,
            message: "the device faulted".into(),
            metadata: Default::default(),
        };
        assert_eq!(absent_if_exiting(fault.clone(), "GPU-1"), fault);
    }

    #[test]
    fn a_dead_executor_is_unavailable_naming_the_device() {
        let fault = LinkError::Down(DownCause::Fault {
            error_name: "CUDA_ERROR_ILLEGAL_ADDRESS".into(),
            message: "boom".into(),
        });
        assert_eq!(
            fault.unavailable("GPU-1"),
            ExecutorError::Unavailable {
                device: "GPU-1".into(),
                cause: "device fault CUDA_ERROR_ILLEGAL_ADDRESS".into(),
            }
        );
    }
}
