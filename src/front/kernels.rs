//! Kernels: LoadKernel, UnloadKernel, ListKernels, the kernel cache and the
//! quotas on what is loaded.
//!
//! Invariants:
//! - A PTX artifact is replaced by its canonical text (printed from the
//!   verified IR) before it is hashed, cached or sent to an executor: what
//!   compiles is what was verified.
//! - Machine code (cubin, fatbin) loads only for callers the operator
//!   trusts, with a declared ABI.
//! - Each distinct (content, symbol, signature, device generation, cache
//!   scope) compiles once; concurrent loads of one content serialize on its
//!   lock and the later ones find the first's slot.
//! - A load that would break a limit first reclaims dead slots, then the
//!   tenant's own idle kernels (least recently used), never another
//!   tenant's; otherwise it is refused with the limit it would break.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ptxd_proto::executor::{self as exec, ArtifactKind as ExecArtifactKind};

use super::effects::{queue_unload, run_cleanup, side_effect, Cleanup};
use super::ring::Grant;
use super::{parse_session, DeviceChoice, Front, State};
use crate::config::CacheScope;
use crate::error::Error;
use crate::executor::supervisor::ExecutorLink;
use crate::handles::{BootId, DeviceGeneration, HandleToken, KernelHandle, KernelRef, SessionId};
use crate::ptx::memo::Accepted;
use crate::ptx::{self, DeclaredAbi, LaunchContract, Signature};
use crate::sessions::{Caller, Session, SessionError, Tenant};
use crate::slots::{ContentKey, LoadedKernel, SlotError, StaleWhy};

/// What an artifact is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArtifactKind {
    Unspecified,
    Ptx,
    Cubin,
    Fatbin,
}

/// The ABI a client declares for machine code (PTX's is read from its text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeclaredArtifactAbi {
    pub inputs: u32,
    pub scalar_params: u32,
    /// Bytes per element of every operand.
    pub element_size: u32,
}

/// LoadKernel.
#[derive(Debug, Clone)]
pub struct LoadRequest {
    pub session: String,
    pub artifact: Vec<u8>,
    pub kind: ArtifactKind,
    pub symbol: String,
    pub label: String,
    pub declared: Option<DeclaredArtifactAbi>,
    pub device: DeviceChoice,
}

/// A kernel the session now holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedKernelInfo {
    /// The session's handle for it.
    pub kernel: String,
    pub signature: Signature,
    /// The launch contract launches are checked against.
    pub contract: Arc<LaunchContract>,
    pub block_size: u32,
    pub cache_hit: bool,
    pub load_micros: u64,
    pub device_uuid: String,
    pub generation: u64,
    /// How the session's ring names it.
    pub ring_index: u32,
}

/// One kernel a session holds, as ListKernels reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelListing {
    pub kernel: String,
    pub symbol: String,
    pub label: String,
    pub device_uuid: String,
    pub generation: u64,
    pub signature: Signature,
    /// The launch contract launches are checked against (its text form is
    /// what ListKernels will show).
    pub contract: Arc<LaunchContract>,
    pub block_size: u32,
    /// False once its generation died: it must be loaded again.
    pub live: bool,
    pub artifact_hash: [u8; 32],
    /// How many sessions hold its slot.
    pub references: u32,
}

/// What the check before a load decided.
#[derive(Debug)]
enum LoadCheck {
    /// A cache hit, already held by the session (and its ring grant).
    Cached(Box<(LoadedKernelInfo, Grant)>),
    /// Room is made: compile in this executor.
    Compile {
        link: Arc<ExecutorLink>,
        generation: DeviceGeneration,
    },
}

/// A load once its artifact is final (canonical PTX, or trusted machine
/// code) and its signature known.
#[derive(Debug)]
struct Prepared {
    session: SessionId,
    device_index: usize,
    hash: [u8; 32],
    artifact: Artifact,
    kind: ExecArtifactKind,
    symbol: String,
    label: String,
    signature: Signature,
    contract: Arc<LaunchContract>,
}

