//! The front: the one owner of ptxd's state (sessions, the slot table, the
//! buffer registry, the devices and their executors) and the verbs that act
//! on it. The gRPC layer only decodes requests, calls a verb and maps the
//! result; nothing here knows tonic beyond the generated message types.
//!
//! Invariants:
//! - The state lock is never held across an `.await`: a verb checks under
//!   the lock, sends to the executor unlocked, and re-checks under the lock
//!   before it records the result (a session can close, or an executor die,
//!   in between).
//! - A launch reaches an executor only after every operand was checked for
//!   ownership, device, generation, alignment and bounds against the kernel's
//!   verified signature.
//! - A device's generation changes only in `restart`, before the new
//!   executor's link is published, so nothing is ever recorded against a
//!   generation whose executor the front does not know.
//! - Each distinct (content, symbol, device generation, cache scope) compiles
//!   once: loads of the same content serialize on a per-content lock and the
//!   second finds the first's slot.
//! - Every side effect in an executor (load, buffer open, event open) goes
//!   through [`side_effect`]: check under the lock, call the executor
//!   unlocked, re-check and commit under the lock, or undo in the executor.
//!   Nothing the executor opened is ever left unrecorded.
//! - Every refusal about a handle is the same for another session's live
//!   handle and a never-issued one (handles are per-session tokens).
//! - Per-tenant quotas (sessions, slots, buffers, loaded artifact bytes) are
//!   checked at the check and again at the commit; a tenant over its share
//!   loses its own dead and idle kernels first, never another tenant's.
//! - A caller without credentials (TCP) never gets what depends on identity:
//!   host shared memory, trust for unverified machine code.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ptxd_proto::executor::{
    self as exec, open_buffer, reply, request::Op, ArtifactKind as ExecArtifactKind, DeviceDesc,
};
use ptxd_proto::v1::{self as api, session_event};
use tokio::sync::{mpsc, watch};

use crate::buffers::{BufferEntry, BufferSource, EventEntry, Registry};
use crate::config::{BackendChoice, CacheScope, ServeConfig, TrustList};
use crate::error::Error;
use crate::executor::supervisor::{
    probe_cuda, DeathNotice, DownCause, ExecutorCommand, ExecutorLink, LinkConfig, LinkError,
};
use crate::executor::ExecutorError;
use crate::handles::{
    BootId, BufferHandle, BufferId, DeviceGeneration, EventHandle, EventId, GenerationCounter,
    HandleToken, KernelHandle, KernelRef, SessionId,
};
use crate::observe::Observer;
use crate::ptx::{self, DeclaredAbi, Signature};
use crate::sessions::{Caller, Session, SessionError, Tenant};
use crate::slots::{ContentKey, LoadedKernel, SlotError, SlotTable, StaleWhy};

/// The block size used when a kernel names none and the executor reports
/// none (the host engine's default).
pub const DEFAULT_BLOCK: u32 = 256;

/// The most inputs, and the most scalar params, a kernel may have.
const MAX_KERNEL_OPERANDS: u32 = 64;

/// How long an executor that exited (rather than faulted or hung) waits to
/// be replaced, in case the exit came from a signal to the whole process
/// group that is about to start the drain.
const EXIT_GRACE: Duration = Duration::from_millis(100);

/// How long to wait for an executor to answer a clean-up request.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(10);

/// Capacity of a session's lease-event channel. Events are rare (restarts,
/// drain); once a client leaves this many unread, newer events are dropped
/// (never blocking the daemon). The state they report stays readable with
/// GetInfo and ListKernels.
const SESSION_EVENT_CAPACITY: usize = 16;

/// The configured limits.
#[derive(Debug, Clone)]
pub struct Limits {
    pub slots: u32,
    pub max_artifact_bytes: u64,
    pub max_request_bytes: u64,
    pub max_sessions: u32,
    pub max_buffers_per_session: u32,
    pub max_kernels_per_session: u32,
    pub max_buffer_bytes_per_session: u64,
    pub max_events_per_session: u32,
    pub max_sessions_per_uid: u32,
    pub max_slots_per_uid: u32,
    pub max_buffers_per_uid: u32,
    pub max_loaded_bytes: u64,
    pub max_loaded_bytes_per_uid: u64,
    pub max_loaded_bytes_per_session: u64,
}

impl Limits {
    pub fn from_config(config: &ServeConfig) -> Limits {
        Limits {
            slots: config.slots,
            max_artifact_bytes: config.max_artifact_bytes,
            max_request_bytes: config.max_request_bytes,
            max_sessions: config.max_sessions,
            max_buffers_per_session: config.max_buffers_per_session,
            max_kernels_per_session: config.max_kernels_per_session,
            max_buffer_bytes_per_session: config.max_buffer_bytes_per_session,
            max_events_per_session: config.max_events_per_session,
            max_sessions_per_uid: clamp_u32(
                config
                    .max_sessions_per_uid
                    .of(config.max_sessions.into())
                    .min(config.max_sessions.into()),
            ),
            max_slots_per_uid: clamp_u32(
                config
                    .max_slots_per_uid
                    .of(config.slots.into())
                    .min(config.slots.into()),
            ),
            max_buffers_per_uid: config.max_buffers_per_uid,
            max_loaded_bytes: config.max_loaded_bytes,
            max_loaded_bytes_per_uid: config
                .max_loaded_bytes_per_uid
                .of(config.max_loaded_bytes)
                .min(config.max_loaded_bytes),
            max_loaded_bytes_per_session: config.max_loaded_bytes_per_session,
        }
    }

    fn to_proto(&self) -> api::Limits {
        api::Limits {
            slots: self.slots,
            max_artifact_bytes: self.max_artifact_bytes,
            max_request_bytes: self.max_request_bytes,
            max_sessions: self.max_sessions,
            max_buffers_per_session: self.max_buffers_per_session,
            max_kernels_per_session: self.max_kernels_per_session,
            max_buffer_bytes_per_session: self.max_buffer_bytes_per_session,
            max_events_per_session: self.max_events_per_session,
            max_sessions_per_uid: self.max_sessions_per_uid,
            max_slots_per_uid: self.max_slots_per_uid,
            max_buffers_per_uid: self.max_buffers_per_uid,
            max_loaded_bytes: self.max_loaded_bytes,
            max_loaded_bytes_per_uid: self.max_loaded_bytes_per_uid,
            max_loaded_bytes_per_session: self.max_loaded_bytes_per_session,
        }
    }
}

fn clamp_u32(value: u64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

/// What a tenant (or one session) holds, as quotas count it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub sessions: u32,
    /// Distinct slots its sessions hold (a shared slot counts for each
    /// tenant holding it).
    pub slots: u32,
    pub buffers: u32,
    /// Artifact bytes of those slots.
    pub loaded_bytes: u64,
}

/// Why the front could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("the CUDA backend was requested but is unavailable: {0}")]
    CudaUnavailable(String),
    #[error("no CUDA device matches {0:?}")]
    NoMatchingDevice(String),
    #[error("executor for device {device} did not start: {error}")]
    Executor { device: String, error: String },
}

/// A device and the executor that currently drives it.
#[derive(Debug)]
struct DeviceState {
    desc: DeviceDesc,
    command: ExecutorCommand,
    generation: DeviceGeneration,
    link: Option<Arc<ExecutorLink>>,
    restarts: u64,
    restarting: bool,
}

impl DeviceState {
    fn live_link(&self) -> Option<&Arc<ExecutorLink>> {
        self.link.as_ref().filter(|l| !l.is_down())
    }

    fn at_generation(&self, generation: DeviceGeneration) -> String {
        format!("{}@{}", self.desc.uuid, generation)
    }
}

#[derive(Debug)]
struct State {
    sessions: HashMap<SessionId, Session>,
    slots: SlotTable,
    registry: Registry,
    devices: Vec<DeviceState>,
    draining: bool,
}

