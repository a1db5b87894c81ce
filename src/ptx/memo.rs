//! A bounded memo of [`super::canonicalize`] results, keyed by a hash of
//! exactly what canonicalization reads (the client's text, the symbol and
//! the declared ABI), so a LoadKernel cache hit does not parse and verify
//! the same text again.
//!
//! Invariants:
//! - An entry is the result `canonicalize` returned for those exact inputs;
//!   canonicalization is a pure function, so serving it again is the same
//!   as computing it again.
//! - Only accepted kernels are kept (a refusal is recomputed, so a flood of
//!   bad texts costs the sender, not the memo).
//! - At most `max_entries` entries and `max_bytes` of client plus canonical
//!   text are held; the least recently used go first.
//! - The key is computed over the client's bytes, so a hit needs neither a
//!   UTF-8 check (only accepted, hence UTF-8, texts are kept) nor a hash of
//!   the canonical text: the entry keeps that hash, the cache key of the
//!   slot table.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{canonicalize, Canonical, DeclaredAbi, PtxError};

type Key = [u8; 32];

/// An accepted kernel: its canonical form and the BLAKE3 hash of the
/// canonical text (what the kernel cache is keyed by).
#[derive(Debug, PartialEq, Eq)]
pub struct Accepted {
    pub canonical: Canonical,
    pub hash: [u8; 32],
}

impl Accepted {
    fn new(canonical: Canonical) -> Accepted {
        let hash = *blake3::hash(canonical.text.as_bytes()).as_bytes();
        Accepted { canonical, hash }
    }
}

#[derive(Debug)]
struct Entry {
    accepted: Arc<Accepted>,
    bytes: usize,
    used: u64,
}

#[derive(Debug, Default)]
struct Inner {
    map: HashMap<Key, Entry>,
    bytes: usize,
    tick: u64,
}

/// See the module docs.
#[derive(Debug)]
pub struct CanonicalMemo {
    inner: Mutex<Inner>,
    max_entries: usize,
    max_bytes: usize,
}

fn key(text: &[u8], symbol: &str, declared: Option<DeclaredAbi>) -> Key {
    let mut h = blake3::Hasher::new();
    h.update(&(text.len() as u64).to_le_bytes());
    h.update(text);
    h.update(&(symbol.len() as u64).to_le_bytes());
    h.update(symbol.as_bytes());
    match declared {
        Some(d) => {
            h.update(&[1]);
            h.update(&d.inputs.to_le_bytes());
            h.update(&d.scalar_params.to_le_bytes());
        }
        None => {
            h.update(&[0]);
        }
    }
    *h.finalize().as_bytes()
}