/// The final bytes of a load: PTX's canonical text, shared with the memo
/// (a cache hit copies nothing), or machine code as the client sent it.
#[derive(Debug)]
enum Artifact {
    Ptx(Arc<Accepted>),
    Machine(Vec<u8>),
}

impl Artifact {
    fn bytes(&self) -> &[u8] {
        match self {
            Artifact::Ptx(accepted) => accepted.canonical.text.as_bytes(),
            Artifact::Machine(bytes) => bytes,
        }
    }
}

impl State {
    /// What one session holds (sessions = 1).
    fn session_usage(&self, session: &Session) -> super::Usage {
        let loaded_bytes = session
            .kernels
            .values()
            .filter_map(|h| self.slots.occupant_of(&h))
            .map(|k| k.artifact_bytes)
            .sum();
        super::Usage {
            sessions: 1,
            slots: session.kernels.len() as u32,
            buffers: self.registry.holdings(&session.id).buffers,
            loaded_bytes,
        }
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
            let mut ring_index = None;
            if let Some(session) = self.sessions.get_mut(&id) {
                session.kernels.remove(&handle);
                ring_index = session.ring_indices.forget_kernel(&handle);
            }
            self.queue_revoke(&id, vec![], ring_index.into_iter().collect(), cleanup);
            if let Ok(released) = self.slots.release(&handle, &id) {
                queue_unload(&self.devices, released, cleanup);
            }
        }
        tracing::info!(%tenant, ?idle_for, "reclaimed an idle kernel of a tenant at its share");
        true
    }
}

impl Front {
    /// LoadKernel.
    pub async fn load_kernel(
        &self,
        request: LoadRequest,
        peer: Caller,
    ) -> Result<LoadedKernelInfo, Error> {
        let started = Instant::now();
        let load = self.prepare(request, peer).await?;
        let lock_key = (
            load.device_index,
            load.hash,
            load.kind as i32,
            load.symbol.clone(),
            load.signature.clone(),
        );
        let content_lock = {
            let mut locks = self.load_locks.lock().unwrap_or_else(|p| p.into_inner());
            locks.entry(lock_key.clone()).or_default().clone()
        };
        let result = {
            let _serialized = content_lock.lock().await;
            self.load_locked(&load, peer, started).await
        };
        {
            let mut locks = self.load_locks.lock().unwrap_or_else(|p| p.into_inner());
            // Only the map and this call hold it: nobody else is waiting.
            if Arc::strong_count(&content_lock) == 2 {
                locks.remove(&lock_key);
            }
        }
        result
    }

