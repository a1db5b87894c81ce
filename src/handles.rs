//! The opaque handles ptxd gives out, their text form, and the identities
//! they are built from.
//!
//! Invariants:
//! - Every handle names the daemon boot that minted it; a handle from another
//!   boot never resolves (it is stale, not someone else's object).
//! - A handle a client sees is per session and unguessable: its identifying
//!   part is a random 64-bit [`HandleToken`] that only the issuing session's
//!   [`Tokens`] table resolves. Another session's live handle and a
//!   never-issued one therefore resolve alike (to nothing), and two sessions
//!   holding the same cached kernel hold different handles. Nothing in the
//!   text counts anything (no sequential ids, no slot indices).
//! - Behind the token, a kernel handle names slot, slot epoch and device
//!   generation (the generation is also in the text), so a handle whose slot
//!   was freed or reused, or whose generation died, is detectably stale and
//!   never launches whatever occupies the slot now.
//! - Device generations are never reused: the upper 32 bits are random per
//!   boot, the lower 32 count executor starts within the boot.

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
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

/// Whether `part` is a field as ptxd prints it: lower-case hex digits
/// only (`from_str_radix` also takes a `+` and upper case), the token (the
/// first field) as its 16 digits, any other without leading zeros. So a
/// handle has one spelling: no alias of it names the same object.
fn canonical_hex(part: &str, token: bool) -> bool {
    let digits = part.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let width = if token {
        part.len() == 16
    } else {
        !part.is_empty() && (part == "0" || !part.starts_with('0'))
    };
    digits && width
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
    for (index, slot) in out.iter_mut().enumerate() {
        let part = parts.next().ok_or_else(|| malformed(kind, text))?;
        if !canonical_hex(part, index == 0) {
            return Err(malformed(kind, text));
        }
        *slot = u64::from_str_radix(part, 16).map_err(|_| malformed(kind, text))?;
    }
    if parts.next().is_some() {
        return Err(malformed(kind, text));
    }
    Ok(out)
}

/// A kernel as the slot table knows it: slot, the slot's epoch when the
/// kernel moved in, the device generation and the boot. Never leaves the
/// daemon; a session's [`KernelRef`] names it through a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KernelHandle {
    pub slot: SlotIndex,
    pub epoch: SlotEpoch,
    pub generation: DeviceGeneration,
    pub boot: BootId,
}

impl fmt::Display for KernelHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "slot {} epoch {} generation {}",
            self.slot, self.epoch, self.generation
        )
    }
}

/// The random, per-session part of a handle a client holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HandleToken(pub u64);

/// A kernel handle as a client holds it:
/// `krn-<token>-<generation>-<boot>`, fields in hex.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KernelRef {
    pub token: HandleToken,
    pub generation: DeviceGeneration,
    pub boot: BootId,
}

impl KernelRef {
    pub fn parse(text: &str) -> Result<KernelRef, MalformedHandle> {
        let [token, generation, boot] = fields::<3>(text, "krn-", "kernel")?;
        Ok(KernelRef {
            token: HandleToken(token),
            generation: DeviceGeneration(generation),
            boot: BootId(boot),
        })
    }
}

impl fmt::Display for KernelRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "krn-{:016x}-{:x}-{:x}",
            self.token.0, self.generation.0, self.boot.0
        )
    }
}

/// Identifies a registered buffer within a boot. Never reused, never shown
/// to a client (its [`BufferHandle`] carries a token instead).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufferId(pub u64);

/// Identifies a registered event within a boot. Never reused, never shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(pub u64);

/// A buffer handle: `buf-<token>-<boot>`, fields in hex.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufferHandle {
    pub token: HandleToken,
    pub boot: BootId,
}

impl BufferHandle {
    pub fn parse(text: &str) -> Result<BufferHandle, MalformedHandle> {
        let [token, boot] = fields::<2>(text, "buf-", "buffer")?;
        Ok(BufferHandle {
            token: HandleToken(token),
            boot: BootId(boot),
        })
    }
}

