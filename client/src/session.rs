//! Sessions: the lease, kernels, buffers, events and launches.
//!
//! A [`Session`] holds its lease (the `OpenSession` response stream) in a
//! task of its own, which forwards the daemon's events to
//! [`Session::events`]. The session ends when that stream ends: on
//! [`Session::close`], on drop (the task is aborted, which cancels the
//! stream), or when the daemon or the connection goes away.
//!
//! Invariants:
//! - The session id is only ever sent to the daemon; `Debug` redacts it.
//! - A [`Kernel`] keeps the artifact, symbol, device and options it was
//!   loaded with, so it can be reloaded into the same session; a reload
//!   swaps its handle in place, and concurrent launches that all hit the same
//!   stale handle reload it once (the reload is serialized and skipped when
//!   the handle changed since the refused launch).
//! - With automatic reload on, a launch refused as STALE_KERNEL is retried
//!   exactly once after a successful reload; any other outcome is returned
//!   as is.
//! - The lease task orphans the session's launch rings, writing their
//!   pending semaphore signals (see `launch_ring`'s release module): on an
//!   executor restart, before the event is forwarded, for the rings of the
//!   generation that died; and for every ring when the task ends, however
//!   it ends (the stream ends or breaks, or the task is aborted because the
//!   session was dropped), before [`SessionEvent::Ended`] is sent.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use ptxd_proto::v1 as pb;
use ptxd_proto::v1::ptxd_client::PtxdClient;
use ptxd_proto::v1::session_event::Event as WireEvent;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinHandle;
use tonic::transport::Channel;

use crate::error::{from_launch_error, Error, Refusal};
use crate::fd_lane::FdLane;
use crate::lane::Lane;
use crate::launch_ring::{ReleaseOnEnd, RingRegistry, RingShared};
use crate::shm::HostShm;
use crate::transport::Transports;
use crate::types::{
    Artifact, Buffer, BufferListing, CloseReport, DeclaredAbi, DeviceSelector, Event,
    KernelListing, KernelSignature, Launch, Launched, LoadOptions, SessionEvent,
};

/// How many lease events a slow [`Session::events`] receiver may lag behind.
const EVENT_BACKLOG: usize = 64;
/// How many launches may wait in a [`LaunchStream`]'s send queue.
const LAUNCH_QUEUE: usize = 256;

/// Options of a new session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionOptions {
    /// A label for the daemon's logs and listings.
    pub label: String,
    /// Reload a kernel and retry the launch once when a launch is refused as
    /// STALE_KERNEL (e.g. after an executor restart).
    pub auto_reload_stale: bool,
}

impl SessionOptions {
    /// Options with a label and automatic reload off.
    pub fn new(label: impl Into<String>) -> Self {
        SessionOptions {
            label: label.into(),
            auto_reload_stale: false,
        }
    }

    /// Turns automatic reload of stale kernels on or off.
    pub fn auto_reload_stale(mut self, on: bool) -> Self {
        self.auto_reload_stale = on;
        self
    }
}

/// Aborts a task when dropped.
#[derive(Debug)]
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// An open session. Dropping it ends the session (the daemon releases
/// everything it holds); [`Session::close`] does so explicitly and reports
/// what was released.
pub struct Session {
    grpc: PtxdClient<Channel>,
    /// Where unary launches go first (Unix sockets only).
    lane: Option<Arc<Lane>>,
    id: String,
    boot_id: String,
    auto_reload: bool,
    events: broadcast::Sender<SessionEvent>,
    lease_alive: watch::Receiver<bool>,
    rings: RingRegistry,
    _lease: AbortOnDrop<()>,
    /// The daemon's fd socket, for buffers passed by descriptor.
    pub(crate) fd_socket: Option<std::path::PathBuf>,
    /// Where unary launches go first, as fd socket packets (Unix sockets
    /// only; set by the client).
    pub(crate) fd_lane: Option<Arc<FdLane>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &"<redacted>")
            .field("boot_id", &self.boot_id)
            .field("auto_reload", &self.auto_reload)
            .field("lease_alive", &*self.lease_alive.borrow())
            .finish()
    }
}

