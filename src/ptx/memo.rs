//! A bounded memo of [`super::canonicalize`] results, keyed by a hash of
//! exactly what canonicalization reads (the client's bytes, the symbol and
//! the declared ABI), so that a LoadKernel of bytes seen before neither
//! parses nor verifies them again: an accepted text is served its canonical
//! form, a refused one its refusal.
//!
//! Invariants:
//! - An entry is the result `canonicalize` returned for those exact inputs
//!   (a text that is not UTF-8 is refused as a parse error at line 0).
//!   Canonicalization is a pure function of them (its caps count work, not
//!   time), so serving a result again is the same as computing it again: a
//!   refusal served from the memo is the same refusal, reason, sub_reason,
//!   line and explanation.
//! - Accepted and refused results are kept in two separate tables, each with
//!   its own bounds on entries and bytes, least recently used first out: a
//!   flood of distinct hostile texts evicts only other refusals, never an
//!   accepted kernel.
//! - A table holds at most its `entries` and `bytes` (client plus canonical
//!   text for an accepted entry; the refusal's text and metadata for a
//!   refused one); one result larger than the table's bytes is returned and
//!   not kept.
//! - The key is computed over the client's bytes, so a hit needs neither a
//!   UTF-8 check nor a hash of the canonical text: the accepted entry keeps
//!   that hash, the cache key of the slot table.
//! - [`MemoStats::verifications`] counts the calls that did run the verifier;
//!   a result served from the memo never adds to it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
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

/// The bounds of one table of the memo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub entries: usize,
    pub bytes: usize,
}

/// What the memo holds and has done, for tests, benchmarks and logs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoStats {
    pub accepted_entries: usize,
    pub accepted_bytes: usize,
    pub refused_entries: usize,
    pub refused_bytes: usize,
    /// Calls that ran the verifier (a miss).
    pub verifications: u64,
    /// Accepted results served from the memo.
    pub accepted_hits: u64,
    /// Refusals served from the memo.
    pub refused_hits: u64,
}

/// How a result was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// From the memo: nothing was parsed or verified.
    Memo,
    /// The verifier ran.
    Verified,
}

#[derive(Debug)]
struct Entry<V> {
    value: V,
    bytes: usize,
    used: u64,
}

/// One bounded table, least recently used first out.
#[derive(Debug)]
struct Table<V> {
    map: HashMap<Key, Entry<V>>,
    bytes: usize,
    bounds: Bounds,
}

impl<V: Clone> Table<V> {
    fn new(bounds: Bounds) -> Table<V> {
        Table {
            map: HashMap::new(),
            bytes: 0,
            bounds,
        }
    }

    fn get(&mut self, k: &Key, tick: u64) -> Option<V> {
        let e = self.map.get_mut(k)?;
        e.used = tick;
        Some(e.value.clone())
    }

    fn insert(&mut self, k: Key, value: V, bytes: usize, tick: u64) {
        if bytes > self.bounds.bytes || self.bounds.entries == 0 {
            return;
        }
        if let Some(old) = self.map.remove(&k) {
            self.bytes -= old.bytes;
        }
        while self.map.len() >= self.bounds.entries || self.bytes + bytes > self.bounds.bytes {
            let Some(oldest) = self.map.iter().min_by_key(|(_, e)| e.used).map(|(k, _)| *k) else {
                break;
            };
            if let Some(e) = self.map.remove(&oldest) {
                self.bytes -= e.bytes;
            }
        }
        self.map.insert(
            k,
            Entry {
                value,
                bytes,
                used: tick,
            },
        );
        self.bytes += bytes;
    }
}

#[derive(Debug)]
struct Inner {
    accepted: Table<Arc<Accepted>>,
    refused: Table<Arc<PtxError>>,
    tick: u64,
}

impl Inner {
    fn tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }
}

