//! The slot table: a bounded bank of loaded kernels, shared by every session
//! and indexed by content so each distinct kernel compiles once per device
//! generation.
//!
//! Invariants (the seed's, carried into the daemon):
//! 1. A [`KernelHandle`] resolves only while its slot's epoch and occupant
//!    generation match and that generation is live; otherwise it is stale and
//!    never resolves to whatever occupies the slot now.
//! 2. A slot's epoch is bumped every time it gets a new occupant.
//! 3. Liveness is asked per [`DeviceGeneration`] (never per device ordinal),
//!    so a live successor's generation never makes a dead slot look live.
//! 4. When the bank is full, slots of dead generations are reclaimed before a
//!    load is refused as bank-full.
//! 5. A slot of a live generation is freed only when no session holds it.
//! 6. A handle minted by another daemon boot never resolves.
//! 7. A session that does not hold a slot's kernel gets the same answer for
//!    it as for a slot that never existed ([`StaleWhy::UnknownToSession`]).
//! 8. With `--kernel-cache-scope uid` the cache key includes the tenant, so a
//!    cache hit never crosses uids.
//! 9. The bytes of every loaded artifact are counted (`loaded_bytes`), so
//!    executor memory is bounded by the artifact-byte limits, not only by the
//!    number of slots.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::handles::{BootId, DeviceGeneration, KernelHandle, SessionId, SlotEpoch, SlotIndex};
use crate::ptx::{LaunchContract, Signature};
use crate::sessions::Tenant;

/// What identifies a compiled kernel for sharing: the device generation it
/// was compiled in, the artifact's content hash and kind, the entry symbol,
/// and the signature launches are checked against. The kind and signature
/// are part of the key so that one session can never hand another a cached
/// kernel with a different (e.g. declared rather than verified) signature.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ContentKey {
    pub generation: DeviceGeneration,
    pub artifact_hash: [u8; 32],
    pub kind: i32,
    pub symbol: String,
    pub signature: Signature,
    /// `None`: shared node-wide; `Some(tenant)`: shared only within it.
    pub scope: Option<Tenant>,
}

impl ContentKey {
    /// The key a loaded kernel is cached under.
    pub fn of(kernel: &LoadedKernel) -> ContentKey {
        ContentKey {
            generation: kernel.generation,
            artifact_hash: kernel.artifact_hash,
            kind: kernel.kind,
            symbol: kernel.symbol.clone(),
            signature: kernel.signature.clone(),
            scope: kernel.scope,
        }
    }
}

/// A kernel compiled in an executor.
#[derive(Debug, Clone)]
pub struct LoadedKernel {
    /// The executor's id for the module (never reused within a boot).
    pub module_id: u64,
    pub device_index: usize,
    pub device_uuid: String,
    pub generation: DeviceGeneration,
    pub artifact_hash: [u8; 32],
    /// The artifact kind (`ptxd.executor.v1.ArtifactKind`).
    pub kind: i32,
    pub symbol: String,
    pub label: String,
    pub signature: Signature,
    /// The launch contract the verifier proved (the scalar ABI's for
    /// machine code taken at its declared ABI); launches are checked
    /// against it, bound to `block_size`.
    pub contract: Arc<LaunchContract>,
    pub block_size: u32,
    /// The artifact's size: what the executor holds for it.
    pub artifact_bytes: u64,
    /// The cache scope it was loaded under (see [`ContentKey::scope`]).
    pub scope: Option<Tenant>,
}

/// Why the slot table refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlotError {
    #[error("kernel handle {handle} is stale: {why}")]
    Stale { handle: String, why: StaleWhy },
    #[error("every one of the {capacity} slots holds a live kernel")]
    BankFull { capacity: u32 },
}

/// Why a kernel handle is stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StaleWhy {
    OtherBoot,
    /// Never issued to this session, another session's, released, or its
    /// slot was freed or reused: one answer for all, so that a session
    /// cannot tell another session's live handle from a made-up one.
    UnknownToSession,
    GenerationDead,
}

impl StaleWhy {
    pub fn as_str(self) -> &'static str {
        match self {
            StaleWhy::OtherBoot => "minted by another daemon boot",
            StaleWhy::UnknownToSession => {
                "it is not a kernel this session holds (unloaded, reclaimed, or never loaded here)"
            }
            StaleWhy::GenerationDead => "its device generation is dead (the executor restarted)",
        }
    }
}

