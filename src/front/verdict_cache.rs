//! The persistent verdict cache: what the verifier accepted, kept on disk so
//! that a restarted daemon loads a kernel it verified before without
//! verifying it again (a 32-kernel working set reloaded in 18–21 ms with
//! it, 41–46 ms without, on the host backend: BENCHMARKS.md).
//!
//! An entry is an accepted PTX kernel's verdict: its canonical text, the
//! text's blake3 hash, its signature and its launch contract, exactly what
//! [`crate::ptx::memo::CanonicalMemo::canonicalize_bytes`] returns. Refusals are not kept (a
//! refused kernel is verified again, and refused again with the same
//! reason: the verifier is a pure function of its inputs). Machine code is
//! never verified and never kept here.
//!
//! Invariants:
//! - The files are the compiled-kernel cache's ([`KernelCache`], opened
//!   with a format of its own in the `verdicts` subdirectory of
//!   `--kernel-cache-dir`): the directory is the daemon's (0700, not a
//!   symbolic link, not another user's), an entry is written whole by
//!   rename (two daemons may share the directory), its header's magic, key
//!   and payload hash are checked on read, a bad entry is deleted and is a
//!   miss, and what one daemon knows of the directory stays under
//!   `--verdict-cache-max-bytes` (several daemons sharing it each keep
//!   their own account: together up to that many times the bound between
//!   their listings).
//! - The cache is optional: a `verdicts` path it cannot open (a file, a
//!   link, another user's directory) leaves the daemon running without it
//!   (`Front::start` logs why), never stopped.
//! - The bound is kept by an account in memory, under one lock: the
//!   entries' sizes and use order, built by one listing of the directory at
//!   open. A put is one write and the account's evictions; the directory is
//!   listed again only after each bound's worth of bytes written. An entry
//!   another daemon deleted is forgotten when found gone, and one it wrote
//!   is entered at its size when hit, neither with a listing.
//! - One kernel (one canonical text, whatever the bytes the client sent)
//!   has at most [`VARIANTS_PER_KERNEL`] entries among those this daemon
//!   wrote or read: another variant replaces the kernel's least recently
//!   used one, so copies of one kernel never evict other kernels' verdicts.
//! - The key is a blake3 hash of everything the verdict depends on: the
//!   client's exact bytes, the entry's name, the declared ABI (the inputs of
//!   `canonicalize_bytes`), the encoding's version, and the verifier's
//!   identity, [`VERIFIER_IDENTITY`].
//! - A stale verifier's verdict is never reused: the identity is the
//!   crate's version and `PTXD_VERIFIER_SOURCE_HASH`, a hash of every
//!   source file of `src/ptx/` (the verifier, the canonical printer and the
//!   contract, a module that imports nothing else of the crate) and of
//!   `Cargo.lock`, computed by `build.rs` at every build in which one of
//!   them changed, and a hash of this file (the encoding and the checks a
//!   decoded verdict passes), so an encoding changed without a version
//!   bump never decodes an old entry. A verifier that differs by one byte of source, or is
//!   built against other dependencies, looks up other keys: an old entry is
//!   never found, and ages out under the size bound.
//! - A payload is decoded by an explicit, versioned format (below), with
//!   every length checked against the bytes left and every nesting bounded;
//!   a decoded verdict is then checked for consistency (the text hashes to
//!   the hash it carries, the signature and the contract agree on the
//!   operand and scalar counts, the param layout is one the executor's
//!   `layout::decode` accepts and operand k's footprint is the param that
//!   passes operand k, every arg a footprint or precondition reads is
//!   a 64-bit integer scalar, the entry and every param are named in the
//!   text). Anything that fails is a miss (logged, the entry deleted), never
//!   a panic: the kernel is verified again.
//! - Only the daemon's user can write the directory; an entry that passed
//!   its checks is trusted as the verifier's own output, as the compiled
//!   code next to it is trusted as the driver's. An entry another user
//!   could have written (owned by another user, or writable by group or
//!   others: planted while the directory was writable by others, before
//!   the cache made it 0700) is a miss and is deleted, never trusted.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use crate::executor::kernel_cache::{CacheError, CacheKey, EntryFormat, KernelCache, Lookup};
use crate::ptx::contract::{
    BlockRule, Condition, ContractParam, Expr, Footprint, Geometry, ParamKind, PointerAccess,
    Precondition, ScalarType, PRECONDITION_NAMES,
};
use crate::ptx::memo::Accepted;
use crate::ptx::{Canonical, DeclaredAbi, LaunchContract, Signature};

/// The files of a verdict cache (format version 1 of the header).
pub const VERDICTS: EntryFormat = EntryFormat {
    magic: *b"PTXDVC01",
    name: "verdict cache",
};

/// The subdirectory of the kernel cache directory the verdicts live in.
pub const SUBDIRECTORY: &str = "verdicts";

/// The version of the payload's encoding; part of every key, so a daemon
/// with another encoding never reads this one's entries.
const ENCODING_VERSION: u8 = 1;

/// The verifier that reached the verdicts: the crate's version and a hash
/// of the verifier's sources and dependencies (see the module docs).
pub const VERIFIER_IDENTITY: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    "+",
    env!("PTXD_VERIFIER_SOURCE_HASH")
);

/// This file: the verdict's encoding and decoding, and the checks a
/// decoded verdict passes, are part of what a kept verdict means.
const ENCODER: &str = include_str!("verdict_cache.rs");

/// The identity a cache keys its entries by: the verifier's
/// ([`VERIFIER_IDENTITY`], which hashes `src/ptx/` only) and a hash of the
/// code that encodes and decodes verdicts (`encoder`, this file's source).
/// An entry written by a build whose encoding differs (a tag renumbered,
/// a field reordered, a check dropped) without [`ENCODING_VERSION`] being
/// bumped would decode to another contract; with the encoder in the key
/// it is never looked up.
fn identity_with(encoder: &str) -> String {
    let hash = blake3::hash(encoder.as_bytes()).to_hex();
    format!("{VERIFIER_IDENTITY}+{}", &hash.as_str()[..32])
}

/// Expressions nested deeper than this are not decoded (the verifier's
/// own are a few levels deep).
const MAX_EXPR_DEPTH: u32 = 64;

/// At most this many entries of one kernel (one canonical text) are kept:
/// texts that differ only in what the verifier canonicalises away are one
/// kernel's variants, and a client that sends many of them replaces its
/// own older variants instead of evicting other kernels' verdicts.
pub const VARIANTS_PER_KERNEL: usize = 8;

/// One daemon's view of a verdict cache directory (others may share it).
#[derive(Debug)]
pub struct VerdictCache {
    store: KernelCache,
    identity: String,
    max_bytes: u64,
    account: Mutex<Account>,
}

/// One entry as the account knows it.
#[derive(Debug)]
struct Kept {
    bytes: u64,
    /// Its place in the use order: larger is more recent.
    used: u64,
    /// Its kernel (the canonical text's hash), once known: every entry
    /// this daemon wrote or read, not one it only found in the directory.
    kernel: Option<[u8; 32]>,
}