impl Session {
    pub(crate) async fn open(
        mut grpc: PtxdClient<Channel>,
        lane: Option<Arc<Lane>>,
        options: SessionOptions,
    ) -> Result<Self, Error> {
        let request = pb::OpenSessionRequest {
            label: options.label,
        };
        let mut lease = grpc.open_session(request).await?.into_inner();
        let opened = match lease.message().await? {
            Some(pb::SessionEvent {
                event: Some(WireEvent::Opened(opened)),
            }) if !opened.session.is_empty() => opened,
            Some(other) => {
                return Err(Error::Protocol(format!(
                    "the lease's first message is not a session id: {other:?}"
                )))
            }
            None => return Err(Error::SessionClosed),
        };
        let (events, _) = broadcast::channel(EVENT_BACKLOG);
        let (alive_tx, lease_alive) = watch::channel(true);
        let task_events = events.clone();
        let rings = RingRegistry::default();
        let mut release = ReleaseOnEnd {
            registry: rings.clone(),
            why: "the session was dropped".to_owned(),
        };
        let task = tokio::spawn(async move {
            let why = loop {
                let event = match lease.message().await {
                    Ok(Some(pb::SessionEvent { event: Some(event) })) => event,
                    // An empty or repeated message carries nothing to report.
                    Ok(Some(pb::SessionEvent { event: None })) => continue,
                    Ok(None) => break "the daemon ended the lease".to_owned(),
                    Err(status) => break format!("the lease broke: {}", Error::from(status)),
                };
                let event = match event {
                    WireEvent::Opened(_) => continue,
                    WireEvent::ExecutorRestarted(r) => {
                        // Before the event goes out: see launch_ring's
                        // release module.
                        release.registry.executor_restarted(
                            &r.device_uuid,
                            r.old_generation,
                            r.new_generation,
                            &r.cause,
                        );
                        SessionEvent::ExecutorRestarted {
                            device_uuid: r.device_uuid,
                            old_generation: r.old_generation,
                            new_generation: r.new_generation,
                            cause: r.cause,
                        }
                    }
                    WireEvent::Draining(d) => SessionEvent::Draining { reason: d.reason },
                    WireEvent::ExecutorDown(d) => {
                        // The rings of the dead generation will never be
                        // served again: their waiters are released now,
                        // not when (if ever) a restart succeeds.
                        release.registry.executor_down(
                            &d.device_uuid,
                            d.generation,
                            &d.cause,
                            &d.restart_error,
                        );
                        SessionEvent::ExecutorDown {
                            device_uuid: d.device_uuid,
                            generation: d.generation,
                            cause: d.cause,
                            failed_restarts: d.failed_restarts,
                            restart_error: d.restart_error,
                            retry_in: std::time::Duration::from_millis(d.retry_in_ms),
                        }
                    }
                };
                tracing::debug!(?event, "session event");
                // No receiver is not an error: nobody asked to watch.
                let _ = task_events.send(event);
            };
            let _ = alive_tx.send(false);
            release.why.clone_from(&why);
            // Releases the rings' waiters before the end is announced.
            drop(release);
            let _ = task_events.send(SessionEvent::Ended { why });
        });
        Ok(Session {
            grpc,
            lane,
            id: opened.session,
            boot_id: opened.boot_id,
            auto_reload: options.auto_reload_stale,
            events,
            lease_alive,
            rings,
            _lease: AbortOnDrop(task),
            fd_socket: None,
            fd_lane: None,
        })
    }

    /// The session id, as the daemon expects it in every request. It is a
    /// secret: it authorizes use of the session's buffers and kernels.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The daemon's boot id at the time the session opened.
    pub fn boot_id(&self) -> &str {
        &self.boot_id
    }

    /// True while the lease stream is open.
    pub fn is_open(&self) -> bool {
        *self.lease_alive.borrow()
    }

    /// Waits until the lease stream ends (the session is over).
    pub async fn closed(&self) {
        let mut alive = self.lease_alive.clone();
        // An error means the lease task is gone, which also ends the session.
        let _ = alive.wait_for(|open| !open).await;
    }

    /// Events of the lease from now on (executor restarts, drain, end).
    pub fn events(&self) -> broadcast::Receiver<SessionEvent> {
        self.events.subscribe()
    }

