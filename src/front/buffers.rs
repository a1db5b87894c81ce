//! Buffers and events: RegisterBuffer, ReleaseBuffer, ListBuffers,
//! RegisterEvent, ReleaseEvent.
//!
//! Invariants:
//! - A buffer or event is recorded in the registry only after its executor
//!   opened it, and only through `effects::side_effect` (a refused commit
//!   closes it again).
//! - Host shared memory, CUDA IPC memory and IPC events are opened with the
//!   daemon's rights, so only a caller with credentials may register them.
//! - Memory passed by descriptor registers in two halves: RegisterBuffer
//!   checks the request and issues a one-time token bound to the session and
//!   the caller's uid (`crate::fd_tokens`); the descriptor that comes with
//!   it on the fd socket completes the same checks and open as any buffer.
//!   The front keeps a reference to the descriptor until the registration
//!   ends, to open it again after an executor restart.
//! - Per-session, per-tenant and daemon-wide limits (buffers, registered
//!   bytes, buffers passed by descriptor) are checked before the open and
//!   again at the commit; a buffer passed by descriptor is counted against
//!   the descriptor limits already when its token is issued.

use ptxd_proto::executor::{self as exec, open_buffer};

use super::effects::{queue_close_buffer, queue_close_event, run_cleanup, side_effect, Cleanup};
use std::os::fd::AsFd;

use super::awaiting::{Awaiting, AwaitingFd};
use super::{parse_session, Front, State};
use crate::buffers::{BufferEntry, BufferSource, EventEntry, SharedFd};
use crate::error::Error;
use crate::executor::supervisor::ExecutorLink;
use crate::executor::ExecutorError;
use crate::handles::{BufferHandle, BufferId, EventHandle, EventId, SessionId};
use crate::sessions::Caller;

/// Where the memory of a buffer to register comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BufferOrigin {
    /// A legacy CUDA IPC memory handle (64 bytes) of an allocation on the
    /// named device.
    CudaIpc {
        handle: Vec<u8>,
        device_uuid: String,
    },
    /// A POSIX shared-memory object, for the host backend (device: the
    /// daemon's first unless named).
    HostShm { name: String, device_uuid: String },
    /// Memory whose descriptor follows on the fd socket (device: the
    /// daemon's first unless named); the buffer starts `offset` bytes in.
    PosixFd {
        device_uuid: String,
        offset: u64,
        allocation_size: u64,
    },
}

/// What RegisterBuffer answers: a buffer, or the token its descriptor must
/// come with on the fd socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Registration {
    Registered(RegisteredBuffer),
    AwaitingFd {
        token: String,
        ttl: std::time::Duration,
    },
}

/// RegisterBuffer.
#[derive(Debug, Clone)]
pub struct BufferRequest {
    pub session: String,
    pub label: String,
    pub size: u64,
    pub origin: Option<BufferOrigin>,
}

/// A registered buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisteredBuffer {
    pub buffer: String,
    pub device_uuid: String,
    pub generation: u64,
    /// How the session's ring names it.
    pub ring_index: u32,
}

/// One buffer a session holds, as ListBuffers reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferListing {
    pub buffer: String,
    pub label: String,
    pub kind: &'static str,
    pub device_uuid: String,
    pub size: u64,
    /// 0 once dead.
    pub generation: u64,
    pub live: bool,
}

/// RegisterEvent.
#[derive(Debug, Clone)]
pub struct EventRequest {
    pub session: String,
    pub label: String,
    /// A CUipcEventHandle (64 bytes).
    pub handle: Vec<u8>,
    /// Empty: the daemon's first device.
    pub device_uuid: String,
}

