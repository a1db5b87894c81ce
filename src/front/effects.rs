//! Side effects in executors, and their clean-up.
//!
//! Invariant: nothing an executor opened is ever left unrecorded by the
//! front. Every verb that opens something (a module, a buffer mapping, an
//! event) goes through [`side_effect`]: check under the state lock, call the
//! executor unlocked, re-check and commit under the lock, or undo in the
//! executor. Clean-ups of released objects go through [`run_cleanup`], which
//! never fails the verb (the executor's death releases them anyway).

use std::sync::Arc;
use std::time::Duration;

use ptxd_proto::executor as exec;

use super::DeviceState;
use crate::buffers::{BufferEntry, EventEntry};
use crate::error::Error;
use crate::executor::link::{CleanUp, Operation};
use crate::executor::supervisor::ExecutorLink;
use crate::executor::ExecutorError;
use crate::handles::DeviceGeneration;

/// How long to wait for an executor to answer a clean-up request.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(10);

/// Work to send to executors after the state lock is released.
pub(super) type Cleanup = Vec<(Arc<ExecutorLink>, CleanUp)>;

/// The live executor that holds a mapping opened in `open_in`, if any.
pub(super) fn close_target(
    devices: &[DeviceState],
    index: usize,
    open_in: Option<DeviceGeneration>,
) -> Option<Arc<ExecutorLink>> {
    let device = devices.get(index)?;
    let link = device.live_link()?;
    (Some(link.generation) == open_in).then(|| link.clone())
}

/// Queues `close` for the executor that holds an object opened in
/// `open_in` on device `index`; nothing when that generation is dead.
pub(super) fn queue_close(
    devices: &[DeviceState],
    index: usize,
    open_in: Option<DeviceGeneration>,
    close: impl Operation<Reply = ()>,
    cleanup: &mut Cleanup,
) {
    if let Some(link) = close_target(devices, index, open_in) {
        cleanup.push((link, CleanUp::new(close)));
    }
}

/// Queues the close of a released buffer's mapping in the executor that
/// holds it (nothing when its generation is dead).
pub(super) fn queue_close_buffer(
    devices: &[DeviceState],
    entry: &BufferEntry,
    cleanup: &mut Cleanup,
) {
    let close = exec::CloseBuffer {
        buffer_id: entry.id.0,
    };
    queue_close(devices, entry.device_index, entry.open_in, close, cleanup);
}

/// Queues the close of a released event, as [`queue_close_buffer`].
pub(super) fn queue_close_event(
    devices: &[DeviceState],
    entry: &EventEntry,
    cleanup: &mut Cleanup,
) {
    let close = exec::CloseEvent {
        event_id: entry.id.0,
    };
    queue_close(devices, entry.device_index, entry.open_in, close, cleanup);
}

/// Queues the unload of a kernel whose last hold was just released, in the
/// executor that loaded it (nothing when that generation is dead).
pub(super) fn queue_unload(
    devices: &[DeviceState],
    released: crate::slots::Released,
    cleanup: &mut Cleanup,
) {
    if let Some(kernel) = released.freed {
        queue_close(
            devices,
            kernel.device_index,
            Some(kernel.generation),
            exec::UnloadModule {
                module_id: kernel.module_id,
            },
            cleanup,
        );
    }
}

pub(super) async fn run_cleanup(cleanup: Cleanup) {
    for (link, close) in cleanup {
        undo_in(&*link, close).await;
    }
}

/// What the front needs of an executor for a side effect (a seam for
/// testing [`side_effect`] without a child process).
pub(crate) trait Executor {
    fn request<O: Operation>(
        &self,
        operation: O,
    ) -> impl std::future::Future<Output = Result<O::Reply, ExecutorError>> + Send;
}

impl Executor for ExecutorLink {
    fn request<O: Operation>(
        &self,
        operation: O,
    ) -> impl std::future::Future<Output = Result<O::Reply, ExecutorError>> + Send {
        ExecutorLink::request(self, operation)
    }
}