    /// The generated gRPC client on the session's connection.
    pub fn raw(&self) -> PtxdClient<Channel> {
        self.grpc.clone()
    }

    pub(crate) fn grpc(&self) -> Result<PtxdClient<Channel>, Error> {
        if self.is_open() {
            Ok(self.grpc.clone())
        } else {
            Err(Error::SessionClosed)
        }
    }

    /// The transports this session's unary calls may take
    /// ([`crate::transport`] decides which).
    fn transports(&self) -> Result<Transports<'_>, Error> {
        Ok(Transports {
            packet: self.fd_lane.as_deref(),
            h2_lane: self.lane.as_deref(),
            channel: self.grpc()?,
        })
    }

    /// Ends the session and reports what the daemon released.
    pub async fn close(self) -> Result<CloseReport, Error> {
        let request = pb::CloseSessionRequest {
            session: self.id.clone(),
        };
        let response = self.grpc()?.close_session(request).await?.into_inner();
        Ok(CloseReport {
            buffers_released: response.buffers_released,
            kernels_released: response.kernels_released,
            events_released: response.events_released,
        })
    }

    /// Loads PTX text for `device`.
    pub async fn load_ptx(
        &self,
        device: impl Into<DeviceSelector>,
        ptx: impl Into<String>,
        symbol: &str,
        options: LoadOptions,
    ) -> Result<Kernel, Error> {
        self.load(device, Artifact::Ptx(ptx.into()), symbol, options)
            .await
    }

    /// Loads a cubin for `device`, with the ABI it must be launched with.
    pub async fn load_cubin(
        &self,
        device: impl Into<DeviceSelector>,
        cubin: impl Into<Vec<u8>>,
        symbol: &str,
        abi: DeclaredAbi,
    ) -> Result<Kernel, Error> {
        let options = LoadOptions {
            label: String::new(),
            declared: Some(abi),
        };
        self.load(device, Artifact::Cubin(cubin.into()), symbol, options)
            .await
    }

    /// Loads any artifact for `device`.
    pub async fn load(
        &self,
        device: impl Into<DeviceSelector>,
        artifact: Artifact,
        symbol: &str,
        options: LoadOptions,
    ) -> Result<Kernel, Error> {
        let source = KernelSource {
            device: device.into(),
            artifact,
            symbol: symbol.to_owned(),
            options,
        };
        let state = self.load_source(&source).await?;
        Ok(Kernel {
            inner: Arc::new(KernelInner {
                source,
                state: Mutex::new(state),
                reload: tokio::sync::Mutex::new(()),
                reloads: AtomicU64::new(0),
            }),
        })
    }

    async fn load_source(&self, source: &KernelSource) -> Result<KernelState, Error> {
        let request = pb::LoadKernelRequest {
            session: self.id.clone(),
            device: Some(source.device.to_proto()),
            kind: source.artifact.kind() as i32,
            artifact: source.artifact.bytes().to_vec(),
            symbol: source.symbol.clone(),
            label: source.options.label.clone(),
            declared: source.options.declared.map(DeclaredAbi::to_proto),
        };
        let response = self.transports()?.load(request).await?;
        if response.kernel.is_empty() {
            return Err(Error::Protocol("a kernel load returned no handle".into()));
        }
        Ok(KernelState {
            handle: response.kernel,
            signature: response.signature.map(Into::into).unwrap_or_default(),
            cache_hit: response.cache_hit,
            load_micros: response.load_micros,
            device_uuid: response.device_uuid,
            generation: response.generation,
            ring_index: response.ring_index,
        })
    }

    /// Opens the session's launch ring on `device`, with `slots` slots (a
    /// power of two up to 4096): launches then bypass gRPC (see
    /// [`LaunchRing`](crate::LaunchRing)). The session's lease orphans the
    /// ring, releasing its semaphore waiters, when the ring's executor
    /// restarts or the session ends.
    pub async fn open_ring(
        &self,
        slots: u32,
        device: impl Into<DeviceSelector>,
    ) -> Result<crate::LaunchRing, Error> {
        let submitter = ptxd_ipc::ring::Submitter::create(slots)
            .map_err(|e| Error::InvalidInput(format!("cannot create the ring: {e}")))?;
        let request = pb::OpenRingRequest {
            session: self.id.clone(),
            shm_name: submitter.name().to_owned(),
            device: Some(device.into().to_proto()),
            by_fd: false,
        };
        let response = self.grpc()?.open_ring(request).await?.into_inner();
        self.ring_opened(submitter, response)
    }

    /// Like [`open_ring`](Self::open_ring), with the ring in a memfd passed
    /// to the daemon by descriptor over the fd socket: for a session that
    /// shares no `/dev/shm` with ptxd (its own IPC or mount namespace).
    pub async fn open_ring_fd(
        &self,
        slots: u32,
        device: impl Into<DeviceSelector>,
    ) -> Result<crate::LaunchRing, Error> {
        let fd_socket = self.fd_socket_path()?.to_owned();
        let submitter = ptxd_ipc::ring::Submitter::create_memfd(slots)
            .map_err(|e| Error::InvalidInput(format!("cannot create the ring: {e}")))?;
        let request = pb::OpenRingRequest {
            session: self.id.clone(),
            shm_name: String::new(),
            device: Some(device.into().to_proto()),
            by_fd: true,
        };
        let token = self.grpc()?.open_ring(request).await?.into_inner().fd_token;
        if token.is_empty() {
            return Err(Error::Protocol(
                "OpenRing (by_fd) returned no fd token".into(),
            ));
        }
        let memfd = submitter
            .memfd()
            .ok_or_else(|| Error::Protocol("a memfd ring without its descriptor".into()))?;
        let response = crate::fd_buffers::attach_ring_fd(&fd_socket, &token, memfd).await?;
        self.ring_opened(submitter, response)
    }

    /// Wraps a ring the daemon now serves.
    fn ring_opened(
        &self,
        submitter: ptxd_ipc::ring::Submitter,
        response: pb::OpenRingResponse,
    ) -> Result<crate::LaunchRing, Error> {
        let shared = RingShared::new(response.device_uuid, response.generation);
        self.rings.register(&shared);
        Ok(crate::LaunchRing::new(submitter, shared))
    }

    /// Loads `kernel`'s artifact again and swaps in the new handle.
    pub async fn reload(&self, kernel: &Kernel) -> Result<(), Error> {
        let _serialized = kernel.inner.reload.lock().await;
        self.reload_locked(kernel).await
    }

    async fn reload_locked(&self, kernel: &Kernel) -> Result<(), Error> {
        let state = self.load_source(&kernel.inner.source).await?;
        tracing::debug!(symbol = %kernel.inner.source.symbol, "kernel reloaded");
        *kernel.lock_state() = state;
        kernel.inner.reloads.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Reloads `kernel` unless its handle already moved on from `stale`.
    async fn reload_if_still(&self, kernel: &Kernel, stale: &str) -> Result<(), Error> {
        let _serialized = kernel.inner.reload.lock().await;
        if kernel.handle() != stale {
            return Ok(());
        }
        self.reload_locked(kernel).await
    }

    /// Drops the session's reference to `kernel`; true when that freed its
    /// slot.
    pub async fn unload(&self, kernel: &Kernel) -> Result<bool, Error> {
        let request = pb::UnloadKernelRequest {
            session: self.id.clone(),
            kernel: kernel.handle(),
        };
        Ok(self
            .grpc()?
            .unload_kernel(request)
            .await?
            .into_inner()
            .slot_freed)
    }

    /// The kernels the session holds.
    pub async fn list_kernels(&self) -> Result<Vec<KernelListing>, Error> {
        let request = pb::ListKernelsRequest {
            session: self.id.clone(),
        };
        let response = self.grpc()?.list_kernels(request).await?.into_inner();
        Ok(response.kernels.into_iter().map(Into::into).collect())
    }

    /// Registers a buffer from any source.
    pub async fn register_buffer(
        &self,
        source: BufferSource,
        size: u64,
        label: &str,
    ) -> Result<Buffer, Error> {
        use pb::register_buffer_request::Source;
        let source = match source {
            BufferSource::CudaIpc {
                handle,
                device_uuid,
            } => Source::CudaIpc(pb::CudaIpcBuffer {
                handle: handle.to_vec(),
                device_uuid,
            }),
            BufferSource::HostShm { name, device_uuid } => Source::HostShm(pb::HostShmBuffer {
                name,
                device_uuid: device_uuid.unwrap_or_default(),
            }),
        };
        let request = pb::RegisterBufferRequest {
            session: self.id.clone(),
            source: Some(source),
            size,
            label: label.to_owned(),
        };
        let response = self.grpc()?.register_buffer(request).await?.into_inner();
        if response.buffer.is_empty() {
            return Err(Error::Protocol("a registration returned no handle".into()));
        }
        Ok(Buffer {
            handle: response.buffer,
            size,
            device_uuid: response.device_uuid,
            generation: response.generation,
            ring_index: response.ring_index,
        })
    }

    /// Registers a CUDA IPC memory handle (`cuIpcGetMemHandle`) of an
    /// allocation of `size` bytes on the device `device_uuid`.
    pub async fn register_cuda_ipc(
        &self,
        handle: [u8; 64],
        device_uuid: &str,
        size: u64,
    ) -> Result<Buffer, Error> {
        let source = BufferSource::CudaIpc {
            handle,
            device_uuid: device_uuid.to_owned(),
        };
        self.register_buffer(source, size, "").await
    }

    /// Registers a POSIX shared-memory object by name (host backend);
    /// `device_uuid` `None` means the first host device.
    pub async fn register_host_shm(
        &self,
        name: &str,
        size: u64,
        device_uuid: Option<&str>,
    ) -> Result<Buffer, Error> {
        let source = BufferSource::HostShm {
            name: name.to_owned(),
            device_uuid: device_uuid.map(str::to_owned),
        };
        self.register_buffer(source, size, "").await
    }

    /// Registers the whole of a [`HostShm`] (host backend).
    pub async fn register_shm(
        &self,
        shm: &HostShm,
        device_uuid: Option<&str>,
    ) -> Result<Buffer, Error> {
        self.register_host_shm(shm.name(), shm.size(), device_uuid)
            .await
    }

    /// Releases a buffer registration.
    pub async fn release_buffer(&self, buffer: &Buffer) -> Result<(), Error> {
        let request = pb::ReleaseBufferRequest {
            session: self.id.clone(),
            buffer: buffer.handle.clone(),
        };
        self.grpc()?.release_buffer(request).await?;
        Ok(())
    }

    /// The buffers the session registered.
    pub async fn list_buffers(&self) -> Result<Vec<BufferListing>, Error> {
        let request = pb::ListBuffersRequest {
            session: self.id.clone(),
        };
        let response = self.grpc()?.list_buffers(request).await?.into_inner();
        Ok(response.buffers.into_iter().map(Into::into).collect())
    }

    /// Registers a CUDA IPC event handle (`cuIpcGetEventHandle`).
    pub async fn register_event(
        &self,
        handle: [u8; 64],
        device_uuid: &str,
        label: &str,
    ) -> Result<Event, Error> {
        let request = pb::RegisterEventRequest {
            session: self.id.clone(),
            handle: handle.to_vec(),
            device_uuid: device_uuid.to_owned(),
            label: label.to_owned(),
        };
        let response = self.grpc()?.register_event(request).await?.into_inner();
        Ok(Event {
            handle: response.event,
        })
    }

    /// Releases an event registration.
    pub async fn release_event(&self, event: &Event) -> Result<(), Error> {
        let request = pb::ReleaseEventRequest {
            session: self.id.clone(),
            event: event.handle.clone(),
        };
        self.grpc()?.release_event(request).await?;
        Ok(())
    }

    /// Launches `kernel`. With automatic reload on, a STALE_KERNEL refusal
    /// reloads the kernel and retries once.
    pub async fn launch(&self, kernel: &Kernel, launch: &Launch) -> Result<Launched, Error> {
        let handle = kernel.handle();
        match self.launch_once(handle.clone(), launch).await {
            Err(Error::Refused(Refusal::StaleKernel(details))) if self.auto_reload => {
                tracing::debug!(message = %details.message, "stale kernel; reloading");
                self.reload_if_still(kernel, &handle).await?;
                let launched = self.launch_once(kernel.handle(), launch).await?;
                Ok(Launched {
                    reloaded: true,
                    ..launched
                })
            }
            other => other,
        }
    }

    async fn launch_once(&self, kernel: String, launch: &Launch) -> Result<Launched, Error> {
        let request = launch.to_proto(&self.id, kernel, 0);
        let response = self.transports()?.launch(request).await?;
        Ok(Launched {
            tag: response.tag,
            micros: response.micros,
            reloaded: false,
        })
    }

    /// Opens a launch stream: launches sent on it are answered one by one,
    /// in order, and a refused launch does not end the stream. Stale kernels
    /// are not reloaded automatically here: on a `StaleKernel` reply call
    /// [`Session::reload`] and send again.
    pub async fn launch_stream(&self) -> Result<LaunchStream, Error> {
        let mut grpc = self.grpc()?;
        let (tx, rx) = mpsc::channel(LAUNCH_QUEUE);
        // The call runs in a task of its own so that launches queued before
        // the daemon answers the call are sent all the same.
        let call = tokio::spawn(async move {
            grpc.launch_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await
        });
        Ok(LaunchStream {
            sender: LaunchSender {
                session: self.id.clone(),
                queue: tx,
                next_tag: 1,
            },
            receiver: LaunchReceiver {
                state: ReceiverState::Calling(AbortOnDrop(call)),
            },
        })
    }
}