impl State {
    fn is_live(devices: &[DeviceState]) -> impl Fn(DeviceGeneration) -> bool + '_ {
        move |generation| {
            devices
                .iter()
                .any(|d| d.generation == generation && d.live_link().is_some())
        }
    }

    fn session(&self, id: &SessionId, caller: Caller) -> Result<&Session, Error> {
        let session = self.sessions.get(id).ok_or_else(|| SessionError::Unknown {
            session: id.to_string(),
        })?;
        session.authorize(caller)?;
        Ok(session)
    }

    fn session_mut(&mut self, id: &SessionId, caller: Caller) -> Result<&mut Session, Error> {
        let session = self
            .sessions
            .get_mut(id)
            .ok_or_else(|| SessionError::Unknown {
                session: id.to_string(),
            })?;
        session.authorize(caller)?;
        Ok(session)
    }

    /// The re-check before a commit: the session is still open and the
    /// device still runs the generation the executor call went to.
    fn recheck(
        &self,
        id: &SessionId,
        device_index: usize,
        generation: DeviceGeneration,
        device_uuid: &str,
    ) -> Result<(), Error> {
        if !self.sessions.contains_key(id) {
            return Err(SessionError::Unknown {
                session: id.to_string(),
            }
            .into());
        }
        let current = self
            .devices
            .get(device_index)
            .is_some_and(|d| d.generation == generation);
        if !current {
            return Err(ExecutorError::Unavailable {
                device: device_uuid.to_string(),
                cause: "the executor restarted during the request".into(),
            }
            .into());
        }
        Ok(())
    }

    /// What one session holds (sessions = 1).
    fn session_usage(&self, session: &Session) -> Usage {
        let loaded_bytes = session
            .kernels
            .values()
            .filter_map(|h| self.slots.occupant_of(&h))
            .map(|k| k.artifact_bytes)
            .sum();
        Usage {
            sessions: 1,
            slots: session.kernels.len() as u32,
            buffers: session.buffers.len() as u32,
            loaded_bytes,
        }
    }

    /// What `tenant`'s sessions hold together; `extra` is a kernel about to
    /// be held (charged unless the tenant already holds it).
    fn tenant_usage(&self, tenant: Tenant) -> Usage {
        let mut usage = Usage::default();
        let mut held = std::collections::HashSet::new();
        for session in self.sessions.values().filter(|s| s.tenant() == tenant) {
            usage.sessions += 1;
            usage.buffers += session.buffers.len() as u32;
            for handle in session.kernels.values() {
                if let Some(kernel) = self.slots.occupant_of(&handle) {
                    if held.insert(handle) {
                        usage.slots += 1;
                        usage.loaded_bytes += kernel.artifact_bytes;
                    }
                }
            }
        }
        usage
    }

    fn tenant_buffers(&self, tenant: Tenant) -> u32 {
        self.sessions
            .values()
            .filter(|s| s.tenant() == tenant)
            .map(|s| s.buffers.len() as u32)
            .sum()
    }

    fn tenant_holds(&self, tenant: Tenant, handle: &KernelHandle) -> bool {
        self.sessions
            .values()
            .any(|s| s.tenant() == tenant && s.kernels.contains(handle))
    }

    /// Drops every hold `tenant`'s sessions have on its least recently used
    /// kernel idle for at least `idle` (never `keep`); returns false when it
    /// has none. Freed slots' modules are unloaded through `cleanup`.
    fn evict_idle(
        &mut self,
        tenant: Tenant,
        idle: Duration,
        keep: Option<&KernelHandle>,
        cleanup: &mut Cleanup,
    ) -> bool {
        let mut candidate: Option<(Duration, KernelHandle)> = None;
        for session in self.sessions.values().filter(|s| s.tenant() == tenant) {
            for handle in session.kernels.values() {
                if Some(&handle) == keep {
                    continue;
                }
                let Some(idle_for) = self.slots.idle_for(&handle) else {
                    continue;
                };
                if idle_for >= idle && candidate.is_none_or(|(best, _)| idle_for > best) {
                    candidate = Some((idle_for, handle));
                }
            }
        }
        let Some((idle_for, handle)) = candidate else {
            return false;
        };
        let holders: Vec<SessionId> = self
            .slots
            .holders(&handle)
            .into_iter()
            .filter(|id| self.sessions.get(id).is_some_and(|s| s.tenant() == tenant))
            .collect();
        for id in holders {
            if let Some(session) = self.sessions.get_mut(&id) {
                session.kernels.remove(&handle);
            }
            if let Ok(released) = self.slots.release(&handle, &id) {
                queue_unload(&self.devices, released, cleanup);
            }
        }
        tracing::info!(%tenant, ?idle_for, "reclaimed an idle kernel of a tenant at its share");
        true
    }

    fn device_index(&self, selector: Option<&api::DeviceSelector>) -> Result<usize, Error> {
        use api::device_selector::Selector;
        match selector.and_then(|s| s.selector.as_ref()) {
            None => Ok(0),
            Some(Selector::Uuid(uuid)) => self.device_by_uuid(uuid),
            Some(Selector::Ordinal(ordinal)) => self
                .devices
                .iter()
                .position(|d| d.desc.ordinal == *ordinal)
                .ok_or_else(|| Error::UnknownDevice {
                    device: ordinal.to_string(),
                }),
        }
    }

    fn device_by_uuid(&self, uuid: &str) -> Result<usize, Error> {
        self.devices
            .iter()
            .position(|d| d.desc.uuid == uuid)
            .ok_or_else(|| Error::UnknownDevice {
                device: uuid.chars().take(96).collect(),
            })
    }

    fn link(&self, index: usize) -> Result<(Arc<ExecutorLink>, DeviceGeneration), Error> {
        let device = self
            .devices
            .get(index)
            .ok_or_else(|| Error::UnknownDevice {
                device: index.to_string(),
            })?;
        match device.live_link() {
            Some(link) => Ok((link.clone(), device.generation)),
            None => Err(ExecutorError::Unavailable {
                device: device.desc.uuid.clone(),
                cause: if device.restarting {
                    "restarting".into()
                } else {
                    "down".into()
                },
            }
            .into()),
        }
    }
}

/// Loads of the same (device, content hash, symbol) serialize on one lock.
type LoadKey = (usize, [u8; 32], i32, String, Signature);

/// Held by a launch from its check until its reply (see `Session::inflight`).
type InflightLaunch = tokio::sync::OwnedRwLockReadGuard<()>;

/// Work to send to executors after the state lock is released.
type Cleanup = Vec<(Arc<ExecutorLink>, Op)>;

/// What a session held when it was released.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReleasedCounts {
    pub buffers: u32,
    pub kernels: u32,
    pub events: u32,
}

/// Accepted PTX texts whose canonical form is remembered (see
/// [`ptx::memo`]), and the bytes of client plus canonical text they may hold.
const CANONICAL_MEMO_ENTRIES: usize = 4096;
const CANONICAL_MEMO_BYTES: usize = 64 << 20;

/// The front.
#[derive(Debug)]
pub struct Front {
    pub boot: BootId,
    pub backend: &'static str,
    pub limits: Limits,
    generations: GenerationCounter,
    state: Mutex<State>,
    deaths: mpsc::UnboundedSender<DeathNotice>,
    load_locks: Mutex<HashMap<LoadKey, Arc<tokio::sync::Mutex<()>>>>,
    next_module: AtomicU64,
    next_stream: AtomicU64,
    /// True while every device's executor is up (drives health).
    available: watch::Sender<bool>,
    /// Bumped whenever sessions, buffers, slots or devices change (drives metrics gauges).
    pub changes: watch::Sender<u64>,
    observer: Observer,
    executor: LinkConfig,
    /// Who may load unverified machine code.
    trust: TrustList,
    cache_scope: CacheScope,
    idle_reclaim_after: Duration,
    /// True once the drain began (ends open LaunchStreams).
    drain: watch::Sender<bool>,
    drain_timeout: Duration,
    /// Canonical texts of PTX accepted before, so a cache hit does not
    /// parse and verify the same text again.
    canonical: Arc<ptx::memo::CanonicalMemo>,
}

fn down_to_error(device: &str, error: LinkError) -> Error {
    let LinkError::Down(cause) = error;
    let cause = match cause {
        DownCause::Fault { error_name, .. } => format!("device fault {error_name}"),
        other => other.to_string(),
    };
    ExecutorError::Unavailable {
        device: device.to_string(),
        cause,
    }
    .into()
}

impl Front {
    /// Chooses the backend, starts an executor per device and the supervisor.
    pub async fn start(config: &ServeConfig, observer: Observer) -> Result<Arc<Front>, StartError> {
        let boot = BootId::random();
        let generations = GenerationCounter::new(boot);
        let (backend, devices) = Self::choose_devices(config).await?;
        let (deaths_tx, deaths_rx) = mpsc::unbounded_channel();
        let executor = LinkConfig::from_config(config);
        let mut states = Vec::new();
        for (desc, command) in devices {
            let generation = generations.next();
            let index = states.len();
            let link =
                ExecutorLink::spawn(index, generation, &command, &executor, deaths_tx.clone())
                    .await
                    .map_err(|e| StartError::Executor {
                        device: desc.uuid.clone(),
                        error: e.to_string(),
                    })?;
            let desc = link.hello.devices.first().cloned().unwrap_or(desc);
            tracing::info!(device = %desc.uuid, name = %desc.name, %generation, pid = link.pid(), "executor up");
            states.push(DeviceState {
                desc,
                command,
                generation,
                link: Some(link),
                restarts: 0,
                restarting: false,
            });
        }
        let limits = Limits::from_config(config);
        let front = Arc::new(Front {
            boot,
            backend,
            generations,
            state: Mutex::new(State {
                sessions: HashMap::new(),
                slots: SlotTable::new(limits.slots, boot),
                registry: Registry::default(),
                devices: states,
                draining: false,
            }),
            limits,
            deaths: deaths_tx,
            load_locks: Mutex::new(HashMap::new()),
            next_module: AtomicU64::new(1),
            next_stream: AtomicU64::new(1),
            available: watch::Sender::new(true),
            changes: watch::Sender::new(0),
            observer,
            executor,
            trust: config.trust_unverified_artifacts.clone(),
            cache_scope: config.kernel_cache_scope,
            idle_reclaim_after: config.idle_reclaim_after,
            drain: watch::Sender::new(false),
            drain_timeout: config.drain_timeout,
            canonical: Arc::new(ptx::memo::CanonicalMemo::new(
                CANONICAL_MEMO_ENTRIES,
                CANONICAL_MEMO_BYTES,
            )),
        });
        tokio::spawn(front.clone().supervise(deaths_rx));
        Ok(front)
    }

