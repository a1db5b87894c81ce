//! The persistent compiled-kernel cache: machine code a backend compiled
//! from a kernel's text, kept on disk so that a restarted executor, a spare
//! or a restarted daemon loads a known kernel without compiling it again
//! (on an H200, loading a cubin takes 0.075 ms where the driver's JIT of
//! the same PTX takes 153 ms).
//!
//! Backend-independent: an entry is opaque bytes under a [`CacheKey`] made
//! of the kernel text's blake3 hash and a backend's description of what the
//! bytes are good for (for CUDA: the device's architecture `sm_XX` and the
//! driver's version, so that code compiled by another driver or for
//! another architecture is never looked up).
//!
//! The file handling here is not specific to machine code: the front's
//! verdict cache (`front::verdict_cache`) keeps its entries with the same
//! code, in a directory of its own and under a magic of its own
//! ([`EntryFormat`]), so that an entry of one can never be read as the
//! other's.
//!
//! Invariants:
//! - The directory is the daemon's: created with mode 0700, refused when it
//!   is a symbolic link, not a directory, or owned by another user (another
//!   user could plant machine code there); entries are created 0600.
//! - An entry is written whole or not at all: to a temporary file of its
//!   own (a unique name, `O_EXCL`), then renamed over the entry's name, so
//!   a reader (in this process or another daemon's) sees either no entry or
//!   a complete one, and two writers of the same entry both leave a
//!   complete one.
//! - Nothing is returned that was not written for the key asked: an entry
//!   starts with a header holding a magic number, the key, the payload's
//!   length and its blake3 hash, all checked on read. An entry that fails
//!   any check (truncated, tampered, from another format) is deleted and
//!   reported a miss; the caller compiles again.
//! - Only an entry this daemon's user could have written is read: a plain
//!   file (opened without following a link or blocking on a FIFO), owned
//!   by the user and writable by no one else; anything else, such as a file
//!   another user left while the directory was writable by others, is
//!   deleted and reported a miss.
//! - The directory stays under its size bound: after each `put`, the
//!   entries least recently used (by modification time, which a hit
//!   refreshes) are deleted until the total fits. A caller that keeps its
//!   own account of the entries (the verdict cache) writes with `write`,
//!   which does not list the directory, and evicts by that account.
//!   Temporary files left by a writer that died are deleted once they are
//!   an hour old, and a file with the entry suffix whose name is not one
//!   `CacheKey::file_name` writes (no lookup can reach it) at the next
//!   listing.
//! - No path here panics: every file-system failure is a miss or a skipped
//!   write (the cache only ever saves time) or, at open, a typed error.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// What the entries of one cache are: the first bytes of every entry (the
/// format and its version) and a name for logs.
#[derive(Debug, PartialEq, Eq)]
pub struct EntryFormat {
    pub magic: [u8; 8],
    pub name: &'static str,
}

/// Compiled machine code (format version 1).
pub const COMPILED_KERNELS: EntryFormat = EntryFormat {
    magic: *b"PTXDKC01",
    name: "kernel cache",
};
/// Magic, key, payload length, payload hash.
pub(crate) const HEADER_BYTES: usize = 8 + 32 + 8 + 32;
/// The suffix of complete entries; temporary files end in `.tmp`.
const ENTRY_SUFFIX: &str = ".kc";
const TEMP_SUFFIX: &str = ".tmp";
/// A temporary file this old belongs to a writer that died.
const STALE_TEMP: Duration = Duration::from_secs(3600);

/// What an entry is looked up by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheKey([u8; 32]);

impl CacheKey {
    /// A key that is already a hash of everything its entry depends on
    /// (the verdict cache's: `front::verdict_cache`).
    pub fn from_hash(hash: [u8; 32]) -> CacheKey {
        CacheKey(hash)
    }

