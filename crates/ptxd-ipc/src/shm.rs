//! Shared-memory buffers for ptxd's host (CPU) backend: named POSIX
//! objects ([`HostShm`]) and sealed memfds passed by descriptor
//! ([`HostMemfd`]).
//!
//! A [`HostShm`] is a shared-memory object this process creates (`shm_open`
//! with `O_CREAT | O_EXCL`, so it never adopts someone else's object), sizes
//! and maps `MAP_SHARED`; registered with a session, ptxd maps the same
//! object, so a launch's results land here without copies.
//!
//! Invariants:
//! - The mapping is exactly `len` bytes, `len > 0`, alive from `create` to
//!   `Drop`; `Drop` unmaps it and unlinks the name (of a [`HostShm`]), once.
//! - A [`HostMemfd`] is sealed before it is mapped or handed out, so no
//!   holder of its descriptor can shrink it.
//! - Byte views borrow `self` (shared for reads, exclusive for writes). The
//!   daemon writes the object too: read it only while no launch on it is in
//!   flight (a sync launch has completed when its reply arrives).
//! - Semaphore words (a launch ring's waits and signals) are read and
//!   written only with atomic operations ([`SharedBytes::load_word`],
//!   [`SharedBytes::store_word`]) on naturally aligned words, since ptxd's
//!   executor writes them while this process reads them.

use std::ffi::CString;
use std::num::NonZeroUsize;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, OFlag, SealFlag};
use nix::sys::memfd::{memfd_create, MFdFlags};
use nix::sys::mman::{mmap, munmap, shm_open, shm_unlink, MapFlags, ProtFlags};
use nix::sys::stat::Mode;
use nix::unistd::ftruncate;

use crate::ring::SemaphoreWidth;

/// Why a shared-memory buffer could not be made or accessed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShmError {
    /// The name is not a portable POSIX shm name (`/` then 1..=254 bytes
    /// without `/` or NUL).
    #[error("invalid shared-memory name {0:?}: it must be '/' followed by 1 to 254 bytes without '/' or NUL")]
    InvalidName(String),
    /// A zero-byte (or unaddressable) size.
    #[error("invalid shared-memory size {0}: it must be between 1 and isize::MAX bytes")]
    InvalidSize(u64),
    /// An OS call failed.
    #[error("shared memory {name:?}: {call} failed: {errno}")]
    Os {
        /// The shared-memory object's name.
        name: String,
        /// The failed call, e.g. `shm_open` or `mmap`.
        call: &'static str,
        /// What the OS answered.
        errno: Errno,
    },
    /// A semaphore word's offset is not a multiple of its width.
    #[error("a {width}-byte word at offset {offset} is not aligned to its width")]
    Misaligned {
        /// The word's byte offset.
        offset: usize,
        /// The word's width in bytes (4 or 8).
        width: usize,
    },
    /// A typed access falls outside the buffer.
    #[error("access of {len} bytes at offset {offset} is outside the {size}-byte buffer")]
    OutOfBounds {
        /// Where the access starts, in bytes from the buffer's start.
        offset: usize,
        /// The access's length in bytes.
        len: usize,
        /// The buffer's size in bytes.
        size: usize,
    },
}

/// Checks that `name` is a portable POSIX shared-memory name.
pub fn validate_shm_name(name: &str) -> Result<(), ShmError> {
    let rest = name.strip_prefix('/').unwrap_or("");
    if rest.is_empty() || rest.len() > 254 || rest.contains('/') || rest.contains('\0') {
        return Err(ShmError::InvalidName(name.to_owned()));
    }
    Ok(())
}

/// A shared, writable mapping of a whole shared-memory object or memfd:
/// the byte views and typed accessors of [`HostShm`] and [`HostMemfd`]
/// (both dereference to it). Unmapped on drop.
pub struct SharedBytes {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory owned by this value; nothing in
// it is tied to the creating thread, and all access goes through `&self` /
// `&mut self` borrows.
unsafe impl Send for SharedBytes {}
// SAFETY: `&SharedBytes` only hands out shared byte views; writes need `&mut`.
unsafe impl Sync for SharedBytes {}

impl std::fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedBytes")
            .field("len", &self.len)
            .finish()
    }
}

/// `size` as a mapping length: 1..=isize::MAX bytes.
fn mapping_len(size: u64) -> Result<NonZeroUsize, ShmError> {
    usize::try_from(size)
        .ok()
        .filter(|len| isize::try_from(*len).is_ok())
        .and_then(NonZeroUsize::new)
        .ok_or(ShmError::InvalidSize(size))
}

