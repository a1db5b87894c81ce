//! Launch rings: OpenRing, and keeping each ring's capability table in its
//! executor current.
//!
//! Invariants:
//! - A ring's table holds only objects its session holds on the ring's
//!   device, in the generation serving the ring: buffers are granted after
//!   their registration commits and revoked before their close is sent;
//!   kernels are granted when the session gets its handle and revoked when
//!   it lets go.
//! - Ring indices are per session and never reused (`RingIndices`), so a
//!   descriptor written for a released object is refused, never
//!   redirected.
//! - A ring lives in one executor generation; a restart ends it (the lease
//!   stream says so) and the session opens a new one.
//! - A ring opens with the session's kernel-timeout count and limit: a
//!   session refused `LIMIT_EXCEEDED` on gRPC is refused on its ring too.

use std::sync::Arc;

use ptxd_proto::executor as exec;

use super::awaiting::{Awaiting, AwaitingRing};
use super::effects::{run_cleanup, side_effect, Cleanup};
use super::{parse_session, DeviceChoice, Front, State};
use crate::error::Error;
use crate::executor::link::CleanUp;
use crate::executor::supervisor::ExecutorLink;
use crate::executor::ExecutorError;
use crate::handles::{DeviceGeneration, KernelHandle, SessionId};
use crate::sessions::Caller;

/// A grant to send to a ring's executor once the state lock is released.
pub(super) type Grant = Option<(Arc<ExecutorLink>, exec::RingGrant)>;

/// OpenRing.
#[derive(Debug, Clone)]
pub struct RingRequest {
    pub session: String,
    pub shm_name: String,
    pub device: DeviceChoice,
    /// The ring's memory comes as a memfd over the fd socket.
    pub by_fd: bool,
}

/// What OpenRing answers: the ring, or the token its memfd must come with
/// on the fd socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RingOpening {
    Opened(OpenedRing),
    AwaitingFd {
        token: String,
        ttl: std::time::Duration,
    },
}

/// Where a ring's memory comes from.
enum RingSource {
    Name(String),
    Fd(std::os::fd::OwnedFd),
}

/// A ring the device's executor now serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenedRing {
    pub device_uuid: String,
    pub generation: u64,
}

/// The executor request that grants kernel `handle` (held by the session as
/// ring index `index`) to a ring, if its slot is on `device` at `generation`.
fn kernel_grant(
    state: &State,
    handle: &KernelHandle,
    index: u32,
    device: usize,
    generation: DeviceGeneration,
) -> Option<exec::RingKernel> {
    let kernel = state.slots.occupant_of(handle)?;
    let terms =
        crate::ring_check::grant_terms(&kernel.contract, &kernel.signature, kernel.block_size)?;
    (kernel.device_index == device && kernel.generation == generation).then(|| exec::RingKernel {
        ring_index: index,
        module_id: kernel.module_id,
        inputs: kernel.signature.inputs,
        scalar_params: kernel.signature.scalar_params,
        element_sizes: kernel.signature.element_sizes.clone(),
        ..terms
    })
}

impl State {
    /// Where `session`'s ring is served, with its executor, if it has one.
    fn ring_of(&self, session: &SessionId) -> Option<(usize, DeviceGeneration, Arc<ExecutorLink>)> {
        let (device, generation) = self.sessions.get(session)?.ring?;
        let link = self
            .devices
            .get(device)?
            .live_link()
            .filter(|l| l.generation == generation)?;
        Some((device, generation, link.clone()))
    }

    /// Queues, before any close in `cleanup`, the revoke of `session`'s
    /// ring indices `buffers` and `kernels` (nothing without a ring).
    pub(super) fn queue_revoke(
        &self,
        session: &SessionId,
        buffers: Vec<u32>,
        kernels: Vec<u32>,
        cleanup: &mut Cleanup,
    ) {
        let Some(stream) = self.sessions.get(session).map(|s| s.stream) else {
            return;
        };
        if buffers.is_empty() && kernels.is_empty() {
            return;
        }
        if let Some((_, _, link)) = self.ring_of(session) {
            let grant = exec::RingGrant {
                stream,
                revoke_buffers: buffers,
                revoke_kernels: kernels,
                ..Default::default()
            };
            cleanup.insert(0, (link, CleanUp::new(grant)));
        }
    }

    /// The grant of one new buffer or kernel to `session`'s ring, if the
    /// ring is on the object's device and generation.
    pub(super) fn ring_grant(
        &self,
        session: &SessionId,
        device: usize,
        generation: DeviceGeneration,
        buffer: Option<exec::RingBuffer>,
        kernel: Option<(KernelHandle, u32)>,
    ) -> Grant {
        let (ring_device, ring_generation, link) = self.ring_of(session)?;
        if (ring_device, ring_generation) != (device, generation) {
            return None;
        }
        let stream = self.sessions.get(session)?.stream;
        let kernels = kernel
            .and_then(|(handle, index)| kernel_grant(self, &handle, index, device, generation))
            .into_iter()
            .collect();
        let grant = exec::RingGrant {
            stream,
            buffers: buffer.into_iter().collect(),
            kernels,
            ..Default::default()
        };
        Some((link, grant))
    }
}

impl Front {
    /// Sends a grant built under the lock (after the lock is released). A
    /// grant that fails leaves the object out of the ring's table: ring
    /// launches naming it are refused, gRPC launches still work.
    pub(super) async fn send_grant(&self, grant: Grant) {
        if let Some((link, grant)) = grant {
            if let Err(error) = link.ring_grant(grant).await {
                tracing::warn!(%error, "a ring grant failed");
            }
        }
    }