    /// The key of the code compiled from `text` for `target` (a backend's
    /// description of what the code runs on, e.g. `cuda sm_90 driver 12080`).
    pub fn new(text: &[u8], target: &str) -> CacheKey {
        let mut hasher = blake3::Hasher::new();
        hasher.update(b"ptxd kernel cache v1\0");
        hasher.update(blake3::hash(text).as_bytes());
        hasher.update(&(target.len() as u64).to_le_bytes());
        hasher.update(target.as_bytes());
        CacheKey(*hasher.finalize().as_bytes())
    }

    /// The key an entry's file name names, if it is one.
    fn from_file_name(name: &str) -> Option<CacheKey> {
        // Only the names `file_name` writes: 64 lowercase hex digits. A
        // parser's leniency (`+`, upper case) would let two names alias
        // one key.
        let hex = name.strip_suffix(ENTRY_SUFFIX)?.as_bytes();
        if hex.len() != 64 {
            return None;
        }
        let digit = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        let mut key = [0u8; 32];
        for (byte, pair) in key.iter_mut().zip(hex.chunks_exact(2)) {
            *byte = (digit(pair[0])? << 4) | digit(pair[1])?;
        }
        Some(CacheKey(key))
    }

    fn file_name(&self) -> String {
        let mut name = String::with_capacity(64 + ENTRY_SUFFIX.len());
        for byte in self.0 {
            name.push_str(&format!("{byte:02x}"));
        }
        name.push_str(ENTRY_SUFFIX);
        name
    }
}

/// Why the cache directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("{cache} directory {path}: {source}")]
    Io {
        /// The cache's [`EntryFormat::name`].
        cache: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{cache} directory {path} is not a directory of this user ({why})")]
    NotOurs {
        cache: &'static str,
        path: PathBuf,
        why: String,
    },
}

/// A complete entry as the directory lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub key: CacheKey,
    /// The entry's bytes on disk (header and payload).
    pub bytes: u64,
    /// When it was written or last hit.
    pub modified: SystemTime,
}

/// What a lookup found.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    /// A complete entry for the key.
    Hit(Vec<u8>),
    /// No entry.
    Miss,
    /// An entry that failed its checks; it was deleted.
    Discarded(String),
}

/// One daemon's view of a cache directory (other daemons may share it).
#[derive(Debug, Clone)]
pub struct KernelCache {
    dir: PathBuf,
    max_bytes: u64,
    format: &'static EntryFormat,
}

impl KernelCache {
    /// Opens (creating it, mode 0700) the compiled-kernel cache directory
    /// `dir`, bounded to `max_bytes` of entries.
    pub fn open(dir: &Path, max_bytes: u64) -> Result<KernelCache, CacheError> {
        KernelCache::open_as(dir, max_bytes, &COMPILED_KERNELS)
    }