/// What the directory holds, as far as this daemon knows: built by one
/// listing at open and kept by every put, hit and deletion, so that a put
/// lists nothing. The directory is listed again only after each bound's
/// worth of bytes written (what other daemons wrote counts then): one
/// listing of n entries per n entries' worth of puts. Another daemon's
/// deletions and writes reach it without a listing: an entry found gone
/// when evicted is forgotten, one hit that it did not hold is entered.
#[derive(Debug, Default)]
struct Account {
    entries: HashMap<CacheKey, Kept>,
    /// Least recently used first.
    order: BTreeMap<u64, CacheKey>,
    /// Each known kernel's entries, at most [`VARIANTS_PER_KERNEL`].
    variants: HashMap<[u8; 32], Vec<CacheKey>>,
    total: u64,
    clock: u64,
    /// Bytes written since the directory was listed.
    written: u64,
    /// Listings of the directory, the one at open included.
    listings: u64,
}

impl Account {
    fn forget(&mut self, key: &CacheKey) -> Option<Kept> {
        let kept = self.entries.remove(key)?;
        self.order.remove(&kept.used);
        self.total = self.total.saturating_sub(kept.bytes);
        if let Some(kernel) = kept.kernel {
            if let Some(keys) = self.variants.get_mut(&kernel) {
                keys.retain(|k| k != key);
                if keys.is_empty() {
                    self.variants.remove(&kernel);
                }
            }
        }
        Some(kept)
    }

    /// Enters `key` as the most recently used entry.
    fn insert(&mut self, key: CacheKey, bytes: u64, kernel: Option<[u8; 32]>) {
        self.forget(&key);
        self.clock += 1;
        let used = self.clock;
        self.order.insert(used, key);
        self.entries.insert(
            key,
            Kept {
                bytes,
                used,
                kernel,
            },
        );
        self.total = self.total.saturating_add(bytes);
        if let Some(kernel) = kernel {
            self.variants.entry(kernel).or_default().push(key);
        }
    }

    /// Marks a hit on `key`, of `kernel`; false when the account does not
    /// hold it.
    fn touch(&mut self, key: &CacheKey, kernel: [u8; 32]) -> bool {
        match self.forget(key) {
            Some(kept) => {
                self.insert(*key, kept.bytes, Some(kernel));
                true
            }
            None => false,
        }
    }

    /// The entry to drop before another of `kernel` is entered: its least
    /// recently used variant, when it already has its share.
    fn surplus_variant(&self, kernel: &[u8; 32]) -> Option<CacheKey> {
        let keys = self.variants.get(kernel)?;
        if keys.len() < VARIANTS_PER_KERNEL {
            return None;
        }
        keys.iter()
            .min_by_key(|k| self.entries.get(k).map_or(0, |e| e.used))
            .copied()
    }

    fn least_recent(&self) -> Option<CacheKey> {
        self.order.first_key_value().map(|(_, k)| *k)
    }
}

impl VerdictCache {
    /// Opens (creating it, mode 0700) the verdict directory under the
    /// kernel cache directory `kernel_cache_dir`, bounded to `max_bytes`.
    pub fn open(kernel_cache_dir: &Path, max_bytes: u64) -> Result<VerdictCache, CacheError> {
        VerdictCache::open_with_identity(kernel_cache_dir, max_bytes, &identity_with(ENCODER))
    }

    /// [`VerdictCache::open`] as a verifier of another identity would (for
    /// the tests of a changed verifier).
    fn open_with_identity(
        kernel_cache_dir: &Path,
        max_bytes: u64,
        identity: &str,
    ) -> Result<VerdictCache, CacheError> {
        let cache = VerdictCache {
            store: KernelCache::open_as(
                &kernel_cache_dir.join(SUBDIRECTORY),
                max_bytes,
                &VERDICTS,
            )?,
            identity: identity.to_owned(),
            max_bytes,
            account: Mutex::new(Account::default()),
        };
        cache.relist(&mut cache.lock());
        Ok(cache)
    }

