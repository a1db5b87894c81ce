//! Surviving a shared-memory object that shrinks under a running launch.
//!
//! A client owns its POSIX shared-memory object and may `ftruncate` it at any
//! time. Pages of the host executor's `MAP_SHARED` mapping past the object's
//! new end then raise SIGBUS when a kernel touches them, which by default
//! kills the executor and every other session's kernels with it. The size
//! check before each launch cannot close that window, so the executor
//! catches the signal:
//!
//! - A launch [`watch`]es each mapping it uses: its range and the launch's
//!   [`LaunchControl`] go into a fixed table of slots that the handler reads
//!   without locks or allocation (a seqlock per slot).
//! - The handler maps anonymous zero pages (`MAP_FIXED`) from the faulting
//!   page to the end of the mapping, so the access is retried against memory
//!   that exists, marks the slot faulted and aborts the launch; the engine
//!   stops at its next poll and the launch is refused with a typed reason.
//!   The executor then maps the object again over the whole range
//!   ([`Watch::faulted`] says which mappings need it).
//! - A SIGBUS at an address no running launch watches is a real bug: the
//!   handler restores the default action and returns, so the access faults
//!   again and the process dies as it would have without the handler.
//!
//! Invariants: a watched range is only touched by threads that watch it (a
//! launch's threads, a ring's semaphore access), and it is unwatched (the
//! [`Watch`] dropped) only after every one of them returned, so a handler
//! that found a range can use its control pointer. A fault marks every
//! watch of the range.

use std::num::NonZeroUsize;
use std::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

use nix::libc;
use nix::sys::mman::{mmap_anonymous, MapFlags, ProtFlags};
use nix::sys::signal::{sigaction, signal, SaFlags, SigAction, SigHandler, SigSet, Signal};

use crate::ptx::host::exec::LaunchControl;

/// Ranges watched at once, over every running launch (each launch watches
/// one per operand, at most 65).
const SLOTS: usize = 4096;

struct Slot {
    /// Claimed by a watch.
    busy: AtomicBool,
    /// Even when `start`, `len` and `control` are consistent.
    seq: AtomicU64,
    start: AtomicUsize,
    len: AtomicUsize,
    control: AtomicPtr<LaunchControl>,
    faulted: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)] // Only used to build TABLE.
const EMPTY: Slot = Slot {
    busy: AtomicBool::new(false),
    seq: AtomicU64::new(0),
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    control: AtomicPtr::new(std::ptr::null_mut()),
    faulted: AtomicBool::new(false),
};

static TABLE: [Slot; SLOTS] = [EMPTY; SLOTS];
static PAGE: AtomicUsize = AtomicUsize::new(4096);
static INSTALLED: OnceLock<Result<(), nix::Error>> = OnceLock::new();

/// Installs the SIGBUS handler (once per process).
pub fn install() -> Result<(), nix::Error> {
    *INSTALLED.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if let Ok(page) = usize::try_from(page) {
            if page.is_power_of_two() {
                PAGE.store(page, Ordering::Relaxed);
            }
        }
        let action = SigAction::new(
            SigHandler::SigAction(on_sigbus),
            SaFlags::SA_SIGINFO,
            SigSet::empty(),
        );
        // SAFETY: the handler only touches atomics and makes
        // async-signal-safe system calls (mmap, sigaction); see `on_sigbus`.
        unsafe { sigaction(Signal::SIGBUS, &action) }.map(|_| ())
    })
}

/// The ranges one launch watches; unwatched on drop.
#[derive(Debug)]
pub struct Watch {
    slots: Vec<usize>,
}

/// Why a launch could not be watched.
#[derive(Debug, thiserror::Error)]
#[error("every one of the {SLOTS} SIGBUS watch slots is in use")]
pub struct TableFull;

