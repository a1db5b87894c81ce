//! The buffer and event registry: every registration of every session, the
//! handles the sessions hold for them, the device each lives on and the
//! generation its mapping is open in.
//!
//! The registry keeps its own invariants; its tables are private and change
//! only through the methods below:
//! - Buffer and event ids are never reused within a boot, so a released
//!   handle stays stale forever.
//! - A handle names an object only for the session it was issued to, and only
//!   in the boot that minted it.
//! - A registration's mapping is open in exactly the generation recorded in
//!   `open_in`; after an executor restart it is re-opened in the new
//!   generation, or marked dead (`open_in = None`) if that fails.
//! - A session's registered bytes are the sum of its buffers' sizes, and
//!   its descriptors the number of its buffers passed by descriptor (each
//!   holds one in the front and one in its executor); both are kept with
//!   every register and release, per session and daemon-wide.
//! - Launch bounds are checked against `size`, which the executor verified
//!   the mapping covers when it opened it.
//! - A lookup answers alike for an id that was never registered, one that was
//!   released and one another session registered: a session cannot learn
//!   that another session's object exists.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use crate::handles::{
    BootId, BufferHandle, BufferId, DeviceGeneration, EventHandle, EventId, HandleToken, SessionId,
    Tokens,
};

/// Where a buffer's memory comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BufferSource {
    CudaIpc {
        handle: Vec<u8>,
    },
    HostShm {
        name: String,
    },
    /// Memory a client passed by descriptor. The front keeps its own
    /// reference (to open the buffer again after an executor restart) until
    /// the registration ends.
    PosixFd {
        fd: SharedFd,
        offset: u64,
        /// The client's word for the allocation's size (CUDA), checked by
        /// the driver.
        allocation_size: u64,
    },
}

/// A descriptor shared by a registration and its re-opens; two are equal
/// when they are the same descriptor.
#[derive(Debug, Clone)]
pub struct SharedFd(pub std::sync::Arc<std::os::fd::OwnedFd>);

impl PartialEq for SharedFd {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for SharedFd {}

impl BufferSource {
    /// True for memory passed by descriptor: the front keeps the
    /// descriptor, and its executor holds another, while it is registered.
    pub fn holds_descriptor(&self) -> bool {
        matches!(self, BufferSource::PosixFd { .. })
    }

    pub fn kind(&self) -> &'static str {
        match self {
            BufferSource::CudaIpc { .. } => "cuda_ipc",
            BufferSource::HostShm { .. } => "host_shm",
            BufferSource::PosixFd { .. } => "posix_fd",
        }
    }
}

/// A registered buffer.
#[derive(Debug, Clone)]
pub struct BufferEntry {
    pub id: BufferId,
    pub session: SessionId,
    pub label: String,
    pub source: BufferSource,
    pub size: u64,
    pub device_index: usize,
    pub device_uuid: String,
    /// The generation the mapping is open in; `None` once it could not be
    /// re-opened after a restart.
    pub open_in: Option<DeviceGeneration>,
    /// The registering peer's uid, which must own a host shared-memory
    /// object. Always set for host shared memory: a caller without
    /// credentials cannot register one.
    pub owner_uid: Option<u32>,
    /// How the session's ring names it.
    pub ring_index: u32,
}

/// A registered IPC event.
#[derive(Debug, Clone)]
pub struct EventEntry {
    pub id: EventId,
    pub session: SessionId,
    pub label: String,
    pub handle: Vec<u8>,
    pub device_index: usize,
    pub device_uuid: String,
    pub open_in: Option<DeviceGeneration>,
}

/// The two kinds of registered object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectKind {
    Buffer,
    Event,
}

impl ObjectKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectKind::Buffer => "buffer",
            ObjectKind::Event => "event",
        }
    }
}

impl fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a handle a session does not hold is refused: the same words for a
/// released handle, another session's and one never issued.
pub const UNKNOWN_TO_SESSION: &str =
    "it is not registered in this session (released, or never registered here)";