    fn lock(&self) -> MutexGuard<'_, Account> {
        // Every critical section leaves the account whole before anything
        // that could panic.
        self.account.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Builds the account again from one listing of the directory (oldest
    /// first, by modification time, which a hit refreshes), keeping the
    /// kernels it knew, then evicts down to the bound.
    fn relist(&self, account: &mut Account) {
        // A directory that cannot be read just now (a person's chmod, a
        // full inode table) is not an empty one: the account stays as it
        // was, so the bound still holds over what it knew.
        let Some(mut listed) = self.store.list() else {
            account.listings += 1;
            account.written = 0;
            return;
        };
        listed.sort_by_key(|l| l.modified);
        let kernels: HashMap<CacheKey, [u8; 32]> = account
            .entries
            .drain()
            .filter_map(|(key, kept)| Some((key, kept.kernel?)))
            .collect();
        *account = Account {
            clock: account.clock,
            listings: account.listings + 1,
            ..Account::default()
        };
        for l in listed {
            account.insert(l.key, l.bytes, kernels.get(&l.key).copied());
        }
        self.evict_to_bound(account);
    }

    /// Deletes `key`'s entry. One already gone was deleted by another
    /// daemon sharing the directory (or a person): forgetting it is all
    /// the account needs, with no listing (two daemons evicting the same
    /// oldest entries would otherwise list the directory on nearly every
    /// put).
    fn evict(&self, account: &mut Account, key: CacheKey) {
        account.forget(&key);
        self.store.remove(&key);
    }

    fn evict_to_bound(&self, account: &mut Account) {
        while account.total > self.max_bytes {
            let Some(key) = account.least_recent() else {
                break;
            };
            self.evict(account, key);
        }
    }

    /// The key of the verdict on these exact inputs of the verifier.
    fn key(&self, text: &[u8], symbol: &str, declared: Option<DeclaredAbi>) -> CacheKey {
        let mut h = blake3::Hasher::new();
        h.update(b"ptxd verdict\0");
        h.update(&[ENCODING_VERSION]);
        put_bytes(&mut h, self.identity.as_bytes());
        put_bytes(&mut h, text);
        put_bytes(&mut h, symbol.as_bytes());
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
        CacheKey::from_hash(*h.finalize().as_bytes())
    }

    /// The verdict kept for these inputs, if one is and it passes every
    /// check; an entry that does not is deleted.
    pub fn get(
        &self,
        text: &[u8],
        symbol: &str,
        declared: Option<DeclaredAbi>,
    ) -> Option<Accepted> {
        let key = self.key(text, symbol, declared);
        // The store reads only an entry this daemon's user could have
        // written (a plain file it owns, writable by no one else): one
        // another user planted while the directory was open to them, under
        // a key anyone computes, is discarded like a corrupt one.
        match self.store.get(&key) {
            Lookup::Hit(payload) => match decode(&payload).and_then(|a| consistent(a, symbol)) {
                Ok(accepted) => {
                    let mut account = self.lock();
                    if !account.touch(&key, accepted.hash) {
                        // Written by another daemon sharing the directory:
                        // entered at its size, without a listing.
                        let bytes =
                            (crate::executor::kernel_cache::HEADER_BYTES + payload.len()) as u64;
                        account.insert(key, bytes, Some(accepted.hash));
                        self.evict_to_bound(&mut account);
                    }
                    Some(accepted)
                }
                Err(why) => {
                    tracing::warn!(%symbol, why, "a verdict cache entry does not decode to a consistent verdict; discarded");
                    self.store.remove(&key);
                    self.lock().forget(&key);
                    None
                }
            },
            Lookup::Discarded(why) => {
                tracing::warn!(%symbol, why, "a verdict cache entry failed its checks; discarded");
                self.lock().forget(&key);
                None
            }
            Lookup::Miss => {
                // Deleted by another daemon, if the account held it.
                self.lock().forget(&key);
                None
            }
        }
    }

    /// Keeps `accepted`, the verdict on these inputs: one write, and
    /// evictions by the account (the least recently used variant of the
    /// same kernel when it has [`VARIANTS_PER_KERNEL`], then the least
    /// recently used entries until the store fits its bound); no listing
    /// of the directory unless a bound's worth of bytes was written since
    /// the last one.
    pub fn put(
        &self,
        text: &[u8],
        symbol: &str,
        declared: Option<DeclaredAbi>,
        accepted: &Accepted,
    ) {
        let key = self.key(text, symbol, declared);
        let Some(bytes) = self.store.write(&key, &encode(accepted)) else {
            return;
        };
        let mut account = self.lock();
        account.forget(&key);
        // Each eviction takes one key out of the kernel's variants (they
        // only ever hold keys of the account), so the loop ends, at most
        // after as many rounds as the kernel has variants; a kernel over
        // its share (old entries it learned of by hits) comes down to it.
        let rounds = account.variants.get(&accepted.hash).map_or(0, Vec::len);
        for _ in 0..rounds {
            let Some(variant) = account.surplus_variant(&accepted.hash) else {
                break;
            };
            self.evict(&mut account, variant);
        }
        account.insert(key, bytes, Some(accepted.hash));
        account.written = account.written.saturating_add(bytes);
        self.evict_to_bound(&mut account);
        if account.written > self.max_bytes {
            self.relist(&mut account);
        }
    }

    /// Listings of the directory so far (one at open).
    #[cfg(test)]
    fn listings(&self) -> u64 {
        self.lock().listings
    }

    #[cfg(test)]
    fn entry_path(
        &self,
        text: &[u8],
        symbol: &str,
        declared: Option<DeclaredAbi>,
    ) -> std::path::PathBuf {
        self.store.entry_path(&self.key(text, symbol, declared))
    }
}

fn put_bytes(h: &mut blake3::Hasher, bytes: &[u8]) {
    h.update(&(bytes.len() as u64).to_le_bytes());
    h.update(bytes);
}

// The encoding, version 1: little-endian integers; a string or list is a
// u32 count then its items; an option is a 0/1 byte then the value; an
// enum is a tag byte then its fields.
//
//   verdict   = version:u8 hash:[u8;32] text:string signature contract
//   signature = inputs:u32 element_sizes:[u32] scalar_params:u32
//               reqntid:option<u32> maxntid:option<u32>
//   contract  = params:[param] block:block elements_per_thread:u32
//               footprints:[footprint] preconditions:[precondition]
//   param     = name:string kind:(0 access:u8 operand:option<u32>
//                                | 1 count:scalar | 2 scalar:scalar)
//   block     = 0 x:u32 (required) | 1 x:u32 (at most) | 2 (default)
//   footprint = param:u16 alignment:u32 bytes:expr
//   precondition = name:string (0 (at most) | 1 (at least)) expr bound:u128
//   expr      = 0 u64 (const) | 1 (count) | 2 (grid) | 3 (block)
//             | 4 a b (add) | 5 a b (mul) | 6 e k:u64 (round up)
//             | 7 k:u16 (arg) | 8 a b (div) | 9 a b (sat sub) | 10 a b (min)

fn encode(accepted: &Accepted) -> Vec<u8> {
    let canonical = &accepted.canonical;
    let mut out = Vec::with_capacity(canonical.text.len() + 256);
    out.push(ENCODING_VERSION);
    out.extend_from_slice(&accepted.hash);
    put_str(&mut out, &canonical.text);
    let s = &canonical.signature;
    put_u32(&mut out, s.inputs);
    put_len(&mut out, s.element_sizes.len());
    for size in &s.element_sizes {
        put_u32(&mut out, *size);
    }
    put_u32(&mut out, s.scalar_params);
    put_opt_u32(&mut out, s.reqntid);
    put_opt_u32(&mut out, s.maxntid);
    let c = &canonical.contract;
    put_len(&mut out, c.params.len());
    for p in &c.params {
        put_str(&mut out, &p.name);
        match p.kind {
            ParamKind::Pointer { access, operand } => {
                out.push(0);
                out.push(match access {
                    PointerAccess::Read => 0,
                    PointerAccess::Written => 1,
                    PointerAccess::UnusedNull => 2,
                });
                put_opt_u32(&mut out, operand);
            }
            ParamKind::Count(t) => {
                out.push(1);
                out.push(scalar_tag(t));
            }
            ParamKind::Scalar(t) => {
                out.push(2);
                out.push(scalar_tag(t));
            }
        }
    }
    match c.geometry.block {
        BlockRule::Required(x) => {
            out.push(0);
            put_u32(&mut out, x);
        }
        BlockRule::AtMost(x) => {
            out.push(1);
            put_u32(&mut out, x);
        }
        BlockRule::Default => out.push(2),
    }
    put_u32(&mut out, c.geometry.elements_per_thread);
    put_len(&mut out, c.footprints.len());
    for f in &c.footprints {
        out.extend_from_slice(&f.param.to_le_bytes());
        put_u32(&mut out, f.alignment);
        put_expr(&mut out, &f.bytes);
    }
    put_len(&mut out, c.preconditions.len());
    for p in &c.preconditions {
        put_str(&mut out, p.name);
        let (tag, e, bound) = match &p.condition {
            Condition::AtMost(e, b) => (0, e, b),
            Condition::AtLeast(e, b) => (1, e, b),
        };
        out.push(tag);
        put_expr(&mut out, e);
        out.extend_from_slice(&bound.to_le_bytes());
    }
    out
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// A count; every count a verdict holds is far below `u32::MAX` (a text is
/// at most `--max-artifact-bytes`), and one that is not is written as
/// `u32::MAX`, which no decode accepts: a miss, never a wrong verdict.
fn put_len(out: &mut Vec<u8>, len: usize) {
    put_u32(out, u32::try_from(len).unwrap_or(u32::MAX));
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_len(out, s.len());
    out.extend_from_slice(s.as_bytes());
}

fn put_opt_u32(out: &mut Vec<u8>, v: Option<u32>) {
    match v {
        Some(v) => {
            out.push(1);
            put_u32(out, v);
        }
        None => out.push(0),
    }
}

fn scalar_tag(t: ScalarType) -> u8 {
    match t {
        ScalarType::U32 => 0,
        ScalarType::S32 => 1,
        ScalarType::U64 => 2,
        ScalarType::S64 => 3,
        ScalarType::F32 => 4,
        ScalarType::F64 => 5,
    }
}

fn put_expr(out: &mut Vec<u8>, e: &Expr) {
    let pair = |out: &mut Vec<u8>, tag: u8, a: &Expr, b: &Expr| {
        out.push(tag);
        put_expr(out, a);
        put_expr(out, b);
    };
    match e {
        Expr::Const(v) => {
            out.push(0);
            out.extend_from_slice(&v.to_le_bytes());
        }
        Expr::Count => out.push(1),
        Expr::Grid => out.push(2),
        Expr::Block => out.push(3),
        Expr::Add(a, b) => pair(out, 4, a, b),
        Expr::Mul(a, b) => pair(out, 5, a, b),
        Expr::RoundUp(e, k) => {
            out.push(6);
            put_expr(out, e);
            out.extend_from_slice(&k.to_le_bytes());
        }
        Expr::Arg(k) => {
            out.push(7);
            out.extend_from_slice(&k.to_le_bytes());
        }
        Expr::Div(a, b) => pair(out, 8, a, b),
        Expr::SatSub(a, b) => pair(out, 9, a, b),
        Expr::Min(a, b) => pair(out, 10, a, b),
    }
}

/// A reader over a payload; every read checks the bytes left.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.bytes.len() {
            return Err(format!(
                "{n} bytes wanted, {} left in the payload",
                self.bytes.len()
            ));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.array::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn u128(&mut self) -> Result<u128, String> {
        Ok(u128::from_le_bytes(self.array()?))
    }

    /// A count of items of at least `item_bytes` each: never more than the
    /// bytes left could hold, so a forged count allocates nothing.
    fn count(&mut self, item_bytes: usize) -> Result<usize, String> {
        let n = self.u32()? as usize;
        if n.saturating_mul(item_bytes.max(1)) > self.bytes.len() {
            return Err(format!("a count of {n} is more than the payload holds"));
        }
        Ok(n)
    }

    fn string(&mut self) -> Result<String, String> {
        let n = self.count(1)?;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|e| format!("a string is not UTF-8: {e}"))
    }

