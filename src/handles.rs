//! The opaque handles ptxd gives out, their text form, and the identities
//! they are built from.
//!
//! Invariants:
//! - Every handle names the daemon boot that minted it; a handle from another
//!   boot never resolves (it is stale, not someone else's object).
//! - A kernel handle names slot, slot epoch and device generation, so a handle
//!   whose slot was freed or reused, or whose generation died, is detectably
//!   stale and never launches whatever occupies the slot now.
//! - Device generations are never reused: the upper 32 bits are random per
//!   boot, the lower 32 count executor starts within the boot.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// This daemon boot's identity, random per start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BootId(pub u64);

impl BootId {
    pub fn random() -> BootId {
        BootId(rand::random::<u64>() | 1)
    }
}

impl fmt::Display for BootId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// One start of one executor. Never reused within or across boots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceGeneration(pub u64);

impl fmt::Display for DeviceGeneration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Mints device generations: `(boot prefix << 32) | counter`.
#[derive(Debug)]
pub struct GenerationCounter {
    prefix: u64,
    next: AtomicU64,
}

impl GenerationCounter {
    pub fn new(boot: BootId) -> Self {
        GenerationCounter {
            prefix: boot.0 & 0xffff_ffff_0000_0000,
            next: AtomicU64::new(1),
        }
    }

    pub fn next(&self) -> DeviceGeneration {
        let n = self.next.fetch_add(1, Ordering::Relaxed) & 0xffff_ffff;
        DeviceGeneration(self.prefix | n)
    }
}

/// Index of a slot in the slot table.
pub type SlotIndex = u32;
/// Bumped every time a slot is given to a new occupant.
pub type SlotEpoch = u64;

/// Why a handle's text did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed {kind} handle {text:?}")]
pub struct MalformedHandle {
    pub kind: &'static str,
    pub text: String,
}

fn malformed(kind: &'static str, text: &str) -> MalformedHandle {
    // Never echo an unbounded client string back into errors and logs.
    let text: String = text.chars().take(96).collect();
    MalformedHandle { kind, text }
}

fn fields<const N: usize>(
    text: &str,
    prefix: &str,
    kind: &'static str,
) -> Result<[u64; N], MalformedHandle> {
    let rest = text
        .strip_prefix(prefix)
        .ok_or_else(|| malformed(kind, text))?;
    let mut out = [0u64; N];
    let mut parts = rest.split('-');
    for slot in out.iter_mut() {
        let part = parts.next().ok_or_else(|| malformed(kind, text))?;
        *slot = u64::from_str_radix(part, 16).map_err(|_| malformed(kind, text))?;
    }
    if parts.next().is_some() {
        return Err(malformed(kind, text));
    }
    Ok(out)
}

/// A kernel handle: `krn-<slot>-<epoch>-<generation>-<boot>`, fields in hex.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KernelHandle {
    pub slot: SlotIndex,
    pub epoch: SlotEpoch,
    pub generation: DeviceGeneration,
    pub boot: BootId,
}

impl KernelHandle {
    pub fn parse(text: &str) -> Result<KernelHandle, MalformedHandle> {
        let [slot, epoch, generation, boot] = fields::<4>(text, "krn-", "kernel")?;
        let slot = SlotIndex::try_from(slot).map_err(|_| malformed("kernel", text))?;
        Ok(KernelHandle {
            slot,
            epoch,
            generation: DeviceGeneration(generation),
            boot: BootId(boot),
        })
    }
}

impl fmt::Display for KernelHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "krn-{:x}-{:x}-{:x}-{:x}",
            self.slot, self.epoch, self.generation.0, self.boot.0
        )
    }
}

/// Identifies a registered buffer within a boot. Never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufferId(pub u64);

/// Identifies a registered event within a boot. Never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(pub u64);

/// A buffer handle: `buf-<id>-<boot>`, fields in hex.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufferHandle {
    pub id: BufferId,
    pub boot: BootId,
}

impl BufferHandle {
    pub fn parse(text: &str) -> Result<BufferHandle, MalformedHandle> {
        let [id, boot] = fields::<2>(text, "buf-", "buffer")?;
        Ok(BufferHandle {
            id: BufferId(id),
            boot: BootId(boot),
        })
    }
}

impl fmt::Display for BufferHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "buf-{:x}-{:x}", self.id.0, self.boot.0)
    }
}

/// An event handle: `evt-<id>-<boot>`, fields in hex.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventHandle {
    pub id: EventId,
    pub boot: BootId,
}

impl EventHandle {
    pub fn parse(text: &str) -> Result<EventHandle, MalformedHandle> {
        let [id, boot] = fields::<2>(text, "evt-", "event")?;
        Ok(EventHandle {
            id: EventId(id),
            boot: BootId(boot),
        })
    }
}

impl fmt::Display for EventHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "evt-{:x}-{:x}", self.id.0, self.boot.0)
    }
}

/// A session id: `ses-` and 128 random bits in hex. It is a bearer secret.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(String);

impl SessionId {
    pub fn random() -> SessionId {
        SessionId(format!("ses-{:032x}", rand::random::<u128>()))
    }

    /// Accepts only the shape ptxd mints, so that a malformed id is an
    /// invalid argument rather than an unknown session.
    pub fn parse(text: &str) -> Result<SessionId, MalformedHandle> {
        let ok = text.len() == 36
            && text.starts_with("ses-")
            && text[4..]
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
        if ok {
            Ok(SessionId(text.to_string()))
        } else {
            Err(malformed("session", text))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_through_text() {
        for _ in 0..200 {
            let k = KernelHandle {
                slot: rand::random(),
                epoch: rand::random(),
                generation: DeviceGeneration(rand::random()),
                boot: BootId(rand::random()),
            };
            assert_eq!(KernelHandle::parse(&k.to_string()).unwrap(), k);
            let b = BufferHandle {
                id: BufferId(rand::random()),
                boot: BootId(rand::random()),
            };
            assert_eq!(BufferHandle::parse(&b.to_string()).unwrap(), b);
            let e = EventHandle {
                id: EventId(rand::random()),
                boot: BootId(rand::random()),
            };
            assert_eq!(EventHandle::parse(&e.to_string()).unwrap(), e);
            let s = SessionId::random();
            assert_eq!(SessionId::parse(s.as_str()).unwrap(), s);
        }
    }

    #[test]
    fn malformed_handles_are_refused() {
        for bad in [
            "",
            "krn-",
            "krn-1-2-3",
            "krn-1-2-3-4-5",
            "krn-1-2-3-zz",
            "buf-1-2-3",
            "krn-100000000-0-0-0",
            "evt--1",
        ] {
            assert!(KernelHandle::parse(bad).is_err(), "{bad}");
            assert!(BufferHandle::parse(bad).is_err(), "{bad}");
            assert!(EventHandle::parse(bad).is_err(), "{bad}");
        }
        assert!(SessionId::parse("ses-XYZ").is_err());
        let long = "x".repeat(10_000);
        assert!(KernelHandle::parse(&long).unwrap_err().text.len() <= 96);
    }

    #[test]
    fn generations_are_unique_and_carry_the_boot_prefix() {
        let boot = BootId(0xdead_beef_0000_0001);
        let counter = GenerationCounter::new(boot);
        let a = counter.next();
        let b = counter.next();
        assert_ne!(a, b);
        assert_eq!(a.0 >> 32, b.0 >> 32);
        let other = GenerationCounter::new(BootId(0x1234_5678_0000_0001)).next();
        assert_ne!(a, other);
    }
}