/// Why the registry refused a handle.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// Not this session's: released, another session's, or never issued.
    #[error("{kind} {handle} is stale: {UNKNOWN_TO_SESSION}")]
    Unknown { kind: ObjectKind, handle: String },
    /// Minted by another boot of the daemon.
    #[error("{kind} {handle} is stale: minted by another daemon boot")]
    OtherBoot { kind: ObjectKind, handle: String },
    /// Its mapping could not be re-opened after an executor restart.
    #[error("{kind} {handle} is stale: it could not be re-opened after an executor restart")]
    Dead { kind: ObjectKind, handle: String },
}

impl RegistryError {
    pub fn kind(&self) -> ObjectKind {
        match self {
            RegistryError::Unknown { kind, .. }
            | RegistryError::OtherBoot { kind, .. }
            | RegistryError::Dead { kind, .. } => *kind,
        }
    }

    /// The handle as the client spelled it (at most 96 characters).
    pub fn handle(&self) -> &str {
        match self {
            RegistryError::Unknown { handle, .. }
            | RegistryError::OtherBoot { handle, .. }
            | RegistryError::Dead { handle, .. } => handle,
        }
    }

    /// Why, in words (the `why` of the refusal's metadata).
    pub fn why(&self) -> &'static str {
        match self {
            RegistryError::Unknown { .. } => UNKNOWN_TO_SESSION,
            RegistryError::OtherBoot { .. } => "minted by another daemon boot",
            RegistryError::Dead { .. } => "it could not be re-opened after an executor restart",
        }
    }
}

fn clip(handle: &str) -> String {
    handle.chars().take(96).collect()
}

/// What the registry keeps for every kind of object.
trait Registered: Clone {
    const KIND: ObjectKind;
    type Id: Copy + Ord + std::hash::Hash;
    fn id(&self) -> Self::Id;
    fn session(&self) -> &SessionId;
    fn open_in(&self) -> Option<DeviceGeneration>;
    fn set_open_in(&mut self, generation: Option<DeviceGeneration>);
    fn device_index(&self) -> usize;
}

impl Registered for BufferEntry {
    const KIND: ObjectKind = ObjectKind::Buffer;
    type Id = BufferId;
    fn id(&self) -> BufferId {
        self.id
    }
    fn session(&self) -> &SessionId {
        &self.session
    }
    fn open_in(&self) -> Option<DeviceGeneration> {
        self.open_in
    }
    fn set_open_in(&mut self, generation: Option<DeviceGeneration>) {
        self.open_in = generation;
    }
    fn device_index(&self) -> usize {
        self.device_index
    }
}

impl Registered for EventEntry {
    const KIND: ObjectKind = ObjectKind::Event;
    type Id = EventId;
    fn id(&self) -> EventId {
        self.id
    }
    fn session(&self) -> &SessionId {
        &self.session
    }
    fn open_in(&self) -> Option<DeviceGeneration> {
        self.open_in
    }
    fn set_open_in(&mut self, generation: Option<DeviceGeneration>) {
        self.open_in = generation;
    }
    fn device_index(&self) -> usize {
        self.device_index
    }
}

/// One kind of object: the entries and each session's tokens for them.
#[derive(Debug)]
struct Table<E: Registered> {
    entries: BTreeMap<E::Id, E>,
    tokens: HashMap<SessionId, Tokens<E::Id>>,
}

impl<E: Registered> Default for Table<E> {
    fn default() -> Self {
        Table {
            entries: BTreeMap::new(),
            tokens: HashMap::new(),
        }
    }
}

impl<E: Registered> Table<E> {
    fn register(&mut self, entry: E) -> HandleToken {
        let token = self
            .tokens
            .entry(entry.session().clone())
            .or_default()
            .issue(entry.id());
        self.entries.insert(entry.id(), entry);
        token
    }