/// Where a buffer's memory comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BufferSource {
    /// A CUDA IPC memory handle and the UUID of its device.
    CudaIpc {
        /// The `cuIpcGetMemHandle` handle of the whole allocation; ptxd maps
        /// it at the allocation's base.
        handle: [u8; 64],
        /// The device the allocation lives on; ptxd refuses the buffer if
        /// the mapped memory lives elsewhere.
        device_uuid: String,
    },
    /// A POSIX shared-memory object; `None` means the first host device.
    HostShm {
        /// The object's name: `/` then 1 to 254 bytes, no other `/` and no
        /// NUL (a portable POSIX shared-memory name), which ptxd opens
        /// itself.
        name: String,
        /// The host-backend device to register it on.
        device_uuid: Option<String>,
    },
}

/// What a kernel was loaded from, kept for reloads.
#[derive(Debug)]
struct KernelSource {
    device: DeviceSelector,
    artifact: Artifact,
    symbol: String,
    options: LoadOptions,
}

/// The current load of a kernel: what the daemon answered the last (re)load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelState {
    /// ptxd's opaque kernel handle.
    pub handle: String,
    /// The signature ptxd verified.
    pub signature: KernelSignature,
    /// True when the artifact was already compiled for the device generation.
    pub cache_hit: bool,
    /// Time the load took inside ptxd, in microseconds.
    pub load_micros: u64,
    /// The device the kernel lives on.
    pub device_uuid: String,
    /// The device generation it was loaded in.
    pub generation: u64,
    /// How the session's launch ring names it.
    pub ring_index: u32,
}