    async fn choose_devices(
        config: &ServeConfig,
    ) -> Result<(&'static str, Vec<(DeviceDesc, ExecutorCommand)>), StartError> {
        let host = || {
            let threads = config.host_threads.unwrap_or_else(|| {
                std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(1)
            });
            (0..config.host_devices)
                .map(|index| {
                    let desc = DeviceDesc {
                        ordinal: index,
                        uuid: crate::executor::host::host_device_uuid(index),
                        name: "host CPU".into(),
                        ..Default::default()
                    };
                    (
                        desc,
                        ExecutorCommand::Host {
                            index,
                            threads,
                            checked: config.host_checked,
                        },
                    )
                })
                .collect::<Vec<_>>()
        };
        match config.backend {
            BackendChoice::Host => {
                tracing::info!("backend: host (requested)");
                Ok(("host", host()))
            }
            BackendChoice::Cuda | BackendChoice::Auto => match probe_cuda().await {
                Ok(hello) => {
                    let selected = select_devices(&hello.devices, &config.devices)?;
                    tracing::info!(
                        devices = selected.len(),
                        "backend: cuda (libcuda present, devices answer)"
                    );
                    Ok(("cuda", selected))
                }
                Err(e) if config.backend == BackendChoice::Auto => {
                    tracing::info!(reason = %e, "backend: host (CUDA unavailable)");
                    Ok(("host", host()))
                }
                Err(e) => Err(StartError::CudaUnavailable(e.to_string())),
            },
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every critical section leaves the state consistent before anything
        // that could panic, so a poisoned lock still guards valid state.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A receiver that is true while every device's executor is up.
    pub fn availability(&self) -> watch::Receiver<bool> {
        self.available.subscribe()
    }

    /// A receiver that turns true when the drain begins.
    pub fn draining(&self) -> watch::Receiver<bool> {
        self.drain.subscribe()
    }

    /// How long an open `LaunchStream` keeps answering (with DRAINING) after
    /// the drain began before it ends with a DRAINING status: half the drain
    /// timeout, so that it ends before in-flight calls are cut off.
    pub fn stream_drain_grace(&self) -> Duration {
        self.drain_timeout / 2
    }

    fn publish_availability(&self, state: &State) {
        let all_up = !state.draining && state.devices.iter().all(|d| d.live_link().is_some());
        self.available
            .send_if_modified(|v| std::mem::replace(v, all_up) != all_up);
    }

    /// Gauges for metrics: (sessions, buffers, buffer bytes, slots used, generations per device).
    pub fn gauges(&self) -> Gauges {
        let state = self.lock();
        Gauges {
            sessions: state.sessions.len() as u64,
            buffers: state.registry.buffers.len() as u64,
            buffer_bytes: state.registry.total_bytes(),
            slots_used: state.slots.used() as u64,
            loaded_bytes: state.slots.loaded_bytes(),
            loaded_bytes_limit: self.limits.max_loaded_bytes,
            devices: state
                .devices
                .iter()
                .map(|d| (d.desc.uuid.clone(), d.generation.0, d.restarts))
                .collect(),
        }
    }

    // ----- supervision -----------------------------------------------------

    async fn supervise(self: Arc<Self>, mut deaths: mpsc::UnboundedReceiver<DeathNotice>) {
        while let Some((index, generation, cause)) = deaths.recv().await {
            let start = {
                let mut state = self.lock();
                let draining = state.draining;
                let Some(device) = state.devices.get_mut(index) else {
                    continue;
                };
                if device.generation != generation {
                    continue;
                }
                device.link = None;
                let start = !device.restarting && !draining && cause != DownCause::Stopped;
                if start {
                    device.restarting = true;
                }
                self.publish_availability(&state);
                start
            };
            self.changed();
            if let (DownCause::Fault { .. }, Some(device)) =
                (&cause, self.lock().devices.get(index))
            {
                self.observer.kernel_fault(&device.desc.uuid);
            }
            if start {
                tokio::spawn(self.clone().restart(index, generation, cause));
            }
        }
    }

    async fn restart(self: Arc<Self>, index: usize, old: DeviceGeneration, cause: DownCause) {
        if matches!(cause, DownCause::Exited { .. }) {
            // A SIGTERM sent to the whole process group (systemd, a
            // terminal's ^C) reaches the executors as it reaches the daemon,
            // and their exit can be seen before the drain begins: give the
            // drain a moment to start rather than replace them during
            // shutdown. Faults and timeouts restart at once.
            let mut drain = self.drain.subscribe();
            let _ = tokio::time::timeout(EXIT_GRACE, drain.wait_for(|d| *d)).await;
            if self.lock().draining {
                tracing::info!(device = index, %old, "executor exited during shutdown; not restarting");
                return;
            }
        }
        tracing::warn!(device = index, generation = %old, %cause, "executor died; restarting");
        let mut backoff = Duration::from_millis(50);
        let cause_text = match &cause {
            DownCause::Fault { error_name, .. } => format!("KERNEL_FAULT {error_name}"),
            DownCause::Exited { .. } => "exited".to_string(),
            DownCause::Unresponsive { .. } => "unresponsive".to_string(),
            DownCause::Stopped => "stopped".to_string(),
        };
        loop {
            let (command, uuid) = {
                let state = self.lock();
                if state.draining {
                    return;
                }
                let Some(device) = state.devices.get(index) else {
                    return;
                };
                (device.command.clone(), device.desc.uuid.clone())
            };
            let generation = self.generations.next();
            let link = match ExecutorLink::spawn(
                index,
                generation,
                &command,
                &self.executor,
                self.deaths.clone(),
            )
            .await
            {
                Ok(link)
                    if link.hello.devices.first().map(|d| d.uuid.as_str())
                        == Some(uuid.as_str()) =>
                {
                    link
                }
                Ok(link) => {
                    tracing::error!(device = %uuid, "restarted executor drives another device; retrying");
                    link.shutdown(Duration::from_secs(1)).await;
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                    continue;
                }
                Err(e) => {
                    tracing::error!(device = %uuid, error = %e, "executor restart failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                    continue;
                }
            };
            // Publish the generation first so a death of the new executor
            // during the re-open is attributed to it, not dropped as stale.
            let (buffers, events) = {
                let mut state = self.lock();
                let Some(device) = state.devices.get_mut(index) else {
                    return;
                };
                device.generation = generation;
                let buffers: Vec<BufferEntry> = state
                    .registry
                    .buffers
                    .values()
                    .filter(|b| b.device_index == index)
                    .cloned()
                    .collect();
                let events: Vec<EventEntry> = state
                    .registry
                    .events
                    .values()
                    .filter(|e| e.device_index == index)
                    .cloned()
                    .collect();
                (buffers, events)
            };
            let mut reopened_buffers = Vec::new();
            for buffer in &buffers {
                let ok = matches!(
                    link.call(open_buffer_op(buffer)).await,
                    Ok(reply::Result::OpenBuffer(_))
                );
                if !ok {
                    tracing::warn!(
                        buffer = buffer.id.0,
                        "buffer could not be re-opened after restart; it is stale"
                    );
                }
                reopened_buffers.push((buffer.id, ok));
            }
            let mut reopened_events = Vec::new();
            for event in &events {
                let op = Op::OpenEvent(exec::OpenEvent {
                    event_id: event.id.0,
                    handle: event.handle.clone(),
                });
                let ok = matches!(link.call(op).await, Ok(reply::Result::Ok(_)));
                reopened_events.push((event.id, ok));
            }
            if link.is_down() {
                tracing::error!(device = %uuid, "restarted executor died while re-opening; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(10));
                continue;
            }
            let mut late_closes: Cleanup = Vec::new();
            let mut died_before_publishing = false;
            {
                let mut state = self.lock();
                for (id, ok) in reopened_buffers {
                    match state.registry.buffers.get_mut(&id) {
                        Some(entry) => entry.open_in = ok.then_some(generation),
                        // Released while we re-opened it: close it again.
                        None if ok => late_closes.push((
                            link.clone(),
                            Op::CloseBuffer(exec::CloseBuffer { buffer_id: id.0 }),
                        )),
                        None => {}
                    }
                }
                for (id, ok) in reopened_events {
                    match state.registry.events.get_mut(&id) {
                        Some(entry) => entry.open_in = ok.then_some(generation),
                        None if ok => late_closes.push((
                            link.clone(),
                            Op::CloseEvent(exec::CloseEvent { event_id: id.0 }),
                        )),
                        None => {}
                    }
                }
                if state.draining {
                    return;
                }
                // A death between the re-open and here was handled by
                // `supervise` while `restarting` was set: retry ourselves.
                if link.is_down() {
                    died_before_publishing = true;
                } else {
                    let Some(device) = state.devices.get_mut(index) else {
                        return;
                    };
                    device.link = Some(link.clone());
                    device.restarts += 1;
                    device.restarting = false;
                    let event = api::SessionEvent {
                        event: Some(session_event::Event::ExecutorRestarted(
                            api::ExecutorRestarted {
                                device_uuid: uuid.clone(),
                                old_generation: old.0,
                                new_generation: generation.0,
                                cause: cause_text.clone(),
                            },
                        )),
                    };
                    for session in state.sessions.values() {
                        let _ = session.events.try_send(Ok(event.clone()));
                    }
                    self.publish_availability(&state);
                }
            }
            if died_before_publishing {
                tracing::error!(device = %uuid, "restarted executor died before it was published; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(10));
                continue;
            }
            run_cleanup(late_closes).await;
            self.observer.executor_restart(&uuid);
            self.changed();
            tracing::info!(device = %uuid, old = %old, new = %generation, pid = link.pid(), "executor restarted");
            return;
        }
    }

    /// Kills the executor of device `index` (fault injection for tests and
    /// operators; the supervisor restarts it).
    pub fn kill_executor(&self, index: usize) -> bool {
        let state = self.lock();
        match state.devices.get(index).and_then(|d| d.link.as_ref()) {
            Some(link) => {
                link.kill();
                true
            }
            None => false,
        }
    }

    // ----- verbs -----------------------------------------------------------

    fn refuse_if_draining(state: &State) -> Result<(), Error> {
        if state.draining {
            Err(Error::Draining)
        } else {
            Ok(())
        }
    }

    /// GetInfo: the daemon, its limits, what is loaded, and what the
    /// caller's tenant holds against its quotas.
    pub fn info(&self, caller: Caller) -> api::GetInfoResponse {
        let state = self.lock();
        let usage = state.tenant_usage(caller.tenant());
        api::GetInfoResponse {
            version: env!("CARGO_PKG_VERSION").to_string(),
            backend: self.backend.to_string(),
            devices: state
                .devices
                .iter()
                .map(|d| api::Device {
                    ordinal: d.desc.ordinal,
                    uuid: d.desc.uuid.clone(),
                    name: d.desc.name.clone(),
                    compute_major: d.desc.compute_major,
                    compute_minor: d.desc.compute_minor,
                    generation: d.generation.0,
                    total_memory: d.desc.total_memory,
                    available: d.live_link().is_some(),
                    restarts: d.restarts,
                    executor_pid: d.live_link().map(|l| l.pid()).unwrap_or(0),
                })
                .collect(),
            slots_used: state.slots.used(),
            limits: Some(self.limits.to_proto()),
            sessions: state.sessions.len() as u32,
            boot_id: self.boot.to_string(),
            loaded_bytes: state.slots.loaded_bytes(),
            caller_usage: Some(api::Usage {
                sessions: usage.sessions,
                slots: usage.slots,
                buffers: usage.buffers,
                loaded_bytes: usage.loaded_bytes,
            }),
            kernel_cache_scope: match self.cache_scope {
                CacheScope::Node => "node".into(),
                CacheScope::Uid => "uid".into(),
            },
        }
    }

    /// Opens a session. The returned receiver is the lease stream's source;
    /// the caller must call [`Front::release_session`] when the stream ends.
    pub fn open_session(
        &self,
        label: String,
        peer: Caller,
    ) -> Result<
        (
            SessionId,
            mpsc::Receiver<Result<api::SessionEvent, tonic::Status>>,
        ),
        Error,
    > {
        let (tx, rx) = mpsc::channel(SESSION_EVENT_CAPACITY);
        let id = SessionId::random();
        {
            let mut state = self.lock();
            Self::refuse_if_draining(&state)?;
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
            let opened = api::SessionEvent {
                event: Some(session_event::Event::Opened(api::SessionOpened {
                    session: id.to_string(),
                    boot_id: self.boot.to_string(),
                })),
            };
            // The channel is fresh and has room: this cannot fail.
            let _ = tx.try_send(Ok(opened));
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
                    buffers: Default::default(),
                    events_held: Default::default(),
                    buffer_bytes: 0,
                    inflight: Default::default(),
                },
            );
        }
        tracing::debug!(session = %id, ?peer, "session opened");
        self.changed();
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
                        Op::CloseStream(exec::CloseStream {
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
            for buffer_id in session.buffers.values() {
                if let Some(entry) = state.registry.buffers.remove(&buffer_id) {
                    counts.buffers += 1;
                    if let Some(op_link) =
                        close_target(&state.devices, entry.device_index, entry.open_in)
                    {
                        cleanup.push((
                            op_link,
                            Op::CloseBuffer(exec::CloseBuffer {
                                buffer_id: buffer_id.0,
                            }),
                        ));
                    }
                }
            }
            for event_id in session.events_held.values() {
                if let Some(entry) = state.registry.events.remove(&event_id) {
                    counts.events += 1;
                    if let Some(op_link) =
                        close_target(&state.devices, entry.device_index, entry.open_in)
                    {
                        cleanup.push((
                            op_link,
                            Op::CloseEvent(exec::CloseEvent {
                                event_id: event_id.0,
                            }),
                        ));
                    }
                }
            }
            (counts, cleanup)
        };
        run_cleanup(cleanup).await;
        tracing::debug!(session = %id, ?counts, "session released");
        self.changed();
        counts
    }

    /// LoadKernel.
    pub async fn load_kernel(
        &self,
        mut request: api::LoadKernelRequest,
        peer: Caller,
    ) -> Result<api::LoadKernelResponse, Error> {
        let started = Instant::now();
        let session_id = parse_session(&request.session)?;
        if request.artifact.is_empty() {
            return Err(Error::InvalidArgument {
                field: "artifact",
                message: "the artifact is empty".into(),
            });
        }
        if request.artifact.len() as u64 > self.limits.max_artifact_bytes {
            return Err(Error::LimitExceeded {
                limit: "max_artifact_bytes",
                value: self.limits.max_artifact_bytes,
            });
        }
        validate_symbol(&request.symbol)?;
        let kind =
            api::ArtifactKind::try_from(request.kind).unwrap_or(api::ArtifactKind::Unspecified);
        let declared = request.declared.map(|d| {
            (
                DeclaredAbi {
                    inputs: d.inputs,
                    scalar_params: d.scalar_params,
                },
                d.element_size,
            )
        });

        let device_index = {
            let state = self.lock();
            Self::refuse_if_draining(&state)?;
            self.check_kernel_limit(state.session(&session_id, peer)?)?;
            state.device_index(request.device.as_ref())?
        };

        let (signature, exec_kind) = match kind {
            api::ArtifactKind::Ptx => {
                let text = String::from_utf8(request.artifact.clone()).map_err(|e| {
                    Error::Ptx(ptx::PtxError::Parse {
                        line: 0,
                        column: 0,
                        message: format!("PTX is not UTF-8: {e}"),
                    })
                })?;
                let symbol = request.symbol.clone();
                let declared_abi = declared.map(|(abi, _)| abi);
                let memo = self.canonical.clone();
                let (canonical, _) = tokio::task::spawn_blocking(move || {
                    memo.canonicalize(&text, &symbol, declared_abi)
                })
                .await
                .map_err(|e| Error::Internal {
                    message: format!("verifier task failed: {e}"),
                })??;
                // From here on the artifact is the canonical text: it is what
                // the executor compiles and what the cache key hashes.
                request.artifact = canonical.text.clone().into_bytes();
                (canonical.signature.clone(), ExecArtifactKind::Ptx)
            }
            api::ArtifactKind::Cubin | api::ArtifactKind::Fatbin => {
                let (exec_kind, name) = if kind == api::ArtifactKind::Cubin {
                    (ExecArtifactKind::Cubin, "cubin")
                } else {
                    (ExecArtifactKind::Fatbin, "fatbin")
                };
                // Machine code is not verified: it runs only for callers the
                // operator trusts by uid/gid, and a caller without
                // credentials is never one of them.
                let trusted = match peer {
                    Caller::Local(p) => self.trust.trusts(p.uid, p.gid),
                    Caller::Remote { .. } => false,
                };
                if !trusted {
                    return Err(Error::UnverifiedArtifact { kind: name });
                }
                let Some((abi, element_size)) = declared else {
                    return Err(Error::UnsupportedArtifact {
                        message:
                            "a cubin or fatbin cannot be verified from its text: declare its ABI \
                                  (inputs, scalar_params, element_size)"
                                .into(),
                    });
                };
                if abi.inputs > MAX_KERNEL_OPERANDS || abi.scalar_params > MAX_KERNEL_OPERANDS {
                    return Err(Error::LimitExceeded {
                        limit: "kernel_operands",
                        value: MAX_KERNEL_OPERANDS.into(),
                    });
                }
                if !matches!(element_size, 1 | 2 | 4 | 8) {
                    return Err(Error::InvalidArgument {
                        field: "declared.element_size",
                        message: format!("{element_size} is not 1, 2, 4 or 8"),
                    });
                }
                // The host backend's executor refuses machine code itself
                // (UNSUPPORTED_ARTIFACT).
                let signature = Signature {
                    inputs: abi.inputs,
                    element_sizes: vec![element_size; abi.inputs as usize + 1],
                    scalar_params: abi.scalar_params,
                    reqntid: None,
                    maxntid: None,
                };
                (signature, exec_kind)
            }
            api::ArtifactKind::Unspecified => {
                return Err(Error::InvalidArgument {
                    field: "kind",
                    message: "set kind to PTX, CUBIN or FATBIN".into(),
                })
            }
        };
        if signature.inputs > MAX_KERNEL_OPERANDS || signature.scalar_params > MAX_KERNEL_OPERANDS {
            return Err(Error::LimitExceeded {
                limit: "kernel_operands",
                value: MAX_KERNEL_OPERANDS.into(),
            });
        }

        let hash: [u8; 32] = *blake3::hash(&request.artifact).as_bytes();
        let lock_key = (
            device_index,
            hash,
            exec_kind as i32,
            request.symbol.clone(),
            signature.clone(),
        );
        let content_lock = {
            let mut locks = self.load_locks.lock().unwrap_or_else(|p| p.into_inner());
            locks.entry(lock_key.clone()).or_default().clone()
        };
        let result = {
            let _serialized = content_lock.lock().await;
            self.load_locked(
                &session_id,
                peer,
                device_index,
                hash,
                &request,
                signature,
                exec_kind,
                started,
            )
            .await
        };
        {
            let mut locks = self.load_locks.lock().unwrap_or_else(|p| p.into_inner());
            // Only the map and this call hold it: nobody else is waiting.
            if Arc::strong_count(&content_lock) == 2 {
                locks.remove(&lock_key);
            }
        }
        if result.is_ok() {
            self.changed();
        }
        result
    }

    /// Makes room for `session` (of `tenant`) to hold a kernel of `bytes`
    /// artifact bytes: `cached` when it is a cache hit on a slot that exists,
    /// `None` when a new slot and new executor memory are needed. Refuses
    /// with the limit it would break, after reclaiming dead slots and then
    /// the tenant's own idle kernels.
    fn make_room(
        &self,
        state: &mut State,
        session_id: &SessionId,
        tenant: Tenant,
        cached: Option<&KernelHandle>,
        bytes: u64,
        cleanup: &mut Cleanup,
    ) -> Result<(), Error> {
        let Some(session) = state.sessions.get(session_id) else {
            return Err(SessionError::Unknown {
                session: session_id.to_string(),
            }
            .into());
        };
        self.check_kernel_limit(session)?;
        if state
            .session_usage(session)
            .loaded_bytes
            .saturating_add(bytes)
            > self.limits.max_loaded_bytes_per_session
        {
            return Err(Error::LimitExceeded {
                limit: "max_loaded_bytes_per_session",
                value: self.limits.max_loaded_bytes_per_session,
            });
        }
        let mut reclaimed_dead = false;
        loop {
            let usage = state.tenant_usage(tenant);
            let new_for_tenant = cached.is_none_or(|h| !state.tenant_holds(tenant, h));
            let (slots, bytes_for_tenant) = if new_for_tenant { (1, bytes) } else { (0, 0) };
            // Daemon-wide limits first, then the tenant's share.
            let over = if cached.is_none() && state.slots.used() >= state.slots.capacity() {
                Some(Error::Slot(SlotError::BankFull {
                    capacity: state.slots.capacity(),
                }))
            } else if cached.is_none()
                && state.slots.loaded_bytes().saturating_add(bytes) > self.limits.max_loaded_bytes
            {
                Some(Error::LimitExceeded {
                    limit: "max_loaded_bytes",
                    value: self.limits.max_loaded_bytes,
                })
            } else if usage.slots + slots > self.limits.max_slots_per_uid {
                Some(Error::LimitExceeded {
                    limit: "max_slots_per_uid",
                    value: self.limits.max_slots_per_uid.into(),
                })
            } else if usage.loaded_bytes.saturating_add(bytes_for_tenant)
                > self.limits.max_loaded_bytes_per_uid
            {
                Some(Error::LimitExceeded {
                    limit: "max_loaded_bytes_per_uid",
                    value: self.limits.max_loaded_bytes_per_uid,
                })
            } else {
                None
            };
            let Some(refusal) = over else {
                return Ok(());
            };
            // Dead generations first (nobody can use them), then the
            // tenant's own idle kernels, least recently used first.
            if !reclaimed_dead {
                reclaimed_dead = true;
                let freed = state.slots.reclaim_dead(State::is_live(&state.devices));
                if !freed.is_empty() {
                    tracing::info!(slots = freed.len(), "reclaimed slots of dead generations");
                    continue;
                }
            }
            if !state.evict_idle(tenant, self.idle_reclaim_after, cached, cleanup) {
                return Err(refusal);
            }
        }
    }

    fn cache_scope_of(&self, tenant: Tenant) -> Option<Tenant> {
        match self.cache_scope {
            CacheScope::Node => None,
            CacheScope::Uid => Some(tenant),
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn load_locked(
        &self,
        session_id: &SessionId,
        peer: Caller,
        device_index: usize,
        hash: [u8; 32],
        request: &api::LoadKernelRequest,
        signature: Signature,
        exec_kind: ExecArtifactKind,
        started: Instant,
    ) -> Result<api::LoadKernelResponse, Error> {
        let tenant = peer.tenant();
        let bytes = request.artifact.len() as u64;
        let scope = self.cache_scope_of(tenant);
        let mut evicted: Cleanup = Vec::new();
        let checked = {
            let mut state = self.lock();
            self.load_check(
                &mut state,
                session_id,
                peer,
                device_index,
                hash,
                request,
                &signature,
                exec_kind,
                scope,
                started,
                &mut evicted,
            )
        };
        run_cleanup(std::mem::take(&mut evicted)).await;
        let (link, generation) = match checked? {
            LoadCheck::Cached(response) => return Ok(response),
            LoadCheck::Compile { link, generation } => (link, generation),
        };

        let module_id = self.next_module.fetch_add(1, Ordering::Relaxed);
        let op = Op::LoadModule(exec::LoadModule {
            module_id,
            kind: exec_kind as i32,
            artifact: request.artifact.clone(),
            symbol: request.symbol.clone(),
            inputs: signature.inputs,
            scalar_params: signature.scalar_params,
            element_sizes: signature.element_sizes.clone(),
            reqntid: signature.reqntid.unwrap_or(0),
            maxntid: signature.maxntid.unwrap_or(0),
        });
        let device_uuid = link
            .hello
            .devices
            .first()
            .map(|d| d.uuid.clone())
            .unwrap_or_default();
        let undo = Op::UnloadModule(exec::UnloadModule { module_id });
        let result = side_effect(
            &*link,
            &device_uuid,
            op,
            undo,
            |reply| match reply {
                reply::Result::LoadModule(ok) => Ok(ok.block_size),
                _ => Err(ExecutorError::UnexpectedReply("LoadModule").into()),
            },
            |block_size| {
                let block_size = if block_size > 0 {
                    block_size
                } else {
                    signature.reqntid.unwrap_or(DEFAULT_BLOCK)
                };
                let kernel = LoadedKernel {
                    module_id,
                    device_index,
                    device_uuid: device_uuid.clone(),
                    generation,
                    artifact_hash: hash,
                    kind: exec_kind as i32,
                    symbol: request.symbol.clone(),
                    label: request.label.chars().take(256).collect(),
                    signature: signature.clone(),
                    block_size,
                    artifact_bytes: bytes,
                    scope,
                };
                let mut state = self.lock();
                state.recheck(session_id, device_index, generation, &device_uuid)?;
                // Quotas again: another load may have taken the room.
                self.make_room(&mut state, session_id, tenant, None, bytes, &mut evicted)?;
                let State {
                    slots,
                    devices,
                    sessions,
                    ..
                } = &mut *state;
                let (handle, kernel) = slots.insert(kernel, session_id, State::is_live(devices))?;
                let session = sessions
                    .get_mut(session_id)
                    .ok_or_else(|| Error::Internal {
                        message: "session vanished under the lock".into(),
                    })?;
                let token = session.kernels.issue(handle);
                Ok(load_response(
                    token, &handle, &kernel, false, started, self.boot,
                ))
            },
        )
        .await;
        run_cleanup(evicted).await;
        result
    }

    /// The check before a load: a cache hit is answered at once (the
    /// session gets its own handle for the shared slot); otherwise room is
    /// made and the load goes to the executor.
    #[allow(clippy::too_many_arguments)]
    fn load_check(
        &self,
        state: &mut State,
        session_id: &SessionId,
        peer: Caller,
        device_index: usize,
        hash: [u8; 32],
        request: &api::LoadKernelRequest,
        signature: &Signature,
        exec_kind: ExecArtifactKind,
        scope: Option<Tenant>,
        started: Instant,
        evicted: &mut Cleanup,
    ) -> Result<LoadCheck, Error> {
        Self::refuse_if_draining(state)?;
        let tenant = peer.tenant();
        state.session(session_id, peer)?;
        let (link, generation) = state.link(device_index)?;
        let key = ContentKey {
            generation,
            artifact_hash: hash,
            kind: exec_kind as i32,
            symbol: request.symbol.clone(),
            signature: signature.clone(),
            scope,
        };
        let bytes = request.artifact.len() as u64;
        let cached = state.slots.cached(&key, State::is_live(&state.devices));
        if let Some(handle) = cached {
            // Loading a kernel the session already holds is idempotent.
            let already = state
                .sessions
                .get(session_id)
                .and_then(|s| s.kernels.token_of(&handle));
            if already.is_none() {
                self.make_room(state, session_id, tenant, Some(&handle), bytes, evicted)?;
            }
            let State {
                slots,
                devices,
                sessions,
                ..
            } = &mut *state;
            if let Some((handle, kernel)) =
                slots.hold_cached(&key, session_id, State::is_live(devices))
            {
                let session = sessions
                    .get_mut(session_id)
                    .ok_or_else(|| Error::Internal {
                        message: "session vanished under the lock".into(),
                    })?;
                let token = session.kernels.issue(handle);
                return Ok(LoadCheck::Cached(load_response(
                    token, &handle, &kernel, true, started, self.boot,
                )));
            }
        }
        self.make_room(state, session_id, tenant, None, bytes, evicted)?;
        Ok(LoadCheck::Compile { link, generation })
    }

    /// UnloadKernel.
    pub async fn unload_kernel(
        &self,
        session_id: &str,
        kernel: &str,
        peer: Caller,
    ) -> Result<api::UnloadKernelResponse, Error> {
        let session_id = parse_session(session_id)?;
        let handle = KernelRef::parse(kernel)?;
        let cleanup = {
            let mut state = self.lock();
            let session = state.session_mut(&session_id, peer)?;
            let internal = (handle.boot == self.boot)
                .then(|| session.kernels.remove_token(handle.token))
                .flatten();
            let Some(internal) = internal else {
                return Err(stale_kernel(kernel, self.boot, &handle));
            };
            let mut cleanup: Cleanup = Vec::new();
            // Its slot may have been reclaimed after its generation died:
            // then the session's hold is simply gone.
            if let Ok(released) = state.slots.release(&internal, &session_id) {
                queue_unload(&state.devices, released, &mut cleanup);
            }
            cleanup
        };
        let slot_freed = !cleanup.is_empty();
        run_cleanup(cleanup).await;
        self.changed();
        Ok(api::UnloadKernelResponse { slot_freed })
    }

    /// ListKernels.
    pub fn list_kernels(
        &self,
        session_id: &str,
        peer: Caller,
    ) -> Result<api::ListKernelsResponse, Error> {
        let session_id = parse_session(session_id)?;
        let state = self.lock();
        let session = state.session(&session_id, peer)?;
        let is_live = State::is_live(&state.devices);
        let kernels = state
            .slots
            .held_by(&session_id)
            .into_iter()
            .filter_map(|held| {
                let token = session.kernels.token_of(&held.handle)?;
                Some(api::KernelInfo {
                    kernel: KernelRef {
                        token,
                        generation: held.handle.generation,
                        boot: self.boot,
                    }
                    .to_string(),
                    symbol: held.kernel.symbol.clone(),
                    label: held.kernel.label.clone(),
                    device_uuid: held.kernel.device_uuid.clone(),
                    generation: held.kernel.generation.0,
                    signature: Some(signature_proto(
                        &held.kernel.signature,
                        held.kernel.block_size,
                    )),
                    live: is_live(held.kernel.generation),
                    artifact_hash: hex(&held.kernel.artifact_hash),
                    references: held.holders,
                })
            })
            .collect();
        Ok(api::ListKernelsResponse { kernels })
    }

    /// RegisterBuffer.
    pub async fn register_buffer(
        &self,
        request: api::RegisterBufferRequest,
        peer: Caller,
    ) -> Result<api::RegisterBufferResponse, Error> {
        use api::register_buffer_request::Source;
        let session_id = parse_session(&request.session)?;
        if request.size == 0 {
            return Err(Error::InvalidArgument {
                field: "size",
                message: "a buffer has at least one byte".into(),
            });
        }
        let (source, claimed_uuid) = match request.source {
            Some(Source::CudaIpc(ipc)) => {
                // The executor opens the handle with the daemon's rights,
                // not the caller's: without an identity there is no one to
                // act for.
                if peer.credentials().is_none() {
                    return Err(Error::IdentityRequired {
                        resource: "cuda_ipc",
                    });
                }
                if ipc.handle.len() != 64 {
                    return Err(Error::InvalidArgument {
                        field: "cuda_ipc.handle",
                        message: format!("a CUipcMemHandle is 64 bytes, not {}", ipc.handle.len()),
                    });
                }
                if ipc.device_uuid.is_empty() {
                    return Err(Error::InvalidArgument {
                        field: "cuda_ipc.device_uuid",
                        message: "name the device that owns the allocation".into(),
                    });
                }
                (
                    BufferSource::CudaIpc { handle: ipc.handle },
                    Some(ipc.device_uuid),
                )
            }
            Some(Source::HostShm(shm)) => {
                // Who may map a shared-memory name depends on who asks: a
                // caller without credentials would borrow the daemon's.
                if peer.credentials().is_none() {
                    return Err(Error::IdentityRequired {
                        resource: "host_shm",
                    });
                }
                validate_shm_name(&shm.name)?;
                let uuid = (!shm.device_uuid.is_empty()).then_some(shm.device_uuid);
                (BufferSource::HostShm { name: shm.name }, uuid)
            }
            None => {
                return Err(Error::InvalidArgument {
                    field: "source",
                    message: "set cuda_ipc or host_shm".into(),
                })
            }
        };
        let (id, index, link, generation, device_uuid) = {
            let mut state = self.lock();
            Self::refuse_if_draining(&state)?;
            let session = state.session(&session_id, peer)?;
            self.check_buffer_limits(&state, session, request.size)?;
            let index = match &claimed_uuid {
                Some(uuid) => state.device_by_uuid(uuid)?,
                None => 0,
            };
            let (link, generation) = state.link(index)?;
            let device_uuid = state.devices[index].desc.uuid.clone();
            (
                BufferId(state.registry.next_id()),
                index,
                link,
                generation,
                device_uuid,
            )
        };
        let entry = BufferEntry {
            id,
            session: session_id.clone(),
            label: request.label.chars().take(256).collect(),
            source,
            size: request.size,
            device_index: index,
            device_uuid: device_uuid.clone(),
            open_in: Some(generation),
            owner_uid: peer.credentials().map(|p| p.uid),
        };
        let op = open_buffer_op(&entry);
        let undo = Op::CloseBuffer(exec::CloseBuffer { buffer_id: id.0 });
        let token = side_effect(
            &*link,
            &device_uuid,
            op,
            undo,
            |reply| match reply {
                reply::Result::OpenBuffer(ok) if ok.device_uuid == device_uuid => Ok(()),
                reply::Result::OpenBuffer(ok) => Err(Error::DeviceMismatch {
                    operand: "buffer".into(),
                    kernel_device: device_uuid.clone(),
                    operand_device: ok.device_uuid,
                }),
                _ => Err(ExecutorError::UnexpectedReply("OpenBuffer").into()),
            },
            |()| {
                let mut state = self.lock();
                state.recheck(&session_id, index, generation, &device_uuid)?;
                let session = state.session(&session_id, peer)?;
                self.check_buffer_limits(&state, session, request.size)?;
                let State {
                    sessions, registry, ..
                } = &mut *state;
                let session = sessions
                    .get_mut(&session_id)
                    .ok_or_else(|| Error::Internal {
                        message: "session vanished under the lock".into(),
                    })?;
                let token = session.buffers.issue(entry.id);
                session.buffer_bytes += entry.size;
                registry.buffers.insert(entry.id, entry);
                Ok(token)
            },
        )
        .await?;
        self.changed();
        Ok(api::RegisterBufferResponse {
            buffer: BufferHandle {
                token,
                boot: self.boot,
            }
            .to_string(),
            device_uuid,
            generation: generation.0,
        })
    }

    fn check_kernel_limit(&self, session: &Session) -> Result<(), Error> {
        if session.kernels.len() as u64 >= u64::from(self.limits.max_kernels_per_session) {
            return Err(Error::LimitExceeded {
                limit: "max_kernels_per_session",
                value: self.limits.max_kernels_per_session.into(),
            });
        }
        Ok(())
    }

    fn check_event_limit(&self, session: &Session) -> Result<(), Error> {
        if session.events_held.len() as u64 >= u64::from(self.limits.max_events_per_session) {
            return Err(Error::LimitExceeded {
                limit: "max_events_per_session",
                value: self.limits.max_events_per_session.into(),
            });
        }
        Ok(())
    }

    fn check_buffer_limits(
        &self,
        state: &State,
        session: &Session,
        size: u64,
    ) -> Result<(), Error> {
        if session.buffers.len() as u64 >= u64::from(self.limits.max_buffers_per_session) {
            return Err(Error::LimitExceeded {
                limit: "max_buffers_per_session",
                value: self.limits.max_buffers_per_session.into(),
            });
        }
        if session.buffer_bytes.saturating_add(size) > self.limits.max_buffer_bytes_per_session {
            return Err(Error::LimitExceeded {
                limit: "max_buffer_bytes_per_session",
                value: self.limits.max_buffer_bytes_per_session,
            });
        }
        if state.tenant_buffers(session.tenant()) >= self.limits.max_buffers_per_uid {
            return Err(Error::LimitExceeded {
                limit: "max_buffers_per_uid",
                value: self.limits.max_buffers_per_uid.into(),
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
            let session = state.session_mut(&session_id, peer)?;
            if handle.boot != self.boot {
                return Err(stale_buffer(buffer, "minted by another daemon boot"));
            }
            let Some(id) = session.buffers.remove_token(handle.token) else {
                return Err(Registry::unknown("buffer", buffer).into());
            };
            let entry = state.registry.buffers.remove(&id);
            let mut cleanup: Cleanup = Vec::new();
            if let Some(entry) = entry {
                if let Some(session) = state.sessions.get_mut(&session_id) {
                    session.buffer_bytes = session.buffer_bytes.saturating_sub(entry.size);
                }
                if let Some(link) = close_target(&state.devices, entry.device_index, entry.open_in)
                {
                    cleanup.push((link, Op::CloseBuffer(exec::CloseBuffer { buffer_id: id.0 })));
                }
            }
            cleanup
        };
        run_cleanup(cleanup).await;
        self.changed();
        Ok(())
    }

    /// ListBuffers.
    pub fn list_buffers(
        &self,
        session_id: &str,
        peer: Caller,
    ) -> Result<api::ListBuffersResponse, Error> {
        let session_id = parse_session(session_id)?;
        let state = self.lock();
        let session = state.session(&session_id, peer)?;
        let mut buffers: Vec<(BufferId, api::BufferInfo)> = session
            .buffers
            .iter()
            .filter_map(|(token, id)| Some((token, state.registry.buffers.get(&id)?)))
            .map(|(token, entry)| {
                let info = api::BufferInfo {
                    buffer: BufferHandle {
                        token,
                        boot: self.boot,
                    }
                    .to_string(),
                    label: entry.label.clone(),
                    kind: entry.source.kind().to_string(),
                    device_uuid: entry.device_uuid.clone(),
                    size: entry.size,
                    generation: entry.open_in.map(|g| g.0).unwrap_or(0),
                    live: entry.open_in.is_some(),
                };
                (entry.id, info)
            })
            .collect();
        // In registration order.
        buffers.sort_by_key(|(id, _)| *id);
        Ok(api::ListBuffersResponse {
            buffers: buffers.into_iter().map(|(_, info)| info).collect(),
        })
    }

    /// RegisterEvent.
    pub async fn register_event(
        &self,
        request: api::RegisterEventRequest,
        peer: Caller,
    ) -> Result<api::RegisterEventResponse, Error> {
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
            Self::refuse_if_draining(&state)?;
            self.check_event_limit(state.session(&session_id, peer)?)?;
            let index = if request.device_uuid.is_empty() {
                0
            } else {
                state.device_by_uuid(&request.device_uuid)?
            };
            let (link, generation) = state.link(index)?;
            let uuid = state.devices[index].desc.uuid.clone();
            (
                EventId(state.registry.next_id()),
                index,
                link,
                generation,
                uuid,
            )
        };
        let op = Op::OpenEvent(exec::OpenEvent {
            event_id: id.0,
            handle: request.handle.clone(),
        });
        let undo = Op::CloseEvent(exec::CloseEvent { event_id: id.0 });
        let token = side_effect(
            &*link,
            &device_uuid,
            op,
            undo,
            |reply| match reply {
                reply::Result::Ok(_) => Ok(()),
                _ => Err(ExecutorError::UnexpectedReply("OpenEvent").into()),
            },
            |()| {
                let mut state = self.lock();
                state.recheck(&session_id, index, generation, &device_uuid)?;
                self.check_event_limit(state.session(&session_id, peer)?)?;
                let State {
                    sessions, registry, ..
                } = &mut *state;
                let session = sessions
                    .get_mut(&session_id)
                    .ok_or_else(|| Error::Internal {
                        message: "session vanished under the lock".into(),
                    })?;
                let token = session.events_held.issue(id);
                registry.events.insert(
                    id,
                    EventEntry {
                        id,
                        session: session_id.clone(),
                        label: request.label.chars().take(256).collect(),
                        handle: request.handle,
                        device_index: index,
                        device_uuid: device_uuid.clone(),
                        open_in: Some(generation),
                    },
                );
                Ok(token)
            },
        )
        .await?;
        Ok(api::RegisterEventResponse {
            event: EventHandle {
                token,
                boot: self.boot,
            }
            .to_string(),
        })
    }

    /// ReleaseEvent.
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
            let session = state.session_mut(&session_id, peer)?;
            if handle.boot != self.boot {
                return Err(invalid_event(event));
            }
            // A dead (not re-opened) event may still be released: check
            // ownership only, not liveness.
            let Some(id) = session.events_held.remove_token(handle.token) else {
                return Err(Registry::unknown("event", event).into());
            };
            let mut cleanup: Cleanup = Vec::new();
            if let Some(entry) = state.registry.events.remove(&id) {
                if let Some(link) = close_target(&state.devices, entry.device_index, entry.open_in)
                {
                    cleanup.push((link, Op::CloseEvent(exec::CloseEvent { event_id: id.0 })));
                }
            }
            cleanup
        };
        run_cleanup(cleanup).await;
        Ok(())
    }

    /// Launch: checks every operand, then hands the launch to the executor.
    pub async fn launch(
        &self,
        request: &api::LaunchRequest,
        peer: Caller,
    ) -> Result<api::LaunchResponse, Error> {
        let started = Instant::now();
        let (link, op, device_uuid, _inflight) = self.check_launch(request, peer)?;
        match link
            .call(op)
            .await
            .map_err(|e| down_to_error(&device_uuid, e))?
        {
            reply::Result::Ok(_) => {}
            reply::Result::Failure(failure) => return Err(ExecutorError::from(failure).into()),
            _ => return Err(ExecutorError::UnexpectedReply("Launch").into()),
        }
        Ok(api::LaunchResponse {
            tag: request.tag,
            micros: started.elapsed().as_micros() as u64,
            error: None,
        })
    }

    fn check_launch(
        &self,
        request: &api::LaunchRequest,
        peer: Caller,
    ) -> Result<(Arc<ExecutorLink>, Op, String, InflightLaunch), Error> {
        let session_id = parse_session(&request.session)?;
        let handle = KernelRef::parse(&request.kernel)?;
        let state = self.lock();
        Self::refuse_if_draining(&state)?;
        let session = state.session(&session_id, peer)?;
        self.executor.kernel_timeouts.check(session.stream)?;
        let internal = (handle.boot == self.boot)
            .then(|| session.kernels.get(handle.token))
            .flatten()
            .ok_or_else(|| stale_kernel(&request.kernel, self.boot, &handle))?;
        let kernel = state
            .slots
            .resolve(&internal, &session_id, State::is_live(&state.devices))
            .map_err(|why| SlotError::Stale {
                handle: request.kernel.chars().take(96).collect(),
                why,
            })?;
        let signature = &kernel.signature;
        if request.inputs.len() != signature.inputs as usize {
            return Err(Error::LaunchArity {
                what: "inputs",
                expected: signature.inputs,
                found: request.inputs.len() as u32,
            });
        }
        if request.params.len() != signature.scalar_params as usize {
            return Err(Error::LaunchArity {
                what: "scalar params",
                expected: signature.scalar_params,
                found: request.params.len() as u32,
            });
        }
        let output = request
            .output
            .as_ref()
            .ok_or_else(|| Error::InvalidArgument {
                field: "output",
                message: "a launch needs an output".into(),
            })?;
        if request.n > i64::MAX as u64 {
            return Err(Error::InvalidArgument {
                field: "n",
                message: "n must fit a long long".into(),
            });
        }
        let device = state
            .devices
            .get(kernel.device_index)
            .ok_or_else(|| Error::Internal {
                message: "kernel names a device the front does not have".into(),
            })?;
        let kernel_at = device.at_generation(kernel.generation);
        let operands = request
            .inputs
            .iter()
            .enumerate()
            .map(|(i, o)| (format!("input {i}"), o))
            .chain([("output".to_string(), output)]);
        let mut checked = Vec::with_capacity(request.inputs.len() + 1);
        for ((name, operand), element_size) in operands.zip(signature.element_sizes.iter().copied())
        {
            let handle = BufferHandle::parse(&operand.buffer)?;
            if handle.boot != self.boot {
                return Err(stale_buffer(
                    &operand.buffer,
                    "minted by another daemon boot",
                ));
            }
            let id = session
                .buffers
                .get(handle.token)
                .ok_or_else(|| Registry::unknown("buffer", &operand.buffer))?;
            let entry = state.registry.buffer(id, &session_id, &operand.buffer)?;
            if entry.device_index != kernel.device_index || entry.open_in != Some(kernel.generation)
            {
                let operand_device = match (state.devices.get(entry.device_index), entry.open_in) {
                    (Some(d), Some(g)) => d.at_generation(g),
                    _ => entry.device_uuid.clone(),
                };
                return Err(Error::DeviceMismatch {
                    operand: name,
                    kernel_device: kernel_at,
                    operand_device,
                });
            }
            if element_size > 1 && operand.offset % u64::from(element_size) != 0 {
                return Err(Error::InvalidArgument {
                    field: "offset",
                    message: format!(
                        "{name}: offset {} is not a multiple of the element size {element_size}",
                        operand.offset
                    ),
                });
            }
            let needed =
                u128::from(operand.offset) + u128::from(request.n) * u128::from(element_size);
            if needed > u128::from(entry.size) {
                return Err(Error::BufferTooSmall {
                    operand: name,
                    needed_bytes: needed,
                    buffer_bytes: entry.size,
                });
            }
            checked.push(exec::LaunchOperand {
                buffer_id: id.0,
                offset: operand.offset,
            });
        }
        let output = checked.pop().ok_or_else(|| Error::Internal {
            message: "signature without an output".into(),
        })?;
        if checked.len() != signature.inputs as usize {
            return Err(Error::Internal {
                message: "signature element sizes do not cover every operand".into(),
            });
        }
        let wait_event =
            self.check_event(&state, &request.wait_event, session, &kernel, "wait_event")?;
        let signal_event = self.check_event(
            &state,
            &request.signal_event,
            session,
            &kernel,
            "signal_event",
        )?;
        let link = device
            .live_link()
            .filter(|l| l.generation == kernel.generation)
            .cloned()
            .ok_or_else(|| {
                Error::from(ExecutorError::Unavailable {
                    device: device.desc.uuid.clone(),
                    cause: "down".into(),
                })
            })?;
        let op = Op::Launch(exec::Launch {
            module_id: kernel.module_id,
            inputs: checked,
            output: Some(output),
            n: request.n,
            // The scalar ABI's params are f32; doubles narrow with rounding
            // (out-of-range magnitudes become infinities, as in C).
            params: request.params.iter().map(|&p| p as f32).collect(),
            stream: session.stream,
            wait_event,
            signal_event,
            sync: request.sync,
        });
        let inflight =
            session
                .inflight
                .clone()
                .try_read_owned()
                .map_err(|_| SessionError::Unknown {
                    session: session_id.to_string(),
                })?;
        Ok((link, op, device.desc.uuid.clone(), inflight))
    }

    fn check_event(
        &self,
        state: &State,
        text: &str,
        session: &Session,
        kernel: &LoadedKernel,
        field: &'static str,
    ) -> Result<u64, Error> {
        if text.is_empty() {
            return Ok(0);
        }
        let handle = EventHandle::parse(text)?;
        if handle.boot != self.boot {
            return Err(invalid_event(text));
        }
        let id = session
            .events_held
            .get(handle.token)
            .ok_or_else(|| Registry::unknown("event", text))?;
        let entry = state.registry.event(id, &session.id, text)?;
        if entry.device_index != kernel.device_index || entry.open_in != Some(kernel.generation) {
            return Err(Error::DeviceMismatch {
                operand: field.to_string(),
                kernel_device: kernel.device_uuid.clone(),
                operand_device: entry.device_uuid.clone(),
            });
        }
        Ok(id.0)
    }

    /// Begins the drain: refuses new work, tells every session and ends
    /// their lease streams.
    pub fn begin_drain(&self, reason: &str) {
        let mut state = self.lock();
        state.draining = true;
        self.drain.send_replace(true);
        let event = api::SessionEvent {
            event: Some(session_event::Event::Draining(api::Draining {
                reason: reason.to_string(),
            })),
        };
        for session in state.sessions.values() {
            let _ = session.events.try_send(Ok(event.clone()));
        }
        self.publish_availability(&state);
    }

    /// Ends every session's lease stream (after the drain notice).
    pub fn end_leases(&self) {
        let mut state = self.lock();
        for session in state.sessions.values_mut() {
            // Replace the sender: the lease stream ends once the queued
            // events are read.
            let (closed, _) = mpsc::channel(1);
            session.events = closed;
        }
    }

    /// Releases every session and stops every executor.
    pub async fn shutdown(&self, grace: Duration) {
        // The executors release every module, mapping, event and stream when
        // they stop, so the sessions are dropped here without a clean-up
        // request per object (a hung executor would make that take minutes).
        let links: Vec<Arc<ExecutorLink>> = {
            let mut state = self.lock();
            state.draining = true;
            let sessions = std::mem::take(&mut state.sessions);
            for id in sessions.keys() {
                for held in state.slots.held_by(id) {
                    let _ = state.slots.release(&held.handle, id);
                }
            }
            state.registry = Registry::default();
            state
                .devices
                .iter_mut()
                .filter_map(|d| d.link.take())
                .collect()
        };
        futures_util::future::join_all(links.iter().map(|l| l.shutdown(grace))).await;
        self.changed();
    }
}

/// Gauges for metrics.
#[derive(Debug, Clone, Default)]
pub struct Gauges {
    pub sessions: u64,
    pub buffers: u64,
    pub buffer_bytes: u64,
    pub slots_used: u64,
    /// Artifact bytes loaded in the executors, and their limit.
    pub loaded_bytes: u64,
    pub loaded_bytes_limit: u64,
    /// (uuid, generation, restarts)
    pub devices: Vec<(String, u64, u64)>,
}

fn select_devices(
    devices: &[DeviceDesc],
    spec: &str,
) -> Result<Vec<(DeviceDesc, ExecutorCommand)>, StartError> {
    let chosen: Vec<&DeviceDesc> = if spec.trim() == "all" {
        devices.iter().collect()
    } else {
        let mut chosen = Vec::new();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let device = devices
                .iter()
                .find(|d| d.uuid == item || d.ordinal.to_string() == item)
                .ok_or_else(|| StartError::NoMatchingDevice(item.to_string()))?;
            chosen.push(device);
        }
        chosen
    };
    if chosen.is_empty() {
        return Err(StartError::NoMatchingDevice(spec.to_string()));
    }
    Ok(chosen
        .into_iter()
        .map(|d| {
            (
                d.clone(),
                ExecutorCommand::Cuda {
                    uuid: d.uuid.clone(),
                },
            )
        })
        .collect())
}

fn open_buffer_op(entry: &BufferEntry) -> Op {
    let source = match &entry.source {
        BufferSource::CudaIpc { handle } => open_buffer::Source::CudaIpc(handle.clone()),
        BufferSource::HostShm { name } => open_buffer::Source::ShmName(name.clone()),
    };
    Op::OpenBuffer(exec::OpenBuffer {
        buffer_id: entry.id.0,
        source: Some(source),
        size: entry.size,
        claimed_device_uuid: entry.device_uuid.clone(),
        owner_uid: entry.owner_uid,
    })
}

/// The live executor that holds a mapping opened in `open_in`, if any.
fn close_target(
    devices: &[DeviceState],
    index: usize,
    open_in: Option<DeviceGeneration>,
) -> Option<Arc<ExecutorLink>> {
    let device = devices.get(index)?;
    let link = device.live_link()?;
    (Some(link.generation) == open_in).then(|| link.clone())
}

/// Queues the unload of a kernel whose last hold was just released, in the
/// executor that loaded it (nothing when that generation is dead).
fn queue_unload(devices: &[DeviceState], released: crate::slots::Released, cleanup: &mut Cleanup) {
    if let Some(kernel) = released.freed {
        if let Some(link) = close_target(devices, kernel.device_index, Some(kernel.generation)) {
            cleanup.push((
                link,
                Op::UnloadModule(exec::UnloadModule {
                    module_id: kernel.module_id,
                }),
            ));
        }
    }
}

async fn run_cleanup(cleanup: Cleanup) {
    for (link, op) in cleanup {
        undo_in(&*link, op).await;
    }
}

/// What the front needs of an executor for a side effect (a seam for
/// testing [`side_effect`] without a child process).
pub(crate) trait Executor {
    fn call(
        &self,
        op: Op,
    ) -> impl std::future::Future<Output = Result<reply::Result, LinkError>> + Send;
}

impl Executor for ExecutorLink {
    fn call(
        &self,
        op: Op,
    ) -> impl std::future::Future<Output = Result<reply::Result, LinkError>> + Send {
        ExecutorLink::call(self, op)
    }
}

/// Sends a clean-up or undo request; failures are logged, never returned
/// (the executor, or its death, releases the object anyway).
async fn undo_in<E: Executor>(executor: &E, op: Op) {
    match tokio::time::timeout(CLEANUP_TIMEOUT, executor.call(op)).await {
        Ok(Ok(reply::Result::Failure(f))) => {
            tracing::warn!(message = %f.message, "executor clean-up failed")
        }
        Ok(Err(e)) => tracing::debug!(error = %e, "executor gone during clean-up"),
        Err(_) => tracing::warn!("executor clean-up timed out"),
        Ok(Ok(_)) => {}
    }
}

/// The one path for a side effect in an executor: the caller has checked
/// under the state lock; this sends `op` (unlocked), reads a success reply
/// with `accept`, then `commit` re-checks and records under the lock. When
/// `accept` or `commit` refuses, `undo` goes to the executor before the
/// refusal is returned, so the executor never keeps an object the front did
/// not record (two registrations racing for the last place under a limit:
/// both pass the check, both open, the second's commit fails and is undone).
/// A failure reply or a dead executor needs no undo: nothing was opened, or
/// everything the executor held is gone with it.
async fn side_effect<E: Executor, R, T>(
    executor: &E,
    device_uuid: &str,
    op: Op,
    undo: Op,
    accept: impl FnOnce(reply::Result) -> Result<R, Error>,
    commit: impl FnOnce(R) -> Result<T, Error>,
) -> Result<T, Error> {
    let reply = executor
        .call(op)
        .await
        .map_err(|e| down_to_error(device_uuid, e))?;
    if let reply::Result::Failure(failure) = reply {
        return Err(ExecutorError::from(failure).into());
    }
    let outcome = accept(reply).and_then(commit);
    if outcome.is_err() {
        undo_in(executor, undo).await;
    }
    outcome
}

/// What the check before a load decided.
#[derive(Debug)]
enum LoadCheck {
    /// A cache hit, already held by the session.
    Cached(api::LoadKernelResponse),
    /// Room is made: compile in this executor.
    Compile {
        link: Arc<ExecutorLink>,
        generation: DeviceGeneration,
    },
}

fn parse_session(text: &str) -> Result<SessionId, Error> {
    if text.is_empty() {
        return Err(Error::InvalidArgument {
            field: "session",
            message: "open a session first (OpenSession)".into(),
        });
    }
    Ok(SessionId::parse(text)?)
}

fn validate_symbol(symbol: &str) -> Result<(), Error> {
    let ok = !symbol.is_empty()
        && symbol.len() <= 1024
        && symbol
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidArgument {
            field: "symbol",
            message: "a symbol is 1 to 1024 characters of [A-Za-z0-9_$.]".into(),
        })
    }
}

fn validate_shm_name(name: &str) -> Result<(), Error> {
    let ok = name.len() >= 2
        && name.len() <= 255
        && name.starts_with('/')
        && !name[1..].contains('/')
        && !name.contains('\0');
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidArgument {
            field: "host_shm.name",
            message:
                "a POSIX shared-memory name is '/' then 1 to 254 characters without '/' or NUL"
                    .into(),
        })
    }
}