    /// The id `token` names for `session` (ownership only, not liveness).
    fn owned(
        &self,
        boot: BootId,
        session: &SessionId,
        token: HandleToken,
        handle_boot: BootId,
        text: &str,
    ) -> Result<E::Id, RegistryError> {
        if handle_boot != boot {
            return Err(RegistryError::OtherBoot {
                kind: E::KIND,
                handle: clip(text),
            });
        }
        self.tokens
            .get(session)
            .and_then(|t| t.get(token))
            .filter(|id| self.entries.get(id).is_some_and(|e| e.session() == session))
            .ok_or_else(|| RegistryError::Unknown {
                kind: E::KIND,
                handle: clip(text),
            })
    }

    fn live(
        &self,
        boot: BootId,
        session: &SessionId,
        token: HandleToken,
        handle_boot: BootId,
        text: &str,
    ) -> Result<&E, RegistryError> {
        let id = self.owned(boot, session, token, handle_boot, text)?;
        let entry = self
            .entries
            .get(&id)
            .ok_or_else(|| RegistryError::Unknown {
                kind: E::KIND,
                handle: clip(text),
            })?;
        if entry.open_in().is_none() {
            return Err(RegistryError::Dead {
                kind: E::KIND,
                handle: clip(text),
            });
        }
        Ok(entry)
    }

    fn release(
        &mut self,
        boot: BootId,
        session: &SessionId,
        token: HandleToken,
        handle_boot: BootId,
        text: &str,
    ) -> Result<E, RegistryError> {
        let id = self.owned(boot, session, token, handle_boot, text)?;
        if let Some(tokens) = self.tokens.get_mut(session) {
            tokens.remove_token(token);
        }
        self.entries
            .remove(&id)
            .ok_or_else(|| RegistryError::Unknown {
                kind: E::KIND,
                handle: clip(text),
            })
    }

    fn release_session(&mut self, session: &SessionId) -> Vec<E> {
        let Some(tokens) = self.tokens.remove(session) else {
            return Vec::new();
        };
        let mut ids: Vec<E::Id> = tokens.iter().map(|(_, id)| id).collect();
        ids.sort_unstable();
        ids.iter()
            .filter_map(|id| self.entries.remove(id))
            .collect()
    }

    fn count(&self, session: &SessionId) -> usize {
        self.tokens.get(session).map_or(0, |t| t.len())
    }

    fn on_device(&self, index: usize) -> Vec<E> {
        self.entries
            .values()
            .filter(|e| e.device_index() == index)
            .cloned()
            .collect()
    }

    fn set_open_in(&mut self, id: E::Id, generation: Option<DeviceGeneration>) -> bool {
        match self.entries.get_mut(&id) {
            Some(entry) => {
                entry.set_open_in(generation);
                true
            }
            None => false,
        }
    }
}

/// What one session holds in the registry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Holdings {
    pub buffers: u32,
    pub events: u32,
    pub buffer_bytes: u64,
    /// Buffers passed by descriptor.
    pub descriptors: u32,
}

/// Every buffer and event registration of one daemon boot.
#[derive(Debug)]
pub struct Registry {
    boot: BootId,
    next_id: u64,
    buffers: Table<BufferEntry>,
    events: Table<EventEntry>,
    /// Registered buffer bytes per session.
    bytes: HashMap<SessionId, u64>,
    /// Buffers passed by descriptor, per session.
    descriptors: HashMap<SessionId, u32>,
    /// The sums of `bytes` and `descriptors`.
    total_bytes: u64,
    total_descriptors: u64,
    /// Bumped by every registration and release: a reader that saw the
    /// same count has seen the same registrations (a spare executor's sync
    /// skips its copy of the registry when nothing changed).
    changes: u64,
}

impl Registry {
    pub fn new(boot: BootId) -> Registry {
        Registry {
            boot,
            next_id: 0,
            buffers: Table::default(),
            events: Table::default(),
            bytes: HashMap::new(),
            descriptors: HashMap::new(),
            total_bytes: 0,
            total_descriptors: 0,
            changes: 0,
        }
    }