impl CanonicalMemo {
    pub fn new(max_entries: usize, max_bytes: usize) -> CanonicalMemo {
        CanonicalMemo {
            inner: Mutex::new(Inner::default()),
            max_entries,
            max_bytes,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The memo's answer for these exact bytes, if they were accepted
    /// before: one hash and a map lookup, cheap enough to run on the
    /// caller's thread before deciding whether verification needs a
    /// blocking thread. The bytes need not be checked for UTF-8 first.
    pub fn lookup(
        &self,
        text: &[u8],
        symbol: &str,
        declared: Option<DeclaredAbi>,
    ) -> Option<Arc<Accepted>> {
        self.lookup_key(&key(text, symbol, declared))
    }

    fn lookup_key(&self, k: &Key) -> Option<Arc<Accepted>> {
        let mut inner = self.lock();
        inner.tick += 1;
        let tick = inner.tick;
        let e = inner.map.get_mut(k)?;
        e.used = tick;
        Some(e.accepted.clone())
    }

    /// [`canonicalize`], served from the memo when these exact inputs were
    /// accepted before. The flag says whether it was.
    pub fn canonicalize(
        &self,
        text: &str,
        symbol: &str,
        declared: Option<DeclaredAbi>,
    ) -> Result<(Arc<Accepted>, bool), PtxError> {
        let k = key(text.as_bytes(), symbol, declared);
        if let Some(accepted) = self.lookup_key(&k) {
            return Ok((accepted, true));
        }
        let accepted = Arc::new(Accepted::new(canonicalize(text, symbol, declared)?));
        let bytes = text.len() + accepted.canonical.text.len();
        if bytes > self.max_bytes {
            return Ok((accepted, false));
        }
        let mut inner = self.lock();
        while !inner.map.is_empty()
            && (inner.map.len() >= self.max_entries || inner.bytes + bytes > self.max_bytes)
        {
            let Some(oldest) = inner
                .map
                .iter()
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| *k)
            else {
                break;
            };
            if let Some(e) = inner.map.remove(&oldest) {
                inner.bytes -= e.bytes;
            }
        }
        inner.tick += 1;
        let used = inner.tick;
        if let Some(old) = inner.map.insert(
            k,
            Entry {
                accepted: accepted.clone(),
                bytes,
                used,
            },
        ) {
            inner.bytes -= old.bytes;
        }
        inner.bytes += bytes;
        Ok((accepted, false))
    }

    /// Entries and bytes held.
    pub fn usage(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.map.len(), inner.bytes)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    fn corpus(name: &str) -> String {
        std::fs::read_to_string(format!(
            "{}/tests/corpus/{name}.ptx",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap()
    }

    #[test]
    fn a_repeat_is_served_and_equals_a_fresh_canonicalization() {
        let memo = CanonicalMemo::new(8, 1 << 20);
        let text = corpus("add_f32_scalar");
        let bytes = text.as_bytes();
        assert!(memo.lookup(bytes, "add_f32_scalar", None).is_none());
        let (first, hit) = memo.canonicalize(&text, "add_f32_scalar", None).unwrap();
        assert!(!hit);
        let looked_up = memo.lookup(bytes, "add_f32_scalar", None).unwrap();
        assert!(Arc::ptr_eq(&first, &looked_up));
        assert!(memo.lookup(bytes, "add_f32_other", None).is_none());
        // One byte more is another text.
        assert!(memo
            .lookup(format!("{text} ").as_bytes(), "add_f32_scalar", None)
            .is_none());
        let (again, hit) = memo.canonicalize(&text, "add_f32_scalar", None).unwrap();
        assert!(hit);
        assert!(Arc::ptr_eq(&first, &again));
        let fresh = canonicalize(&text, "add_f32_scalar", None).unwrap();
        // The kept hash is the canonical text's, the kernel cache's key.
        assert_eq!(again.hash, *blake3::hash(fresh.text.as_bytes()).as_bytes());
        assert_eq!(again.canonical, fresh);
        // Another declared ABI is another key, and is checked.
        let wrong = Some(DeclaredAbi {
            inputs: 3,
            scalar_params: 0,
        });
        assert!(matches!(
            memo.canonicalize(&text, "add_f32_scalar", wrong),
            Err(PtxError::AbiMismatch { .. })
        ));
        // Refusals are not kept.
        let vec4 = corpus("add_f32_vec4");
        assert!(memo.canonicalize(&vec4, "add_f32_vec4", None).is_err());
        assert_eq!(memo.usage().0, 1);
    }

    #[test]
    fn entries_and_bytes_are_bounded_least_recent_first() {
        let text = corpus("add_f32_scalar");
        let one = text.len()
            + canonicalize(&text, "add_f32_scalar", None)
                .unwrap()
                .text
                .len();
        let memo = CanonicalMemo::new(3, 2 * one + one / 2);
        let variant = |k: usize| format!("{text}\n// {k:04}\n");
        for k in 0..5 {
            memo.canonicalize(&variant(k), "add_f32_scalar", None)
                .unwrap();
        }
        let (entries, bytes) = memo.usage();
        assert_eq!(entries, 2, "the byte bound holds two");
        assert!(bytes <= 2 * one + one / 2 + 32);
        // The two most recent are kept.
        assert!(
            memo.canonicalize(&variant(4), "add_f32_scalar", None)
                .unwrap()
                .1
        );
        assert!(
            memo.canonicalize(&variant(3), "add_f32_scalar", None)
                .unwrap()
                .1
        );
        assert!(
            !memo
                .canonicalize(&variant(0), "add_f32_scalar", None)
                .unwrap()
                .1
        );
    }
}