fn stale_buffer(handle: &str, why: &'static str) -> Error {
    crate::buffers::RegistryError::Stale {
        kind: "buffer",
        handle: handle.chars().take(96).collect(),
        why,
    }
    .into()
}

/// The refusal for a kernel handle the session cannot use: one answer for
/// another session's live handle, a released one and a made-up one; only a
/// handle of another boot (which says so in its text) is told apart.
fn stale_kernel(text: &str, boot: BootId, handle: &KernelRef) -> Error {
    SlotError::Stale {
        handle: text.chars().take(96).collect(),
        why: if handle.boot == boot {
            StaleWhy::UnknownToSession
        } else {
            StaleWhy::OtherBoot
        },
    }
    .into()
}

fn invalid_event(handle: &str) -> Error {
    crate::buffers::RegistryError::Stale {
        kind: "event",
        handle: handle.chars().take(96).collect(),
        why: "minted by another daemon boot",
    }
    .into()
}

fn signature_proto(signature: &Signature, block_size: u32) -> api::KernelSignature {
    api::KernelSignature {
        inputs: signature.inputs,
        element_sizes: signature.element_sizes.clone(),
        scalar_params: signature.scalar_params,
        block_size,
        reqntid: signature.reqntid.unwrap_or(0),
        maxntid: signature.maxntid.unwrap_or(0),
    }
}