/// The executor request that opens a registered buffer (at registration,
/// and again after a restart). A descriptor goes to `link`'s fd inbox first,
/// so send the request on that same link, right after.
pub(super) fn open_buffer_request(
    entry: &BufferEntry,
    link: &ExecutorLink,
) -> Result<exec::OpenBuffer, Error> {
    let (source, offset, allocation_size) = match &entry.source {
        BufferSource::CudaIpc { handle } => (open_buffer::Source::CudaIpc(handle.clone()), 0, 0),
        BufferSource::HostShm { name } => (open_buffer::Source::ShmName(name.clone()), 0, 0),
        BufferSource::PosixFd {
            fd,
            offset,
            allocation_size,
        } => {
            let tag = link
                .send_fd(fd.0.as_fd())
                .map_err(|e| ExecutorError::Unavailable {
                    device: entry.device_uuid.clone(),
                    cause: e.to_string(),
                })?;
            (open_buffer::Source::FdTag(tag), *offset, *allocation_size)
        }
    };
    Ok(exec::OpenBuffer {
        buffer_id: entry.id.0,
        source: Some(source),
        size: entry.size,
        claimed_device_uuid: entry.device_uuid.clone(),
        owner_uid: entry.owner_uid,
        offset,
        allocation_size,
    })
}

/// Refuses a shared-memory object that `uid` does not own (root may map
/// any), naming the object and never its owner. The executor checks again
/// on the object it opens; this check answers first, with the front's
/// words. An object that cannot be looked at here is left to the executor.
fn check_shm_owner(name: &str, uid: u32) -> Result<(), Error> {
    use std::os::unix::fs::MetadataExt;
    if uid == 0 {
        return Ok(());
    }
    // `name` is validated: '/' then a name without '/'.
    match std::fs::symlink_metadata(format!("/dev/shm{name}")) {
        Ok(meta) if meta.uid() != uid => Err(Error::ShmNotOwned {
            name: name.to_string(),
        }),
        _ => Ok(()),
    }
}

impl Front {
    /// RegisterBuffer. A posix_fd source answers with a token; the
    /// descriptor then comes through [`Front::attach_fd`].
    pub async fn register_buffer(
        &self,
        request: BufferRequest,
        peer: Caller,
    ) -> Result<Registration, Error> {
        let session_id = parse_session(&request.session)?;
        if request.size == 0 {
            return Err(Error::InvalidArgument {
                field: "size",
                message: "a buffer has at least one byte".into(),
            });
        }
        let (source, claimed_uuid) = match request.origin {
            Some(BufferOrigin::CudaIpc {
                handle,
                device_uuid,
            }) => {
                // The executor opens the handle with the daemon's rights,
                // not the caller's: without an identity there is no one to
                // act for.
                if peer.credentials().is_none() {
                    return Err(Error::IdentityRequired {
                        resource: "cuda_ipc",
                    });
                }
                if handle.len() != 64 {
                    return Err(Error::InvalidArgument {
                        field: "cuda_ipc.handle",
                        message: format!("a CUipcMemHandle is 64 bytes, not {}", handle.len()),
                    });
                }
                if device_uuid.is_empty() {
                    return Err(Error::InvalidArgument {
                        field: "cuda_ipc.device_uuid",
                        message: "name the device that owns the allocation".into(),
                    });
                }
                (BufferSource::CudaIpc { handle }, Some(device_uuid))
            }
            Some(BufferOrigin::HostShm { name, device_uuid }) => {
                // Who may map a shared-memory name depends on who asks: a
                // caller without credentials would borrow the daemon's.
                if peer.credentials().is_none() {
                    return Err(Error::IdentityRequired {
                        resource: "host_shm",
                    });
                }
                ptxd_ipc::shm::validate_shm_name(&name).map_err(|_| Error::InvalidArgument {
                    field: "host_shm.name",
                    message:
                        "a POSIX shared-memory name is '/' then 1 to 254 characters without '/' or NUL"
                            .into(),
                })?;
                if let Some(credentials) = peer.credentials() {
                    check_shm_owner(&name, credentials.uid)?;
                }
                let uuid = (!device_uuid.is_empty()).then_some(device_uuid);
                (BufferSource::HostShm { name }, uuid)
            }
            Some(BufferOrigin::PosixFd {
                device_uuid,
                offset,
                allocation_size,
            }) => {
                return self.await_fd(
                    &session_id,
                    peer,
                    AwaitingFd {
                        caller: peer,
                        label: request.label,
                        size: request.size,
                        offset,
                        allocation_size,
                        device_uuid: (!device_uuid.is_empty()).then_some(device_uuid),
                    },
                );
            }
            None => {
                return Err(Error::InvalidArgument {
                    field: "source",
                    message: "set cuda_ipc, host_shm or posix_fd".into(),
                })
            }
        };
        self.open_buffer(
            &session_id,
            peer,
            &request.label,
            request.size,
            source,
            claimed_uuid,
        )
        .await
        .map(Registration::Registered)
    }