/// Watches `ranges` (`(start, len)` of whole mappings) for the launch
/// controlled by `control`, which must outlive the returned [`Watch`].
pub fn watch(ranges: &[(usize, usize)], control: &LaunchControl) -> Result<Watch, TableFull> {
    let mut watch = Watch {
        slots: Vec::with_capacity(ranges.len()),
    };
    for &(start, len) in ranges {
        let index = TABLE
            .iter()
            .position(|slot| {
                slot.busy
                    .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            })
            .ok_or(TableFull)?;
        let slot = &TABLE[index];
        let seq = slot.seq.load(Ordering::Relaxed);
        slot.seq.store(seq + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        slot.start.store(start, Ordering::Relaxed);
        slot.len.store(len, Ordering::Relaxed);
        slot.control
            .store(std::ptr::from_ref(control).cast_mut(), Ordering::Relaxed);
        slot.faulted.store(false, Ordering::Relaxed);
        slot.seq.store(seq + 2, Ordering::Release);
        watch.slots.push(index);
    }
    Ok(watch)
}

impl Watch {
    /// For each watched range, in order: did a SIGBUS land in it?
    pub fn faulted(&self) -> Vec<bool> {
        self.slots
            .iter()
            .map(|&i| TABLE[i].faulted.load(Ordering::Acquire))
            .collect()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        for &index in &self.slots {
            let slot = &TABLE[index];
            let seq = slot.seq.load(Ordering::Relaxed);
            slot.seq.store(seq + 1, Ordering::Relaxed);
            fence(Ordering::Release);
            slot.len.store(0, Ordering::Relaxed);
            slot.control.store(std::ptr::null_mut(), Ordering::Relaxed);
            slot.seq.store(seq + 2, Ordering::Release);
            slot.busy.store(false, Ordering::Release);
        }
    }
}

/// A consistent snapshot of a busy slot: (start, len, control).
fn read_slot(slot: &Slot) -> Option<(usize, usize, *mut LaunchControl)> {
    if !slot.busy.load(Ordering::Acquire) {
        return None;
    }
    let before = slot.seq.load(Ordering::Acquire);
    if !before.is_multiple_of(2) {
        return None;
    }
    let start = slot.start.load(Ordering::Relaxed);
    let len = slot.len.load(Ordering::Relaxed);
    let control = slot.control.load(Ordering::Relaxed);
    fence(Ordering::Acquire);
    (slot.seq.load(Ordering::Relaxed) == before && !control.is_null())
        .then_some((start, len, control))
}

extern "C" fn on_sigbus(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo_t to an SA_SIGINFO handler;
    // for SIGBUS si_addr is the faulting address.
    let addr = unsafe { (*info).si_addr() } as usize;
    let page = PAGE.load(Ordering::Relaxed);
    // Every watch of the faulting range hears of it: a buffer can be
    // watched by two threads at once (a session's launch and its ring's
    // semaphore), and the one that did not fault must not trust it either.
    let mut patched = false;
    for slot in &TABLE {
        let Some((start, len, control)) = read_slot(slot) else {
            continue;
        };
        if addr < start || addr - start >= len {
            continue;
        }
        if !patched {
            let from = addr & !(page - 1);
            let end = (start + len).div_ceil(page) * page;
            let mapped = NonZeroUsize::new(from).zip(NonZeroUsize::new(end - from));
            let Some((at, length)) = mapped else {
                break;
            };
            // SAFETY: [from, end) lies inside the watched mapping (start is
            // page-aligned, as mmap returned it, and the mapping covers
            // whole pages), which this process owns and no Rust reference
            // covers: every access goes through raw pointers or atomics
            // under a watch. Replacing its pages with zero pages changes
            // what the access reads, never the validity of other memory.
            let replaced = unsafe {
                mmap_anonymous(
                    Some(at),
                    length,
                    ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                    MapFlags::MAP_PRIVATE | MapFlags::MAP_FIXED,
                )
            };
            if replaced.is_err() {
                break;
            }
            patched = true;
            slot.faulted.store(true, Ordering::Release);
            // SAFETY: the slot was busy and consistent when read, so its
            // watch was alive; a watch keeps its control alive until it is
            // dropped, and a watch covering the faulting address is, save
            // the two-watch case (a launch and its ring's semaphore word on
            // one buffer), the faulting access's own, which cannot be
            // dropped while that access is in this handler.
            unsafe { &*control }.abort();
            continue;
        }
        // Another watch of the same range: told through its slot (static
        // memory) only; its own access will see the zero pages or fault
        // into this handler itself.
        slot.faulted.store(true, Ordering::Release);
    }
    if patched {
        return;
    }
    // Not a watched range (or it could not be patched): die as without the
    // handler, when the access is retried.
    // SAFETY: resetting a disposition to the default is async-signal-safe.
    let _ = unsafe { signal(Signal::SIGBUS, SigHandler::SigDfl) };
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use nix::sys::mman::{mmap, munmap, shm_open, shm_unlink};
    use nix::sys::stat::Mode;
    use nix::unistd::ftruncate;

    #[test]
    fn a_shrink_under_a_watched_range_aborts_its_launch_instead_of_the_process() {
        install().unwrap();
        let name = format!("/ptxd-sigbus-unit-{}", std::process::id());
        let fd = shm_open(
            name.as_str(),
            nix::fcntl::OFlag::O_RDWR | nix::fcntl::OFlag::O_CREAT | nix::fcntl::OFlag::O_EXCL,
            Mode::S_IRUSR | Mode::S_IWUSR,
        )
        .unwrap();
        shm_unlink(name.as_str()).unwrap();
        let len = 8 * PAGE.load(Ordering::Relaxed);
        ftruncate(&fd, len as i64).unwrap();
        let length = NonZeroUsize::new(len).unwrap();
        // SAFETY: a fresh shared mapping of our own object.
        let base = unsafe {
            mmap(
                None,
                length,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                &fd,
                0,
            )
        }
        .unwrap()
        .cast::<u8>();
        let ptr = base.as_ptr();
        // SAFETY: inside the mapping, which the object still covers.
        unsafe { ptr.add(len - 1).write_volatile(7) };

        let control = LaunchControl::new(None);
        let watch = watch(&[(ptr as usize, len)], &control).unwrap();
        ftruncate(&fd, 0).unwrap();
        // SAFETY: the object is gone, so this access raises SIGBUS; the
        // handler maps a zero page over it and the read sees 0.
        let seen = unsafe { ptr.add(len - 1).read_volatile() };
        assert_eq!(seen, 0);
        assert_eq!(watch.faulted(), vec![true]);
        assert_eq!(
            control.stopped(),
            Some(crate::ptx::host::exec::StopReason::Aborted)
        );
        drop(watch);
        // SAFETY: base/len are what mmap returned.
        unsafe { munmap(base.cast(), len) }.unwrap();
    }
}