impl SharedBytes {
    /// Maps the first `len` bytes of `fd`, shared and writable.
    fn map(fd: BorrowedFd<'_>, len: NonZeroUsize) -> nix::Result<Self> {
        // SAFETY: a fresh MAP_SHARED mapping of an object the caller just
        // created and sized to at least `len`; no Rust object aliases the new
        // pages. The mapping outlives `fd`, which may close.
        let base = unsafe {
            mmap(
                None,
                len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                fd,
                0,
            )
        }?;
        Ok(SharedBytes {
            base: base.cast(),
            len: len.get(),
        })
    }

    /// The size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a mapping holds at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The size in bytes, as a registration takes it.
    pub fn size(&self) -> u64 {
        self.len as u64
    }

    /// The bytes of the object.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `base` points to a live mapping of exactly `len` readable
        // bytes (module invariant); the borrow of `self` keeps it mapped.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr(), self.len) }
    }

    /// The bytes of the object, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes this the only view
        // handed out by this process.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr(), self.len) }
    }

    fn range(&self, offset: usize, len: usize) -> Result<std::ops::Range<usize>, ShmError> {
        offset
            .checked_add(len)
            .filter(|end| *end <= self.len)
            .map(|end| offset..end)
            .ok_or(ShmError::OutOfBounds {
                offset,
                len,
                size: self.len,
            })
    }

    /// Writes `values` (native endianness) starting at byte `offset`.
    pub fn write_f32(&mut self, offset: usize, values: &[f32]) -> Result<(), ShmError> {
        self.write_elements(offset, values, |v| v.to_ne_bytes())
    }

    /// Reads `count` f32 values starting at byte `offset`.
    pub fn read_f32(&self, offset: usize, count: usize) -> Result<Vec<f32>, ShmError> {
        self.read_elements(offset, count, f32::from_ne_bytes)
    }

    /// Writes `values` (raw 16-bit elements, e.g. f16 bits) at byte `offset`.
    pub fn write_u16(&mut self, offset: usize, values: &[u16]) -> Result<(), ShmError> {
        self.write_elements(offset, values, |v| v.to_ne_bytes())
    }

    /// Reads `count` 16-bit elements starting at byte `offset`.
    pub fn read_u16(&self, offset: usize, count: usize) -> Result<Vec<u16>, ShmError> {
        self.read_elements(offset, count, u16::from_ne_bytes)
    }

    /// The aligned word of `width` at byte `offset`, as an address inside
    /// the mapping.
    fn word(&self, offset: usize, width: SemaphoreWidth) -> Result<*mut u8, ShmError> {
        let bytes = width.bytes() as usize;
        let range = self.range(offset, bytes)?;
        if !offset.is_multiple_of(bytes) {
            return Err(ShmError::Misaligned {
                offset,
                width: bytes,
            });
        }
        // SAFETY: `range` lies inside the mapping (checked above).
        Ok(unsafe { self.base.as_ptr().add(range.start) })
    }

    /// Atomically loads the semaphore word of `width` at byte `offset` (a
    /// launch ring's wait or signal word; native endianness, Acquire).
    pub fn load_word(&self, offset: usize, width: SemaphoreWidth) -> Result<u64, ShmError> {
        let word = self.word(offset, width)?;
        Ok(match width {
            SemaphoreWidth::Bits32 => {
                // SAFETY: an aligned word inside the live mapping (checked
                // by `word`), which `&self` keeps mapped; other processes
                // write it, so it is only ever accessed atomically.
                let atomic = unsafe { AtomicU32::from_ptr(word.cast()) };
                u64::from(atomic.load(Ordering::Acquire))
            }
            SemaphoreWidth::Bits64 => {
                // SAFETY: as above.
                let atomic = unsafe { AtomicU64::from_ptr(word.cast()) };
                atomic.load(Ordering::Acquire)
            }
        })
    }

    /// Atomically stores `value` to the semaphore word of `width` at byte
    /// `offset` (Release), as ptxd's executor writes a ring launch's
    /// signal. A 32-bit word takes the low 32 bits of `value`.
    pub fn store_word(
        &self,
        offset: usize,
        width: SemaphoreWidth,
        value: u64,
    ) -> Result<(), ShmError> {
        let word = self.word(offset, width)?;
        match width {
            SemaphoreWidth::Bits32 => {
                // SAFETY: as in `load_word`.
                let atomic = unsafe { AtomicU32::from_ptr(word.cast()) };
                // The documented truncation.
                atomic.store(value as u32, Ordering::Release)
            }
            SemaphoreWidth::Bits64 => {
                // SAFETY: as in `load_word`.
                let atomic = unsafe { AtomicU64::from_ptr(word.cast()) };
                atomic.store(value, Ordering::Release)
            }
        }
        Ok(())
    }

    fn write_elements<T: Copy, const N: usize>(
        &mut self,
        offset: usize,
        values: &[T],
        to_bytes: impl Fn(T) -> [u8; N],
    ) -> Result<(), ShmError> {
        let len = values.len().saturating_mul(N);
        let range = self.range(offset, len)?;
        let bytes = &mut self.as_mut_slice()[range];
        for (chunk, value) in bytes.chunks_exact_mut(N).zip(values) {
            chunk.copy_from_slice(&to_bytes(*value));
        }
        Ok(())
    }

    fn read_elements<T, const N: usize>(
        &self,
        offset: usize,
        count: usize,
        from_bytes: impl Fn([u8; N]) -> T,
    ) -> Result<Vec<T>, ShmError> {
        let range = self.range(offset, count.saturating_mul(N))?;
        Ok(self.as_slice()[range]
            .chunks_exact(N)
            .map(|chunk| {
                let mut element = [0u8; N];
                element.copy_from_slice(chunk);
                from_bytes(element)
            })
            .collect())
    }
}