#[derive(Debug)]
struct KernelInner {
    source: KernelSource,
    state: Mutex<KernelState>,
    /// Serializes reloads, so concurrent stale launches reload once.
    reload: tokio::sync::Mutex<()>,
    reloads: AtomicU64,
}

/// A kernel loaded into a session. Clones share the handle, so a reload is
/// seen by every clone. Dropping it unloads nothing (the session's end does;
/// or [`Session::unload`]).
#[derive(Debug, Clone)]
pub struct Kernel {
    inner: Arc<KernelInner>,
}

impl Kernel {
    fn lock_state(&self) -> std::sync::MutexGuard<'_, KernelState> {
        // The state is replaced whole under the lock, so a panic elsewhere
        // cannot leave it half-written: a poisoned lock is still consistent.
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The current handle.
    pub fn handle(&self) -> String {
        self.lock_state().handle.clone()
    }

    /// The verified signature of the current load.
    pub fn signature(&self) -> KernelSignature {
        self.lock_state().signature.clone()
    }

    /// How the session's launch ring names the current load (what a ring
    /// descriptor carries): one word read under the lock, where
    /// [`Kernel::state`] clones the whole answer, signature and contract
    /// included.
    pub fn ring_index(&self) -> u32 {
        self.lock_state().ring_index
    }