impl fmt::Display for BufferHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "buf-{:016x}-{:x}", self.token.0, self.boot.0)
    }
}

/// An event handle: `evt-<token>-<boot>`, fields in hex.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventHandle {
    pub token: HandleToken,
    pub boot: BootId,
}

impl EventHandle {
    pub fn parse(text: &str) -> Result<EventHandle, MalformedHandle> {
        let [token, boot] = fields::<2>(text, "evt-", "event")?;
        Ok(EventHandle {
            token: HandleToken(token),
            boot: BootId(boot),
        })
    }
}

impl fmt::Display for EventHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "evt-{:016x}-{:x}", self.token.0, self.boot.0)
    }
}

/// One session's handles of one kind: random tokens mapped to the objects
/// they name, both ways. Issuing the same object twice gives the same token
/// (a session holds a cached kernel once).
#[derive(Debug)]
pub struct Tokens<T> {
    by_token: HashMap<HandleToken, T>,
    by_value: HashMap<T, HandleToken>,
}

impl<T> Default for Tokens<T> {
    fn default() -> Self {
        Tokens {
            by_token: HashMap::new(),
            by_value: HashMap::new(),
        }
    }
}

impl<T: Copy + Eq + Hash> Tokens<T> {
    /// The token for `value`, minting a fresh random one the first time.
    pub fn issue(&mut self, value: T) -> HandleToken {
        if let Some(token) = self.by_value.get(&value) {
            return *token;
        }
        let token = loop {
            let candidate = HandleToken(rand::random::<u64>());
            if candidate.0 != 0 && !self.by_token.contains_key(&candidate) {
                break candidate;
            }
        };
        self.by_token.insert(token, value);
        self.by_value.insert(value, token);
        token
    }

    /// What `token` names in this session, if this session issued it.
    pub fn get(&self, token: HandleToken) -> Option<T> {
        self.by_token.get(&token).copied()
    }

    /// The token this session holds for `value`.
    pub fn token_of(&self, value: &T) -> Option<HandleToken> {
        self.by_value.get(value).copied()
    }

    pub fn contains(&self, value: &T) -> bool {
        self.by_value.contains_key(value)
    }

    /// Forgets a token; returns what it named.
    pub fn remove_token(&mut self, token: HandleToken) -> Option<T> {
        let value = self.by_token.remove(&token)?;
        self.by_value.remove(&value);
        Some(value)
    }

    /// Forgets `value`'s token; returns it.
    pub fn remove(&mut self, value: &T) -> Option<HandleToken> {
        let token = self.by_value.remove(value)?;
        self.by_token.remove(&token);
        Some(token)
    }

    pub fn len(&self) -> usize {
        self.by_token.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_token.is_empty()
    }

