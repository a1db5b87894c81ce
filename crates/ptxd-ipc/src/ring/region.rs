//! The one mapping of a ring object each side holds, and every access to its
//! bytes.
//!
//! The peer is another process that may write any byte at any time, so no
//! `&`/`&mut` reference to plain shared bytes is ever made. Every access is
//! an atomic operation on an aligned word: control words through
//! `&AtomicU64`/`&AtomicU32`, slot copies as word-by-word relaxed atomic
//! loads or stores. A concurrent hostile write then yields torn or
//! unexpected values, which the caller validates, and never a data race in
//! this process's memory model.
//!
//! Invariants:
//! - `base` is page-aligned and maps at least `layout.total_len()` bytes,
//!   readable and writable, from construction to `Drop`.
//! - Offsets come only from [`ControlWord::offset`] and
//!   [`RingLayout::submission_slot`]/[`RingLayout::completion_slot`] (plus
//!   a constant below the slot's size), which are 8-aligned and end inside
//!   `layout.total_len()` for every position, so no counter value a peer
//!   writes can move an access outside the mapping.
//! - A slot's publication word (its sequence word) is accessed only as
//!   that one `AtomicU64`, by the loads and stores named for it: the body
//!   copies skip it, so no two accesses of different sizes overlap.

use std::ffi::CString;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, OFlag, SealFlag};
use nix::sys::mman::{mmap, munmap, shm_open, MapFlags, ProtFlags};
use nix::sys::stat::{fstat, Mode, SFlag};
use nix::sys::uio::pread;

use super::completion::COMPLETION_SIZE;
use super::descriptor::DESCRIPTOR_SIZE;
use super::layout::{
    with_sequence, ControlWord, LayoutError, RingLayout, COMPLETION_WORD, HEADER_LEN,
    SUBMISSION_WORD,
};
use crate::shm::{validate_shm_name, HostMemfd, HostShm, ShmError};

/// Why a ring object could not be created.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CreateError {
    /// The slot count is not a valid layout (zero, not a power of two, or
    /// above [`MAX_SLOTS`](super::MAX_SLOTS)).
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// Creating, sizing or mapping the shared-memory object failed.
    #[error(transparent)]
    Shm(#[from] ShmError),
}

/// Why the server could not open (attach to) a ring object.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// Not a portable shared-memory name.
    #[error(transparent)]
    Name(#[from] ShmError),
    /// An OS call failed.
    #[error("ring object: {call} failed: {errno}")]
    Os {
        /// The call that failed (`shm_open`, `fstat`, `pread`, `mmap`).
        call: &'static str,
        /// Its error number.
        errno: Errno,
    },
    /// Not a regular file (shm objects and memfds are): mapping a device or
    /// a pipe a client passed could do anything.
    #[error("ring object is not a regular file (mode {mode:#o})")]
    NotRegularFile {
        /// The object's `st_mode`, file type bits included.
        mode: u32,
    },
    /// Owned by another uid than the session's.
    #[error("ring object belongs to uid {owner}, not to the session's uid {expected}")]
    WrongOwner {
        /// The uid that owns the object.
        owner: u32,
        /// The session's uid, which the caller required.
        expected: u32,
    },
    /// Smaller than its header or than the layout its header declares.
    #[error("ring object holds {size} bytes, fewer than the {needed} needed")]
    TooSmall {
        /// The object's size in bytes (`st_size`).
        size: u64,
        /// The bytes required: the header's, or the declared layout's
        /// total length.
        needed: u64,
    },
    /// The header is malformed.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// The counters are inconsistent.
    #[error(transparent)]
    Ring(#[from] super::RingError),
}

/// A mapped ring object (module invariants above).
pub(crate) struct Region {
    base: NonNull<u8>,
    layout: RingLayout,
    name: Option<String>,
    shrink_sealed: bool,
    /// The client's own object, which unmaps (and unlinks) itself on drop;
    /// None for the server's mapping, which `Drop` unmaps.
    created: Option<Created>,
}

/// The object a client created for its ring: a named one, or a sealed
/// memfd passed to the daemon by descriptor.
enum Created {
    Shm(HostShm),
    Memfd(HostMemfd),
}

// SAFETY: the region is plain shared memory that every access reaches
// through atomic operations; nothing in it is tied to a thread.
unsafe impl Send for Region {}
// SAFETY: as above: concurrent `&Region` users only perform atomic
// operations on the mapping.
unsafe impl Sync for Region {}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("name", &self.name)
            .field("layout", &self.layout)
            .finish()
    }
}