    /// Everything the daemon answered the current load.
    pub fn state(&self) -> KernelState {
        self.lock_state().clone()
    }

    /// The entry symbol.
    pub fn symbol(&self) -> &str {
        &self.inner.source.symbol
    }

    /// The artifact the kernel was loaded from.
    pub fn artifact(&self) -> &Artifact {
        &self.inner.source.artifact
    }

    /// The device selector the kernel was loaded with.
    pub fn device(&self) -> &DeviceSelector {
        &self.inner.source.device
    }

    /// How many times the kernel has been reloaded.
    pub fn reloads(&self) -> u64 {
        self.inner.reloads.load(Ordering::Relaxed)
    }
}

/// A bidirectional launch stream; see [`Session::launch_stream`]. Use
/// [`LaunchStream::split`] to send and receive from different tasks.
#[derive(Debug)]
pub struct LaunchStream {
    sender: LaunchSender,
    receiver: LaunchReceiver,
}

impl LaunchStream {
    /// Queues a launch; returns its tag, which its reply carries.
    pub async fn send(&mut self, kernel: &Kernel, launch: &Launch) -> Result<u64, Error> {
        self.sender.send(kernel, launch).await
    }

    /// The next reply, in send order; `None` once the stream has ended.
    pub async fn next(&mut self) -> Result<Option<StreamReply>, Error> {
        self.receiver.next().await
    }