    /// Checks a posix_fd registration and issues its token.
    fn await_fd(
        &self,
        session_id: &SessionId,
        peer: Caller,
        awaiting: AwaitingFd,
    ) -> Result<Registration, Error> {
        {
            let state = self.lock();
            state.session(session_id, peer)?;
            self.check_buffer_limits(&state, session_id, awaiting.size, true)?;
            if let Some(uuid) = &awaiting.device_uuid {
                state.device_by_uuid(uuid)?;
            }
        }
        let (token, ttl) = self.issue_fd_token(session_id, peer, Awaiting::Buffer(awaiting))?;
        Ok(Registration::AwaitingFd { token, ttl })
    }

    /// Completes a posix_fd registration with its descriptor.
    pub(super) async fn attach_buffer(
        &self,
        session_id: &SessionId,
        awaiting: AwaitingFd,
        fd: std::os::fd::OwnedFd,
    ) -> Result<RegisteredBuffer, Error> {
        let source = BufferSource::PosixFd {
            fd: SharedFd(std::sync::Arc::new(fd)),
            offset: awaiting.offset,
            allocation_size: awaiting.allocation_size,
        };
        self.open_buffer(
            session_id,
            awaiting.caller,
            &awaiting.label,
            awaiting.size,
            source,
            awaiting.device_uuid,
        )
        .await
    }

    /// Opens a buffer in its device's executor and records it.
    async fn open_buffer(
        &self,
        session_id: &SessionId,
        peer: Caller,
        label: &str,
        size: u64,
        source: BufferSource,
        claimed_uuid: Option<String>,
    ) -> Result<RegisteredBuffer, Error> {
        let session_id = session_id.clone();
        let by_fd = source.holds_descriptor();
        let (id, index, link, generation, device_uuid) = {
            let mut state = self.lock();
            state.refuse_if_draining()?;
            state.session(&session_id, peer)?;
            self.check_buffer_limits(&state, &session_id, size, by_fd)?;
            let index = match &claimed_uuid {
                Some(uuid) => state.device_by_uuid(uuid)?,
                None => 0,
            };
            let (link, generation) = state.link(index)?;
            let device_uuid = state.devices[index].desc.uuid.clone();
            (
                BufferId(state.registry.reserve_id()),
                index,
                link,
                generation,
                device_uuid,
            )
        };
        let entry = BufferEntry {
            id,
            session: session_id.clone(),
            label: label.chars().take(256).collect(),
            source,
            size,
            device_index: index,
            device_uuid: device_uuid.clone(),
            open_in: Some(generation),
            owner_uid: peer.credentials().map(|p| p.uid),
            ring_index: 0,
        };
        let open = open_buffer_request(&entry, &link)?;
        let undo = exec::CloseBuffer { buffer_id: id.0 };
        let (handle, ring_index, grant) = side_effect(&*link, open, undo, |opened| {
            if opened.device_uuid != device_uuid {
                return Err(Error::DeviceMismatch {
                    operand: "buffer".into(),
                    kernel_device: device_uuid.clone(),
                    operand_device: opened.device_uuid,
                });
            }
            let mut state = self.lock();
            state.recheck(&session_id, index, generation, &device_uuid)?;
            state.session(&session_id, peer)?;
            self.check_buffer_limits(&state, &session_id, size, by_fd)?;
            let mut entry = entry;
            entry.ring_index = state
                .sessions
                .get_mut(&session_id)
                .and_then(|s| s.ring_indices.fresh())
                .ok_or_else(super::ring_indices_spent)?;
            let ring = exec::RingBuffer {
                ring_index: entry.ring_index,
                buffer_id: entry.id.0,
                size: entry.size,
            };
            let ring_index = entry.ring_index;
            let handle = state.registry.register_buffer(entry);
            let grant = state.ring_grant(&session_id, index, generation, Some(ring), None);
            Ok((handle, ring_index, grant))
        })
        .await?;
        self.send_grant(grant).await;
        Ok(RegisteredBuffer {
            buffer: handle.to_string(),
            device_uuid,
            generation: generation.0,
            ring_index,
        })
    }

