//! Sessions: open, close, and release with everything they hold.
//!
//! Invariants:
//! - A session is released once, by whoever removes it from the state
//!   first (CloseSession, the end of its lease stream, the drain); the
//!   others find nothing to do.
//! - A session's executor stream is closed only after its last launch was
//!   answered (`Session::inflight`), and before its buffers are unmapped.

use std::sync::atomic::Ordering;
use std::time::Instant;

use ptxd_proto::executor as exec;

use super::effects::{queue_close_buffer, queue_close_event, queue_unload, run_cleanup, Cleanup};
use super::Front;
use crate::error::Error;
use crate::executor::link::CleanUp;
use crate::handles::SessionId;
use crate::sessions::{Caller, LeaseEvent, Session, SessionError};

/// What a session held when it was released.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReleasedCounts {
    pub buffers: u32,
    pub kernels: u32,
    pub events: u32,
}

impl Front {
    /// Opens a session. The returned receiver is the lease stream's source;
    /// the caller must call [`Front::release_session`] when the stream ends.
    pub fn open_session(
        &self,
        label: &str,
        peer: Caller,
    ) -> Result<(SessionId, crate::lease::LeaseReceiver), Error> {
        let (tx, rx) = crate::lease::channel();
        let id = SessionId::random();
        {
            let mut state = self.lock();
            state.refuse_if_draining()?;
            if state.sessions.len() as u64 >= u64::from(self.limits.max_sessions) {
                return Err(Error::LimitExceeded {
                    limit: "max_sessions",
                    value: self.limits.max_sessions.into(),
                });
            }
            let tenant = peer.tenant();
            let tenant_sessions = state
                .sessions
                .values()
                .filter(|s| s.tenant() == tenant)
                .count();
            if tenant_sessions as u64 >= u64::from(self.limits.max_sessions_per_uid) {
                return Err(Error::LimitExceeded {
                    limit: "max_sessions_per_uid",
                    value: self.limits.max_sessions_per_uid.into(),
                });
            }
            tx.send(LeaseEvent::Opened {
                session: id.clone(),
                boot: self.boot,
            });
            state.sessions.insert(
                id.clone(),
                Session {
                    id: id.clone(),
                    label: label.chars().take(256).collect(),
                    opener: peer,
                    opened: Instant::now(),
                    events: tx,
                    stream: self.next_stream.fetch_add(1, Ordering::Relaxed),
                    kernels: Default::default(),
                    ring_indices: Default::default(),
                    ring: None,
                    inflight: Default::default(),
                },
            );
        }
        tracing::debug!(session = %id, ?peer, "session opened");
        Ok((id, rx))
    }

    /// CloseSession: releases everything the session holds.
    pub async fn close_session(
        &self,
        id: &SessionId,
        peer: Caller,
    ) -> Result<ReleasedCounts, Error> {
        {
            let state = self.lock();
            match state.session(id, peer) {
                Ok(_) => {}
                // Closing an already-closed session is a no-op.
                Err(Error::Session(SessionError::Unknown { .. })) => {
                    return Ok(ReleasedCounts::default())
                }
                Err(e) => return Err(e),
            }
        }
        Ok(self.release_session(id).await)
    }

    /// Releases a session and everything it holds (close, lease end, drain).
    pub async fn release_session(&self, id: &SessionId) -> ReleasedCounts {
        let Some(session) = self.lock().sessions.remove(id) else {
            return ReleasedCounts::default();
        };
        // No launch can start now (the session is gone); wait for those that
        // passed their checks to be answered, so CloseStream comes last.
        let _drained = session.inflight.write().await;
        self.executor.kernel_timeouts.forget(session.stream);
        let (counts, cleanup) = {
            let mut state = self.lock();
            let mut cleanup: Cleanup = Vec::new();
            // Streams first: the executor finishes the session's queued work
            // before its buffers are unmapped.
            for device in &state.devices {
                if let Some(link) = device.live_link() {
                    cleanup.push((
                        link.clone(),
                        CleanUp::new(exec::CloseStream {
                            stream: session.stream,
                        }),
                    ));
                }
            }
            let mut counts = ReleasedCounts::default();
            for handle in session.kernels.values() {
                counts.kernels += 1;
                if let Ok(released) = state.slots.release(&handle, id) {
                    queue_unload(&state.devices, released, &mut cleanup);
                }
            }
            let (buffers, events) = state.registry.release_session(id);
            state.fd_tokens.forget_session(id);
            counts.buffers = buffers.len() as u32;
            counts.events = events.len() as u32;
            for entry in &buffers {
                queue_close_buffer(&state.devices, entry, &mut cleanup);
            }
            for entry in &events {
                queue_close_event(&state.devices, entry, &mut cleanup);
            }
            (counts, cleanup)
        };
        run_cleanup(cleanup).await;
        tracing::debug!(session = %id, ?counts, "session released");
        counts
    }
}