    /// The sending and receiving halves.
    pub fn split(self) -> (LaunchSender, LaunchReceiver) {
        (self.sender, self.receiver)
    }
}

/// The sending half of a [`LaunchStream`]. Dropping it ends the request
/// stream; replies to what was sent still arrive.
#[derive(Debug)]
pub struct LaunchSender {
    session: String,
    queue: mpsc::Sender<pb::LaunchRequest>,
    next_tag: u64,
}

impl LaunchSender {
    /// Queues a launch; returns its tag, which its reply carries.
    pub async fn send(&mut self, kernel: &Kernel, launch: &Launch) -> Result<u64, Error> {
        let tag = self.next_tag;
        let request = launch.to_proto(&self.session, kernel.handle(), tag);
        self.queue
            .send(request)
            .await
            .map_err(|_| Error::Protocol("the launch stream has ended".into()))?;
        self.next_tag += 1;
        Ok(tag)
    }
}

/// One reply on a launch stream.
#[derive(Debug)]
pub struct StreamReply {
    /// The tag of the launch this answers.
    pub tag: u64,
    /// The launch's outcome: refusals and failures of one launch land here
    /// without ending the stream.
    pub outcome: Result<Launched, Error>,
}

type LaunchCall =
    AbortOnDrop<Result<tonic::Response<tonic::Streaming<pb::LaunchResponse>>, tonic::Status>>;

#[derive(Debug)]
enum ReceiverState {
    Calling(LaunchCall),
    // Boxed: the stream is large and the other states are tiny.
    Open(Box<tonic::Streaming<pb::LaunchResponse>>),
    Ended,
}

/// The receiving half of a [`LaunchStream`].
#[derive(Debug)]
pub struct LaunchReceiver {
    state: ReceiverState,
}

impl LaunchReceiver {
    /// The next reply, in send order; `None` once the stream has ended. An
    /// `Err` means the stream itself broke (transport, or the daemon refused
    /// the whole stream); no replies follow it.
    pub async fn next(&mut self) -> Result<Option<StreamReply>, Error> {
        if let ReceiverState::Calling(call) = &mut self.state {
            let answered = (&mut call.0).await;
            self.state = ReceiverState::Ended;
            let response = answered
                .map_err(|e| Error::Protocol(format!("the launch stream task failed: {e}")))??;
            self.state = ReceiverState::Open(Box::new(response.into_inner()));
        }
        let ReceiverState::Open(stream) = &mut self.state else {
            return Ok(None);
        };
        match stream.message().await {
            Ok(Some(response)) => Ok(Some(StreamReply {
                tag: response.tag,
                outcome: match response.error {
                    Some(error) => Err(from_launch_error(error)),
                    None => Ok(Launched {
                        tag: response.tag,
                        micros: response.micros,
                        reloaded: false,
                    }),
                },
            })),
            Ok(None) => {
                self.state = ReceiverState::Ended;
                Ok(None)
            }
            Err(status) => {
                self.state = ReceiverState::Ended;
                Err(status.into())
            }
        }
    }
}
