//! Client memory on the host backend: the one way any executor thread reads
//! or writes a registered buffer.
//!
//! A client owns the object behind its buffer and may shrink it at any time;
//! an access past the object's new end raises SIGBUS, which by default
//! kills the executor and every other session with it. So the mapping's
//! address never leaves this module: the only accesses are
//!
//! - [`run_watched`]: a launch's operands, handed to the engine as spans;
//! - [`WatchedWord`]: one aligned word (a ring semaphore), loaded or stored.
//!
//! Invariants:
//! - Each access first checks that the object still holds the registered
//!   size (the size the front checks launches against) and that the access
//!   lies inside it, and runs under the SIGBUS watch ([`super::sigbus`]):
//!   a shrink before the access is refused, one during it costs that
//!   access (a typed fault), never the process.
//! - A mapping whose pages the handler replaced is mapped again from the
//!   object once its access is over ([`Mapping::restore`]); one that cannot
//!   be is poisoned and refused from then on.

use std::num::NonZeroUsize;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};
use nix::sys::stat::fstat;
use ptxd_ipc::ring::SemaphoreWidth;
use ptxd_proto::executor::FailureKind;

use super::OpenFailure;
use crate::executor::sigbus;
use crate::ptx::host::exec::LaunchControl;
use crate::ptx::HostSpan;

/// One shared-memory mapping of a client's object, and the object's
/// descriptor (to re-check its size before every access and to map it
/// again after a SIGBUS).
pub struct Mapping {
    base: NonNull<u8>,
    len: usize,
    fd: OwnedFd,
    /// Where the mapping starts in the object (page-aligned).
    file_offset: u64,
    /// Some pages are private zero pages that could not be replaced by the
    /// object again: every access to it is refused.
    poisoned: AtomicBool,
}

impl std::fmt::Debug for Mapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mapping")
            .field("len", &self.len)
            .field("file_offset", &self.file_offset)
            .finish_non_exhaustive()
    }
}

// SAFETY: the mapping is plain shared memory reached only through this
// module's watched accessors; the struct holds no thread-bound state.
unsafe impl Send for Mapping {}
// SAFETY: as above; `poisoned` is atomic and the rest is read-only.
unsafe impl Sync for Mapping {}

/// Why an access to client memory did not happen, or did not complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct MemoryFault {
    pub kind: FailureKind,
    pub message: String,
    /// `shm_shrank` (refused before the access), `shm_shrank_during_launch`
    /// (stopped by the SIGBUS handler), `out_of_bounds`, `unwatchable`.
    pub why: &'static str,
}

impl MemoryFault {
    fn new(kind: FailureKind, why: &'static str, message: String) -> Self {
        MemoryFault { kind, message, why }
    }
}

impl Mapping {
    /// Maps `size` bytes of `fd` from `offset`, after checking that the
    /// file holds them (its size, never the client's word).
    pub(super) fn map(
        fd: OwnedFd,
        offset: u64,
        size: u64,
        what: &str,
    ) -> Result<Self, OpenFailure> {
        let invalid = |call: &str, err: nix::Error| {
            (
                FailureKind::InvalidHandle,
                format!("{what}: {call}: {err}"),
                vec![("os_error", format!("{err:?}"))],
            )
        };
        let stat = fstat(fd.as_fd()).map_err(|e| invalid("fstat", e))?;
        let actual = u64::try_from(stat.st_size).unwrap_or(0);
        let end = offset.saturating_add(size);
        if actual < end {
            return Err((
                FailureKind::InvalidHandle,
                format!("{what} holds {actual} bytes, fewer than the {end} registered (offset {offset} + size {size})"),
                vec![("os_error", "ERANGE".into())],
            ));
        }
        let len = usize::try_from(size)
            .ok()
            .and_then(NonZeroUsize::new)
            .ok_or_else(|| {
                (
                    FailureKind::InvalidHandle,
                    format!("cannot map {size} bytes"),
                    vec![("os_error", "EINVAL".into())],
                )
            })?;
        let file_offset = i64::try_from(offset).map_err(|_| {
            (
                FailureKind::InvalidHandle,
                format!("offset {offset} is too large"),
                vec![("os_error", "EINVAL".into())],
            )
        })?;
        // SAFETY: a fresh shared mapping of an fd we own; no existing Rust
        // object aliases it.
        let base = unsafe {
            mmap(
                None,
                len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                &fd,
                file_offset,
            )
        }
        .map_err(|e| invalid("mmap", e))?;
        Ok(Mapping {
            base: base.cast(),
            len: len.get(),
            fd,
            file_offset: offset,
            poisoned: AtomicBool::new(false),
        })
    }