impl std::fmt::Display for StaleWhy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug)]
struct Occupant {
    kernel: Arc<LoadedKernel>,
    key: ContentKey,
    holders: BTreeSet<SessionId>,
    /// Milliseconds since the table's origin at the last launch or load.
    last_used: AtomicU64,
}

#[derive(Debug, Default)]
struct Slot {
    epoch: SlotEpoch,
    occupant: Option<Occupant>,
}

/// What releasing a session's hold did.
#[derive(Debug)]
pub struct Released {
    /// The kernel, when this release freed its slot (the caller unloads it
    /// from its executor).
    pub freed: Option<Arc<LoadedKernel>>,
}

/// A kernel as listed for a session.
#[derive(Debug, Clone)]
pub struct HeldKernel {
    pub handle: KernelHandle,
    pub kernel: Arc<LoadedKernel>,
    pub holders: u32,
}

/// The bounded bank of loaded kernels.
#[derive(Debug)]
pub struct SlotTable {
    boot: BootId,
    slots: Vec<Slot>,
    by_content: HashMap<ContentKey, SlotIndex>,
    origin: Instant,
}

impl SlotTable {
    pub fn new(capacity: u32, boot: BootId) -> Self {
        SlotTable {
            boot,
            slots: (0..capacity).map(|_| Slot::default()).collect(),
            by_content: HashMap::new(),
            origin: Instant::now(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }

    /// Artifact bytes of every occupied slot (what the executors hold).
    pub fn loaded_bytes(&self) -> u64 {
        self.slots
            .iter()
            .filter_map(|s| s.occupant.as_ref())
            .map(|o| o.kernel.artifact_bytes)
            .sum()
    }

    /// The kernel `handle` names while its slot still holds it.
    pub fn occupant_of(&self, handle: &KernelHandle) -> Option<&Arc<LoadedKernel>> {
        self.occupant(handle).ok().map(|o| &o.kernel)
    }

    /// How long `handle`'s kernel has gone without a launch or load.
    pub fn idle_for(&self, handle: &KernelHandle) -> Option<Duration> {
        let occupant = self.occupant(handle).ok()?;
        let last = occupant.last_used.load(Ordering::Relaxed);
        Some(Duration::from_millis(self.now_ms().saturating_sub(last)))
    }

    /// The sessions holding `handle`'s kernel.
    pub fn holders(&self, handle: &KernelHandle) -> Vec<SessionId> {
        self.occupant(handle)
            .map(|o| o.holders.iter().cloned().collect())
            .unwrap_or_default()
    }

    pub fn capacity(&self) -> u32 {
        self.slots.len() as u32
    }

    /// Occupied slots, dead generations not yet reclaimed included.
    pub fn used(&self) -> u32 {
        self.slots.iter().filter(|s| s.occupant.is_some()).count() as u32
    }

    fn handle_of(&self, index: SlotIndex) -> Option<KernelHandle> {
        let slot = self.slots.get(index as usize)?;
        let occupant = slot.occupant.as_ref()?;
        Some(KernelHandle {
            slot: index,
            epoch: slot.epoch,
            generation: occupant.kernel.generation,
            boot: self.boot,
        })
    }

    /// The live slot already holding this content, if any (not yet held).
    pub fn cached(
        &self,
        key: &ContentKey,
        is_live: impl Fn(DeviceGeneration) -> bool,
    ) -> Option<KernelHandle> {
        if !is_live(key.generation) {
            return None;
        }
        self.handle_of(*self.by_content.get(key)?)
    }

    /// The cache: a live slot already holding this content, now held by
    /// `session` too.
    pub fn hold_cached(
        &mut self,
        key: &ContentKey,
        session: &SessionId,
        is_live: impl Fn(DeviceGeneration) -> bool,
    ) -> Option<(KernelHandle, Arc<LoadedKernel>)> {
        if !is_live(key.generation) {
            return None;
        }
        let index = *self.by_content.get(key)?;
        let handle = self.handle_of(index)?;
        let now = self.now_ms();
        let occupant = self.slots.get_mut(index as usize)?.occupant.as_mut()?;
        occupant.holders.insert(session.clone());
        occupant.last_used.store(now, Ordering::Relaxed);
        Some((handle, occupant.kernel.clone()))
    }

    /// Frees every slot whose generation is dead; returns what was freed.
    pub fn reclaim_dead(
        &mut self,
        is_live: impl Fn(DeviceGeneration) -> bool,
    ) -> Vec<Arc<LoadedKernel>> {
        let mut freed = Vec::new();
        for slot in &mut self.slots {
            let dead = slot
                .occupant
                .as_ref()
                .is_some_and(|o| !is_live(o.kernel.generation));
            if dead {
                if let Some(occupant) = slot.occupant.take() {
                    self.by_content.remove(&occupant.key);
                    freed.push(occupant.kernel);
                }
            }
        }
        freed
    }

    fn free_index(&self) -> Option<SlotIndex> {
        self.slots
            .iter()
            .position(|s| s.occupant.is_none())
            .map(|i| i as SlotIndex)
    }

    /// Ensures a slot is free, reclaiming dead generations first.
    pub fn ensure_free(
        &mut self,
        is_live: impl Fn(DeviceGeneration) -> bool,
    ) -> Result<Vec<Arc<LoadedKernel>>, SlotError> {
        if self.free_index().is_some() {
            return Ok(Vec::new());
        }
        let reclaimed = self.reclaim_dead(is_live);
        if self.free_index().is_some() {
            Ok(reclaimed)
        } else {
            Err(SlotError::BankFull {
                capacity: self.capacity(),
            })
        }
    }

    /// Puts a freshly compiled kernel into a free slot, held by `session`.
    pub fn insert(
        &mut self,
        kernel: LoadedKernel,
        session: &SessionId,
        is_live: impl Fn(DeviceGeneration) -> bool,
    ) -> Result<(KernelHandle, Arc<LoadedKernel>), SlotError> {
        self.ensure_free(&is_live)?;
        let index = self.free_index().ok_or(SlotError::BankFull {
            capacity: self.capacity(),
        })?;
        let key = ContentKey::of(&kernel);
        let kernel = Arc::new(kernel);
        let now = self.now_ms();
        let slot = &mut self.slots[index as usize];
        slot.epoch += 1;
        slot.occupant = Some(Occupant {
            kernel: kernel.clone(),
            key: key.clone(),
            holders: BTreeSet::from([session.clone()]),
            last_used: AtomicU64::new(now),
        });
        self.by_content.insert(key, index);
        let handle = KernelHandle {
            slot: index,
            epoch: slot.epoch,
            generation: kernel.generation,
            boot: self.boot,
        };
        Ok((handle, kernel))
    }

    fn occupant(&self, handle: &KernelHandle) -> Result<&Occupant, StaleWhy> {
        if handle.boot != self.boot {
            return Err(StaleWhy::OtherBoot);
        }
        let slot = self
            .slots
            .get(handle.slot as usize)
            .ok_or(StaleWhy::UnknownToSession)?;
        match &slot.occupant {
            Some(o) if slot.epoch == handle.epoch && o.kernel.generation == handle.generation => {
                Ok(o)
            }
            _ => Err(StaleWhy::UnknownToSession),
        }
    }

    /// Resolves a handle for a launch by `session`.
    pub fn resolve(
        &self,
        handle: &KernelHandle,
        session: &SessionId,
        is_live: impl Fn(DeviceGeneration) -> bool,
    ) -> Result<Arc<LoadedKernel>, StaleWhy> {
        let occupant = self.occupant(handle)?;
        if !occupant.holders.contains(session) {
            return Err(StaleWhy::UnknownToSession);
        }
        if !is_live(occupant.kernel.generation) {
            return Err(StaleWhy::GenerationDead);
        }
        occupant.last_used.store(self.now_ms(), Ordering::Relaxed);
        Ok(occupant.kernel.clone())
    }

    /// Drops `session`'s hold; frees the slot when nobody holds it any more.
    pub fn release(
        &mut self,
        handle: &KernelHandle,
        session: &SessionId,
    ) -> Result<Released, StaleWhy> {
        self.occupant(handle)?;
        let slot = self
            .slots
            .get_mut(handle.slot as usize)
            .ok_or(StaleWhy::UnknownToSession)?;
        let Some(occupant) = slot.occupant.as_mut() else {
            return Err(StaleWhy::UnknownToSession);
        };
        if !occupant.holders.remove(session) {
            return Err(StaleWhy::UnknownToSession);
        }
        if !occupant.holders.is_empty() {
            return Ok(Released { freed: None });
        }
        let freed = slot.occupant.take().map(|o| {
            self.by_content.remove(&o.key);
            o.kernel
        });
        Ok(Released { freed })
    }

    /// The kernels `session` holds.
    pub fn held_by(&self, session: &SessionId) -> Vec<HeldKernel> {
        (0..self.slots.len() as SlotIndex)
            .filter_map(|index| {
                let occupant = self.slots[index as usize].occupant.as_ref()?;
                if !occupant.holders.contains(session) {
                    return None;
                }
                Some(HeldKernel {
                    handle: self.handle_of(index)?,
                    kernel: occupant.kernel.clone(),
                    holders: occupant.holders.len() as u32,
                })
            })
            .collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn kernel(module_id: u64, generation: u64, content: u8) -> LoadedKernel {
        let signature = Signature {
            inputs: 1,
            element_sizes: vec![4, 4],
            scalar_params: 0,
            reqntid: None,
            maxntid: None,
        };
        LoadedKernel {
            contract: Arc::new(LaunchContract::scalar(&signature, &[])),
            module_id,
            device_index: 0,
            device_uuid: "HOST-0".into(),
            generation: DeviceGeneration(generation),
            artifact_hash: [content; 32],
            kind: 1,
            symbol: "k".into(),
            label: String::new(),
            signature: Signature {
                inputs: 1,
                element_sizes: vec![4, 4],
                scalar_params: 0,
                reqntid: None,
                maxntid: None,
            },
            block_size: 256,
            artifact_bytes: 1000 + u64::from(content),
            scope: None,
        }
    }

    fn key(generation: u64, content: u8) -> ContentKey {
        ContentKey::of(&kernel(0, generation, content))
    }

    const BOOT: BootId = BootId(7);
    fn live(_: DeviceGeneration) -> bool {
        true
    }

    #[test]
    fn the_same_content_is_shared_and_freed_by_the_last_holder() {
        let (a, b) = (SessionId::random(), SessionId::random());
        let mut table = SlotTable::new(4, BOOT);
        let (h1, _) = table.insert(kernel(1, 1, 9), &a, live).unwrap();
        let (h2, k2) = table.hold_cached(&key(1, 9), &b, live).unwrap();
        assert_eq!(h1, h2);
        assert_eq!(k2.module_id, 1);
        assert_eq!(table.used(), 1);
        assert!(table.release(&h1, &a).unwrap().freed.is_none());
        assert!(
            table.resolve(&h1, &a, live).is_err(),
            "a released holder cannot launch"
        );
        assert!(table.resolve(&h1, &b, live).is_ok());
        assert_eq!(table.release(&h1, &b).unwrap().freed.unwrap().module_id, 1);
        assert_eq!(table.used(), 0);
        assert!(table.hold_cached(&key(1, 9), &b, live).is_none());
    }

    #[test]
    fn a_reused_slot_never_resolves_an_old_handle() {
        let s = SessionId::random();
        let mut table = SlotTable::new(1, BOOT);
        let (old, _) = table.insert(kernel(1, 1, 1), &s, live).unwrap();
        table.release(&old, &s).unwrap();
        let (new, _) = table.insert(kernel(2, 1, 2), &s, live).unwrap();
        assert_eq!(old.slot, new.slot);
        assert_ne!(old.epoch, new.epoch);
        match table.resolve(&old, &s, live) {
            Err(StaleWhy::UnknownToSession) => {}
            other => panic!("old handle resolved: {other:?}"),
        }
        assert_eq!(table.resolve(&new, &s, live).unwrap().module_id, 2);
    }

    #[test]
    fn dead_generations_are_stale_and_reclaimed_before_bank_full() {
        let s = SessionId::random();
        let mut table = SlotTable::new(2, BOOT);
        let (dead, _) = table.insert(kernel(1, 10, 1), &s, live).unwrap();
        let (alive, _) = table.insert(kernel(2, 11, 2), &s, live).unwrap();
        let is_live = |g: DeviceGeneration| g.0 != 10;
        match table.resolve(&dead, &s, is_live) {
            Err(StaleWhy::GenerationDead) => {}
            other => panic!("{other:?}"),
        }
        // Full: the next load reclaims exactly the dead slot.
        let (fresh, _) = table.insert(kernel(3, 11, 3), &s, is_live).unwrap();
        assert_eq!(fresh.slot, dead.slot);
        assert!(table.resolve(&alive, &s, is_live).is_ok());
        assert_eq!(
            table.resolve(&dead, &s, is_live).unwrap_err(),
            StaleWhy::UnknownToSession
        );
        // Now every slot is live: bank full, and nothing live was reclaimed.
        assert_eq!(
            table.insert(kernel(4, 11, 4), &s, is_live).unwrap_err(),
            SlotError::BankFull { capacity: 2 }
        );
        assert!(table.resolve(&alive, &s, is_live).is_ok());
        assert!(table.resolve(&fresh, &s, is_live).is_ok());
    }

    #[test]
    fn handles_of_another_boot_or_session_do_not_resolve() {
        let (a, b) = (SessionId::random(), SessionId::random());
        let mut table = SlotTable::new(2, BOOT);
        let (h, _) = table.insert(kernel(1, 1, 1), &a, live).unwrap();
        let foreign = KernelHandle {
            boot: BootId(8),
            ..h
        };
        assert_eq!(
            table.resolve(&foreign, &a, live).unwrap_err(),
            StaleWhy::OtherBoot
        );
        // Held by another session, or no such slot: one answer.
        assert_eq!(
            table.resolve(&h, &b, live).unwrap_err(),
            StaleWhy::UnknownToSession
        );
        assert_eq!(
            table.release(&h, &b).unwrap_err(),
            StaleWhy::UnknownToSession
        );
        let out_of_range = KernelHandle { slot: 99, ..h };
        assert_eq!(
            table.resolve(&out_of_range, &a, live).unwrap_err(),
            StaleWhy::UnknownToSession
        );
    }

    #[test]
    fn another_kind_or_signature_of_the_same_bytes_is_not_a_cache_hit() {
        let (a, b) = (SessionId::random(), SessionId::random());
        let mut table = SlotTable::new(4, BOOT);
        table.insert(kernel(1, 1, 9), &a, live).unwrap();
        let mut as_cubin = key(1, 9);
        as_cubin.kind = 2;
        assert!(table.hold_cached(&as_cubin, &b, live).is_none());
        let mut narrower = key(1, 9);
        narrower.signature.element_sizes = vec![1, 1];
        assert!(table.hold_cached(&narrower, &b, live).is_none());
        assert!(table.hold_cached(&key(1, 9), &b, live).is_some());
    }

    #[test]
    fn a_uid_scoped_entry_is_a_hit_only_within_its_uid() {
        let (a, b) = (SessionId::random(), SessionId::random());
        let mut table = SlotTable::new(4, BOOT);
        let mut scoped = kernel(1, 1, 9);
        scoped.scope = Some(Tenant::Uid(1000));
        table.insert(scoped, &a, live).unwrap();
        let mut other_uid = key(1, 9);
        other_uid.scope = Some(Tenant::Uid(1001));
        assert!(table.hold_cached(&other_uid, &b, live).is_none());
        assert!(
            table.hold_cached(&key(1, 9), &b, live).is_none(),
            "node scope"
        );
        let mut same_uid = key(1, 9);
        same_uid.scope = Some(Tenant::Uid(1000));
        assert!(table.hold_cached(&same_uid, &b, live).is_some());
        assert_eq!(table.loaded_bytes(), 1009);
    }

    #[test]
    fn a_dead_generation_is_never_a_cache_hit() {
        let (a, b) = (SessionId::random(), SessionId::random());
        let mut table = SlotTable::new(2, BOOT);
        table.insert(kernel(1, 5, 1), &a, live).unwrap();
        assert!(table.hold_cached(&key(5, 1), &b, |g| g.0 != 5).is_none());
    }
}