/// See the module docs.
#[derive(Debug)]
pub struct CanonicalMemo {
    inner: Mutex<Inner>,
    verifications: AtomicU64,
    accepted_hits: AtomicU64,
    refused_hits: AtomicU64,
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

/// What a refusal costs the memo: its key and entry, its text and its
/// metadata (every string it carries is in one or the other).
fn refusal_bytes(e: &PtxError) -> usize {
    std::mem::size_of::<(Key, Entry<Arc<PtxError>>, PtxError)>()
        + e.to_string().len()
        + e.metadata()
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>()
}

/// The refusal of bytes that are not UTF-8 (a parse error at line 0).
fn not_utf8(e: std::str::Utf8Error) -> PtxError {
    PtxError::Parse {
        line: 0,
        column: 0,
        message: format!("PTX is not UTF-8: {e}"),
    }
}

impl CanonicalMemo {
    /// A memo whose accepted table holds at most `accepted` and whose
    /// refused table at most `refused`.
    pub fn new(accepted: Bounds, refused: Bounds) -> CanonicalMemo {
        CanonicalMemo {
            inner: Mutex::new(Inner {
                accepted: Table::new(accepted),
                refused: Table::new(refused),
                tick: 0,
            }),
            verifications: AtomicU64::new(0),
            accepted_hits: AtomicU64::new(0),
            refused_hits: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Every critical section leaves both tables consistent before
        // anything that could panic.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The memo's answer for these exact bytes, if they were canonicalized
    /// before: one hash and a map lookup, cheap enough to run on the
    /// caller's thread before deciding whether verification needs a
    /// blocking thread. The bytes need not be checked for UTF-8 first.
    pub fn lookup(
        &self,
        text: &[u8],
        symbol: &str,
        declared: Option<DeclaredAbi>,
    ) -> Option<Result<Arc<Accepted>, PtxError>> {
        self.lookup_key(&key(text, symbol, declared))
    }

    fn lookup_key(&self, k: &Key) -> Option<Result<Arc<Accepted>, PtxError>> {
        let found = {
            let mut inner = self.lock();
            let tick = inner.tick();
            match inner.accepted.get(k, tick) {
                Some(accepted) => Some(Ok(accepted)),
                None => inner.refused.get(k, tick).map(Err),
            }
        };
        match found? {
            Ok(accepted) => {
                self.accepted_hits.fetch_add(1, Ordering::Relaxed);
                Some(Ok(accepted))
            }
            Err(refusal) => {
                self.refused_hits.fetch_add(1, Ordering::Relaxed);
                Some(Err(PtxError::clone(&refusal)))
            }
        }
    }

    /// [`canonicalize`] of the client's bytes (refused as a parse error
    /// when they are not UTF-8), served from the memo when these exact
    /// inputs were seen before, and remembered otherwise, accepted or
    /// refused.
    pub fn canonicalize_bytes(
        &self,
        text: &[u8],
        symbol: &str,
        declared: Option<DeclaredAbi>,
    ) -> Result<(Arc<Accepted>, Served), PtxError> {
        let k = key(text, symbol, declared);
        if let Some(found) = self.lookup_key(&k) {
            return found.map(|accepted| (accepted, Served::Memo));
        }
        self.verifications.fetch_add(1, Ordering::Relaxed);
        let result = std::str::from_utf8(text)
            .map_err(not_utf8)
            .and_then(|text| canonicalize(text, symbol, declared));
        match result {
            Ok(canonical) => Ok((
                self.keep_accepted(k, text, Accepted::new(canonical)),
                Served::Verified,
            )),
            Err(refusal) => {
                let bytes = refusal_bytes(&refusal);
                let mut inner = self.lock();
                let tick = inner.tick();
                inner
                    .refused
                    .insert(k, Arc::new(refusal.clone()), bytes, tick);
                Err(refusal)
            }
        }
    }

    /// Enters `accepted`, the verdict on the inputs keyed `k` whose bytes
    /// are `text`, as the most recently used; returns the memo's copy.
    fn keep_accepted(&self, k: Key, text: &[u8], accepted: Accepted) -> Arc<Accepted> {
        let accepted = Arc::new(accepted);
        let bytes = text.len() + accepted.canonical.text.len();
        let mut inner = self.lock();
        let tick = inner.tick();
        inner.accepted.insert(k, accepted.clone(), bytes, tick);
        accepted
    }

    /// Remembers a verdict reached for these exact inputs by this build's
    /// verifier elsewhere (the daemon's verdict cache on disk, which keys
    /// its entries by the verifier's identity), so that the next load of
    /// the same bytes is a memo hit instead of another read of the disk.
    /// Not a verification: the counters do not move. Returns the memo's
    /// copy.
    pub fn remember(
        &self,
        text: &[u8],
        symbol: &str,
        declared: Option<DeclaredAbi>,
        accepted: Accepted,
    ) -> Arc<Accepted> {
        self.keep_accepted(key(text, symbol, declared), text, accepted)
    }

    /// [`CanonicalMemo::canonicalize_bytes`] of a text; the flag says
    /// whether it was served from the memo.
    pub fn canonicalize(
        &self,
        text: &str,
        symbol: &str,
        declared: Option<DeclaredAbi>,
    ) -> Result<(Arc<Accepted>, bool), PtxError> {
        self.canonicalize_bytes(text.as_bytes(), symbol, declared)
            .map(|(accepted, served)| (accepted, served == Served::Memo))
    }

    /// Entries and bytes of the accepted table.
    pub fn usage(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.accepted.map.len(), inner.accepted.bytes)
    }

    /// What the memo holds and has done.
    pub fn stats(&self) -> MemoStats {
        let inner = self.lock();
        MemoStats {
            accepted_entries: inner.accepted.map.len(),
            accepted_bytes: inner.accepted.bytes,
            refused_entries: inner.refused.map.len(),
            refused_bytes: inner.refused.bytes,
            verifications: self.verifications.load(Ordering::Relaxed),
            accepted_hits: self.accepted_hits.load(Ordering::Relaxed),
            refused_hits: self.refused_hits.load(Ordering::Relaxed),
        }
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

    fn bounds(entries: usize, bytes: usize) -> Bounds {
        Bounds { entries, bytes }
    }

    fn memo(entries: usize, bytes: usize) -> CanonicalMemo {
        CanonicalMemo::new(bounds(entries, bytes), bounds(entries, bytes))
    }

    #[test]
    fn a_repeat_is_served_and_equals_a_fresh_canonicalization() {
        let memo = memo(8, 1 << 20);
        let text = corpus("add_f32_scalar");
        let bytes = text.as_bytes();
        assert!(memo.lookup(bytes, "add_f32_scalar", None).is_none());
        let (first, hit) = memo.canonicalize(&text, "add_f32_scalar", None).unwrap();
        assert!(!hit);
        let looked_up = memo.lookup(bytes, "add_f32_scalar", None).unwrap().unwrap();
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
        // A refusal goes to the refused table, not the accepted one.
        let refused = corpus("nvcc/refused-ptx/grid_stride.sm_90");
        assert!(memo
            .canonicalize(&refused, "grid_stride_scale_f32", None)
            .is_err());
        let stats = memo.stats();
        assert_eq!(stats.accepted_entries, 1);
        assert_eq!(stats.refused_entries, 2);
        assert_eq!(stats.verifications, 3);
    }

    #[test]
    fn a_remembered_verdict_is_served_for_its_inputs_only_and_is_no_verification() {
        let memo = memo(8, 1 << 20);
        let text = corpus("add_f32_scalar");
        let bytes = text.as_bytes();
        let verdict = Accepted::new(canonicalize(&text, "add_f32_scalar", None).unwrap());
        let kept = memo.remember(bytes, "add_f32_scalar", None, verdict);
        let found = memo.lookup(bytes, "add_f32_scalar", None).unwrap().unwrap();
        assert!(Arc::ptr_eq(&kept, &found));
        assert!(memo.lookup(bytes, "add_f32_other", None).is_none());
        let (served, how) = memo
            .canonicalize_bytes(bytes, "add_f32_scalar", None)
            .unwrap();
        assert_eq!(how, Served::Memo);
        assert!(Arc::ptr_eq(&kept, &served));
        assert_eq!(memo.stats().verifications, 0);
    }

    #[test]
    fn a_refusal_is_served_from_the_memo_without_verifying_again() {
        let memo = memo(8, 1 << 20);
        for (text, symbol) in [
            (
                corpus("nvcc/refused-ptx/grid_stride.sm_90").into_bytes(),
                "grid_stride_scale_f32",
            ),
            (
                format!(
                    "{}\n// another text\n",
                    corpus("nvcc/refused-ptx/grid_stride.sm_90")
                )
                .into_bytes(),
                "grid_stride_scale_f32",
            ),
            (corpus("add_f32_scalar").into_bytes(), "no_such_entry"),
            (b"\xff\xfe not utf-8".to_vec(), "k"),
        ] {
            let before = memo.stats();
            let first = memo.canonicalize_bytes(&text, symbol, None).unwrap_err();
            let fresh = std::str::from_utf8(&text)
                .map_err(not_utf8)
                .and_then(|t| canonicalize(t, symbol, None))
                .unwrap_err();
            assert_eq!(first, fresh, "{symbol}");
            let after_first = memo.stats();
            assert_eq!(after_first.verifications, before.verifications + 1);
            assert_eq!(after_first.refused_entries, before.refused_entries + 1);
            // The second identical load: the same refusal (reason,
            // sub_reason, line, explanation), and the verifier did not run.
            assert_eq!(
                memo.lookup(&text, symbol, None).unwrap().unwrap_err(),
                first
            );
            let second = memo.canonicalize_bytes(&text, symbol, None).unwrap_err();
            assert_eq!(second, first);
            assert_eq!(second.metadata(), first.metadata());
            let after = memo.stats();
            assert_eq!(after.verifications, after_first.verifications, "{symbol}");
            assert_eq!(after.refused_hits, after_first.refused_hits + 2);
        }
        let sub_reason = |e: &PtxError| e.metadata().get("sub_reason").cloned();
        let refused = corpus("nvcc/refused-ptx/grid_stride.sm_90");
        let served = memo
            .lookup(refused.as_bytes(), "grid_stride_scale_f32", None)
            .unwrap()
            .unwrap_err();
        assert!(matches!(served, PtxError::NonScalarAbi { .. }), "{served}");
        assert_eq!(
            sub_reason(&served),
            sub_reason(&canonicalize(&refused, "grid_stride_scale_f32", None).unwrap_err())
        );
    }

    #[test]
    fn a_flood_of_refusals_never_evicts_an_accepted_kernel() {
        let accepted = corpus("add_f32_scalar");
        let refused = corpus("nvcc/refused-ptx/grid_stride.sm_90");
        let one_refusal =
            refusal_bytes(&canonicalize(&refused, "grid_stride_scale_f32", None).unwrap_err());
        let memo = CanonicalMemo::new(bounds(4, 1 << 20), bounds(3, 3 * one_refusal + 64));
        memo.canonicalize(&accepted, "add_f32_scalar", None)
            .unwrap();
        for k in 0..50 {
            let variant = format!("{refused}\n// {k:04}\n");
            assert!(memo
                .canonicalize(&variant, "grid_stride_scale_f32", None)
                .is_err());
        }
        let stats = memo.stats();
        assert_eq!(stats.accepted_entries, 1);
        assert_eq!(stats.refused_entries, 3);
        assert!(stats.refused_bytes <= 3 * one_refusal + 64);
        assert!(
            memo.canonicalize(&accepted, "add_f32_scalar", None)
                .unwrap()
                .1
        );
        // The most recent refusals are kept, the oldest went first.
        let variant = |k: usize| format!("{refused}\n// {k:04}\n");
        let verified = memo.stats().verifications;
        assert!(memo
            .canonicalize(&variant(49), "grid_stride_scale_f32", None)
            .is_err());
        assert_eq!(memo.stats().verifications, verified);
        assert!(memo
            .canonicalize(&variant(0), "grid_stride_scale_f32", None)
            .is_err());
        assert_eq!(memo.stats().verifications, verified + 1);
    }

    #[test]
    fn entries_and_bytes_are_bounded_least_recent_first() {
        let text = corpus("add_f32_scalar");
        let one = text.len()
            + canonicalize(&text, "add_f32_scalar", None)
                .unwrap()
                .text
                .len();
        let memo = CanonicalMemo::new(bounds(3, 2 * one + one / 2), bounds(3, 1 << 20));
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
        // A result larger than the table is returned and not kept.
        let tiny = CanonicalMemo::new(bounds(3, 16), bounds(3, 16));
        assert!(!tiny.canonicalize(&text, "add_f32_scalar", None).unwrap().1);
        assert!(tiny
            .canonicalize(
                &corpus("nvcc/refused-ptx/grid_stride.sm_90"),
                "grid_stride_scale_f32",
                None
            )
            .is_err());
        let stats = tiny.stats();
        assert_eq!((stats.accepted_entries, stats.refused_entries), (0, 0));
    }
}
