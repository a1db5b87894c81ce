//! The buffer and event registry: every registration of every session, the
//! device it lives on and the generation its mapping is open in.
//!
//! Invariants:
//! - Buffer and event ids are never reused within a boot, so a released
//!   handle stays stale forever.
//! - A registration's mapping is open in exactly the generation recorded in
//!   `open_in`; after an executor restart it is re-opened in the new
//!   generation, or marked dead (`open_in = None`) if that fails.
//! - Launch bounds are checked against `size`, which the executor verified
//!   the mapping covers when it opened it.
//! - A lookup answers alike for an id that was never registered, one that was
//!   released and one another session registered: a session cannot learn
//!   that another session's object exists.

use std::collections::BTreeMap;

use crate::handles::{BufferId, DeviceGeneration, EventId, SessionId};

/// Where a buffer's memory comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BufferSource {
    CudaIpc { handle: Vec<u8> },
    HostShm { name: String },
}

impl BufferSource {
    pub fn kind(&self) -> &'static str {
        match self {
            BufferSource::CudaIpc { .. } => "cuda_ipc",
            BufferSource::HostShm { .. } => "host_shm",
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

/// Why a registry lookup failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("{kind} {handle} is stale: {why}")]
    Stale {
        kind: &'static str,
        handle: String,
        why: &'static str,
    },
}

/// Why a handle a session does not hold is refused: the same words for a
/// released handle, another session's and one never issued.
pub const UNKNOWN_TO_SESSION: &str =
    "it is not registered in this session (released, or never registered here)";

fn unknown(kind: &'static str, handle: &str) -> RegistryError {
    RegistryError::Stale {
        kind,
        handle: handle.chars().take(96).collect(),
        why: UNKNOWN_TO_SESSION,
    }
}

/// Every buffer and event registration.
#[derive(Debug, Default)]
pub struct Registry {
    next_id: u64,
    pub buffers: BTreeMap<BufferId, BufferEntry>,
    pub events: BTreeMap<EventId, EventEntry>,
}

impl Registry {
    /// A fresh id for a buffer or event (shared counter, never reused).
    pub fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// The buffer `id` if `session` owns it and its mapping is open.
    pub fn buffer(
        &self,
        id: BufferId,
        session: &SessionId,
        handle: &str,
    ) -> Result<&BufferEntry, RegistryError> {
        let entry = self
            .buffers
            .get(&id)
            .filter(|e| &e.session == session)
            .ok_or_else(|| unknown("buffer", handle))?;
        if entry.open_in.is_none() {
            return Err(RegistryError::Stale {
                kind: "buffer",
                handle: handle.to_string(),
                why: "it could not be re-opened after an executor restart",
            });
        }
        Ok(entry)
    }

    /// The event `id` if `session` owns it and it is open.
    pub fn event(
        &self,
        id: EventId,
        session: &SessionId,
        handle: &str,
    ) -> Result<&EventEntry, RegistryError> {
        let entry = self
            .events
            .get(&id)
            .filter(|e| &e.session == session)
            .ok_or_else(|| unknown("event", handle))?;
        if entry.open_in.is_none() {
            return Err(RegistryError::Stale {
                kind: "event",
                handle: handle.to_string(),
                why: "it could not be re-opened after an executor restart",
            });
        }
        Ok(entry)
    }

    /// The refusal for a handle `session` does not hold.
    pub fn unknown(kind: &'static str, handle: &str) -> RegistryError {
        unknown(kind, handle)
    }

    /// Total registered bytes (for metrics).
    pub fn total_bytes(&self) -> u64 {
        self.buffers.values().map(|b| b.size).sum()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn entry(id: u64, session: &SessionId, open: bool) -> BufferEntry {
        BufferEntry {
            id: BufferId(id),
            session: session.clone(),
            label: String::new(),
            source: BufferSource::HostShm { name: "/x".into() },
            size: 64,
            device_index: 0,
            device_uuid: "HOST-0".into(),
            open_in: open.then_some(DeviceGeneration(1)),
            owner_uid: None,
        }
    }

    #[test]
    fn lookups_check_owner_and_liveness() {
        let (a, b) = (SessionId::random(), SessionId::random());
        let mut registry = Registry::default();
        registry.buffers.insert(BufferId(1), entry(1, &a, true));
        registry.buffers.insert(BufferId(2), entry(2, &a, false));
        assert!(registry.buffer(BufferId(1), &a, "h").is_ok());
        // Another session's buffer and a never-registered one: one answer.
        assert_eq!(
            registry.buffer(BufferId(1), &b, "h").unwrap_err(),
            registry.buffer(BufferId(3), &b, "h").unwrap_err()
        );
        assert!(matches!(
            registry.buffer(BufferId(2), &a, "h"),
            Err(RegistryError::Stale { .. })
        ));
        assert!(matches!(
            registry.buffer(BufferId(3), &a, "h"),
            Err(RegistryError::Stale { .. })
        ));
        assert_ne!(registry.next_id(), registry.next_id());
    }
}