    /// OpenRing: the device's executor serves the session's ring from now
    /// on, with everything the session holds there granted. With `by_fd`
    /// the answer is a token; the memfd that comes with it on the fd socket
    /// opens the ring ([`Front::attach_fd`]).
    pub async fn open_ring(
        &self,
        request: RingRequest,
        peer: Caller,
    ) -> Result<RingOpening, Error> {
        let session_id = parse_session(&request.session)?;
        if request.by_fd {
            {
                let state = self.lock();
                state.session(&session_id, peer)?;
                state.device_index(&request.device)?;
            }
            let awaiting = AwaitingRing {
                caller: peer,
                device: request.device,
            };
            let (token, ttl) = self.issue_fd_token(&session_id, peer, Awaiting::Ring(awaiting))?;
            return Ok(RingOpening::AwaitingFd { token, ttl });
        }
        ptxd_ipc::shm::validate_shm_name(&request.shm_name).map_err(|_| {
            Error::InvalidArgument {
                field: "shm_name",
                message:
                    "a POSIX shared-memory name is '/' then 1 to 254 characters without '/' or NUL"
                        .into(),
            }
        })?;
        self.open_ring_from(
            &session_id,
            peer,
            &request.device,
            RingSource::Name(request.shm_name),
        )
        .await
        .map(RingOpening::Opened)
    }

    /// Opens an OpenRing (by_fd) with its memfd.
    pub(super) async fn attach_ring(
        &self,
        session_id: &SessionId,
        awaiting: AwaitingRing,
        fd: std::os::fd::OwnedFd,
    ) -> Result<OpenedRing, Error> {
        self.open_ring_from(
            session_id,
            awaiting.caller,
            &awaiting.device,
            RingSource::Fd(fd),
        )
        .await
    }

    async fn open_ring_from(
        &self,
        session_id: &SessionId,
        peer: Caller,
        device: &DeviceChoice,
        source: RingSource,
    ) -> Result<OpenedRing, Error> {
        let session_id = session_id.clone();
        // The executor maps the object with the daemon's rights, checking
        // that the caller's uid owns it: without an identity there is no uid.
        let Some(credentials) = peer.credentials() else {
            return Err(Error::IdentityRequired { resource: "ring" });
        };
        let (index, link, generation, device_uuid, stream) = {
            let state = self.lock();
            state.refuse_if_draining()?;
            let session = state.session(&session_id, peer)?;
            let index = state.device_index(device)?;
            let (link, generation) = state.link(index)?;
            let uuid = state.devices[index].desc.uuid.clone();
            (index, link, generation, uuid, session.stream)
        };
        // A memfd goes to the executor's inbox first, then the request that
        // names it, on the same link.
        let (shm_name, fd_tag) = match source {
            RingSource::Name(name) => (name, 0),
            RingSource::Fd(fd) => {
                let tag = link.send_fd(std::os::fd::AsFd::as_fd(&fd)).map_err(|e| {
                    ExecutorError::Unavailable {
                        device: device_uuid.clone(),
                        cause: e.to_string(),
                    }
                })?;
                (String::new(), tag)
            }
        };
        // The ring refuses launches over the session's timeout limit
        // itself (its launches never pass through here): it starts from the
        // count so far.
        let timeouts = &self.executor.kernel_timeouts;
        let open = exec::OpenRing {
            stream,
            shm_name,
            owner_uid: Some(credentials.uid),
            fd_tag,
            kernel_timeouts: timeouts.count(stream),
            max_kernel_timeouts: timeouts.limit(),
        };
        let undo = exec::CloseRing { stream };
        let grant = side_effect(&*link, open, undo, |()| {
            let mut state = self.lock();
            state.recheck(&session_id, index, generation, &device_uuid)?;
            state.session(&session_id, peer)?;
            let buffers = state
                .registry
                .buffers_of(&session_id)
                .into_iter()
                .filter(|(_, e)| e.device_index == index && e.open_in == Some(generation))
                .map(|(_, e)| exec::RingBuffer {
                    ring_index: e.ring_index,
                    buffer_id: e.id.0,
                    size: e.size,
                })
                .collect();
            let session = state
                .sessions
                .get(&session_id)
                .ok_or_else(|| Error::Internal {
                    message: "session vanished under the lock".into(),
                })?;
            let kernels = session
                .ring_indices
                .kernels()
                .filter_map(|(h, i)| kernel_grant(&state, h, i, index, generation))
                .collect();
            if let Some(session) = state.sessions.get_mut(&session_id) {
                session.ring = Some((index, generation));
            }
            Ok(exec::RingGrant {
                stream,
                buffers,
                kernels,
                ..Default::default()
            })
        })
        .await?;
        // The first grant goes before the reply: the client may submit as
        // soon as it has it.
        let mut cleanup: Cleanup = Vec::new();
        if let Err(error) = link.ring_grant(grant).await {
            tracing::warn!(%error, "the ring's first grant failed; closing it");
            if let Some(session) = self.lock().sessions.get_mut(&session_id) {
                session.ring = None;
            }
            cleanup.push((link.clone(), CleanUp::new(exec::CloseRing { stream })));
            run_cleanup(cleanup).await;
            // Whatever the grant's failure, the client hears one reason:
            // the ring did not come up as OpenRing promised.
            return Err(ExecutorError::UnexpectedReply("RingGrant").into());
        }
        Ok(OpenedRing {
            device_uuid,
            generation: generation.0,
        })
    }
}