/// Sends a clean-up or undo request; failures are logged, never returned
/// (the executor, or its death, releases the object anyway).
async fn undo_in<E: Executor>(executor: &E, undo: impl Operation<Reply = ()>) {
    // Clients decide how many clean-ups there are: the lines are
    // rate-limited like a refusal's.
    let log = crate::connections::request_log();
    match tokio::time::timeout(CLEANUP_TIMEOUT, executor.request(undo)).await {
        Ok(Err(ExecutorError::Failed { message, .. })) => {
            if let Some(count) = log.admit("executor clean-up failed") {
                tracing::warn!(%message, count, "executor clean-up failed")
            }
        }
        Ok(Err(e @ ExecutorError::Unavailable { .. })) => {
            tracing::debug!(error = %e, "executor gone during clean-up")
        }
        Err(_) => {
            if let Some(count) = log.admit("executor clean-up timed out") {
                tracing::warn!(count, "executor clean-up timed out")
            }
        }
        // Done, or answered with some other shape: nothing to report.
        Ok(_) => {}
    }
}

/// The one path for a side effect in an executor: the caller has checked
/// under the state lock; this sends `operation` (unlocked), reads its own
/// success reply, then `commit` re-checks and records under the lock. When
/// the reply has the wrong shape or `commit` refuses, `undo` goes to the
/// executor before the refusal is returned, so the executor never keeps an
/// object the front did not record (two registrations racing for the last
/// place under a limit: both pass the check, both open, the second's commit
/// fails and is undone). A failure reply or a dead executor needs no undo:
/// nothing was opened, or everything the executor held is gone with it.
pub(super) async fn side_effect<E: Executor, O: Operation, T>(
    executor: &E,
    operation: O,
    undo: impl Operation<Reply = ()>,
    commit: impl FnOnce(O::Reply) -> Result<T, Error>,
) -> Result<T, Error> {
    let outcome = match executor.request(operation).await {
        Ok(reply) => commit(reply),
        // Nothing opened, or nothing left: no undo.
        Err(nothing @ (ExecutorError::Failed { .. } | ExecutorError::Unavailable { .. })) => {
            return Err(nothing.into())
        }
        // Any other answer may have opened what was asked: undo it.
        Err(answered) => Err(answered.into()),
    };
    if outcome.is_err() {
        undo_in(executor, undo).await;
    }
    outcome
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;

    use ptxd_proto::v1 as api;

    use super::*;

    /// An executor that opens and closes events, yielding in every call so
    /// that concurrent callers interleave between check and commit.
    #[derive(Default)]
    struct FakeExecutor {
        open: Mutex<BTreeSet<u64>>,
        closes: AtomicU64,
        fail_opens: bool,
        /// Opens the event, then answers with another operation's reply.
        misanswer_opens: bool,
    }

    impl Executor for FakeExecutor {
        async fn request<O: Operation>(&self, operation: O) -> Result<O::Reply, ExecutorError> {
            use ptxd_proto::executor::{reply, request::Op};
            tokio::task::yield_now().await;
            let mut open = self.open.lock().unwrap();
            O::accept(match operation.into_op() {
                Op::OpenEvent(_) if self.fail_opens => reply::Result::Failure(exec::Failure {
                    kind: exec::FailureKind::InvalidHandle as i32,
                    message: "no such event".into(),
                    ..Default::default()
                }),
                Op::OpenEvent(e) if self.misanswer_opens => {
                    open.insert(e.event_id);
                    reply::Result::OpenBuffer(exec::OpenBufferOk::default())
                }
                Op::OpenEvent(e) => {
                    open.insert(e.event_id);
                    reply::Result::Ok(exec::Empty {})
                }
                Op::CloseEvent(e) => {
                    open.remove(&e.event_id);
                    self.closes.fetch_add(1, Ordering::SeqCst);
                    reply::Result::Ok(exec::Empty {})
                }
                _ => reply::Result::Ok(exec::Empty {}),
            })
        }
    }

    /// One registration as register_event makes it: check the limit, open
    /// in the executor, re-check and commit (or undo) through `side_effect`.
    async fn register(
        executor: &FakeExecutor,
        registered: &Mutex<Vec<u64>>,
        limit: usize,
        id: u64,
    ) -> Result<(), Error> {
        let full = || Error::LimitExceeded {
            limit: "max_events_per_session",
            value: limit as u64,
        };
        if registered.lock().unwrap().len() >= limit {
            return Err(full());
        }
        side_effect(
            executor,
            exec::OpenEvent {
                event_id: id,
                handle: vec![0; 64],
            },
            exec::CloseEvent { event_id: id },
            |()| {
                let mut registered = registered.lock().unwrap();
                if registered.len() >= limit {
                    return Err(full());
                }
                registered.push(id);
                Ok(())
            },
        )
        .await
    }

    #[tokio::test]
    async fn racing_registrations_at_the_limit_are_undone_in_the_executor() {
        let executor = FakeExecutor::default();
        let registered = Mutex::new(Vec::new());
        let limit = 3;
        let results = futures_util::future::join_all(
            (1..=16).map(|id| register(&executor, &registered, limit, id)),
        )
        .await;
        let won: Vec<u64> = (1..=16)
            .zip(&results)
            .filter(|(_, r)| r.is_ok())
            .map(|(id, _)| id)
            .collect();
        assert_eq!(won.len(), limit);
        assert!(
            executor.closes.load(Ordering::SeqCst) > 0,
            "the race happened: some passed the check and lost the commit"
        );
        for result in results.iter().filter_map(|r| r.as_ref().err()) {
            assert_eq!(result.refusal().reason, api::Reason::LimitExceeded);
        }
        // The executor holds exactly what was recorded: nothing leaked.
        let open: Vec<u64> = executor.open.lock().unwrap().iter().copied().collect();
        let mut recorded = registered.lock().unwrap().clone();
        recorded.sort_unstable();
        assert_eq!(open, recorded);
        assert_eq!(open, won);
    }

    #[tokio::test]
    async fn a_failed_open_is_not_undone_and_a_refused_reply_is() {
        let failing = FakeExecutor {
            fail_opens: true,
            ..Default::default()
        };
        let registered = Mutex::new(Vec::new());
        let err = register(&failing, &registered, 1, 7).await.unwrap_err();
        assert_eq!(err.refusal().reason, api::Reason::InvalidHandle);
        assert_eq!(failing.closes.load(Ordering::SeqCst), 0);
        // A success reply the verb cannot use is undone too.
        let executor = FakeExecutor::default();
        let result: Result<(), Error> = side_effect(
            &executor,
            exec::OpenEvent {
                event_id: 9,
                handle: vec![0; 64],
            },
            exec::CloseEvent { event_id: 9 },
            |()| {
                Err(Error::DeviceMismatch {
                    operand: "buffer".into(),
                    kernel_device: "HOST-0".into(),
                    operand_device: "HOST-1".into(),
                })
            },
        )
        .await;
        assert!(result.is_err());
        assert!(executor.open.lock().unwrap().is_empty());
        assert_eq!(executor.closes.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_reply_of_the_wrong_shape_is_refused_and_undone() {
        let executor = FakeExecutor {
            misanswer_opens: true,
            ..Default::default()
        };
        let registered = Mutex::new(Vec::new());
        let err = register(&executor, &registered, 4, 11).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            Error::from(ExecutorError::UnexpectedReply("OpenEvent")).to_string()
        );
        assert_eq!(err.refusal().reason, api::Reason::Internal);
        assert!(registered.lock().unwrap().is_empty(), "nothing recorded");
        assert!(
            executor.open.lock().unwrap().is_empty(),
            "the open was undone"
        );
        assert_eq!(executor.closes.load(Ordering::SeqCst), 1);
    }
}