    /// Every object with its token.
    pub fn iter(&self) -> impl Iterator<Item = (HandleToken, T)> + '_ {
        self.by_token.iter().map(|(t, v)| (*t, *v))
    }

    /// Every object.
    pub fn values(&self) -> impl Iterator<Item = T> + '_ {
        self.by_value.keys().copied()
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
            let k = KernelRef {
                token: HandleToken(rand::random()),
                generation: DeviceGeneration(rand::random()),
                boot: BootId(rand::random()),
            };
            assert_eq!(KernelRef::parse(&k.to_string()).unwrap(), k);
            let b = BufferHandle {
                token: HandleToken(rand::random()),
                boot: BootId(rand::random()),
            };
            assert_eq!(BufferHandle::parse(&b.to_string()).unwrap(), b);
            let e = EventHandle {
                token: HandleToken(rand::random()),
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
            "krn-1-2",
            "krn-1-2-3-4",
            "krn-1-2-zz",
            "buf-1-2-3",
            "krn-100000000000000000-0-0",
            "evt--1",
        ] {
            assert!(KernelRef::parse(bad).is_err(), "{bad}");
            assert!(BufferHandle::parse(bad).is_err(), "{bad}");
            assert!(EventHandle::parse(bad).is_err(), "{bad}");
        }
        assert!(SessionId::parse("ses-XYZ").is_err());
        let long = "x".repeat(10_000);
        assert!(KernelRef::parse(&long).unwrap_err().text.len() <= 96);
    }

    /// A handle has one spelling: a `+` sign, upper case, a token not
    /// padded to 16 digits or another field padded with zeros parses to the
    /// same object as the printed text under `u64::from_str_radix`, and is
    /// refused instead, while the printed text itself parses.
    #[test]
    fn a_handle_is_read_only_as_printed() {
        for _ in 0..200 {
            // Hex letters in every field (so upper case differs), leading
            // zeros in the buffer's token (so its unpadded text differs).
            let k = KernelRef {
                token: HandleToken(rand::random::<u64>() | 0xf),
                generation: DeviceGeneration(rand::random::<u64>() >> 8 | 0xa0),
                boot: BootId(rand::random::<u64>() | 0xb1),
            };
            let b = BufferHandle {
                token: HandleToken(rand::random::<u64>() >> 12 | 0xc0),
                boot: BootId(rand::random::<u64>() | 0xd1),
            };
            assert_eq!(KernelRef::parse(&k.to_string()).unwrap(), k);
            assert_eq!(BufferHandle::parse(&b.to_string()).unwrap(), b);
            let (token, generation, boot) = (
                format!("{:016x}", k.token.0),
                format!("{:x}", k.generation.0),
                format!("{:x}", k.boot.0),
            );
            // What the lenient parser made of them: the same object.
            let upper = u64::from_str_radix(&generation.to_uppercase(), 16);
            assert_eq!(upper, Ok(k.generation.0));
            for alias in [
                format!("krn-+{token}-{generation}-{boot}"),
                format!("krn-{}-{generation}-{boot}", token.to_uppercase()),
                format!("krn-{token}-0{generation}-{boot}"),
                format!("krn-{token}-+{generation}-{boot}"),
                format!("krn-{token}-{}-{boot}", generation.to_uppercase()),
                format!("krn-{token}-{generation}-00{boot}"),
            ] {
                let refused = KernelRef::parse(&alias).unwrap_err();
                assert_eq!(
                    (refused.kind, refused.text.as_str()),
                    ("kernel", alias.as_str())
                );
            }
            let (token, boot) = (format!("{:016x}", b.token.0), format!("{:x}", b.boot.0));
            for alias in [
                format!("buf-{}-{boot}", token.trim_start_matches('0')),
                format!("buf-0{token}-{boot}"),
                format!("buf-{}-{boot}", token.to_uppercase()),
                format!("buf-{token}-0{boot}"),
                format!("buf-{token}-{}", boot.to_uppercase()),
            ] {
                let refused = BufferHandle::parse(&alias).unwrap_err();
                assert_eq!(
                    (refused.kind, refused.text.as_str()),
                    ("buffer", alias.as_str())
                );
            }
        }
    }

    #[test]
    fn tokens_are_per_table_random_and_stable_per_object() {
        let (mut a, mut b) = (Tokens::default(), Tokens::default());
        let ta = a.issue(BufferId(1));
        let tb = b.issue(BufferId(1));
        assert_ne!(ta, tb, "two sessions get different handles for one object");
        assert_eq!(
            a.issue(BufferId(1)),
            ta,
            "issuing again gives the same token"
        );
        assert_eq!(a.get(ta), Some(BufferId(1)));
        assert_eq!(a.get(tb), None, "another table's token resolves to nothing");
        let second = a.issue(BufferId(2));
        assert_ne!(second.0.wrapping_sub(ta.0), 1, "not sequential");
        assert_eq!(a.remove_token(ta), Some(BufferId(1)));
        assert_eq!(a.get(ta), None);
        assert!(!a.contains(&BufferId(1)));
        assert_eq!(a.len(), 1);
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