impl Drop for SharedBytes {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly what mmap returned, and the
        // mapping is unmapped only here, once; no borrow of it outlives self.
        if let Err(errno) = unsafe { munmap(self.base.cast(), self.len) } {
            tracing::warn!(%errno, "munmap failed");
        }
    }
}

/// A POSIX shared-memory object created and mapped by this process, unlinked
/// and unmapped on drop. Its bytes are a [`SharedBytes`].
pub struct HostShm {
    name: String,
    bytes: SharedBytes,
}

impl std::fmt::Debug for HostShm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostShm")
            .field("name", &self.name)
            .field("len", &self.bytes.len)
            .finish()
    }
}

impl HostShm {
    /// Creates a zero-filled shared-memory object of `size` bytes with a
    /// fresh, unique name.
    pub fn create(size: u64) -> Result<Self, ShmError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let mut attempts = 0;
        loop {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let name = format!(
                "/ptxd-client-{}-{}-{nanos:08x}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            );
            match Self::create_named(&name, size) {
                // A stale object of a dead process with our pid; pick another name.
                Err(ShmError::Os {
                    errno: Errno::EEXIST,
                    ..
                }) if attempts < 8 => attempts += 1,
                other => return other,
            }
        }
    }

    /// Creates a zero-filled shared-memory object named `name` of `size`
    /// bytes. Fails with `EEXIST` if the name is taken.
    pub fn create_named(name: &str, size: u64) -> Result<Self, ShmError> {
        validate_shm_name(name)?;
        let len = mapping_len(size)?;
        let os = |call: &'static str| {
            move |errno: Errno| ShmError::Os {
                name: name.to_owned(),
                call,
                errno,
            }
        };
        let cname = CString::new(name).map_err(|_| ShmError::InvalidName(name.to_owned()))?;
        let fd = shm_open(
            cname.as_c_str(),
            OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_EXCL,
            Mode::S_IRUSR | Mode::S_IWUSR,
        )
        .map_err(os("shm_open"))?;
        // From here on the name exists: unlink it on every failure path.
        let unlink_on_error = |error: ShmError| {
            let _ = shm_unlink(cname.as_c_str());
            error
        };
        let size_off = i64::try_from(size)
            .map_err(|_| ShmError::InvalidSize(size))
            .map_err(unlink_on_error)?;
        ftruncate(&fd, size_off)
            .map_err(os("ftruncate"))
            .map_err(unlink_on_error)?;
        let bytes = SharedBytes::map(fd.as_fd(), len)
            .map_err(os("mmap"))
            .map_err(unlink_on_error)?;
        Ok(HostShm {
            name: name.to_owned(),
            bytes,
        })
    }

    /// The object's name, as `shm_open` (and ptxd) takes it.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl std::ops::Deref for HostShm {
    type Target = SharedBytes;
    fn deref(&self) -> &SharedBytes {
        &self.bytes
    }
}

impl std::ops::DerefMut for HostShm {
    fn deref_mut(&mut self) -> &mut SharedBytes {
        &mut self.bytes
    }
}

impl Drop for HostShm {
    fn drop(&mut self) {
        // The mapping (a field) is unmapped after this, when `bytes` drops.
        if let Ok(cname) = CString::new(self.name.as_str()) {
            if let Err(errno) = shm_unlink(cname.as_c_str()) {
                tracing::warn!(name = %self.name, %errno, "shm_unlink failed");
            }
        }
    }
}