    /// Opens (creating it, mode 0700) the directory `dir` of a cache whose
    /// entries are `format`, bounded to `max_bytes` of entries.
    pub fn open_as(
        dir: &Path,
        max_bytes: u64,
        format: &'static EntryFormat,
    ) -> Result<KernelCache, CacheError> {
        let io = |source| CacheError::Io {
            cache: format.name,
            path: dir.to_path_buf(),
            source,
        };
        match fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
        {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io(e)),
        }
        let meta = fs::symlink_metadata(dir).map_err(io)?;
        let not_ours = |why: String| CacheError::NotOurs {
            cache: format.name,
            path: dir.to_path_buf(),
            why,
        };
        if meta.file_type().is_symlink() {
            return Err(not_ours("a symbolic link".into()));
        }
        if !meta.is_dir() {
            return Err(not_ours("not a directory".into()));
        }
        let uid = nix::unistd::geteuid().as_raw();
        if meta.uid() != uid {
            return Err(not_ours(format!("owned by uid {}, not {uid}", meta.uid())));
        }
        if meta.mode() & 0o077 != 0 {
            fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(io)?;
        }
        Ok(KernelCache {
            dir: dir.to_path_buf(),
            max_bytes,
            format,
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where `key`'s entry is (whether or not there is one).
    pub(crate) fn entry_path(&self, key: &CacheKey) -> PathBuf {
        self.dir.join(key.file_name())
    }

    /// Deletes `key`'s entry, if there is one: a caller that found its
    /// payload unusable (one that decodes to nothing valid) drops it as
    /// [`KernelCache::get`] drops an entry that fails its checks. Whether
    /// there was one to delete.
    pub fn remove(&self, key: &CacheKey) -> bool {
        fs::remove_file(self.entry_path(key)).is_ok()
    }

    /// Looks `key` up; an entry that fails its checks is deleted.
    pub fn get(&self, key: &CacheKey) -> Lookup {
        let path = self.entry_path(key);
        // O_NONBLOCK: a FIFO or device node another user planted while the
        // directory was open to them must not block the open (it is then
        // refused as not a plain file).
        let mut file = match OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
            .open(&path)
        {
            Ok(file) => file,
            Err(_) => return Lookup::Miss,
        };
        match read_entry(&mut file, key, self.max_bytes, &self.format.magic) {
            Ok(payload) => {
                // A hit is a use: the entry is the last to be evicted.
                let _ = file.set_modified(SystemTime::now());
                Lookup::Hit(payload)
            }
            Err(why) => {
                tracing::warn!(cache = self.format.name, path = %path.display(), why, "a cache entry failed its checks; discarded");
                let _ = fs::remove_file(&path);
                Lookup::Discarded(why)
            }
        }
    }

    /// Stores `payload` under `key` (atomically; see the module docs),
    /// then evicts down to the bound. A failure is logged and dropped: the
    /// cache only saves time.
    pub fn put(&self, key: &CacheKey, payload: &[u8]) {
        if self.write(key, payload).is_some() {
            self.evict();
        }
    }

    /// Stores `payload` under `key` (atomically) without evicting, for a
    /// caller that keeps its own account of the directory (the verdict
    /// cache): the entry's bytes on disk, or `None` when nothing was
    /// written (larger than the whole bound, or a failure, logged).
    pub fn write(&self, key: &CacheKey, payload: &[u8]) -> Option<u64> {
        let bytes = (HEADER_BYTES + payload.len()) as u64;
        if bytes > self.max_bytes {
            return None;
        }
        match self.write_entry(key, payload) {
            Ok(()) => Some(bytes),
            Err(e) => {
                tracing::warn!(cache = self.format.name, dir = %self.dir.display(), error = %e, "cannot write a cache entry");
                None
            }
        }
    }

    fn write_entry(&self, key: &CacheKey, payload: &[u8]) -> std::io::Result<()> {
        let temp = self.dir.join(format!(
            "{}.{}.{:016x}{TEMP_SUFFIX}",
            key.file_name(),
            std::process::id(),
            rand::random::<u64>()
        ));
        let written = (|| {
            let mut file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(nix::libc::O_NOFOLLOW)
                .open(&temp)?;
            let mut entry = Vec::with_capacity(HEADER_BYTES + payload.len());
            entry.extend_from_slice(&self.format.magic);
            entry.extend_from_slice(&key.0);
            entry.extend_from_slice(&(payload.len() as u64).to_le_bytes());
            entry.extend_from_slice(blake3::hash(payload).as_bytes());
            entry.extend_from_slice(payload);
            file.write_all(&entry)?;
            fs::rename(&temp, self.entry_path(key))
        })();
        if written.is_err() {
            let _ = fs::remove_file(&temp);
        }
        written
    }

    /// Deletes the least recently used entries until the rest fit the
    /// bound, and temporary files of writers that died.
    pub fn evict(&self) {
        let mut entries = self.scan().unwrap_or_default();
        let mut total: u64 = entries.iter().map(|(_, len, _)| len).sum();
        if total <= self.max_bytes {
            return;
        }
        entries.sort();
        for (_, len, path) in entries {
            if total <= self.max_bytes {
                break;
            }
            // Another daemon may have deleted it first: it is gone either way.
            let _ = fs::remove_file(&path);
            total = total.saturating_sub(len);
        }
    }

    /// The complete entries, by key, listed once without evicting
    /// anything; `None` when the directory cannot be read (so a caller
    /// keeps what it knew rather than taking it for empty). Files of
    /// writers that died, and `.kc` names that are no key's, are deleted
    /// on the way.
    pub fn list(&self) -> Option<Vec<Listed>> {
        Some(
            self.scan()?
                .into_iter()
                .filter_map(|(modified, bytes, path)| {
                    let key = CacheKey::from_file_name(path.file_name()?.to_str()?)?;
                    Some(Listed {
                        key,
                        bytes,
                        modified,
                    })
                })
                .collect(),
        )
    }

    /// One pass over the directory: each complete entry's modification
    /// time, length and path. Stale temporary files are deleted, and so
    /// are files with the entry suffix whose name is no key's: no lookup
    /// can reach them, so nothing else would ever delete them, and the
    /// bound would not count them.
    fn scan(&self) -> Option<Vec<(SystemTime, u64, PathBuf)>> {
        let listing = fs::read_dir(&self.dir).ok()?;
        let now = SystemTime::now();
        let mut entries = Vec::new();
        for item in listing.flatten() {
            let name = item.file_name();
            let name = name.to_string_lossy();
            let Ok(meta) = item.metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            if name.ends_with(TEMP_SUFFIX) {
                if now
                    .duration_since(modified)
                    .is_ok_and(|age| age > STALE_TEMP)
                {
                    let _ = fs::remove_file(item.path());
                }
            } else if CacheKey::from_file_name(&name).is_some() {
                entries.push((modified, meta.len(), item.path()));
            } else if name.ends_with(ENTRY_SUFFIX) {
                let _ = fs::remove_file(item.path());
            }
        }
        Some(entries)
    }
}

/// Reads and checks a whole entry; `Err` says which check failed.
fn read_entry(
    file: &mut File,
    key: &CacheKey,
    max_bytes: u64,
    magic: &[u8; 8],
) -> Result<Vec<u8>, String> {
    let meta = file.metadata().map_err(|e| e.to_string())?;
    // Only this user could have written it (see the module docs): a file
    // another user left while the directory was writable by others is not
    // ours, whatever it holds.
    if !meta.file_type().is_file() {
        return Err("not a plain file".into());
    }
    if meta.uid() != nix::unistd::geteuid().as_raw() || meta.mode() & 0o022 != 0 {
        return Err("not an entry this user wrote (its owner or mode)".into());
    }
    let len = meta.len();
    if len < HEADER_BYTES as u64 {
        return Err(format!("{len} bytes, shorter than the header"));
    }
    if len > max_bytes {
        return Err(format!("{len} bytes, over the cache's bound"));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(len)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    let (header, payload) = bytes.split_at(HEADER_BYTES.min(bytes.len()));
    if header.len() < HEADER_BYTES || header[..8] != magic[..] {
        return Err("not an entry of this cache's format".into());
    }
    if header[8..40] != key.0 {
        return Err("the entry is for another key".into());
    }
    let mut stated = [0u8; 8];
    stated.copy_from_slice(&header[40..48]);
    let stated = u64::from_le_bytes(stated);
    if stated != payload.len() as u64 {
        return Err(format!(
            "the header says {stated} payload bytes, the entry holds {}",
            payload.len()
        ));
    }
    if header[48..80] != *blake3::hash(payload).as_bytes() {
        return Err("the payload does not match its hash".into());
    }
    Ok(payload.to_vec())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;
    use rand::Rng;

    fn random_bytes(n: usize) -> Vec<u8> {
        let mut rng = rand::rng();
        (0..n).map(|_| rng.random()).collect()
    }

    fn key(text: &str) -> CacheKey {
        CacheKey::new(text.as_bytes(), "cuda sm_90 driver 12080")
    }

    #[test]
    fn an_entry_comes_back_for_its_key_only() {
        let dir = tempfile::tempdir().unwrap();
        let cache = KernelCache::open(&dir.path().join("cache"), 1 << 20).unwrap();
        let code = random_bytes(5000);
        let k = key("kernel a");
        assert_eq!(cache.get(&k), Lookup::Miss);
        cache.put(&k, &code);
        assert_eq!(cache.get(&k), Lookup::Hit(code.clone()));
        // Another text, or the same text for another target, is another key.
        assert_eq!(cache.get(&key("kernel b")), Lookup::Miss);
        let other_target = CacheKey::new(b"kernel a", "cuda sm_80 driver 12080");
        assert_ne!(other_target, k);
        assert_eq!(cache.get(&other_target), Lookup::Miss);
        // The target's length is hashed too: no text/target split collides.
        assert_ne!(CacheKey::new(b"ab", "c"), CacheKey::new(b"a", "bc"));
    }

    #[test]
    fn the_directory_is_private_and_entries_are_0600() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cache");
        fs::DirBuilder::new().mode(0o777).create(&path).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o777)).unwrap();
        let cache = KernelCache::open(&path, 1 << 20).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o700);
        cache.put(&key("k"), b"code");
        let entry = cache.entry_path(&key("k"));
        assert_eq!(fs::metadata(&entry).unwrap().mode() & 0o777, 0o600);
        // A symbolic link in the directory's place is refused.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(matches!(
            KernelCache::open(&link, 1 << 20),
            Err(CacheError::NotOurs { .. })
        ));
        let file = dir.path().join("file");
        fs::write(&file, b"x").unwrap();
        assert!(matches!(
            KernelCache::open(&file, 1 << 20),
            Err(CacheError::NotOurs { .. })
        ));
    }

    #[test]
    fn a_tampered_or_truncated_entry_is_discarded_never_returned() {
        let dir = tempfile::tempdir().unwrap();
        let cache = KernelCache::open(dir.path(), 1 << 20).unwrap();
        let mut rng = rand::rng();
        let k = key("tampered");
        for round in 0..64 {
            let code = random_bytes(rng.random_range(1..4000));
            cache.put(&k, &code);
            let path = cache.entry_path(&k);
            let mut bytes = fs::read(&path).unwrap();
            let how = match round % 4 {
                // A flipped bit anywhere: header or payload.
                0 | 1 => {
                    let at = rng.random_range(0..bytes.len());
                    bytes[at] ^= 1 << rng.random_range(0..8);
                    "flipped"
                }
                // Cut short anywhere.
                2 => {
                    bytes.truncate(rng.random_range(0..bytes.len()));
                    "truncated"
                }
                // Extended: the length no longer matches.
                _ => {
                    bytes.push(rng.random());
                    "extended"
                }
            };
            fs::write(&path, &bytes).unwrap();
            match cache.get(&k) {
                Lookup::Discarded(_) => {}
                other => panic!("a {how} entry was not discarded (round {round}): {other:?}"),
            }
            assert!(!path.exists(), "the bad entry is deleted");
            assert_eq!(cache.get(&k), Lookup::Miss);
        }
    }

    #[test]
    fn an_entry_renamed_to_another_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cache = KernelCache::open(dir.path(), 1 << 20).unwrap();
        let (a, b) = (key("a"), key("b"));
        cache.put(&a, b"code of a");
        fs::rename(cache.entry_path(&a), cache.entry_path(&b)).unwrap();
        assert!(matches!(cache.get(&b), Lookup::Discarded(why) if why.contains("another key")));
    }

    /// A FIFO planted under an entry's name (while the directory was open
    /// to others) neither blocks the reader nor is read: it is discarded.
    #[test]
    fn a_fifo_under_an_entrys_name_is_discarded_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let cache = KernelCache::open(dir.path(), 1 << 20).unwrap();
        let k = key("fifo");
        nix::unistd::mkfifo(&cache.entry_path(&k), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let (done, got) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let lookup = cache.get(&k);
            let gone = !cache.entry_path(&k).exists();
            let _ = done.send((lookup, gone));
        });
        let (lookup, gone) = got
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the reader blocked on a FIFO");
        reader.join().unwrap();
        assert!(matches!(lookup, Lookup::Discarded(why) if why.contains("plain file")));
        assert!(gone, "the FIFO is deleted");
    }

    #[test]
    fn an_entry_of_another_format_is_refused() {
        static OTHER: EntryFormat = EntryFormat {
            magic: *b"PTXDXX01",
            name: "another cache",
        };
        let dir = tempfile::tempdir().unwrap();
        let kernels = KernelCache::open(dir.path(), 1 << 20).unwrap();
        let other = KernelCache::open_as(dir.path(), 1 << 20, &OTHER).unwrap();
        let k = key("shared key");
        kernels.put(&k, b"machine code");
        assert!(matches!(other.get(&k), Lookup::Discarded(why) if why.contains("format")));
        other.put(&k, b"something else");
        assert!(matches!(kernels.get(&k), Lookup::Discarded(why) if why.contains("format")));
    }

    #[test]
    fn the_bound_evicts_the_least_recently_used_entries() {
        let dir = tempfile::tempdir().unwrap();
        let entry = HEADER_BYTES as u64 + 1000;
        let cache = KernelCache::open(dir.path(), entry * 3).unwrap();
        let keys: Vec<CacheKey> = (0..5).map(|i| key(&format!("k{i}"))).collect();
        let codes: Vec<Vec<u8>> = (0..5).map(|_| random_bytes(1000)).collect();
        let old = SystemTime::now() - Duration::from_secs(100);
        for (i, (k, code)) in keys.iter().zip(&codes).enumerate().take(3) {
            cache.put(k, code);
            // Distinct ages, oldest first, whatever the clock's resolution.
            let file = File::options()
                .write(true)
                .open(cache.entry_path(k))
                .unwrap();
            file.set_modified(old + Duration::from_secs(i as u64))
                .unwrap();
        }
        // Using k0 makes it the most recent: k1 is now the oldest.
        assert_eq!(cache.get(&keys[0]), Lookup::Hit(codes[0].clone()));
        cache.put(&keys[3], &codes[3]);
        assert_eq!(cache.get(&keys[1]), Lookup::Miss, "the least recent went");
        for i in [0, 2, 3] {
            assert_eq!(cache.get(&keys[i]), Lookup::Hit(codes[i].clone()), "{i}");
        }
        // An entry larger than the whole bound is not written at all.
        cache.put(&keys[4], &random_bytes(entry as usize * 3));
        assert_eq!(cache.get(&keys[4]), Lookup::Miss);
        let total: u64 = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
        assert!(total <= entry * 3, "{total}");
    }

    /// `write` stores without evicting (the caller keeps the bound),
    /// `list` names exactly the complete entries by key and size (not a
    /// temporary file, not a file of another name), and `remove` says
    /// whether there was an entry.
    #[test]
    fn write_list_and_remove_keep_to_the_entries() {
        let dir = tempfile::tempdir().unwrap();
        let entry = HEADER_BYTES as u64 + 1000;
        let cache = KernelCache::open(dir.path(), entry * 2).unwrap();
        let keys: Vec<CacheKey> = (0..3).map(|i| key(&format!("w{i}"))).collect();
        for k in &keys {
            assert_eq!(cache.write(k, &random_bytes(1000)), Some(entry));
        }
        assert_eq!(cache.write(&key("huge"), &random_bytes(3000)), None);
        fs::write(dir.path().join(format!("x{TEMP_SUFFIX}")), b"half").unwrap();
        fs::write(dir.path().join(format!("not-a-key{ENTRY_SUFFIX}")), b"x").unwrap();
        // Names a lenient parser would read as a key's: upper case, and a
        // `+` sign in a digit pair.
        let upper = keys[1]
            .file_name()
            .to_ascii_uppercase()
            .replace(".KC", ENTRY_SUFFIX);
        let plus = format!("+{}", &keys[2].file_name()[1..]);
        fs::write(dir.path().join(&upper), b"alias").unwrap();
        fs::write(dir.path().join(&plus), b"alias").unwrap();
        let mut listed = cache.list().unwrap();
        listed.sort_by_key(|l| l.key.0);
        let mut expected = keys.clone();
        expected.sort_by_key(|k| k.0);
        assert_eq!(listed.iter().map(|l| l.key).collect::<Vec<_>>(), expected);
        assert!(listed.iter().all(|l| l.bytes == entry));
        // No lookup reaches a name that is no key's, so the listing
        // deletes it rather than leave it outside every bound.
        for name in [format!("not-a-key{ENTRY_SUFFIX}"), upper, plus] {
            assert!(!dir.path().join(&name).exists(), "{name} left behind");
        }
        assert!(dir.path().join(format!("x{TEMP_SUFFIX}")).exists());
        assert!(cache.remove(&keys[0]));
        assert!(!cache.remove(&keys[0]));
        assert_eq!(cache.list().unwrap().len(), 2);
    }

    /// A directory that cannot be read lists as `None`, not as empty.
    #[test]
    fn an_unreadable_directory_lists_as_none() {
        let dir = tempfile::tempdir().unwrap();
        let cache = KernelCache::open(dir.path(), 1 << 20).unwrap();
        assert!(cache.write(&key("a"), &random_bytes(10)).is_some());
        assert_eq!(cache.list().map(|l| l.len()), Some(1));
        fs::remove_dir_all(dir.path()).unwrap();
        assert!(cache.list().is_none());
    }

    /// Only the names `file_name` writes are keys' names.
    #[test]
    fn a_file_name_is_read_back_only_as_written() {
        let k = key("n");
        let name = k.file_name();
        assert_eq!(CacheKey::from_file_name(&name), Some(k));
        assert_eq!(CacheKey::from_file_name(&name.to_ascii_uppercase()), None);
        assert_eq!(CacheKey::from_file_name(&format!("+{}", &name[1..])), None);
        assert_eq!(CacheKey::from_file_name(&name[1..]), None);
        assert_eq!(CacheKey::from_file_name(&format!("é{}", &name[2..])), None);
    }

    #[test]
    fn a_dead_writers_temporary_file_is_cleared_once_old() {
        let dir = tempfile::tempdir().unwrap();
        let cache = KernelCache::open(dir.path(), 1 << 20).unwrap();
        let fresh = dir.path().join(format!("x{TEMP_SUFFIX}"));
        let stale = dir.path().join(format!("y{TEMP_SUFFIX}"));
        fs::write(&fresh, b"half").unwrap();
        fs::write(&stale, b"half").unwrap();
        File::options()
            .write(true)
            .open(&stale)
            .unwrap()
            .set_modified(SystemTime::now() - STALE_TEMP - Duration::from_secs(1))
            .unwrap();
        cache.evict();
        assert!(fresh.exists(), "a writer may still be writing it");
        assert!(!stale.exists());
    }

    /// The directory a [`writer_process`] run works on (set by
    /// [`concurrent_writer_processes_never_see_a_partial_entry`]).
    const WRITER_DIR: &str = "PTXD_KERNEL_CACHE_TEST_DIR";

    /// The shared keys and payloads of the cross-process test: the same in
    /// every process (derived from the key, as compiled code is).
    fn shared_entry(i: usize) -> (CacheKey, Vec<u8>) {
        let k = key(&format!("cross-process {i}"));
        let mut payload = Vec::new();
        while payload.len() < 30_000 + i * 4099 {
            payload.extend_from_slice(blake3::hash(&payload.len().to_le_bytes()).as_bytes());
        }
        (k, payload)
    }

    /// Writes and reads the shared entries at random; run as a child
    /// process by the test below (ignored on its own: it needs the
    /// directory it is given).
    #[test]
    #[ignore = "a child process of concurrent_writer_processes_never_see_a_partial_entry"]
    fn writer_process() {
        // Run on its own (`--include-ignored`), it has no directory and
        // nothing to do.
        if let Some(dir) = std::env::var_os(WRITER_DIR) {
            write_and_read(Path::new(&dir));
        }
    }

    fn write_and_read(dir: &Path) {
        let cache = KernelCache::open(dir, 1 << 22).unwrap();
        let entries: Vec<(CacheKey, Vec<u8>)> = (0..4).map(shared_entry).collect();
        let mut rng = rand::rng();
        for _ in 0..300 {
            let (k, payload) = &entries[rng.random_range(0..entries.len())];
            if rng.random_bool(0.5) {
                cache.put(k, payload);
            } else {
                match cache.get(k) {
                    Lookup::Hit(found) => assert!(found == *payload, "a wrong payload"),
                    Lookup::Miss => {}
                    Lookup::Discarded(why) => panic!("a partial or foreign entry: {why}"),
                }
            }
        }
    }

    /// Three processes (two children running [`writer_process`] and this
    /// one) share one directory, as daemons do: none ever reads a partial
    /// entry, and every entry is whole at the end.
    #[test]
    fn concurrent_writer_processes_never_see_a_partial_entry() {
        let dir = tempfile::tempdir().unwrap();
        let exe = std::env::current_exe().unwrap();
        let children: Vec<std::process::Child> = (0..2)
            .map(|_| {
                std::process::Command::new(&exe)
                    .args([
                        "--exact",
                        "executor::kernel_cache::tests::writer_process",
                        "--ignored",
                        "--quiet",
                    ])
                    .env(WRITER_DIR, dir.path())
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        write_and_read(dir.path());
        for child in children {
            let out = child.wait_with_output().unwrap();
            let said = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "a writer process failed: {said}");
            // The filter found the test: a writer that ran nothing proves
            // nothing.
            assert!(said.contains("1 passed"), "{said}");
        }
        let cache = KernelCache::open(dir.path(), 1 << 22).unwrap();
        for (k, payload) in (0..4).map(shared_entry) {
            match cache.get(&k) {
                Lookup::Hit(found) => assert!(found == payload),
                other => panic!("{other:?}"),
            }
        }
    }

    /// Writers in two processes' worth of threads, each with its own
    /// `KernelCache` on the same directory (as two daemons have), writing
    /// and reading the same keys at once: every read is a miss or the
    /// exact payload of its key, never a mix or a partial entry.
    #[test]
    fn concurrent_writers_and_readers_never_see_a_partial_entry() {
        let dir = tempfile::tempdir().unwrap();
        let keys: Vec<CacheKey> = (0..4).map(|i| key(&format!("shared {i}"))).collect();
        // Each key's payload is fixed (as compiled code for a key is).
        let codes: Vec<Vec<u8>> = (0..4).map(|i| random_bytes(20_000 + i * 7919)).collect();
        std::thread::scope(|scope| {
            for _ in 0..6 {
                let cache = KernelCache::open(dir.path(), 1 << 20).unwrap();
                let (keys, codes) = (&keys, &codes);
                scope.spawn(move || {
                    let mut rng = rand::rng();
                    for _ in 0..200 {
                        let i = rng.random_range(0..keys.len());
                        if rng.random_bool(0.5) {
                            cache.put(&keys[i], &codes[i]);
                        } else {
                            match cache.get(&keys[i]) {
                                Lookup::Hit(code) => assert!(code == codes[i], "key {i}"),
                                Lookup::Miss => {}
                                Lookup::Discarded(why) => panic!("key {i}: {why}"),
                            }
                        }
                    }
                });
            }
        });
        let cache = KernelCache::open(dir.path(), 1 << 20).unwrap();
        for (k, code) in keys.iter().zip(&codes) {
            assert_eq!(cache.get(k), Lookup::Hit(code.clone()));
        }
        let leftovers: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(TEMP_SUFFIX))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }
}