    fn check_buffer_limits(
        &self,
        state: &State,
        session: &SessionId,
        size: u64,
        by_fd: bool,
    ) -> Result<(), Error> {
        let holdings = state.registry.holdings(session);
        let tenant = state.sessions.get(session).map(|s| s.tenant());
        let over = |limit: &'static str, value: u64| Err(Error::LimitExceeded { limit, value });
        if u64::from(holdings.buffers) >= u64::from(self.limits.max_buffers_per_session) {
            return over(
                "max_buffers_per_session",
                self.limits.max_buffers_per_session.into(),
            );
        }
        if holdings.buffer_bytes.saturating_add(size) > self.limits.max_buffer_bytes_per_session {
            return over(
                "max_buffer_bytes_per_session",
                self.limits.max_buffer_bytes_per_session,
            );
        }
        if let Some(tenant) = tenant {
            let usage = state.tenant_holdings(tenant);
            if usage.buffers >= self.limits.max_buffers_per_uid {
                return over(
                    "max_buffers_per_uid",
                    self.limits.max_buffers_per_uid.into(),
                );
            }
            if usage.buffer_bytes.saturating_add(size) > self.limits.max_buffer_bytes_per_uid {
                return over(
                    "max_buffer_bytes_per_uid",
                    self.limits.max_buffer_bytes_per_uid,
                );
            }
            if by_fd && u64::from(usage.descriptors) >= self.limits.max_fd_buffers_per_uid {
                return over("max_fd_buffers_per_uid", self.limits.max_fd_buffers_per_uid);
            }
        }
        // The daemon-wide bounds, after the tenant's own: a tenant over its
        // share is told so, not that the daemon is full.
        let (total_bytes, total_fd_buffers) = state.registry.totals();
        if total_bytes.saturating_add(size) > self.limits.max_buffer_bytes {
            return over("max_buffer_bytes", self.limits.max_buffer_bytes);
        }
        if by_fd && total_fd_buffers >= self.limits.max_fd_buffers {
            return over("max_fd_buffers", self.limits.max_fd_buffers);
        }
        Ok(())
    }

    fn check_event_limit(&self, state: &State, session: &SessionId) -> Result<(), Error> {
        let events = state.registry.holdings(session).events;
        if u64::from(events) >= u64::from(self.limits.max_events_per_session) {
            return Err(Error::LimitExceeded {
                limit: "max_events_per_session",
                value: self.limits.max_events_per_session.into(),
            });
        }
        Ok(())
    }