    fn opt_u32(&mut self) -> Result<Option<u32>, String> {
        match self.u8()? {
            0 => Ok(None),
            1 => Ok(Some(self.u32()?)),
            tag => Err(format!("option tag {tag}")),
        }
    }

    fn scalar(&mut self) -> Result<ScalarType, String> {
        Ok(match self.u8()? {
            0 => ScalarType::U32,
            1 => ScalarType::S32,
            2 => ScalarType::U64,
            3 => ScalarType::S64,
            4 => ScalarType::F32,
            5 => ScalarType::F64,
            tag => return Err(format!("scalar type tag {tag}")),
        })
    }

    fn expr(&mut self, depth: u32) -> Result<Expr, String> {
        if depth > MAX_EXPR_DEPTH {
            return Err(format!("an expression nested deeper than {MAX_EXPR_DEPTH}"));
        }
        let pair = |r: &mut Reader<'a>| -> Result<(Box<Expr>, Box<Expr>), String> {
            Ok((Box::new(r.expr(depth + 1)?), Box::new(r.expr(depth + 1)?)))
        };
        Ok(match self.u8()? {
            0 => Expr::Const(self.u64()?),
            1 => Expr::Count,
            2 => Expr::Grid,
            3 => Expr::Block,
            4 => {
                let (a, b) = pair(self)?;
                Expr::Add(a, b)
            }
            5 => {
                let (a, b) = pair(self)?;
                Expr::Mul(a, b)
            }
            6 => Expr::RoundUp(Box::new(self.expr(depth + 1)?), self.u64()?),
            7 => Expr::Arg(self.u16()?),
            8 => {
                let (a, b) = pair(self)?;
                Expr::Div(a, b)
            }
            9 => {
                let (a, b) = pair(self)?;
                Expr::SatSub(a, b)
            }
            10 => {
                let (a, b) = pair(self)?;
                Expr::Min(a, b)
            }
            tag => return Err(format!("expression tag {tag}")),
        })
    }
}

/// Decodes a payload; `Err` says what is wrong with it.
fn decode(payload: &[u8]) -> Result<Accepted, String> {
    let mut r = Reader { bytes: payload };
    let version = r.u8()?;
    if version != ENCODING_VERSION {
        return Err(format!("encoding version {version}"));
    }
    let hash = r.array::<32>()?;
    let text = r.string()?;
    let inputs = r.u32()?;
    let sizes = r.count(4)?;
    let element_sizes = (0..sizes).map(|_| r.u32()).collect::<Result<Vec<_>, _>>()?;
    let signature = Signature {
        inputs,
        element_sizes,
        scalar_params: r.u32()?,
        reqntid: r.opt_u32()?,
        maxntid: r.opt_u32()?,
    };
    let mut params = Vec::new();
    for _ in 0..r.count(6)? {
        let name = r.string()?;
        let kind = match r.u8()? {
            0 => {
                let access = match r.u8()? {
                    0 => PointerAccess::Read,
                    1 => PointerAccess::Written,
                    2 => PointerAccess::UnusedNull,
                    tag => return Err(format!("pointer access tag {tag}")),
                };
                ParamKind::Pointer {
                    access,
                    operand: r.opt_u32()?,
                }
            }
            1 => ParamKind::Count(r.scalar()?),
            2 => ParamKind::Scalar(r.scalar()?),
            tag => return Err(format!("param kind tag {tag}")),
        };
        params.push(ContractParam { name, kind });
    }
    let block = match r.u8()? {
        0 => BlockRule::Required(r.u32()?),
        1 => BlockRule::AtMost(r.u32()?),
        2 => BlockRule::Default,
        tag => return Err(format!("block rule tag {tag}")),
    };
    let geometry = Geometry {
        block,
        elements_per_thread: r.u32()?,
    };
    let mut footprints = Vec::new();
    for _ in 0..r.count(7)? {
        footprints.push(Footprint {
            param: r.u16()?,
            alignment: r.u32()?,
            bytes: r.expr(0)?,
        });
    }
    let mut preconditions = Vec::new();
    for _ in 0..r.count(22)? {
        let stated = r.string()?;
        let Some(name) = PRECONDITION_NAMES.iter().find(|n| **n == stated) else {
            return Err(format!("an unknown precondition {stated:?}"));
        };
        let tag = r.u8()?;
        let e = r.expr(0)?;
        let bound = r.u128()?;
        let condition = match tag {
            0 => Condition::AtMost(e, bound),
            1 => Condition::AtLeast(e, bound),
            tag => return Err(format!("condition tag {tag}")),
        };
        preconditions.push(Precondition { name, condition });
    }
    if !r.bytes.is_empty() {
        return Err(format!("{} bytes after the verdict", r.bytes.len()));
    }
    Ok(Accepted {
        canonical: Canonical {
            text,
            signature,
            contract: LaunchContract {
                params,
                geometry,
                footprints,
                preconditions,
            },
        },
        hash,
    })
}