    /// How many registrations and releases there have been (see
    /// `changes`); only ever grows.
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// A fresh id for a buffer or event about to be opened (one counter for
    /// both, never reused).
    pub fn reserve_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Records an opened buffer and issues its session's handle.
    pub fn register_buffer(&mut self, entry: BufferEntry) -> BufferHandle {
        self.changes += 1;
        let session_bytes = self.bytes.entry(entry.session.clone()).or_default();
        *session_bytes = session_bytes.saturating_add(entry.size);
        self.total_bytes = self.total_bytes.saturating_add(entry.size);
        if entry.source.holds_descriptor() {
            *self.descriptors.entry(entry.session.clone()).or_default() += 1;
            self.total_descriptors += 1;
        }
        let token = self.buffers.register(entry);
        BufferHandle {
            token,
            boot: self.boot,
        }
    }

    /// Records an opened event and issues its session's handle.
    pub fn register_event(&mut self, entry: EventEntry) -> EventHandle {
        self.changes += 1;
        let token = self.events.register(entry);
        EventHandle {
            token,
            boot: self.boot,
        }
    }

    /// The buffer `handle` (spelled `text`) names for `session`, if its
    /// mapping is open: what a launch may use.
    pub fn buffer_for_launch(
        &self,
        session: &SessionId,
        handle: BufferHandle,
        text: &str,
    ) -> Result<&BufferEntry, RegistryError> {
        self.buffers
            .live(self.boot, session, handle.token, handle.boot, text)
    }

    /// The event `handle` names for `session`, if it is open.
    pub fn event_for_launch(
        &self,
        session: &SessionId,
        handle: EventHandle,
        text: &str,
    ) -> Result<&EventEntry, RegistryError> {
        self.events
            .live(self.boot, session, handle.token, handle.boot, text)
    }

    /// Forgets `session`'s buffer `handle` (dead or alive); returns it so
    /// that its mapping can be closed.
    pub fn release_buffer(
        &mut self,
        session: &SessionId,
        handle: BufferHandle,
        text: &str,
    ) -> Result<BufferEntry, RegistryError> {
        let entry = self
            .buffers
            .release(self.boot, session, handle.token, handle.boot, text)?;
        self.changes += 1;
        self.uncount(&entry);
        Ok(entry)
    }

    /// Forgets `session`'s event `handle` (dead or alive).
    pub fn release_event(
        &mut self,
        session: &SessionId,
        handle: EventHandle,
        text: &str,
    ) -> Result<EventEntry, RegistryError> {
        let entry = self
            .events
            .release(self.boot, session, handle.token, handle.boot, text)?;
        self.changes += 1;
        Ok(entry)
    }

    /// Forgets everything `session` registered; returns it in registration
    /// order.
    pub fn release_session(&mut self, session: &SessionId) -> (Vec<BufferEntry>, Vec<EventEntry>) {
        self.changes += 1;
        let buffers = self.buffers.release_session(session);
        for entry in &buffers {
            self.uncount(entry);
        }
        self.bytes.remove(session);
        self.descriptors.remove(session);
        (buffers, self.events.release_session(session))
    }

    fn uncount(&mut self, entry: &BufferEntry) {
        self.total_bytes = self.total_bytes.saturating_sub(entry.size);
        if let Some(bytes) = self.bytes.get_mut(&entry.session) {
            *bytes = bytes.saturating_sub(entry.size);
            if *bytes == 0 && self.buffers.count(&entry.session) == 0 {
                self.bytes.remove(&entry.session);
            }
        }
        if entry.source.holds_descriptor() {
            self.total_descriptors = self.total_descriptors.saturating_sub(1);
            if let Some(held) = self.descriptors.get_mut(&entry.session) {
                *held = held.saturating_sub(1);
                if *held == 0 {
                    self.descriptors.remove(&entry.session);
                }
            }
        }
    }