/// An anonymous shared file (`memfd_create`) sealed against shrinking, and
/// mapped by this process: the host backend's buffer passed by file
/// descriptor (the SDK's `Session::register_memfd`).
/// It has no name, so it needs no shared `/dev/shm` or IPC namespace with
/// the daemon; ptxd refuses a memfd without `F_SEAL_SHRINK`, because the
/// owner of an unsealed one could shrink it under a launch.
pub struct HostMemfd {
    fd: OwnedFd,
    bytes: SharedBytes,
}

impl std::fmt::Debug for HostMemfd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostMemfd")
            .field("fd", &self.fd)
            .field("len", &self.bytes.len)
            .finish()
    }
}

/// The seals a [`HostMemfd`] carries: no shrinking, no growing, no more
/// seal changes.
const MEMFD_SEALS: SealFlag = SealFlag::F_SEAL_SHRINK
    .union(SealFlag::F_SEAL_GROW)
    .union(SealFlag::F_SEAL_SEAL);

impl HostMemfd {
    /// Creates a zero-filled memfd of `size` bytes, sealed against
    /// shrinking and growing, and maps it.
    pub fn create(size: u64) -> Result<Self, ShmError> {
        Self::create_with_seals(size, MEMFD_SEALS)
    }

    /// Like [`HostMemfd::create`] but without any seal: ptxd refuses it
    /// (`FD_NOT_SEALED`). For tests of that refusal.
    pub fn create_unsealed(size: u64) -> Result<Self, ShmError> {
        Self::create_with_seals(size, SealFlag::empty())
    }

    fn create_with_seals(size: u64, seals: SealFlag) -> Result<Self, ShmError> {
        let len = mapping_len(size)?;
        let os = |call: &'static str| {
            move |errno: Errno| ShmError::Os {
                name: "memfd:ptxd-buffer".to_owned(),
                call,
                errno,
            }
        };
        let fd = memfd_create(
            c"ptxd-buffer",
            MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
        )
        .map_err(os("memfd_create"))?;
        let size_off = i64::try_from(size).map_err(|_| ShmError::InvalidSize(size))?;
        ftruncate(&fd, size_off).map_err(os("ftruncate"))?;
        if !seals.is_empty() {
            fcntl(&fd, FcntlArg::F_ADD_SEALS(seals)).map_err(os("fcntl"))?;
        }
        let bytes = SharedBytes::map(fd.as_fd(), len).map_err(os("mmap"))?;
        Ok(HostMemfd { fd, bytes })
    }
}

impl AsFd for HostMemfd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl std::ops::Deref for HostMemfd {
    type Target = SharedBytes;
    fn deref(&self) -> &SharedBytes {
        &self.bytes
    }
}