/// Checks that a decoded verdict is one the verifier could have returned
/// for `symbol`: it is `Err` for any part that disagrees with another.
fn consistent(accepted: Accepted, symbol: &str) -> Result<Accepted, String> {
    let c = &accepted.canonical;
    if *blake3::hash(c.text.as_bytes()).as_bytes() != accepted.hash {
        return Err("the canonical text does not hash to the verdict's hash".into());
    }
    let s = &c.signature;
    if s.element_sizes.len() != s.inputs as usize + 1 {
        return Err(format!(
            "{} element sizes for {} inputs",
            s.element_sizes.len(),
            s.inputs
        ));
    }
    if c.contract.footprints.len() != s.element_sizes.len()
        || c.contract.scalar_params() != s.scalar_params as usize
    {
        return Err("the contract's operands or scalars are not the signature's".into());
    }
    if c.contract
        .footprints
        .iter()
        .any(|f| usize::from(f.param) >= c.contract.params.len())
    {
        return Err("a footprint names a param the contract does not have".into());
    }
    // The layout the front sends the executor must be one the executor
    // accepts (every operand passed exactly once, at most one count, the
    // signature's scalars: `layout::decode`), and operand k's footprint
    // must describe the param that passes operand k: a verdict whose
    // layout the executor would refuse, or whose footprints bound other
    // params than the ones passed, is not one the verifier gives.
    let load = ptxd_proto::executor::LoadModule {
        inputs: s.inputs,
        scalar_params: s.scalar_params,
        params: crate::executor::layout::slots_of(&c.contract),
        ..Default::default()
    };
    crate::executor::layout::decode(&load).map_err(|why| format!("the layout: {why}"))?;
    for (k, f) in c.contract.footprints.iter().enumerate() {
        match c.contract.params.get(usize::from(f.param)).map(|p| &p.kind) {
            Some(&ParamKind::Pointer {
                operand: Some(o), ..
            }) if o as usize == k => {}
            _ => {
                return Err(format!(
                    "operand {k}'s footprint is not the param that passes it"
                ))
            }
        }
    }
    if !c.contract.reads_only_integer_args() {
        return Err("the contract reads an arg that is no 64-bit integer scalar".into());
    }
    if !c.text.contains(&format!(".entry {symbol}(")) {
        return Err("the canonical text has no entry of the symbol".into());
    }
    if let Some(p) = c.contract.params.iter().find(|p| !c.text.contains(&p.name)) {
        return Err(format!(
            "the param {:?} is not in the canonical text",
            p.name
        ));
    }
    Ok(accepted)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;
    use rand::Rng;

    fn corpus(name: &str) -> String {
        std::fs::read_to_string(format!(
            "{}/tests/corpus/{name}.ptx",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap()
    }

    fn verified(text: &str, symbol: &str) -> Accepted {
        let canonical = crate::ptx::canonicalize(text, symbol, None).unwrap();
        let hash = *blake3::hash(canonical.text.as_bytes()).as_bytes();
        Accepted { canonical, hash }
    }

    #[test]
    fn a_kept_verdict_is_the_verifiers_own_for_those_inputs_only() {
        let dir = tempfile::tempdir().unwrap();
        let cache = VerdictCache::open(dir.path(), 1 << 20).unwrap();
        let text = corpus("add_f32_scalar");
        let accepted = verified(&text, "add_f32_scalar");
        assert!(cache.get(text.as_bytes(), "add_f32_scalar", None).is_none());
        cache.put(text.as_bytes(), "add_f32_scalar", None, &accepted);
        assert_eq!(
            cache.get(text.as_bytes(), "add_f32_scalar", None),
            Some(verified(&text, "add_f32_scalar"))
        );
        // Another text, entry name or declared ABI is another key.
        assert!(cache
            .get(format!("{text} ").as_bytes(), "add_f32_scalar", None)
            .is_none());
        assert!(cache.get(text.as_bytes(), "add_f32_other", None).is_none());
        let declared = Some(DeclaredAbi {
            inputs: 2,
            scalar_params: 1,
        });
        assert!(cache
            .get(text.as_bytes(), "add_f32_scalar", declared)
            .is_none());
        // The entries live in the subdirectory, 0700 like its parent.
        use std::os::unix::fs::MetadataExt;
        let sub = std::fs::metadata(dir.path().join(SUBDIRECTORY)).unwrap();
        assert_eq!(sub.mode() & 0o777, 0o700);
    }

    #[test]
    fn a_verdict_directory_that_is_not_the_daemons_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), dir.path().join(SUBDIRECTORY)).unwrap();
        match VerdictCache::open(dir.path(), 1 << 20) {
            Err(e @ CacheError::NotOurs { .. }) => assert_eq!(
                e.to_string(),
                format!(
                    "verdict cache directory {} is not a directory of this user (a symbolic link)",
                    dir.path().join(SUBDIRECTORY).display()
                )
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_changed_verifier_identity_is_a_miss() {
        let dir = tempfile::tempdir().unwrap();
        let text = corpus("add_f32_scalar");
        let accepted = verified(&text, "add_f32_scalar");
        let today = VerdictCache::open(dir.path(), 1 << 20).unwrap();
        today.put(text.as_bytes(), "add_f32_scalar", None, &accepted);
        assert!(today.get(text.as_bytes(), "add_f32_scalar", None).is_some());
        let changed = format!("{VERIFIER_IDENTITY}x");
        let tomorrow = VerdictCache::open_with_identity(dir.path(), 1 << 20, &changed).unwrap();
        assert!(tomorrow
            .get(text.as_bytes(), "add_f32_scalar", None)
            .is_none());
        // The encoder is part of the identity: a build whose encoding
        // differs by one byte (here a renumbered tag) misses today's
        // entries, and the default identity is today's encoder's.
        let renumbered = ENCODER.replacen("8 => {", "11 => {", 1);
        assert_ne!(renumbered, ENCODER);
        let edited =
            VerdictCache::open_with_identity(dir.path(), 1 << 20, &identity_with(&renumbered))
                .unwrap();
        assert!(edited
            .get(text.as_bytes(), "add_f32_scalar", None)
            .is_none());
        assert_eq!(today.identity, identity_with(ENCODER));
        assert!(today.identity.starts_with(VERIFIER_IDENTITY));
        // The identity is the build's: the crate version and a 128-bit
        // source hash.
        let (version, hash) = VERIFIER_IDENTITY.split_once('+').unwrap();
        assert_eq!(version, env!("CARGO_PKG_VERSION"));
        assert_eq!(hash.len(), 32);
        assert!(hash.bytes().all(|b| b.is_ascii_hexdigit()));
    }

    /// Every kernel of the corpus the verifier accepts encodes and decodes
    /// to the very verdict (a precondition name missing from
    /// [`PRECONDITION_NAMES`], or an encoding that loses a field, fails
    /// here).
    #[test]
    fn every_corpus_verdict_survives_the_round_trip() {
        let mut seen = 0;
        let mut names = std::collections::BTreeSet::new();
        let root = std::path::PathBuf::from(format!("{}/tests/corpus", env!("CARGO_MANIFEST_DIR")));
        for path in crate::ptx::files_under(&root, "ptx") {
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            let entries = text
                .lines()
                .filter_map(|l| l.split(".entry ").nth(1))
                .filter_map(|rest| rest.split(['(', ' ']).next())
                .map(str::to_owned)
                .collect::<Vec<_>>();
            for symbol in entries {
                let Ok(canonical) = crate::ptx::canonicalize(&text, &symbol, None) else {
                    continue;
                };
                let hash = *blake3::hash(canonical.text.as_bytes()).as_bytes();
                let accepted = Accepted { canonical, hash };
                names.extend(
                    accepted
                        .canonical
                        .contract
                        .preconditions
                        .iter()
                        .map(|p| p.name),
                );
                let decoded = decode(&encode(&accepted))
                    .and_then(|a| consistent(a, &symbol))
                    .unwrap_or_else(|why| panic!("{}: {symbol}: {why}", path.display()));
                assert_eq!(decoded, accepted, "{}: {symbol}", path.display());
                seen += 1;
            }
        }
        assert!(seen >= 50, "only {seen} accepted kernels in the corpus");
        // The corpus reaches more than the scalar family's precondition.
        assert!(names.len() >= 3, "{names:?}");
    }

    /// Every cut and every flipped byte of a payload decodes to an error or
    /// to a consistent verdict, never a panic; a flipped byte of the text or
    /// of the hash is always caught.
    #[test]
    fn a_damaged_payload_is_an_error_never_a_panic() {
        let text = corpus("jit/inductor/add_f32_static_0");
        let symbol = "triton_poi_fused_add_0";
        let accepted = verified(&text, symbol);
        let payload = encode(&accepted);
        for cut in 0..payload.len() {
            assert!(decode(&payload[..cut]).is_err(), "cut at {cut}");
        }
        let mut rng = rand::rng();
        let text_at = 1 + 32 + 4;
        for at in 0..payload.len() {
            let mut bad = payload.clone();
            bad[at] ^= 1 << rng.random_range(0..8);
            let result = decode(&bad).and_then(|a| consistent(a, symbol));
            if (1..text_at + accepted.canonical.text.len()).contains(&at) {
                assert!(result.is_err(), "a flipped byte at {at} was not caught");
            }
        }
    }

    fn one_verdict(dir: &Path) -> (VerdictCache, String, Accepted) {
        let cache = VerdictCache::open(dir, 1 << 20).unwrap();
        let text = corpus("add_f32_scalar");
        let accepted = verified(&text, "add_f32_scalar");
        cache.put(text.as_bytes(), "add_f32_scalar", None, &accepted);
        (cache, text, accepted)
    }

    #[test]
    fn a_tampered_truncated_or_foreign_entry_is_a_miss_and_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let mut rng = rand::rng();
        for round in 0..30 {
            let (cache, text, accepted) = one_verdict(dir.path());
            let path = cache.entry_path(text.as_bytes(), "add_f32_scalar", None);
            let mut bytes = std::fs::read(&path).unwrap();
            match round % 3 {
                // One byte of the payload flipped (the header is 80 bytes).
                0 => {
                    let at = rng.random_range(80..bytes.len());
                    bytes[at] ^= 1 << rng.random_range(0..8);
                }
                1 => bytes.truncate(rng.random_range(0..bytes.len())),
                // A whole entry, for another key, under this key's name.
                _ => {
                    let other = corpus("affine_f32_scalar");
                    let symbol = "affine_f32_scalar";
                    cache.put(other.as_bytes(), symbol, None, &verified(&other, symbol));
                    bytes =
                        std::fs::read(cache.entry_path(other.as_bytes(), symbol, None)).unwrap();
                }
            }
            std::fs::write(&path, &bytes).unwrap();
            assert!(
                cache.get(text.as_bytes(), "add_f32_scalar", None).is_none(),
                "round {round}"
            );
            assert!(!path.exists(), "round {round}: the bad entry is deleted");
            // Kept again, it is a hit again.
            cache.put(text.as_bytes(), "add_f32_scalar", None, &accepted);
            assert!(cache.get(text.as_bytes(), "add_f32_scalar", None).is_some());
        }
    }

    /// An entry whose header and payload hash are right (written through
    /// the store, as a writer of the daemon's user could) but whose verdict
    /// disagrees with itself is a miss, and deleted.
    #[test]
    fn a_verdict_that_decodes_but_is_inconsistent_is_a_miss() {
        let dir = tempfile::tempdir().unwrap();
        let (cache, text, accepted) = one_verdict(dir.path());
        let key = cache.key(text.as_bytes(), "add_f32_scalar", None);
        let mut wrong_text = Accepted {
            canonical: accepted.canonical.clone(),
            hash: accepted.hash,
        };
        wrong_text.canonical.text.push_str("\n// another text");
        let mut wrong_signature = Accepted {
            canonical: accepted.canonical.clone(),
            hash: accepted.hash,
        };
        wrong_signature.canonical.signature.inputs += 1;
        let mut wrong_contract = Accepted {
            canonical: accepted.canonical.clone(),
            hash: accepted.hash,
        };
        wrong_contract.canonical.contract.footprints.pop();
        for (how, bad) in [
            ("text", wrong_text),
            ("signature", wrong_signature),
            ("contract", wrong_contract),
        ] {
            cache.store.put(&key, &encode(&bad));
            assert!(decode(&encode(&bad)).is_ok(), "{how}: it decodes");
            assert!(
                cache.get(text.as_bytes(), "add_f32_scalar", None).is_none(),
                "{how}"
            );
            assert!(!cache
                .entry_path(text.as_bytes(), "add_f32_scalar", None)
                .exists());
        }
        // The same verdict under another entry's name is inconsistent too.
        let other_key = cache.key(text.as_bytes(), "add_f32_other", None);
        cache.store.put(&other_key, &encode(&accepted));
        assert!(cache.get(text.as_bytes(), "add_f32_other", None).is_none());
    }

    /// The verdicts a writer of the daemon's user could keep whose counts
    /// agree with the signature but whose layout does not: the executor
    /// would refuse the module (an operand passed twice and another never,
    /// a count of a float type), or a footprint bounds another param than
    /// the one passing its operand. Each decodes, and each is a miss and
    /// deleted (before, each was served).
    #[test]
    fn a_verdict_whose_layout_does_not_hold_is_a_miss() {
        let dir = tempfile::tempdir().unwrap();
        let (cache, text, accepted) = one_verdict(dir.path());
        let symbol = "add_f32_scalar";
        let key = cache.key(text.as_bytes(), symbol, None);
        let pointers: Vec<usize> = accepted
            .canonical
            .contract
            .params
            .iter()
            .enumerate()
            .filter(|(_, p)| matches!(p.kind, ParamKind::Pointer { .. }))
            .map(|(i, _)| i)
            .collect();
        assert!(pointers.len() >= 2, "{:?}", accepted.canonical.contract);
        let count = accepted
            .canonical
            .contract
            .params
            .iter()
            .position(|p| matches!(p.kind, ParamKind::Count(_)))
            .unwrap();
        let altered = |change: &dyn Fn(&mut LaunchContract)| {
            let mut bad = Accepted {
                canonical: accepted.canonical.clone(),
                hash: accepted.hash,
            };
            change(&mut bad.canonical.contract);
            bad
        };
        let twice = altered(&|c| {
            c.params[pointers[1]].kind = c.params[pointers[0]].kind.clone();
        });
        let float_count = altered(&|c| c.params[count].kind = ParamKind::Count(ScalarType::F32));
        let crossed = altered(&|c| {
            let (a, b) = (c.footprints[0].param, c.footprints[1].param);
            c.footprints[0].param = b;
            c.footprints[1].param = a;
        });
        for (how, bad, why) in [
            ("an operand passed twice", twice, "is passed twice"),
            ("a float count", float_count, "a count of a float type"),
            ("crossed footprints", crossed, "footprint is not the param"),
        ] {
            assert!(
                decode(&encode(&bad))
                    .and_then(|a| consistent(a, symbol))
                    .is_err_and(|e| e.contains(why)),
                "{how}"
            );
            cache.store.put(&key, &encode(&bad));
            assert!(decode(&encode(&bad)).is_ok(), "{how}: it decodes");
            assert!(cache.get(text.as_bytes(), symbol, None).is_none(), "{how}");
            assert!(
                !cache.entry_path(text.as_bytes(), symbol, None).exists(),
                "{how}: the entry is deleted"
            );
        }
        // The verifier's own verdict is still served.
        cache.put(text.as_bytes(), symbol, None, &accepted);
        assert_eq!(cache.get(text.as_bytes(), symbol, None), Some(accepted));
    }

    /// `text` with a comment of its own at the end: another key, the same
    /// kernel once canonicalised.
    fn variant(text: &str, i: usize) -> String {
        format!("{text}\n// variant {i}\n")
    }

    /// A consistent verdict of another kernel (its canonical text ends in
    /// a comment of its own).
    fn another_kernel(accepted: &Accepted, i: usize) -> Accepted {
        let mut canonical = accepted.canonical.clone();
        canonical.text.push_str(&format!("\n// kernel {i}\n"));
        let hash = *blake3::hash(canonical.text.as_bytes()).as_bytes();
        Accepted { canonical, hash }
    }

    fn entry_bytes(cache: &VerdictCache, text: &str, symbol: &str) -> u64 {
        std::fs::metadata(cache.entry_path(text.as_bytes(), symbol, None))
            .unwrap()
            .len()
    }

    fn directory_bytes(dir: &Path) -> (usize, u64) {
        let sizes: Vec<u64> = std::fs::read_dir(dir.join(SUBDIRECTORY))
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .collect();
        (sizes.len(), sizes.iter().sum())
    }

    /// Byte-different copies of one kernel (before, each a new entry that
    /// evicted the least recently used, so one client's copies of one
    /// kernel emptied the shared store of every other verdict) take at
    /// most [`VARIANTS_PER_KERNEL`] entries: the kernel's own oldest
    /// variant goes, and another kernel's verdict, older than every
    /// copy, is still served.
    /// A kernel that a daemon learnt more than its share of variants of
    /// (by hits on entries from before it started) comes down to the share
    /// at its next put, not by a share per put.
    #[test]
    fn a_kernel_over_its_share_comes_down_to_it_at_the_next_put() {
        let dir = tempfile::tempdir().unwrap();
        let text = corpus("add_f32_scalar");
        let accepted = verified(&text, "add_f32_scalar");
        let many = 3 * VARIANTS_PER_KERNEL;
        // Each written by a daemon of its own: none knows the others', so
        // none evicts a variant.
        for i in 0..many {
            let writer = VerdictCache::open(dir.path(), 1 << 24).unwrap();
            writer.put(
                variant(&text, i).as_bytes(),
                "add_f32_scalar",
                None,
                &accepted,
            );
        }
        assert_eq!(directory_bytes(dir.path()).0, many);
        let cache = VerdictCache::open(dir.path(), 1 << 24).unwrap();
        for i in 0..many {
            assert!(cache
                .get(variant(&text, i).as_bytes(), "add_f32_scalar", None)
                .is_some());
        }
        assert_eq!(cache.lock().variants[&accepted.hash].len(), many);
        cache.put(
            variant(&text, many).as_bytes(),
            "add_f32_scalar",
            None,
            &accepted,
        );
        assert_eq!(
            cache.lock().variants[&accepted.hash].len(),
            VARIANTS_PER_KERNEL
        );
        assert_eq!(directory_bytes(dir.path()).0, VARIANTS_PER_KERNEL);
    }

    #[test]
    fn one_kernels_variants_cannot_fill_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let text = corpus("add_f32_scalar");
        let accepted = verified(&text, "add_f32_scalar");
        let other = corpus("affine_f32_scalar");
        let other_verdict = verified(&other, "affine_f32_scalar");
        // Room for 20 entries.
        let elsewhere = tempfile::tempdir().unwrap();
        let probe = VerdictCache::open(elsewhere.path(), 1 << 20).unwrap();
        probe.put(other.as_bytes(), "affine_f32_scalar", None, &other_verdict);
        probe.put(text.as_bytes(), "add_f32_scalar", None, &accepted);
        let room = 20
            * entry_bytes(&probe, &other, "affine_f32_scalar")
                .max(entry_bytes(&probe, &text, "add_f32_scalar") + 32);
        let cache = VerdictCache::open(dir.path(), room).unwrap();
        cache.put(other.as_bytes(), "affine_f32_scalar", None, &other_verdict);
        cache.put(text.as_bytes(), "add_f32_scalar", None, &accepted);
        let flood = 100;
        for i in 0..flood {
            let copy = variant(&text, i);
            assert_eq!(verified(&copy, "add_f32_scalar"), accepted, "variant {i}");
            cache.put(copy.as_bytes(), "add_f32_scalar", None, &accepted);
        }
        assert_eq!(
            cache.get(other.as_bytes(), "add_f32_scalar", None),
            None,
            "another key"
        );
        assert_eq!(
            cache.get(other.as_bytes(), "affine_f32_scalar", None),
            Some(verified(&other, "affine_f32_scalar")),
            "another kernel's verdict was evicted by one kernel's copies"
        );
        // The newest copies are kept, the older ones (and the original,
        // older than all) are gone.
        for i in 0..flood {
            let kept = cache
                .get(variant(&text, i).as_bytes(), "add_f32_scalar", None)
                .is_some();
            assert_eq!(kept, i >= flood - VARIANTS_PER_KERNEL, "variant {i}");
        }
        assert!(cache.get(text.as_bytes(), "add_f32_scalar", None).is_none());
        let (entries, bytes) = directory_bytes(dir.path());
        assert_eq!(entries, VARIANTS_PER_KERNEL + 1);
        assert!(bytes <= room, "{bytes} > {room}");
    }

    /// A put lists nothing: a dead writer's temporary file planted after
    /// the open (deleted by any listing of the directory) outlives a
    /// hundred puts (before, every put listed the directory and deleted
    /// it), and the account alone keeps the directory under its bound;
    /// after the bound's worth of bytes written the directory is listed
    /// once more.
    #[test]
    fn a_put_does_not_list_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let text = corpus("add_f32_scalar");
        let accepted = verified(&text, "add_f32_scalar");
        let probe = VerdictCache::open(dir.path(), 1 << 20).unwrap();
        probe.put(text.as_bytes(), "add_f32_scalar", None, &accepted);
        let entry = entry_bytes(&probe, &text, "add_f32_scalar") + 32;
        let room = 400 * entry;
        let cache = VerdictCache::open(dir.path(), room).unwrap();
        assert_eq!(cache.listings(), 1);
        let stale = dir.path().join(SUBDIRECTORY).join("x.tmp");
        std::fs::write(&stale, b"half").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&stale)
            .unwrap()
            .set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(7200))
            .unwrap();
        // A hundred kernels (distinct canonical hashes: no variant bound).
        let kernel = |i: usize| another_kernel(&accepted, i);
        for i in 0..100 {
            cache.put(
                variant(&text, i).as_bytes(),
                "add_f32_scalar",
                None,
                &kernel(i),
            );
        }
        assert!(stale.exists(), "a put listed the directory");
        assert_eq!(cache.listings(), 1);
        // Ten times the bound: the account evicts, the directory is
        // listed once per bound's worth of writes, and never exceeds it.
        for i in 100..4000 {
            cache.put(
                variant(&text, i).as_bytes(),
                "add_f32_scalar",
                None,
                &kernel(i),
            );
            if i % 500 == 0 {
                let (_, bytes) = directory_bytes(dir.path());
                assert!(bytes <= room, "{bytes} > {room} at {i}");
            }
        }
        assert!(!stale.exists());
        let listings = cache.listings();
        assert!((5..=12).contains(&listings), "{listings} listings");
        let (entries, bytes) = directory_bytes(dir.path());
        assert!(bytes <= room, "{entries} entries, {bytes} bytes");
        // The newest are hits.
        for i in 3990..4000 {
            assert!(cache
                .get(variant(&text, i).as_bytes(), "add_f32_scalar", None)
                .is_some());
        }
    }

    /// A listing that cannot read the directory (here: moved away for a
    /// moment) keeps the account as it was; before, it rebuilt it empty,
    /// and the entries it had counted were outside every bound.
    #[test]
    fn a_listing_of_an_unreadable_directory_keeps_the_account() {
        let dir = tempfile::tempdir().unwrap();
        let text = corpus("add_f32_scalar");
        let accepted = verified(&text, "add_f32_scalar");
        let cache = VerdictCache::open(dir.path(), 1 << 20).unwrap();
        for i in 0..5 {
            cache.put(
                variant(&text, i).as_bytes(),
                "add_f32_scalar",
                None,
                &another_kernel(&accepted, i),
            );
        }
        let (entries, total) = {
            let account = cache.lock();
            (account.entries.len(), account.total)
        };
        assert_eq!(entries, 5);
        let sub = dir.path().join(SUBDIRECTORY);
        let away = dir.path().join("away");
        std::fs::rename(&sub, &away).unwrap();
        let listings = cache.listings();
        cache.relist(&mut cache.lock());
        std::fs::rename(&away, &sub).unwrap();
        assert_eq!(cache.listings(), listings + 1);
        let account = cache.lock();
        assert_eq!((account.entries.len(), account.total), (entries, total));
    }

    /// Two daemons on one directory: what one writes, the other finds on
    /// a hit and enters at its size, without a listing; what one deletes, the other's account drops; the directory
    /// stays under the bound both keep.
    #[test]
    fn two_daemons_sharing_the_directory_keep_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let text = corpus("add_f32_scalar");
        let accepted = verified(&text, "add_f32_scalar");
        let probe = VerdictCache::open(dir.path(), 1 << 20).unwrap();
        probe.put(text.as_bytes(), "add_f32_scalar", None, &accepted);
        let room = 30 * (entry_bytes(&probe, &text, "add_f32_scalar") + 32);
        let kernel = |i: usize| another_kernel(&accepted, i);
        let a = VerdictCache::open(dir.path(), room).unwrap();
        let b = VerdictCache::open(dir.path(), room).unwrap();
        b.put(
            variant(&text, 0).as_bytes(),
            "add_f32_scalar",
            None,
            &kernel(0),
        );
        let before = a.listings();
        assert!(a
            .get(variant(&text, 0).as_bytes(), "add_f32_scalar", None)
            .is_some());
        assert_eq!(
            a.listings(),
            before,
            "a hit on an entry it did not know is entered without a listing"
        );
        let entered = a.key(variant(&text, 0).as_bytes(), "add_f32_scalar", None);
        assert!(a.lock().entries.contains_key(&entered));
        let mut rng = rand::rng();
        for i in 1..400 {
            let writer = if rng.random_bool(0.5) { &a } else { &b };
            writer.put(
                variant(&text, i).as_bytes(),
                "add_f32_scalar",
                None,
                &kernel(i),
            );
            let (_, bytes) = directory_bytes(dir.path());
            // Each daemon bounds what it knows; together at most twice.
            assert!(bytes <= 2 * room, "{bytes} at {i}");
        }
        // Listed again, each finds the directory within the bound.
        let c = VerdictCache::open(dir.path(), room).unwrap();
        assert!(c.lock().total <= room);
        let (_, bytes) = directory_bytes(dir.path());
        assert!(bytes <= room, "{bytes}");
    }

    /// `put` against a store of many entries, the old way (a write and a
    /// listing of the whole directory: `KernelCache::put`) and this one
    /// (a write and the account). Prints the figures; asserts nothing of
    /// them. `cargo test --lib verdict_cache::tests::put_timing --
    /// --ignored --nocapture`
    #[test]
    #[ignore = "a timing, run by hand"]
    fn put_timing() {
        let dir = tempfile::tempdir().unwrap();
        let text = corpus("add_f32_scalar");
        let accepted = verified(&text, "add_f32_scalar");
        let kernel = |i: usize| another_kernel(&accepted, i);
        let payload = encode(&accepted);
        for entries in [1_000usize, 10_000, 50_000] {
            let cache = VerdictCache::open(dir.path(), 256 << 20).unwrap();
            let have = cache.lock().entries.len();
            for i in have..entries {
                let key = CacheKey::from_hash(*blake3::hash(&(i as u64).to_le_bytes()).as_bytes());
                cache.store.write(&key, &payload);
            }
            let started = std::time::Instant::now();
            let cache = VerdictCache::open(dir.path(), 256 << 20).unwrap();
            let open = started.elapsed();
            let rounds = 200;
            let started = std::time::Instant::now();
            for i in 0..rounds {
                let key = cache.key(variant(&text, i).as_bytes(), "add_f32_scalar", None);
                cache.store.put(&key, &payload);
            }
            let old = started.elapsed() / rounds as u32;
            let started = std::time::Instant::now();
            for i in 0..rounds {
                let copy = variant(&text, rounds + i);
                cache.put(copy.as_bytes(), "add_f32_scalar", None, &kernel(rounds + i));
            }
            let new = started.elapsed() / rounds as u32;
            println!(
                "{entries} entries of {} bytes: open {open:?}; put with a listing {old:?}, put by the account {new:?}",
                payload.len() + 80
            );
        }
    }
}