    /// What `session` holds, as limits count it.
    pub fn holdings(&self, session: &SessionId) -> Holdings {
        Holdings {
            buffers: self.buffers.count(session) as u32,
            events: self.events.count(session) as u32,
            buffer_bytes: self.bytes.get(session).copied().unwrap_or(0),
            descriptors: self.descriptors.get(session).copied().unwrap_or(0),
        }
    }

    /// Registered buffer bytes and buffers passed by descriptor,
    /// daemon-wide (what the total limits count).
    pub fn totals(&self) -> (u64, u64) {
        (self.total_bytes, self.total_descriptors)
    }

    /// `session`'s buffers with their handles, in registration order.
    pub fn buffers_of(&self, session: &SessionId) -> Vec<(BufferHandle, &BufferEntry)> {
        let Some(tokens) = self.buffers.tokens.get(session) else {
            return Vec::new();
        };
        let mut held: Vec<(BufferHandle, &BufferEntry)> = tokens
            .iter()
            .filter_map(|(token, id)| {
                let handle = BufferHandle {
                    token,
                    boot: self.boot,
                };
                Some((handle, self.buffers.entries.get(&id)?))
            })
            .collect();
        held.sort_by_key(|(_, entry)| entry.id);
        held
    }

    /// Every registration on device `index` (to re-open after a restart).
    pub fn on_device(&self, index: usize) -> (Vec<BufferEntry>, Vec<EventEntry>) {
        (self.buffers.on_device(index), self.events.on_device(index))
    }

    /// Records where buffer `id` is open now (`None`: it is dead). False
    /// when it was released meanwhile.
    pub fn set_buffer_open_in(&mut self, id: BufferId, open_in: Option<DeviceGeneration>) -> bool {
        self.buffers.set_open_in(id, open_in)
    }

    /// Records where event `id` is open now. False when it was released.
    pub fn set_event_open_in(&mut self, id: EventId, open_in: Option<DeviceGeneration>) -> bool {
        self.events.set_open_in(id, open_in)
    }

    /// Registered buffers and their bytes, daemon-wide (for metrics).
    pub fn buffer_totals(&self) -> (u64, u64) {
        (
            self.buffers.entries.len() as u64,
            self.buffers.entries.values().map(|b| b.size).sum(),
        )
    }