    /// ReleaseBuffer.
    pub async fn release_buffer(
        &self,
        session_id: &str,
        buffer: &str,
        peer: Caller,
    ) -> Result<(), Error> {
        let session_id = parse_session(session_id)?;
        let handle = BufferHandle::parse(buffer)?;
        let cleanup = {
            let mut state = self.lock();
            state.session(&session_id, peer)?;
            let entry = state.registry.release_buffer(&session_id, handle, buffer)?;
            let mut cleanup: Cleanup = Vec::new();
            queue_close_buffer(&state.devices, &entry, &mut cleanup);
            state.queue_revoke(&session_id, vec![entry.ring_index], vec![], &mut cleanup);
            cleanup
        };
        run_cleanup(cleanup).await;
        Ok(())
    }

    /// ListBuffers, in registration order.
    pub fn list_buffers(
        &self,
        session_id: &str,
        peer: Caller,
    ) -> Result<Vec<BufferListing>, Error> {
        let session_id = parse_session(session_id)?;
        let state = self.lock();
        state.session(&session_id, peer)?;
        Ok(state
            .registry
            .buffers_of(&session_id)
            .into_iter()
            .map(|(handle, entry)| BufferListing {
                buffer: handle.to_string(),
                label: entry.label.clone(),
                kind: entry.source.kind(),
                device_uuid: entry.device_uuid.clone(),
                size: entry.size,
                generation: entry.open_in.map(|g| g.0).unwrap_or(0),
                live: entry.open_in.is_some(),
            })
            .collect())
    }

    /// RegisterEvent; returns the session's handle for it.
    pub async fn register_event(
        &self,
        request: EventRequest,
        peer: Caller,
    ) -> Result<String, Error> {
        let session_id = parse_session(&request.session)?;
        if peer.credentials().is_none() {
            return Err(Error::IdentityRequired {
                resource: "ipc_event",
            });
        }
        if request.handle.len() != 64 {
            return Err(Error::InvalidArgument {
                field: "handle",
                message: format!(
                    "a CUipcEventHandle is 64 bytes, not {}",
                    request.handle.len()
                ),
            });
        }
        let (id, index, link, generation, device_uuid) = {
            let mut state = self.lock();
            state.refuse_if_draining()?;
            state.session(&session_id, peer)?;
            self.check_event_limit(&state, &session_id)?;
            let index = if request.device_uuid.is_empty() {
                0
            } else {
                state.device_by_uuid(&request.device_uuid)?
            };
            let (link, generation) = state.link(index)?;
            let uuid = state.devices[index].desc.uuid.clone();
            (
                EventId(state.registry.reserve_id()),
                index,
                link,
                generation,
                uuid,
            )
        };
        let open = exec::OpenEvent {
            event_id: id.0,
            handle: request.handle.clone(),
        };
        let undo = exec::CloseEvent { event_id: id.0 };
        let entry = EventEntry {
            id,
            session: session_id.clone(),
            label: request.label.chars().take(256).collect(),
            handle: request.handle,
            device_index: index,
            device_uuid: device_uuid.clone(),
            open_in: Some(generation),
        };
        let handle: EventHandle = side_effect(&*link, open, undo, |()| {
            let mut state = self.lock();
            state.recheck(&session_id, index, generation, &device_uuid)?;
            state.session(&session_id, peer)?;
            self.check_event_limit(&state, &session_id)?;
            Ok(state.registry.register_event(entry))
        })
        .await?;
        Ok(handle.to_string())
    }

    /// ReleaseEvent. A dead (not re-opened) event may still be released.
    pub async fn release_event(
        &self,
        session_id: &str,
        event: &str,
        peer: Caller,
    ) -> Result<(), Error> {
        let session_id = parse_session(session_id)?;
        let handle = EventHandle::parse(event)?;
        let cleanup = {
            let mut state = self.lock();
            state.session(&session_id, peer)?;
            let entry = state.registry.release_event(&session_id, handle, event)?;
            let mut cleanup: Cleanup = Vec::new();
            queue_close_event(&state.devices, &entry, &mut cleanup);
            cleanup
        };
        run_cleanup(cleanup).await;
        Ok(())
    }
}