    /// Validates a load and makes its artifact final: PTX is verified and
    /// replaced by its canonical text; machine code needs trust and a
    /// declared ABI.
    async fn prepare(&self, request: LoadRequest, peer: Caller) -> Result<Prepared, Error> {
        let session = parse_session(&request.session)?;
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
        let device_index = {
            let state = self.lock();
            state.refuse_if_draining()?;
            self.check_kernel_limit(state.session(&session, peer)?)?;
            state.device_index(&request.device)?
        };
        let LoadRequest {
            artifact,
            kind,
            symbol,
            label,
            declared,
            ..
        } = request;
        let (artifact, signature, contract, kind) = match kind {
            ArtifactKind::Ptx => {
                let declared_abi = declared.map(|d| DeclaredAbi {
                    inputs: d.inputs,
                    scalar_params: d.scalar_params,
                });
                // Bytes seen before are looked up here, on this thread,
                // before any UTF-8 check: a repeat, accepted or refused,
                // costs one hash, not a verification or a hop to a blocking
                // thread and back. Only new text is verified, off the async
                // workers, under the tenant's share of the verifier threads;
                // a verdict kept on disk (the verdict cache) is read there
                // instead of verifying again.
                let accepted = match self.canonical.lookup(&artifact, &symbol, declared_abi) {
                    Some(Ok(accepted)) => accepted,
                    Some(Err(refusal)) => {
                        tracing::debug!(%symbol, served = "memo", "PTX refused again");
                        return Err(refusal.into());
                    }
                    None => {
                        let memo = self.canonical.clone();
                        let verdicts = self.verdicts.clone();
                        let verified_symbol = symbol.clone();
                        self.verifications
                            .run(peer.tenant(), move || {
                                recall_or_verify(
                                    &memo,
                                    verdicts.as_deref(),
                                    &artifact,
                                    &verified_symbol,
                                    declared_abi,
                                )
                            })
                            .await??
                    }
                };
                // From here on the artifact is the canonical text: it is what
                // the executor compiles and what the cache key hashes.
                let signature = accepted.canonical.signature.clone();
                let contract = Arc::new(accepted.canonical.contract.clone());
                (
                    Artifact::Ptx(accepted),
                    signature,
                    contract,
                    ExecArtifactKind::Ptx,
                )
            }
            ArtifactKind::Cubin | ArtifactKind::Fatbin => {
                let (exec_kind, name) = if kind == ArtifactKind::Cubin {
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
                let Some(abi) = declared else {
                    return Err(Error::UnsupportedArtifact {
                        message:
                            "a cubin or fatbin cannot be verified from its text: declare its ABI \
                                  (inputs, scalar_params, element_size)"
                                .into(),
                    });
                };
                check_operand_cap(abi.inputs, abi.scalar_params)?;
                if !matches!(abi.element_size, 1 | 2 | 4 | 8) {
                    return Err(Error::InvalidArgument {
                        field: "declared.element_size",
                        message: format!("{} is not 1, 2, 4 or 8", abi.element_size),
                    });
                }
                // The host backend's executor refuses machine code itself
                // (UNSUPPORTED_ARTIFACT).
                let signature = Signature {
                    inputs: abi.inputs,
                    element_sizes: vec![abi.element_size; abi.inputs as usize + 1],
                    scalar_params: abi.scalar_params,
                    reqntid: None,
                    maxntid: None,
                };
                // Machine code is taken on trust at its declared scalar ABI.
                let contract = Arc::new(LaunchContract::scalar(&signature, &[]));
                (Artifact::Machine(artifact), signature, contract, exec_kind)
            }
            ArtifactKind::Unspecified => {
                return Err(Error::InvalidArgument {
                    field: "kind",
                    message: "set kind to PTX, CUBIN or FATBIN".into(),
                })
            }
        };
        check_operand_cap(signature.inputs, signature.scalar_params)?;
        let hash = match &artifact {
            Artifact::Ptx(accepted) => accepted.hash,
            Artifact::Machine(bytes) => *blake3::hash(bytes).as_bytes(),
        };
        Ok(Prepared {
            session,
            device_index,
            hash,
            artifact,
            kind,
            symbol,
            label,
            signature,
            contract,
        })
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

    async fn load_locked(
        &self,
        load: &Prepared,
        peer: Caller,
        started: Instant,
    ) -> Result<LoadedKernelInfo, Error> {
        let tenant = peer.tenant();
        let bytes = load.artifact.bytes().len() as u64;
        let scope = self.cache_scope_of(tenant);
        let mut evicted: Cleanup = Vec::new();
        let checked = {
            let mut state = self.lock();
            self.load_check(&mut state, load, peer, scope, started, &mut evicted)
        };
        run_cleanup(std::mem::take(&mut evicted)).await;
        let (link, generation) = match checked? {
            LoadCheck::Cached(hit) => {
                let (info, grant) = *hit;
                self.send_grant(grant).await;
                return Ok(info);
            }
            LoadCheck::Compile { link, generation } => (link, generation),
        };

        let module_id = self.next_module.fetch_add(1, Ordering::Relaxed);
        let signature = &load.signature;
        let load_module = load_module(module_id, load);
        let device_uuid = link.device_uuid().to_string();
        let undo = exec::UnloadModule { module_id };
        let session_id = &load.session;
        let result = side_effect(&*link, load_module, undo, |loaded| {
            let block_size = loaded.block_size;
            let block_size = if block_size > 0 {
                block_size
            } else {
                signature.reqntid.unwrap_or(ptx::DEFAULT_BLOCK)
            };
            let kernel = LoadedKernel {
                module_id,
                device_index: load.device_index,
                device_uuid: device_uuid.clone(),
                generation,
                artifact_hash: load.hash,
                kind: load.kind as i32,
                symbol: load.symbol.clone(),
                label: load.label.chars().take(256).collect(),
                signature: signature.clone(),
                contract: load.contract.clone(),
                block_size,
                artifact_bytes: bytes,
                scope,
            };
            let mut state = self.lock();
            state.recheck(session_id, load.device_index, generation, &device_uuid)?;
            // Quotas again: another load may have taken the room (or the
            // session's last ring index).
            check_ring_room(&state, session_id, None)?;
            self.make_room(&mut state, session_id, tenant, None, bytes, &mut evicted)?;
            let State { slots, devices, .. } = &mut *state;
            let (handle, kernel) = slots.insert(kernel, session_id, State::is_live(devices))?;
            issue_to_session(
                &mut state, session_id, handle, &kernel, false, started, self.boot,
            )
        })
        .await;
        let result = match result {
            Ok((info, grant)) => {
                self.send_grant(grant).await;
                Ok(info)
            }
            Err(e) => Err(e),
        };
        run_cleanup(evicted).await;
        result
    }

    /// The check before a load: a cache hit is answered at once (the
    /// session gets its own handle for the shared slot); otherwise room is
    /// made and the load goes to the executor.
    fn load_check(
        &self,
        state: &mut State,
        load: &Prepared,
        peer: Caller,
        scope: Option<Tenant>,
        started: Instant,
        evicted: &mut Cleanup,
    ) -> Result<LoadCheck, Error> {
        let session_id = &load.session;
        state.refuse_if_draining()?;
        let tenant = peer.tenant();
        state.session(session_id, peer)?;
        let (link, generation) = state.link(load.device_index)?;
        let key = ContentKey {
            generation,
            artifact_hash: load.hash,
            kind: load.kind as i32,
            symbol: load.symbol.clone(),
            signature: load.signature.clone(),
            scope,
        };
        let bytes = load.artifact.bytes().len() as u64;
        let cached = state.slots.cached(&key, State::is_live(&state.devices));
        if let Some(handle) = cached {
            check_ring_room(state, session_id, Some(&handle))?;
            // Loading a kernel the session already holds is idempotent.
            let already = state
                .sessions
                .get(session_id)
                .and_then(|s| s.kernels.token_of(&handle));
            if already.is_none() {
                self.make_room(state, session_id, tenant, Some(&handle), bytes, evicted)?;
            }
            let State { slots, devices, .. } = &mut *state;
            if let Some((handle, kernel)) =
                slots.hold_cached(&key, session_id, State::is_live(devices))
            {
                let issued =
                    issue_to_session(state, session_id, handle, &kernel, true, started, self.boot)?;
                return Ok(LoadCheck::Cached(Box::new(issued)));
            }
        }
        check_ring_room(state, session_id, None)?;
        self.make_room(state, session_id, tenant, None, bytes, evicted)?;
        Ok(LoadCheck::Compile { link, generation })
    }

    /// UnloadKernel; true when the kernel's slot was freed.
    pub async fn unload_kernel(
        &self,
        session_id: &str,
        kernel: &str,
        peer: Caller,
    ) -> Result<bool, Error> {
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
            let ring_index = session.ring_indices.forget_kernel(&internal);
            let mut cleanup: Cleanup = Vec::new();
            // Its slot may have been reclaimed after its generation died:
            // then the session's hold is simply gone.
            if let Ok(released) = state.slots.release(&internal, &session_id) {
                queue_unload(&state.devices, released, &mut cleanup);
            }
            let slot_freed = !cleanup.is_empty();
            state.queue_revoke(
                &session_id,
                vec![],
                ring_index.into_iter().collect(),
                &mut cleanup,
            );
            (cleanup, slot_freed)
        };
        let (cleanup, slot_freed) = cleanup;
        run_cleanup(cleanup).await;
        Ok(slot_freed)
    }

    /// ListKernels.
    pub fn list_kernels(
        &self,
        session_id: &str,
        peer: Caller,
    ) -> Result<Vec<KernelListing>, Error> {
        let session_id = parse_session(session_id)?;
        let state = self.lock();
        let session = state.session(&session_id, peer)?;
        let is_live = State::is_live(&state.devices);
        Ok(state
            .slots
            .held_by(&session_id)
            .into_iter()
            .filter_map(|held| {
                let token = session.kernels.token_of(&held.handle)?;
                Some(KernelListing {
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
                    signature: held.kernel.signature.clone(),
                    contract: held.kernel.contract.clone(),
                    block_size: held.kernel.block_size,
                    live: is_live(held.kernel.generation),
                    artifact_hash: held.kernel.artifact_hash,
                    references: held.holders,
                })
            })
            .collect())
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
}

/// PTX verifications in flight, bounded per tenant and in total, so a few
/// concurrent hostile loads cannot take every core of the daemon, while a
/// tenant's burst of legitimate loads (many workers of one server loading
/// their kernels at start) waits its turn instead of failing.
///
/// Invariants:
/// - A tenant has at most `per_tenant` verifications running at once; more
///   wait in arrival order (each tenant's own fair semaphore), up to
///   [`QUEUE_FACTOR`] × `per_tenant` running or waiting; one more is refused
///   `LIMIT_EXCEEDED` (`limit=max_concurrent_verifications_per_uid`) before
///   it waits for anything.
/// - At most `threads` (the machine's cores) run at once, on blocking
///   threads, never on the async workers; a tenant's running ones wait for
///   them in arrival order (tokio's semaphore is fair), so no tenant waits
///   behind more than `per_tenant` of any other tenant's.
/// - A tenant's entry lives exactly while it has a verification running or
///   waiting, so the table holds at most one entry per active tenant.
/// - Every place is held by the blocking task itself, so a caller that goes
///   away does not free it while its verification still runs.
#[derive(Debug)]
pub(super) struct VerificationGate {
    per_tenant: u32,
    tenants: Arc<Mutex<HashMap<Tenant, TenantQueue>>>,
    threads: Arc<tokio::sync::Semaphore>,
    /// Added to every verification: zero unless the daemon's environment
    /// sets [`TEST_DELAY_ENV`] (for the integration test that needs
    /// verifications to overlap whatever the verifier's speed; clients
    /// cannot set it).
    delay: Duration,
}

/// How many verifications a tenant may have running or waiting, as a
/// multiple of the ones it may run at once.
pub const QUEUE_FACTOR: u32 = 16;

/// Milliseconds added to every verification, for tests only.
const TEST_DELAY_ENV: &str = "PTXD_TEST_VERIFICATION_DELAY_MS";

/// One tenant's verifications: how many run or wait, and the places to run.
#[derive(Debug)]
struct TenantQueue {
    admitted: u32,
    running: Arc<tokio::sync::Semaphore>,
}

/// A tenant's place at the gate (running or waiting); given back on drop.
#[derive(Debug)]
struct TenantPlace {
    tenant: Tenant,
    tenants: Arc<Mutex<HashMap<Tenant, TenantQueue>>>,
}

impl Drop for TenantPlace {
    fn drop(&mut self) {
        let mut tenants = self.tenants.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(queue) = tenants.get_mut(&self.tenant) {
            queue.admitted = queue.admitted.saturating_sub(1);
            if queue.admitted == 0 {
                tenants.remove(&self.tenant);
            }
        }
    }
}

/// The limit a tenant over its share of the verifier is refused with.
pub const VERIFICATIONS_LIMIT: &str = "max_concurrent_verifications_per_uid";

impl VerificationGate {
    /// A gate of `per_tenant` running places per tenant and one verifier
    /// thread per core.
    pub(super) fn new(per_tenant: u32) -> VerificationGate {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        VerificationGate::with_threads(per_tenant, cores)
    }

    fn with_threads(per_tenant: u32, threads: usize) -> VerificationGate {
        let delay = std::env::var(TEST_DELAY_ENV)
            .ok()
            .and_then(|ms| ms.parse().ok())
            .map_or(Duration::ZERO, Duration::from_millis);
        VerificationGate {
            per_tenant: per_tenant.max(1),
            tenants: Arc::default(),
            threads: Arc::new(tokio::sync::Semaphore::new(threads)),
            delay,
        }
    }

    /// Admits one more verification of `tenant`, or refuses it when the
    /// tenant's queue is full; returns its place and the tenant's running
    /// places to wait on.
    fn enter(&self, tenant: Tenant) -> Result<(TenantPlace, Arc<tokio::sync::Semaphore>), Error> {
        let mut tenants = self.tenants.lock().unwrap_or_else(|p| p.into_inner());
        let per_tenant = self.per_tenant;
        let queue = tenants.entry(tenant).or_insert_with(|| TenantQueue {
            admitted: 0,
            running: Arc::new(tokio::sync::Semaphore::new(per_tenant as usize)),
        });
        if queue.admitted >= per_tenant.saturating_mul(QUEUE_FACTOR) {
            return Err(Error::LimitExceeded {
                limit: VERIFICATIONS_LIMIT,
                value: self.per_tenant.into(),
            });
        }
        queue.admitted += 1;
        let running = queue.running.clone();
        Ok((
            TenantPlace {
                tenant,
                tenants: self.tenants.clone(),
            },
            running,
        ))
    }

    /// Runs `verify` for `tenant` on a blocking thread, within the bounds.
    async fn run<T: Send + 'static>(
        &self,
        tenant: Tenant,
        verify: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Error> {
        let (place, running) = self.enter(tenant)?;
        let closed = |e: tokio::sync::AcquireError| Error::Internal {
            message: format!("verifier places closed: {e}"),
        };
        // The tenant's own place first, so that a tenant's queue waits on
        // its own semaphore, not in the shared one ahead of other tenants.
        let turn = running.acquire_owned().await.map_err(closed)?;
        let thread = self.threads.clone().acquire_owned().await.map_err(closed)?;
        let delay = self.delay;
        tokio::task::spawn_blocking(move || {
            let _held = (place, turn, thread);
            if !delay.is_zero() {
                std::thread::sleep(delay);
            }
            verify()
        })
        .await
        .map_err(|e| Error::Internal {
            message: format!("verifier task failed: {e}"),
        })
    }
}

/// The log target of the verdict cache's decisions (a hit, or a verifier
/// run that stored its verdict): debug level, one event per verdict served
/// from disk or verified and kept.
pub const VERDICT_LOG: &str = "ptxd::verdicts";

/// The verdict on a PTX load the memo did not have: the one kept on disk
/// when there is a valid one (no verification), else the verifier's (or
/// the memo's, when a concurrent load just verified the same bytes), kept
/// on disk when it is an acceptance that the verifier reached just now.
/// Refusals are not kept: a refused text is verified again after a
/// restart, and refused with the same reason.
fn recall_or_verify(
    memo: &ptx::memo::CanonicalMemo,
    verdicts: Option<&super::verdict_cache::VerdictCache>,
    text: &[u8],
    symbol: &str,
    declared: Option<DeclaredAbi>,
) -> Result<Arc<Accepted>, ptx::PtxError> {
    if let Some(kept) = verdicts.and_then(|v| v.get(text, symbol, declared)) {
        tracing::debug!(target: VERDICT_LOG, %symbol, "PTX verdict served from the verdict cache");
        // Into the memo too: the next load of these bytes is a memo hit.
        return Ok(memo.remember(text, symbol, declared, kept));
    }
    let (accepted, served) = memo.canonicalize_bytes(text, symbol, declared)?;
    if served == ptx::memo::Served::Verified {
        tracing::debug!(target: VERDICT_LOG, %symbol, "PTX verified; its verdict is kept");
        if let Some(verdicts) = verdicts {
            verdicts.put(text, symbol, declared, &accepted);
        }
    }
    Ok(accepted)
}

/// The operand cap: a kernel takes at most [`ptx::MAX_INPUTS`] inputs and
/// [`ptx::MAX_SCALAR_PARAMS`] scalars.
fn check_operand_cap(inputs: u32, scalar_params: u32) -> Result<(), Error> {
    if inputs as usize > ptx::MAX_INPUTS || scalar_params as usize > ptx::MAX_SCALAR_PARAMS {
        return Err(Error::LimitExceeded {
            limit: "kernel_operands",
            value: ptx::MAX_INPUTS as u64,
        });
    }
    Ok(())
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

/// The refusal for a kernel handle the session cannot use: one answer for
/// another session's live handle, a released one and a made-up one; only a
/// handle of another boot (which says so in its text) is told apart.
pub(super) fn stale_kernel(text: &str, boot: BootId, handle: &KernelRef) -> Error {
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

/// Refuses a load that would need a ring index its session has none of
/// left (`held`: the cached kernel it would hold, which may have one
/// already), before anything is held or evicted for it.
fn check_ring_room(
    state: &State,
    session_id: &SessionId,
    held: Option<&KernelHandle>,
) -> Result<(), Error> {
    match state.sessions.get(session_id) {
        Some(session) if !session.ring_indices.has_room_for(held) => {
            Err(super::ring_indices_spent())
        }
        _ => Ok(()),
    }
}

/// Gives the session its handle to a kernel it now holds in a slot (a
/// cache hit or a fresh load): its token, its ring index, the answer, and
/// the grant that tells its ring.
fn issue_to_session(
    state: &mut State,
    session_id: &SessionId,
    handle: KernelHandle,
    kernel: &LoadedKernel,
    cache_hit: bool,
    started: Instant,
    boot: BootId,
) -> Result<(LoadedKernelInfo, Grant), Error> {
    let session = state
        .sessions
        .get_mut(session_id)
        .ok_or_else(|| Error::Internal {
            message: "session vanished under the lock".into(),
        })?;
    // Room for the index was checked before the slot was held (under this
    // lock): this refusal is not reached.
    let ring_index = session
        .ring_indices
        .kernel(handle)
        .ok_or_else(super::ring_indices_spent)?;
    let token = session.kernels.issue(handle);
    let info = loaded_info(
        (token, ring_index),
        &handle,
        kernel,
        cache_hit,
        started,
        boot,
    );
    let grant = state.ring_grant(
        session_id,
        kernel.device_index,
        kernel.generation,
        None,
        Some((handle, ring_index)),
    );
    Ok((info, grant))
}

fn loaded_info(
    (token, ring_index): (HandleToken, u32),
    handle: &KernelHandle,
    kernel: &LoadedKernel,
    cache_hit: bool,
    started: Instant,
    boot: BootId,
) -> LoadedKernelInfo {
    LoadedKernelInfo {
        kernel: KernelRef {
            token,
            generation: handle.generation,
            boot,
        }
        .to_string(),
        signature: kernel.signature.clone(),
        contract: kernel.contract.clone(),
        block_size: kernel.block_size,
        cache_hit,
        load_micros: started.elapsed().as_micros() as u64,
        device_uuid: kernel.device_uuid.clone(),
        generation: kernel.generation.0,
        ring_index,
    }
}

/// The executor's load message for `load`: the artifact, the signature's
/// block bounds, and the param layout of its contract (what the executor
/// passes for each param). A kernel its signature checks (the scalar ABI)
/// keeps the signature's element sizes, which the executor re-checks each
/// launch's operands against; any other contract's footprints are the
/// front's alone to check.
fn load_module(module_id: u64, load: &Prepared) -> exec::LoadModule {
    let signature = &load.signature;
    let contract = &load.contract;
    let scalar_shaped = contract.checked_by_signature_and_max_count(signature);
    exec::LoadModule {
        module_id,
        kind: load.kind as i32,
        artifact: load.artifact.bytes().to_vec(),
        symbol: load.symbol.clone(),
        inputs: u32::try_from(contract.inputs()).unwrap_or(u32::MAX),
        scalar_params: u32::try_from(contract.scalar_params()).unwrap_or(u32::MAX),
        element_sizes: if scalar_shaped {
            signature.element_sizes.clone()
        } else {
            Vec::new()
        },
        reqntid: signature.reqntid.unwrap_or(0),
        maxntid: signature.maxntid.unwrap_or(0),
        params: crate::executor::layout::slots_of(contract),
        elements_per_thread: contract.geometry.elements_per_thread,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A verification that runs until `release` is sent (or dropped).
    fn held(release: std::sync::mpsc::Receiver<()>) -> impl FnOnce() -> u32 + Send + 'static {
        move || {
            let _ = release.recv();
            7
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tenants_burst_waits_its_turn_and_only_past_its_queue_is_refused() {
        let gate = Arc::new(VerificationGate::with_threads(1, 4));
        let alice = Tenant::Uid(1000);
        let admitted = |gate: &VerificationGate| {
            gate.tenants
                .lock()
                .unwrap()
                .get(&alice)
                .map_or(0, |q| q.admitted)
        };
        // One of alice's runs and holds her only running place.
        let (tx, rx) = std::sync::mpsc::channel();
        let first = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.run(alice, held(rx)).await })
        };
        while admitted(&gate) != 1 {
            tokio::task::yield_now().await;
        }
        // The rest of her queue waits, in arrival order, rather than failing.
        let mut waiting = Vec::new();
        for k in 1..QUEUE_FACTOR {
            let queued = gate.clone();
            waiting.push(tokio::spawn(
                async move { queued.run(alice, move || k).await },
            ));
            while admitted(&gate) != k + 1 {
                tokio::task::yield_now().await;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(waiting.iter().all(|t| !t.is_finished()));
        // One more than her queue holds is refused at once, naming the limit.
        match gate.run(alice, || 0).await {
            Err(Error::LimitExceeded { limit, value }) => {
                assert_eq!(limit, "max_concurrent_verifications_per_uid");
                assert_eq!(value, 1);
            }
            other => panic!("{other:?}"),
        }
        // Another tenant, and callers without credentials, are served meanwhile.
        assert_eq!(gate.run(Tenant::Uid(1001), || 3).await.unwrap(), 3);
        assert_eq!(gate.run(Tenant::Anonymous, || 4).await.unwrap(), 4);
        // A waiting caller that goes away gives its place back.
        waiting.remove(0).abort();
        while admitted(&gate) != QUEUE_FACTOR - 1 {
            tokio::task::yield_now().await;
        }
        tx.send(()).unwrap();
        assert_eq!(first.await.unwrap().unwrap(), 7);
        for (k, task) in (2..QUEUE_FACTOR).zip(waiting) {
            assert_eq!(task.await.unwrap().unwrap(), k);
        }
        // Every place is given back once the work ended.
        while !gate.tenants.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        assert_eq!(gate.run(alice, || 5).await.unwrap(), 5);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn past_the_verifier_threads_verifications_wait_their_turn() {
        let gate = Arc::new(VerificationGate::with_threads(1, 1));
        let (tx, rx) = std::sync::mpsc::channel();
        let first = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.run(Tenant::Uid(1), held(rx)).await })
        };
        while gate.threads.available_permits() != 0 {
            tokio::task::yield_now().await;
        }
        // Another tenant is within its share: it waits for the one thread
        // rather than being refused, and runs once the first is done.
        let second = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.run(Tenant::Uid(2), || 9).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!second.is_finished());
        tx.send(()).unwrap();
        assert_eq!(first.await.unwrap().unwrap(), 7);
        assert_eq!(second.await.unwrap().unwrap(), 9);
    }

    #[test]
    fn symbols_are_validated() {
        assert!(validate_symbol("add_f32_scalar").is_ok());
        assert!(validate_symbol("$L__x.1").is_ok());
        for bad in ["", "a b", "a\0", "ü"] {
            assert!(validate_symbol(bad).is_err(), "{bad:?}");
        }
    }
}