    /// Forgets every registration (shutdown: the executors release theirs
    /// when they stop).
    pub fn clear(&mut self) {
        *self = Registry {
            next_id: self.next_id,
            changes: self.changes + 1,
            ..Registry::new(self.boot)
        };
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn entry(registry: &mut Registry, session: &SessionId, size: u64) -> BufferEntry {
        BufferEntry {
            id: BufferId(registry.reserve_id()),
            session: session.clone(),
            label: String::new(),
            source: BufferSource::HostShm { name: "/x".into() },
            size,
            device_index: 0,
            device_uuid: "HOST-0".into(),
            open_in: Some(DeviceGeneration(1)),
            owner_uid: None,
            ring_index: 0,
        }
    }

    #[test]
    fn lookups_check_boot_owner_and_liveness() {
        let boot = BootId::random();
        let (a, b) = (SessionId::random(), SessionId::random());
        let mut registry = Registry::new(boot);
        let first = entry(&mut registry, &a, 64);
        let first_id = first.id;
        let h1 = registry.register_buffer(first);
        let second = entry(&mut registry, &a, 32);
        let h2 = registry.register_buffer(second);
        assert_eq!(
            registry.buffer_for_launch(&a, h1, "h").unwrap().id,
            first_id
        );
        // Another session's buffer and a never-issued token: one answer.
        let never = BufferHandle {
            token: HandleToken(h1.token.0 ^ 1),
            boot,
        };
        assert_eq!(
            registry.buffer_for_launch(&b, h1, "h").unwrap_err(),
            registry.buffer_for_launch(&a, never, "h").unwrap_err()
        );
        assert!(matches!(
            registry.buffer_for_launch(&b, h1, "h"),
            Err(RegistryError::Unknown {
                kind: ObjectKind::Buffer,
                ..
            })
        ));
        let other_boot = BufferHandle {
            token: h1.token,
            boot: BootId::random(),
        };
        assert!(matches!(
            registry.buffer_for_launch(&a, other_boot, "h"),
            Err(RegistryError::OtherBoot { .. })
        ));
        // A dead mapping can be released but not launched on.
        let dead = registry.buffers_of(&a)[1].1.id;
        assert!(registry.set_buffer_open_in(dead, None));
        assert!(matches!(
            registry.buffer_for_launch(&a, h2, "h"),
            Err(RegistryError::Dead { .. })
        ));
        assert_eq!(registry.holdings(&a).buffer_bytes, 96);
        assert_eq!(registry.release_buffer(&a, h2, "h").unwrap().id, dead);
        assert_eq!(
            registry.holdings(&a),
            Holdings {
                buffers: 1,
                events: 0,
                buffer_bytes: 64,
                descriptors: 0,
            }
        );
        // Released: stale forever, and ids are never reused.
        assert!(registry.release_buffer(&a, h2, "h").is_err());
        assert_ne!(registry.reserve_id(), registry.reserve_id());
        let (buffers, events) = registry.release_session(&a);
        assert_eq!((buffers.len(), events.len()), (1, 0));
        assert_eq!(registry.holdings(&a), Holdings::default());
        assert_eq!(registry.buffer_totals(), (0, 0));
        assert_eq!(registry.totals(), (0, 0));
    }

    #[test]
    fn every_registration_and_release_changes_the_count_and_nothing_else_does() {
        let a = SessionId::random();
        let mut registry = Registry::new(BootId::random());
        let mut seen = registry.changes();
        let mut changed = |registry: &Registry, what: &str| {
            assert!(registry.changes() > seen, "{what} left the count");
            seen = registry.changes();
        };
        let first = entry(&mut registry, &a, 8);
        let id = first.id;
        let handle = registry.register_buffer(first);
        changed(&registry, "a registration");
        // Where a buffer is open is not a registration.
        let before = registry.changes();
        assert!(registry.set_buffer_open_in(id, Some(DeviceGeneration(2))));
        let _ = registry.on_device(0);
        assert_eq!(registry.changes(), before);
        registry.release_buffer(&a, handle, "h").unwrap();
        changed(&registry, "a release");
        let second = entry(&mut registry, &a, 8);
        registry.register_buffer(second);
        changed(&registry, "a second registration");
        registry.release_session(&a);
        changed(&registry, "a session's release");
        registry.clear();
        changed(&registry, "the clear");
    }

    #[test]
    fn descriptors_and_bytes_are_counted_per_session_and_in_all() {
        let (a, b) = (SessionId::random(), SessionId::random());
        let mut registry = Registry::new(BootId::random());
        let memfd = std::fs::File::open("/dev/null").unwrap();
        let fd = SharedFd(std::sync::Arc::new(std::os::fd::OwnedFd::from(memfd)));
        let mut by_fd = entry(&mut registry, &a, 1 << 40);
        by_fd.source = BufferSource::PosixFd {
            fd,
            offset: 0,
            allocation_size: 0,
        };
        let handle = registry.register_buffer(by_fd);
        let plain = entry(&mut registry, &a, 10);
        registry.register_buffer(plain);
        let other = entry(&mut registry, &b, 5);
        registry.register_buffer(other);
        assert_eq!(registry.holdings(&a).descriptors, 1);
        assert_eq!(registry.holdings(&b).descriptors, 0);
        assert_eq!(registry.totals(), ((1 << 40) + 15, 1));
        registry.release_buffer(&a, handle, "h").unwrap();
        assert_eq!(registry.totals(), (15, 0));
        assert_eq!(registry.holdings(&a).descriptors, 0);
        registry.release_session(&a);
        registry.release_session(&b);
        assert_eq!(registry.totals(), (0, 0));
    }
}