    /// The registered size, in bytes.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Fails when the object is now shorter than the mapping (or the
    /// mapping could not be restored after a shrink).
    fn usable(&self) -> Result<(), String> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(
                "the shared-memory object shrank during an earlier launch and its mapping could not be restored; register it again".into(),
            );
        }
        let size = fstat(self.fd.as_fd()).map(|st| st.st_size).unwrap_or(0);
        if u64::try_from(size).unwrap_or(0) < self.file_offset.saturating_add(self.len as u64) {
            return Err(format!(
                "the shared-memory object shrank to {size} bytes after it was registered with {}",
                self.len
            ));
        }
        Ok(())
    }

    fn range(&self) -> (usize, usize) {
        (self.base.as_ptr() as usize, self.len)
    }

    /// Maps the object again over the whole range, replacing the zero
    /// pages the SIGBUS handler put in. Any other thread still touching the
    /// range does so under a watch of its own, so a page the object no
    /// longer holds costs that access a fault, never the process.
    fn restore(&self) {
        let restored = NonZeroUsize::new(self.len).map(|len| {
            // SAFETY: replaces exactly this mapping's own range (base and
            // len as mmap returned them) with the same object, shared, as it
            // was mapped at registration; every access to the range is
            // watched (module invariants).
            unsafe {
                mmap(
                    NonZeroUsize::new(self.base.as_ptr() as usize),
                    len,
                    ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                    MapFlags::MAP_SHARED | MapFlags::MAP_FIXED,
                    &self.fd,
                    i64::try_from(self.file_offset).unwrap_or(i64::MAX),
                )
            }
        });
        if !matches!(restored, Some(Ok(_))) {
            tracing::warn!(
                "cannot map a shrunk shared-memory object again; its buffer is refused from now on"
            );
            self.poisoned.store(true, Ordering::Release);
        }
    }

    /// One aligned word of this buffer at `offset`, checked and watched
    /// for as long as the returned value lives.
    pub(super) fn word(
        self: &Arc<Self>,
        offset: u64,
        width: SemaphoreWidth,
    ) -> Result<WatchedWord, MemoryFault> {
        let bytes = width.bytes();
        let inside = usize::try_from(offset)
            .ok()
            .filter(|o| o.is_multiple_of(bytes as usize))
            .filter(|o| {
                o.checked_add(bytes as usize)
                    .is_some_and(|end| end <= self.len)
            });
        let Some(offset) = inside else {
            return Err(MemoryFault::new(
                FailureKind::OutOfBounds,
                "out_of_bounds",
                format!(
                    "a {bytes}-byte semaphore word at offset {offset} does not fit, aligned, in its {}-byte buffer",
                    self.len
                ),
            ));
        };
        self.usable().map_err(|message| {
            MemoryFault::new(
                FailureKind::OutOfBounds,
                "shm_shrank",
                format!("semaphore: {message}"),
            )
        })?;
        let control = Box::new(LaunchControl::new(None));
        let watch = sigbus::watch(&[self.range()], &control)
            .map_err(|e| MemoryFault::new(FailureKind::Internal, "unwatchable", e.to_string()))?;
        Ok(WatchedWord {
            mapping: self.clone(),
            offset,
            width,
            watch: Some(watch),
            _control: control,
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly what mmap returned for this
        // mapping, and it is unmapped only here, once (the last Arc).
        if let Err(e) = unsafe { munmap(self.base.cast(), self.len) } {
            tracing::warn!(error = %e, "munmap failed");
        }
    }
}

/// A semaphore word in a client's buffer, watched while this value lives:
/// the only way a ring reads or writes one.
pub(super) struct WatchedWord {
    mapping: Arc<Mapping>,
    offset: usize,
    width: SemaphoreWidth,
    /// Declared before the control it points to, and taken in `drop`.
    watch: Option<sigbus::Watch>,
    _control: Box<LaunchControl>,
}

impl WatchedWord {
    fn address(&self) -> *mut u8 {
        // SAFETY: `offset + width <= len` (checked when made), so the
        // result lies inside the mapping, which the Arc keeps mapped.
        unsafe { self.mapping.base.as_ptr().add(self.offset) }
    }

    fn faulted(&self) -> Result<(), MemoryFault> {
        if self
            .watch
            .as_ref()
            .is_some_and(|w| w.faulted().contains(&true))
        {
            return Err(MemoryFault::new(
                FailureKind::OutOfBounds,
                "shm_shrank_during_launch",
                "semaphore: the shared-memory object shrank under the semaphore word".into(),
            ));
        }
        Ok(())
    }

    /// The word's value (Acquire). Err once the object shrank under it.
    pub(super) fn load(&self) -> Result<u64, MemoryFault> {
        self.faulted()?;
        let word = self.address();
        let value = match self.width {
            // SAFETY: an aligned word inside a live shared mapping (see
            // `address`); other processes write it, hence atomics; a page
            // that vanishes is replaced by the watched SIGBUS handler.
            SemaphoreWidth::Bits32 => unsafe {
                u64::from((*word.cast::<AtomicU32>()).load(Ordering::Acquire))
            },
            // SAFETY: as above.
            SemaphoreWidth::Bits64 => unsafe {
                (*word.cast::<AtomicU64>()).load(Ordering::Acquire)
            },
        };
        self.faulted()?;
        Ok(value)
    }

    /// Writes `value` (Release; a 32-bit word takes the low half, the
    /// descriptor's decoder checked it fits).
    pub(super) fn store(&self, value: u64) -> Result<(), MemoryFault> {
        self.faulted()?;
        let word = self.address();
        match self.width {
            // SAFETY: as in `load`.
            SemaphoreWidth::Bits32 => unsafe {
                (*word.cast::<AtomicU32>()).store(value as u32, Ordering::Release)
            },
            // SAFETY: as in `load`.
            SemaphoreWidth::Bits64 => unsafe {
                (*word.cast::<AtomicU64>()).store(value, Ordering::Release)
            },
        }
        self.faulted()
    }
}

impl Drop for WatchedWord {
    fn drop(&mut self) {
        let faulted = self
            .watch
            .as_ref()
            .is_some_and(|w| w.faulted().contains(&true));
        // Unwatched before the control it points to is freed (fields drop
        // after this body), and before the mapping is restored.
        drop(self.watch.take());
        if faulted {
            self.mapping.restore();
        }
    }
}

/// An operand of a launch: (name, mapping, byte offset inside it).
pub(super) type Operand = (String, Arc<Mapping>, usize);

/// Runs `launch` over `operands`' spans (inputs, then the output), after
/// checking each object still holds its registered size, under the SIGBUS
/// watch of every range; faulted mappings are restored afterwards.
pub(super) fn run_watched<R>(
    operands: &[Operand],
    control: &LaunchControl,
    launch: impl FnOnce(&[HostSpan]) -> R,
) -> Result<R, (String, MemoryFault)> {
    for (name, mapping, offset) in operands {
        if *offset > mapping.len {
            return Err((
                name.clone(),
                MemoryFault::new(
                    FailureKind::OutOfBounds,
                    "out_of_bounds",
                    format!("{name}: offset {offset} is past the mapping"),
                ),
            ));
        }
        if let Err(message) = mapping.usable() {
            return Err((
                name.clone(),
                MemoryFault::new(
                    FailureKind::OutOfBounds,
                    "shm_shrank",
                    format!("{name}: {message}"),
                ),
            ));
        }
    }
    let spans: Vec<HostSpan> = operands
        .iter()
        .map(|(_, mapping, offset)| HostSpan {
            // SAFETY: offset <= len (checked above), so the result stays
            // inside (or one past) the mapping.
            ptr: unsafe { mapping.base.as_ptr().add(*offset) },
            len: mapping.len - offset,
        })
        .collect();
    let ranges: Vec<(usize, usize)> = operands.iter().map(|(_, m, _)| m.range()).collect();
    let watch = sigbus::watch(&ranges, control).map_err(|e| {
        (
            String::new(),
            MemoryFault::new(FailureKind::Internal, "unwatchable", e.to_string()),
        )
    })?;
    let result = launch(&spans);
    let faulted = watch.faulted();
    drop(watch);
    let mut shrank = None;
    for ((name, mapping, _), faulted) in operands.iter().zip(faulted) {
        if faulted {
            mapping.restore();
            shrank.get_or_insert(name.clone());
        }
    }
    if let Some(name) = shrank {
        let message = format!(
            "{name}: the shared-memory object shrank during the launch; the launch was stopped and its output is undefined"
        );
        return Err((
            name,
            MemoryFault::new(
                FailureKind::OutOfBounds,
                "shm_shrank_during_launch",
                message,
            ),
        ));
    }
    Ok(result)
}
