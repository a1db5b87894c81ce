//! The front: the one owner of ptxd's state (sessions, the slot table, the
//! buffer registry, the devices and their executors) and the verbs that act
//! on it. The gRPC layer converts requests into calls of these verbs and
//! maps their results; the front knows nothing of tonic.
//!
//! The verbs live in child modules, each implementing part of [`Front`]:
//! - `lifecycle`: start, device choice, GetInfo, drain and shutdown;
//! - `supervise`: executor deaths, restarts, re-opening, generations;
//! - `sessions`: open, close and release of sessions;
//! - `kernels`: LoadKernel, UnloadKernel, ListKernels, the cache and quotas;
//! - `buffers`: buffers and events;
//! - `launch`: Launch, through [`crate::launch::check`];
//! - `ring`: OpenRing, and each ring's capability table in its executor;
//! - `fds`: tokens for what comes by descriptor, and the fd socket's half;
//! - `effects`: the one commit-or-undo path for executor side effects.
//!
//! Invariants (each kept in the module named):
//! - The state lock is never held across an `.await`: a verb checks under
//!   the lock, sends to the executor unlocked, and re-checks under the lock
//!   before it records the result (a session can close, or an executor die,
//!   in between). `State::recheck` is that re-check.
//! - A launch reaches an executor only after [`crate::launch::check`] passed
//!   it (`launch`).
//! - A device's generation changes only in `supervise::restart`, before the
//!   new executor's link is published, so nothing is ever recorded against a
//!   generation whose executor the front does not know.
//! - Each distinct (content, symbol, device generation, cache scope) compiles
//!   once: loads of the same content serialize on a per-content lock and the
//!   second finds the first's slot (`kernels`).
//! - Every side effect in an executor goes through `effects::side_effect`;
//!   nothing the executor opened is ever left unrecorded.
//! - Every refusal about a handle is the same for another session's live
//!   handle and a never-issued one (handles are per-session tokens; the
//!   registry and the slot table keep this).
//! - Per-tenant and daemon-wide quotas (sessions, slots, buffers, buffer
//!   bytes, buffers passed by descriptor, loaded artifact bytes) are
//!   checked at the check and again at the commit; a tenant over its share
//!   loses its own dead and idle kernels first, never another tenant's.
//! - A caller without credentials (TCP) never gets what depends on identity:
//!   host shared memory, memory passed by descriptor, trust for unverified
//!   machine code.

mod awaiting;
mod buffers;
mod effects;
mod fds;
mod kernels;
mod launch;
mod lifecycle;
mod ring;
mod sessions;
mod supervise;
pub mod verdict_cache;

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ptxd_proto::executor::DeviceDesc;
use tokio::sync::{mpsc, watch};

use crate::buffers::Registry;
use crate::config::{CacheScope, Limits, TrustList};
use crate::error::Error;
use crate::executor::supervisor::{DeathNotice, ExecutorCommand, ExecutorLink, LinkConfig};
use crate::executor::ExecutorError;
use crate::fd_tokens::FdTokens;
use crate::handles::{BootId, DeviceGeneration, GenerationCounter, SessionId};
use crate::observe::Observer;
use crate::ptx::{self, Signature};
use crate::sessions::{Caller, Session, SessionError, Tenant};
use crate::slots::SlotTable;

pub use buffers::{
    BufferListing, BufferOrigin, BufferRequest, EventRequest, RegisteredBuffer, Registration,
};
pub use fds::Attached;
pub use kernels::{
    ArtifactKind, DeclaredArtifactAbi, KernelListing, LoadRequest, LoadedKernelInfo,
    QUEUE_FACTOR as VERIFICATION_QUEUE_FACTOR,
};
pub use launch::{LaunchRequest, OperandRef};
pub use lifecycle::{DeviceReport, Info, StartError};
pub use ring::{OpenedRing, RingOpening, RingRequest};
pub use sessions::ReleasedCounts;

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

    /// This device at `generation`, as refusals name it.
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
    /// RegisterBuffer (posix_fd) calls waiting for their descriptor.
    fd_tokens: FdTokens<awaiting::Awaiting>,
}