impl Region {
    /// Creates a fresh ring object (zero-filled, so every counter starts at
    /// 0 and both waiters awake) and writes its header.
    pub(crate) fn create(layout: RingLayout) -> Result<Self, CreateError> {
        let shm = HostShm::create(layout.total_len() as u64)?;
        let name = shm.name().to_owned();
        Self::created(layout, Created::Shm(shm), Some(name))
    }

    /// Like [`Region::create`], in a memfd sealed against shrinking and
    /// growing, for a daemon reached only by descriptor (no shared
    /// `/dev/shm`).
    pub(crate) fn create_memfd(layout: RingLayout) -> Result<Self, CreateError> {
        let memfd = HostMemfd::create(layout.total_len() as u64)?;
        Self::created(layout, Created::Memfd(memfd), None)
    }

    fn created(
        layout: RingLayout,
        mut created: Created,
        name: Option<String>,
    ) -> Result<Self, CreateError> {
        let bytes: &mut crate::shm::SharedBytes = match &mut created {
            Created::Shm(shm) => shm,
            Created::Memfd(memfd) => memfd,
        };
        if bytes.len() < layout.total_len() {
            return Err(ShmError::InvalidSize(bytes.size()).into());
        }
        // The object has not left this process yet, so this exclusive
        // borrow aliases nothing; afterwards only this raw pointer is used.
        let base = NonNull::new(bytes.as_mut_slice().as_mut_ptr())
            .ok_or(ShmError::InvalidSize(bytes.size()))?;
        let region = Region {
            base,
            layout,
            name,
            shrink_sealed: false,
            created: Some(created),
        };
        region.store_bytes(0, &layout.header());
        Ok(region)
    }