impl std::ops::DerefMut for HostMemfd {
    fn deref_mut(&mut self) -> &mut SharedBytes {
        &mut self.bytes
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::os::fd::AsFd;

    use nix::sys::stat::fstat;

    use super::*;

    fn random_f32s(count: usize, seed: u64) -> Vec<f32> {
        // xorshift: distinct, non-trivial values without a rand dependency.
        let mut state = seed | 1;
        (0..count)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state % 1_000_000) as f32 / 997.0 - 500.0
            })
            .collect()
    }

    fn open_existing(name: &str) -> nix::Result<std::os::fd::OwnedFd> {
        let cname = CString::new(name).unwrap();
        shm_open(cname.as_c_str(), OFlag::O_RDWR, Mode::empty())
    }

    #[test]
    fn round_trip_is_visible_through_a_second_mapping_and_unlinked_on_drop() {
        let count = 1000;
        let values = random_f32s(count, 0x5eed);
        let mut shm = HostShm::create((count * 4) as u64).unwrap();
        assert_eq!(shm.len(), count * 4);
        assert!(
            shm.as_slice().iter().all(|b| *b == 0),
            "a new object is zero-filled"
        );
        shm.write_f32(0, &values).unwrap();
        assert_eq!(shm.read_f32(0, count).unwrap(), values);

        // Another mapping of the same name (as ptxd makes) sees the bytes and
        // its writes land here.
        let name = shm.name().to_owned();
        let fd = open_existing(&name).unwrap();
        assert_eq!(fstat(fd.as_fd()).unwrap().st_size, (count * 4) as i64);
        let len = NonZeroUsize::new(count * 4).unwrap();
        // SAFETY: a fresh shared mapping of the object, unmapped below.
        let other = unsafe {
            mmap(
                None,
                len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                &fd,
                0,
            )
        }
        .unwrap();
        // SAFETY: the mapping is `len` bytes and alive until munmap below.
        let other_bytes =
            unsafe { std::slice::from_raw_parts_mut(other.as_ptr().cast::<u8>(), len.get()) };
        assert_eq!(&other_bytes[..], shm.as_slice());
        let doubled: Vec<f32> = values.iter().map(|v| v * 2.0).collect();
        for (chunk, v) in other_bytes.chunks_exact_mut(4).zip(&doubled) {
            chunk.copy_from_slice(&v.to_ne_bytes());
        }
        assert_eq!(shm.read_f32(0, count).unwrap(), doubled);
        // SAFETY: exactly the mapping made above, no view of it survives.
        unsafe { munmap(other, len.get()) }.unwrap();

        drop(shm);
        assert_eq!(open_existing(&name).unwrap_err(), Errno::ENOENT);
    }

    #[test]
    fn u16_elements_at_an_offset() {
        let mut shm = HostShm::create(64).unwrap();
        let values: Vec<u16> = (0..8).map(|i| 0x3c00 + i * 37).collect();
        shm.write_u16(16, &values).unwrap();
        assert_eq!(shm.read_u16(16, 8).unwrap(), values);
        assert!(shm.as_slice()[..16].iter().all(|b| *b == 0));
        assert!(shm.as_slice()[32..].iter().all(|b| *b == 0));
    }

    #[test]
    fn semaphore_words_are_aligned_and_inside_the_buffer() {
        let shm = HostShm::create(16).unwrap();
        shm.store_word(4, SemaphoreWidth::Bits32, 0x1_0000_0007)
            .unwrap();
        assert_eq!(shm.load_word(4, SemaphoreWidth::Bits32).unwrap(), 7);
        shm.store_word(8, SemaphoreWidth::Bits64, u64::MAX - 1)
            .unwrap();
        assert_eq!(
            shm.load_word(8, SemaphoreWidth::Bits64).unwrap(),
            u64::MAX - 1
        );
        assert_eq!(shm.read_u16(4, 2).unwrap(), [7, 0], "native endianness");
        assert!(matches!(
            shm.store_word(4, SemaphoreWidth::Bits64, 1),
            Err(ShmError::Misaligned {
                offset: 4,
                width: 8
            })
        ));
        assert!(matches!(
            shm.load_word(2, SemaphoreWidth::Bits32),
            Err(ShmError::Misaligned { .. })
        ));
        assert!(matches!(
            shm.load_word(16, SemaphoreWidth::Bits32),
            Err(ShmError::OutOfBounds { .. })
        ));
    }

    #[test]
    fn accesses_outside_the_buffer_are_refused() {
        let mut shm = HostShm::create(16).unwrap();
        assert!(matches!(
            shm.write_f32(8, &[1.0, 2.0, 3.0]),
            Err(ShmError::OutOfBounds {
                offset: 8,
                len: 12,
                size: 16
            })
        ));
        assert!(matches!(
            shm.read_f32(0, 5),
            Err(ShmError::OutOfBounds { .. })
        ));
        assert!(matches!(
            shm.read_f32(usize::MAX, 1),
            Err(ShmError::OutOfBounds { .. })
        ));
        assert!(matches!(
            shm.read_u16(0, usize::MAX),
            Err(ShmError::OutOfBounds { .. })
        ));
        assert_eq!(shm.read_f32(12, 1).unwrap(), vec![0.0]);
    }

    #[test]
    fn names_and_sizes_are_validated() {
        for bad in [
            "",
            "/",
            "noslash",
            "/a/b",
            "/nul\0",
            &format!("/{}", "x".repeat(255)),
        ] {
            assert!(
                matches!(validate_shm_name(bad), Err(ShmError::InvalidName(_))),
                "{bad:?}"
            );
        }
        validate_shm_name("/ptxd-tensor-1").unwrap();
        assert!(matches!(HostShm::create(0), Err(ShmError::InvalidSize(0))));
        assert!(matches!(
            HostShm::create(u64::MAX),
            Err(ShmError::InvalidSize(_))
        ));
    }

    #[test]
    fn create_named_refuses_an_existing_name() {
        let first = HostShm::create(8).unwrap();
        let err = HostShm::create_named(first.name(), 8).unwrap_err();
        assert!(matches!(
            err,
            ShmError::Os {
                errno: Errno::EEXIST,
                call: "shm_open",
                ..
            }
        ));
        // The failed create must not have unlinked the first object.
        assert!(open_existing(first.name()).is_ok());
    }
}