fn load_response(
    token: HandleToken,
    handle: &KernelHandle,
    kernel: &LoadedKernel,
    cache_hit: bool,
    started: Instant,
    boot: BootId,
) -> api::LoadKernelResponse {
    api::LoadKernelResponse {
        kernel: KernelRef {
            token,
            generation: handle.generation,
            boot,
        }
        .to_string(),
        signature: Some(signature_proto(&kernel.signature, kernel.block_size)),
        cache_hit,
        load_micros: started.elapsed().as_micros() as u64,
        device_uuid: kernel.device_uuid.clone(),
        generation: kernel.generation.0,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn shm_names_and_symbols_are_validated() {
        assert!(validate_shm_name("/ptxd-x").is_ok());
        for bad in ["", "/", "x", "/a/b", "/a\0b"] {
            assert!(validate_shm_name(bad).is_err(), "{bad:?}");
        }
        assert!(validate_shm_name(&format!("/{}", "a".repeat(300))).is_err());
        assert!(validate_symbol("add_f32_scalar").is_ok());
        assert!(validate_symbol("$L__x.1").is_ok());
        for bad in ["", "a b", "a\0", "ü"] {
            assert!(validate_symbol(bad).is_err(), "{bad:?}");
        }
    }

    /// An executor that opens and closes events, yielding in every call so
    /// that concurrent callers interleave between check and commit.
    #[derive(Default)]
    struct FakeExecutor {
        open: Mutex<std::collections::BTreeSet<u64>>,
        closes: AtomicU64,
        fail_opens: bool,
    }

    impl Executor for FakeExecutor {
        async fn call(&self, op: Op) -> Result<reply::Result, LinkError> {
            tokio::task::yield_now().await;
            let mut open = self.open.lock().unwrap();
            Ok(match op {
                Op::OpenEvent(_) if self.fail_opens => reply::Result::Failure(exec::Failure {
                    kind: exec::FailureKind::InvalidHandle as i32,
                    message: "no such event".into(),
                    ..Default::default()
                }),
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
            "HOST-0",
            Op::OpenEvent(exec::OpenEvent {
                event_id: id,
                handle: vec![0; 64],
            }),
            Op::CloseEvent(exec::CloseEvent { event_id: id }),
            |reply| match reply {
                reply::Result::Ok(_) => Ok(()),
                _ => Err(ExecutorError::UnexpectedReply("OpenEvent").into()),
            },
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
            "HOST-0",
            Op::OpenEvent(exec::OpenEvent {
                event_id: 9,
                handle: vec![0; 64],
            }),
            Op::CloseEvent(exec::CloseEvent { event_id: 9 }),
            |_| {
                Err(Error::DeviceMismatch {
                    operand: "buffer".into(),
                    kernel_device: "HOST-0".into(),
                    operand_device: "HOST-1".into(),
                })
            },
            |()| Ok(()),
        )
        .await;
        assert!(result.is_err());
        assert!(executor.open.lock().unwrap().is_empty());
        assert_eq!(executor.closes.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn device_selection_by_uuid_and_ordinal() {
        let devices: Vec<DeviceDesc> = (0..3)
            .map(|i| DeviceDesc {
                ordinal: i,
                uuid: format!("GPU-{i}"),
                ..Default::default()
            })
            .collect();
        assert_eq!(select_devices(&devices, "all").unwrap().len(), 3);
        let picked = select_devices(&devices, "GPU-2, 0").unwrap();
        assert_eq!(
            picked.iter().map(|(d, _)| d.ordinal).collect::<Vec<_>>(),
            vec![2, 0]
        );
        assert!(matches!(
            select_devices(&devices, "GPU-9"),
            Err(StartError::NoMatchingDevice(_))
        ));
    }
}