    /// The descriptor of a ring created in a memfd, to pass to the daemon.
    pub(crate) fn memfd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        match &self.created {
            Some(Created::Memfd(memfd)) => Some(memfd.as_fd()),
            _ => None,
        }
    }

    /// Opens the client's object by name. `owner_uid`: the session's uid,
    /// which must own the object (None: anyone; uid 0 may open any).
    pub(crate) fn open(name: &str, owner_uid: Option<u32>) -> Result<Self, OpenError> {
        validate_shm_name(name)?;
        let cname = CString::new(name).map_err(|_| ShmError::InvalidName(name.to_owned()))?;
        let fd = shm_open(cname.as_c_str(), OFlag::O_RDWR, Mode::empty()).map_err(|errno| {
            OpenError::Os {
                call: "shm_open",
                errno,
            }
        })?;
        let mut region = Self::from_fd(fd, owner_uid)?;
        region.name = Some(name.to_owned());
        Ok(region)
    }

    /// Maps a ring object passed as a file descriptor (a POSIX shm object or
    /// a memfd), with the same checks as `open`.
    pub(crate) fn from_fd(fd: OwnedFd, owner_uid: Option<u32>) -> Result<Self, OpenError> {
        let os = |call: &'static str| move |errno: Errno| OpenError::Os { call, errno };
        let stat = fstat(fd.as_fd()).map_err(os("fstat"))?;
        let mode = stat.st_mode;
        if mode & SFlag::S_IFMT.bits() != SFlag::S_IFREG.bits() {
            return Err(OpenError::NotRegularFile { mode });
        }
        if let Some(expected) = owner_uid {
            if expected != 0 && stat.st_uid != expected {
                return Err(OpenError::WrongOwner {
                    owner: stat.st_uid,
                    expected,
                });
            }
        }
        let size = u64::try_from(stat.st_size).unwrap_or(0);
        // The header is read with pread, once: the layout below is the only
        // description of the object this side ever uses.
        let mut header = [0u8; HEADER_LEN];
        let read = pread(fd.as_fd(), &mut header, 0).map_err(os("pread"))?;
        if read < HEADER_LEN {
            return Err(OpenError::TooSmall {
                size,
                needed: HEADER_LEN as u64,
            });
        }
        let layout = RingLayout::from_header(&header)?;
        let needed = layout.total_len() as u64;
        if size < needed {
            return Err(OpenError::TooSmall { size, needed });
        }
        let len =
            NonZeroUsize::new(layout.total_len()).ok_or(OpenError::TooSmall { size, needed })?;
        // Sealed against shrinking (a memfd with F_SEAL_SHRINK): no access
        // can fault with SIGBUS. A POSIX shm object cannot be sealed.
        let shrink_sealed = fcntl(fd.as_fd(), FcntlArg::F_GET_SEALS)
            .map(|seals| SealFlag::from_bits_truncate(seals).contains(SealFlag::F_SEAL_SHRINK))
            .unwrap_or(false);
        // SAFETY: a fresh MAP_SHARED mapping of an fd this call owns; no Rust
        // object aliases the new pages. The mapping outlives `fd`.
        let base = unsafe {
            mmap(
                None,
                len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                &fd,
                0,
            )
        }
        .map_err(os("mmap"))?;
        Ok(Region {
            base: base.cast(),
            layout,
            name: None,
            shrink_sealed,
            created: None,
        })
    }

    /// The mapping's address and length (for a SIGBUS guard over it).
    pub(crate) fn range(&self) -> (usize, usize) {
        (self.base.as_ptr() as usize, self.layout.total_len())
    }

    pub(crate) fn layout(&self) -> RingLayout {
        self.layout
    }

    pub(crate) fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    pub(crate) fn shrink_sealed(&self) -> bool {
        self.shrink_sealed
    }

    /// A u64 control word.
    pub(crate) fn counter(&self, word: ControlWord) -> &AtomicU64 {
        // SAFETY: `word.offset()` is 128-byte aligned and below CONTROL_LEN,
        // inside the live mapping (module invariants); the page-aligned base
        // makes the address 8-aligned. The word is only ever accessed
        // atomically by this process, and the borrow of `self` keeps the
        // mapping alive for the reference's lifetime.
        unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(word.offset()).cast()) }
    }

    /// A u32 futex word.
    pub(crate) fn waiter(&self, word: ControlWord) -> &AtomicU32 {
        // SAFETY: as in `counter`: aligned, inside the mapping, atomic-only.
        unsafe { AtomicU32::from_ptr(self.base.as_ptr().add(word.offset()).cast()) }
    }

    /// Copies submission slot `position` out, word by word (the
    /// client's shadow of its own slots, and tests).
    pub(crate) fn load_submission(&self, position: u64, out: &mut [u8; DESCRIPTOR_SIZE]) {
        self.load_bytes(self.layout.submission_slot(position), out);
    }

    /// The publication word of submission slot `position` (its counts and
    /// its sequence word, [`SUBMISSION_WORD`]).
    pub(crate) fn submission_word(&self, position: u64) -> &AtomicU64 {
        self.word::<DESCRIPTOR_SIZE>(self.layout.submission_slot(position), SUBMISSION_WORD / 8)
    }

    /// Copies a published submission slot out: every word but the
    /// publication word, which the caller already loaded (with Acquire,
    /// finding the slot published) and passes as `publication`; it goes
    /// into the copy with its sequence bytes zeroed, as a descriptor holds
    /// them. Each shared byte of the slot is read once.
    pub(crate) fn load_submission_published(
        &self,
        position: u64,
        publication: u64,
        out: &mut [u8; DESCRIPTOR_SIZE],
    ) {
        let offset = self.layout.submission_slot(position);
        for index in 0..DESCRIPTOR_SIZE / 8 {
            let value = if index == SUBMISSION_WORD / 8 {
                with_sequence(publication, 0)
            } else {
                self.word::<DESCRIPTOR_SIZE>(offset, index)
                    .load(Ordering::Relaxed)
            };
            out[8 * index..8 * index + 8].copy_from_slice(&value.to_ne_bytes());
        }
    }

    /// Writes submission slot `position`, word by word, publication word
    /// included (tests: a scribbling peer).
    #[cfg(test)]
    pub(crate) fn store_submission(&self, position: u64, bytes: &[u8; DESCRIPTOR_SIZE]) {
        self.store_bytes(self.layout.submission_slot(position), bytes);
    }

    /// Writes the body of submission slot `position` (every word but the
    /// publication word, which the caller stores last, with Release), only
    /// the words that differ from `shadow` (what this side last wrote
    /// there), and brings `shadow` up to date. A word left alone keeps its
    /// cache line shared with the reader, which then reads it from its own
    /// cache: a launch that names two inputs and one scalar moves two or
    /// three lines between the cores, not the slot's 32.
    pub(crate) fn store_submission_changed(
        &self,
        position: u64,
        bytes: &[u8; DESCRIPTOR_SIZE],
        shadow: &mut [u8; DESCRIPTOR_SIZE],
    ) {
        let offset = self.layout.submission_slot(position);
        for index in 0..DESCRIPTOR_SIZE / 8 {
            let word = 8 * index..8 * index + 8;
            if index == SUBMISSION_WORD / 8 || bytes[word.clone()] == shadow[word.clone()] {
                continue;
            }
            let mut value = [0u8; 8];
            value.copy_from_slice(&bytes[word.clone()]);
            self.word::<DESCRIPTOR_SIZE>(offset, index)
                .store(u64::from_ne_bytes(value), Ordering::Relaxed);
            shadow[word].copy_from_slice(&value);
        }
    }

    /// The sequence word of completion slot `position` ([`COMPLETION_WORD`]).
    pub(crate) fn completion_word(&self, position: u64) -> &AtomicU64 {
        self.word::<COMPLETION_SIZE>(self.layout.completion_slot(position), COMPLETION_WORD / 8)
    }

    /// Copies a published completion slot out: every word but the
    /// sequence word (which the caller loaded, with Acquire, to find the
    /// slot published), zero in the copy as in a record.
    pub(crate) fn load_completion_published(&self, position: u64, out: &mut [u8; COMPLETION_SIZE]) {
        let offset = self.layout.completion_slot(position);
        for index in 0..COMPLETION_SIZE / 8 {
            let value = if index == COMPLETION_WORD / 8 {
                0
            } else {
                self.word::<COMPLETION_SIZE>(offset, index)
                    .load(Ordering::Relaxed)
            };
            out[8 * index..8 * index + 8].copy_from_slice(&value.to_ne_bytes());
        }
    }

    /// Writes the body of completion slot `position` (every word but the
    /// sequence word, which [`completion_word`](Self::completion_word)
    /// stores last, with Release), word by word.
    pub(crate) fn store_completion(&self, position: u64, bytes: &[u8; COMPLETION_SIZE]) {
        let offset = self.layout.completion_slot(position);
        for index in (0..COMPLETION_SIZE / 8).filter(|index| *index != COMPLETION_WORD / 8) {
            let mut value = [0u8; 8];
            value.copy_from_slice(&bytes[8 * index..8 * index + 8]);
            self.word::<COMPLETION_SIZE>(offset, index)
                .store(u64::from_ne_bytes(value), Ordering::Relaxed);
        }
    }

    /// The word at byte `offset + 8 * index` of a slot or the header at
    /// `offset`: `offset` is an 8-aligned offset from the layout and
    /// `8 * index + 8 <= N`, the slot's (or header's) size.
    fn word<const N: usize>(&self, offset: usize, index: usize) -> &AtomicU64 {
        debug_assert!(offset.is_multiple_of(8) && 8 * index + 8 <= N);
        debug_assert!(offset + N <= self.layout.total_len());
        // SAFETY: `offset + 8 * index + 8 <= offset + N`, inside the live
        // mapping (module invariants: slot and header offsets end inside
        // `total_len`, and callers keep `index < N / 8`); 8-aligned because
        // `offset` is and the base is page-aligned; accessed only atomically
        // by this process.
        unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(offset + 8 * index).cast()) }
    }

    /// Writes `value` at an 8-aligned `offset` anywhere in the object, as a
    /// hostile peer would; out-of-range offsets are ignored.
    #[cfg(test)]
    pub(crate) fn scribble(&self, offset: usize, value: u64) {
        if offset.is_multiple_of(8) && offset + 8 <= self.layout.total_len() {
            // SAFETY: checked just above: aligned and inside the mapping;
            // atomic-only access.
            unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(offset).cast()) }
                .store(value, Ordering::Relaxed);
        }
    }

    fn load_bytes<const N: usize>(&self, offset: usize, out: &mut [u8; N]) {
        for index in 0..N / 8 {
            let value = self.word::<N>(offset, index).load(Ordering::Relaxed);
            // Native byte order: the copy reproduces the bytes in memory.
            out[8 * index..8 * index + 8].copy_from_slice(&value.to_ne_bytes());
        }
    }

    fn store_bytes<const N: usize>(&self, offset: usize, bytes: &[u8; N]) {
        for index in 0..N / 8 {
            let mut value = [0u8; 8];
            value.copy_from_slice(&bytes[8 * index..8 * index + 8]);
            self.word::<N>(offset, index)
                .store(u64::from_ne_bytes(value), Ordering::Relaxed);
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.created.is_some() {
            // HostShm's and HostMemfd's own Drop unmap (and unlink).
            return;
        }
        // SAFETY: `base`/`total_len` are exactly what mmap returned; unmapped
        // only here, once; no reference into the mapping outlives `self`
        // (they all borrow it).
        if let Err(errno) = unsafe { munmap(self.base.cast(), self.layout.total_len()) } {
            tracing::warn!(%errno, "munmap of a ring failed");
        }
    }
}