impl State {
    fn is_live(devices: &[DeviceState]) -> impl Fn(DeviceGeneration) -> bool + '_ {
        move |generation| {
            devices
                .iter()
                .any(|d| d.generation == generation && d.live_link().is_some())
        }
    }

    fn refuse_if_draining(&self) -> Result<(), Error> {
        if self.draining {
            Err(Error::Draining)
        } else {
            Ok(())
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

    /// What `tenant`'s sessions hold together.
    fn tenant_usage(&self, tenant: Tenant) -> Usage {
        let mut usage = Usage::default();
        let mut held = std::collections::HashSet::new();
        for session in self.sessions.values().filter(|s| s.tenant() == tenant) {
            usage.sessions += 1;
            usage.buffers += self.registry.holdings(&session.id).buffers;
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

    /// What `tenant`'s sessions hold in the registry together: buffers,
    /// their bytes, and how many were passed by descriptor.
    fn tenant_holdings(&self, tenant: Tenant) -> crate::buffers::Holdings {
        let mut held = crate::buffers::Holdings::default();
        for session in self.sessions.values().filter(|s| s.tenant() == tenant) {
            let holdings = self.registry.holdings(&session.id);
            held.buffers += holdings.buffers;
            held.events += holdings.events;
            held.buffer_bytes = held.buffer_bytes.saturating_add(holdings.buffer_bytes);
            held.descriptors += holdings.descriptors;
        }
        held
    }

    /// The device a request names: by uuid, by ordinal, or the first.
    fn device_index(&self, choice: &DeviceChoice) -> Result<usize, Error> {
        match choice {
            DeviceChoice::First => Ok(0),
            DeviceChoice::Uuid(uuid) => self.device_by_uuid(uuid),
            DeviceChoice::Ordinal(ordinal) => self
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

    /// The live executor of device `index` and its generation.
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

/// Which device a request names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum DeviceChoice {
    /// The daemon's first device.
    #[default]
    First,
    Uuid(String),
    Ordinal(u32),
}

/// Loads of the same (device, content hash, symbol) serialize on one lock.
type LoadKey = (usize, [u8; 32], i32, String, Signature);

/// Accepted PTX texts whose canonical form is remembered (see
/// [`ptx::memo`]), and the bytes of client plus canonical text they may hold.
const CANONICAL_MEMO_ENTRIES: usize = 4096;
const CANONICAL_MEMO_BYTES: usize = 64 << 20;
/// Refused PTX texts whose refusal is remembered, in a table of their own
/// (a flood of hostile texts never evicts an accepted one): a refusal is a
/// few hundred bytes, so the byte bound is rarely the one that binds.
const REFUSAL_MEMO_ENTRIES: usize = 4096;
const REFUSAL_MEMO_BYTES: usize = 8 << 20;

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
    observer: Observer,
    executor: LinkConfig,
    /// Who may load unverified machine code.
    trust: TrustList,
    cache_scope: CacheScope,
    idle_reclaim_after: Duration,
    /// True once the drain began (ends open LaunchStreams).
    drain: watch::Sender<bool>,
    drain_timeout: Duration,
    /// Canonical texts of PTX accepted before, and refusals of PTX refused
    /// before, so a repeat does not parse and verify the same text again.
    canonical: Arc<ptx::memo::CanonicalMemo>,
    /// Verifications running or waiting, per tenant and in total.
    verifications: kernels::VerificationGate,
    /// Accepted verdicts kept on disk across restarts (with
    /// `--kernel-cache-dir`).
    verdicts: Option<Arc<verdict_cache::VerdictCache>>,
    /// The devices' hot spare executors (`--spare-executor`).
    spares: supervise::Spares,
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
    /// (uuid, whether its executor runs as a CUDA MPS client)
    pub mps: Vec<(String, bool)>,
    /// (uuid, whether the device has a live executor now)
    pub available: Vec<(String, bool)>,
}

impl Front {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every critical section leaves the state consistent before anything
        // that could panic, so a poisoned lock still guards valid state.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The daemon's spinning waits (`--front-spin`): the executor links'
    /// and the fd socket's share one bound.
    pub fn spinners(&self) -> std::sync::Arc<crate::spin::Spinners> {
        self.executor.spinners.clone()
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

    /// Gauges for metrics.
    pub fn gauges(&self) -> Gauges {
        let state = self.lock();
        let (buffers, buffer_bytes) = state.registry.buffer_totals();
        Gauges {
            sessions: state.sessions.len() as u64,
            buffers,
            buffer_bytes,
            slots_used: state.slots.used() as u64,
            loaded_bytes: state.slots.loaded_bytes(),
            loaded_bytes_limit: self.limits.max_loaded_bytes,
            devices: state
                .devices
                .iter()
                .map(|d| (d.desc.uuid.clone(), d.generation.0, d.restarts))
                .collect(),
            mps: state
                .devices
                .iter()
                .map(|d| (d.desc.uuid.clone(), d.mps_enabled()))
                .collect(),
            available: state
                .devices
                .iter()
                .map(|d| (d.desc.uuid.clone(), d.live_link().is_some()))
                .collect(),
        }
    }
}

/// The refusal of a registration or a kernel load once its session has
/// minted every ring index ([`crate::sessions::RingIndices`]): another
/// would name an object the session's ring may still name.
fn ring_indices_spent() -> Error {
    Error::LimitExceeded {
        limit: "ring_indices_per_session",
        value: u64::from(u32::MAX),
    }
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
