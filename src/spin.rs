//! One daemon-wide bound on the waits that spin, in every process
//! (`--front-spin`, `--executor-spin` and the launch rings' spins).
//!
//! A spinning wait (a fd socket connection polling for its next call, a
//! call polling for its executor's reply, an executor's request loop polling
//! for the next request, a ring thread polling its ring or a semaphore)
//! keeps a core busy until what it waits for comes or its spin ends. The
//! spin bounds each wait; this bounds how many spin at once, over the front
//! and every executor together, so that a flood of connections or rings
//! cannot keep every core busy: past the bound a wait sleeps at once, as
//! with a spin of 0.
//!
//! How the bound is shared across processes: the front creates one page of
//! shared memory (a memfd) and hands it to every executor it spawns (file
//! descriptor [`INHERITED_FD`], with the executor's slot on its command
//! line). Slot 0 holds the bound, slot 1 how many slots are in use, slot 2
//! the front's spinners and slot `3 + i` those of device `i`'s executor. A
//! wait takes a permit by adding one to its own process's slot and then
//! summing every slot in use; over the bound, it takes the one back and
//! does not spin. All operations are `SeqCst`, so of the waits that hold
//! permits at any moment, the one whose increment came last saw every
//! other's increment in its sum: at most the bound hold permits at once.
//! A process that dies holding permits leaves them in its own slot only,
//! which the front clears when it notices the death and before it spawns
//! the next executor there ([`Spinners::clear_executor`]).
//!
//! Invariant: at most `max` permits are out at any time, over every
//! process, and a permit is returned when dropped, however its wait ends.

use std::num::NonZeroUsize;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};

/// The descriptor an executor finds the front's spin page on.
pub const INHERITED_FD: std::os::fd::RawFd = 4;

/// Slots in the page: the bound, the slots in use, the front, then one per
/// device executor.
const SLOTS: usize = 512;
const PAGE_BYTES: usize = SLOTS * 8;
const BOUND: usize = 0;
const IN_USE: usize = 1;
const FRONT: usize = 2;
const FIRST_EXECUTOR: usize = 3;

/// The slot of device `index`'s executor (none past the page: that
/// executor never spins).
pub fn executor_slot(index: usize) -> Option<u32> {
    let slot = FIRST_EXECUTOR.checked_add(index)?;
    if slot < SLOTS {
        u32::try_from(slot).ok()
    } else {
        None
    }
}

/// The counters: a shared page, or (when no memfd can be made, and in unit
/// tests) the same layout in this process only.
enum Page {
    Shared {
        base: NonNull<AtomicU64>,
        fd: OwnedFd,
    },
    Local(Box<[AtomicU64]>),
}

// SAFETY: the page is only reached through `&AtomicU64`s; the pointer is a
// mapping this value owns until it drops.
unsafe impl Send for Page {}
// SAFETY: as above: atomics only.
unsafe impl Sync for Page {}

impl Page {
    fn local() -> Page {
        Page::Local((0..SLOTS).map(|_| AtomicU64::new(0)).collect())
    }

    fn map(fd: OwnedFd) -> Result<Page, nix::Error> {
        let len = NonZeroUsize::new(PAGE_BYTES).ok_or(nix::Error::EINVAL)?;
        let stat = nix::sys::stat::fstat(fd.as_fd())?;
        if usize::try_from(stat.st_size).unwrap_or(0) < PAGE_BYTES {
            return Err(nix::Error::ERANGE);
        }
        // SAFETY: a fresh shared mapping of a descriptor we own, which holds
        // the whole page (checked above) and is never shrunk: only the front
        // holds it besides its executors, and neither truncates it.
        let base = unsafe {
            mmap(
                None,
                len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                &fd,
                0,
            )
        }?;
        Ok(Page::Shared {
            base: base.cast(),
            fd,
        })
    }

    fn create() -> Result<Page, nix::Error> {
        let fd = nix::sys::memfd::memfd_create(
            c"ptxd-spinners",
            nix::sys::memfd::MFdFlags::MFD_CLOEXEC,
        )?;
        nix::unistd::ftruncate(&fd, PAGE_BYTES as i64)?;
        Page::map(fd)
    }

    fn slot(&self, index: usize) -> &AtomicU64 {
        match self {
            // SAFETY: `index < SLOTS` at every call site (constants, or a
            // slot checked when the value was built); the page holds SLOTS
            // aligned u64s and lives as long as `self`.
            Page::Shared { base, .. } => unsafe { &*base.as_ptr().add(index.min(SLOTS - 1)) },
            Page::Local(slots) => &slots[index.min(SLOTS - 1)],
        }
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        if let Page::Shared { base, .. } = self {
            // SAFETY: base/PAGE_BYTES are what mmap returned; unmapped once.
            let _ = unsafe { munmap(base.cast(), PAGE_BYTES) };
        }
    }
}

/// The spin and the share of the daemon-wide bound of one process.
pub struct Spinners {
    spin: Duration,
    page: Page,
    /// This process's slot.
    own: usize,
}

impl std::fmt::Debug for Spinners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spinners")
            .field("spin", &self.spin)
            .field("own", &self.own)
            .field("active", &self.active())
            .finish()
    }
}

/// One wait's right to spin; returned on drop.
#[derive(Debug)]
pub struct SpinPermit(Arc<Spinners>);

impl Drop for SpinPermit {
    fn drop(&mut self) {
        self.0.give_back();
    }
}

impl Spinners {
    /// The front's spinners: waits spin for up to `spin`, at most `max` of
    /// them at once over the front and every executor it spawns with
    /// [`Spinners::inheritable`].
    pub fn new(spin: Duration, max: usize) -> Arc<Spinners> {
        let page = Page::create().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot share the spin bound with executors; they will not spin");
            Page::local()
        });
        page.slot(BOUND)
            .store(u64::try_from(max).unwrap_or(u64::MAX), Ordering::SeqCst);
        page.slot(IN_USE)
            .store(FIRST_EXECUTOR as u64, Ordering::SeqCst);
        Arc::new(Spinners {
            spin,
            page,
            own: FRONT,
        })
    }

    /// Half of this machine's cores (at least one) may spin at once, over
    /// every process of the daemon: at least half of them are always free
    /// for everything else.
    pub fn for_this_machine(spin: Duration) -> Arc<Spinners> {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        Spinners::new(spin, (cores / 2).max(1))
    }

    /// The page to hand to device `index`'s executor, with its slot (none:
    /// the bound is not shared, or the device has no slot; that executor
    /// then never spins). Counts the slot as in use.
    pub fn inheritable(&self, index: usize) -> Option<(BorrowedFd<'_>, u32)> {
        let Page::Shared { fd, .. } = &self.page else {
            return None;
        };
        let slot = executor_slot(index)?;
        self.clear_executor(index);
        self.page
            .slot(IN_USE)
            .fetch_max(u64::from(slot) + 1, Ordering::SeqCst);
        Some((fd.as_fd(), slot))
    }

    /// Forgets the permits device `index`'s executor held: it died, or a
    /// new one is about to start in its place.
    pub fn clear_executor(&self, index: usize) {
        if let Some(slot) = executor_slot(index) {
            self.page.slot(slot as usize).store(0, Ordering::SeqCst);
        }
    }

    /// An executor's spinners over the page the front passed as
    /// [`INHERITED_FD`]: spins of up to `spin` each, under the daemon-wide
    /// bound. `None` when the page is not there (the executor then never
    /// spins).
    pub fn inherited(slot: u32, spin: Duration) -> Option<Arc<Spinners>> {
        let own = usize::try_from(slot)
            .ok()
            .filter(|s| (FIRST_EXECUTOR..SLOTS).contains(s))?;
        // SAFETY: the front installed the page at INHERITED_FD before exec
        // (see the supervisor), and nothing else in this process uses that
        // descriptor: this takes ownership of it once (callers go through
        // `install_inherited`, which runs at most once).
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(INHERITED_FD) };
        match Page::map(fd) {
            Ok(page) => Some(Arc::new(Spinners { spin, page, own })),
            Err(e) => {
                tracing::warn!(error = %e, "cannot map the front's spin page; this executor will not spin");
                None
            }
        }
    }

    /// The same bound with another spin (an executor's ring threads spin
    /// for their own time, under the same permits).
    pub fn with_spin(self: &Arc<Self>, spin: Duration) -> SpinnerView {
        SpinnerView {
            spinners: self.clone(),
            spin,
        }
    }

    fn give_back(&self) {
        let own = self.page.slot(self.own);
        // Never below zero: after the front cleared a dead process's slot,
        // a straggler's late return must not wrap it.
        let _ = own.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1));
    }

    fn take_for(self: &Arc<Self>, spin: Duration) -> (Duration, Option<SpinPermit>) {
        if spin.is_zero() {
            return (Duration::ZERO, None);
        }
        let own = self.page.slot(self.own);
        own.fetch_add(1, Ordering::SeqCst);
        let permit = SpinPermit(self.clone());
        if u64::try_from(self.active()).unwrap_or(u64::MAX) > self.max() {
            return (Duration::ZERO, None);
        }
        (spin, Some(permit))
    }

    /// How long this wait may spin, and the permit to hold while it does:
    /// the configured spin, or zero (and no permit) when the spin is off or
    /// the bound's waits are spinning already.
    pub fn take(self: &Arc<Self>) -> (Duration, Option<SpinPermit>) {
        self.take_for(self.spin)
    }

    fn max(&self) -> u64 {
        self.page.slot(BOUND).load(Ordering::SeqCst)
    }

    /// Waits spinning now, over every process.
    pub fn active(&self) -> usize {
        let in_use = usize::try_from(self.page.slot(IN_USE).load(Ordering::SeqCst))
            .unwrap_or(SLOTS)
            .clamp(FIRST_EXECUTOR, SLOTS);
        let sum = (FRONT..in_use)
            .map(|slot| self.page.slot(slot).load(Ordering::SeqCst))
            .fold(0u64, u64::saturating_add);
        usize::try_from(sum).unwrap_or(usize::MAX)
    }
}

/// Spinners with a spin of their own (see [`Spinners::with_spin`]).
#[derive(Debug, Clone)]
pub struct SpinnerView {
    spinners: Arc<Spinners>,
    spin: Duration,
}

impl SpinnerView {
    /// As [`Spinners::take`], for this view's spin.
    pub fn take(&self) -> (Duration, Option<SpinPermit>) {
        self.spinners.take_for(self.spin)
    }
}

static EXECUTOR: OnceLock<Option<Arc<Spinners>>> = OnceLock::new();

/// Installs this executor's share of the daemon-wide bound from the page
/// the front passed (once per process; `slot` from the command line, none:
/// this executor never spins).
pub fn install_inherited(slot: Option<u32>, spin: Duration) {
    EXECUTOR.get_or_init(|| slot.and_then(|slot| Spinners::inherited(slot, spin)));
}

/// This executor's spinners (none: it never spins).
pub fn executor_spinners() -> Option<Arc<Spinners>> {
    EXECUTOR.get().cloned().flatten()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn at_most_max_waits_spin_and_a_dropped_permit_is_returned() {
        let spin = Duration::from_micros(200);
        let spinners = Spinners::new(spin, 2);
        let (first, a) = spinners.take();
        let (second, b) = spinners.take();
        let (third, c) = spinners.take();
        assert_eq!((first, second, third), (spin, spin, Duration::ZERO));
        assert!(a.is_some() && b.is_some() && c.is_none());
        assert_eq!(spinners.active(), 2);
        drop(a);
        assert_eq!(spinners.active(), 1);
        let (again, d) = spinners.take();
        assert_eq!(again, spin);
        drop((b, d));
        assert_eq!(spinners.active(), 0);
        // Spin off: nobody spins, nothing is counted.
        let off = Spinners::new(Duration::ZERO, 8);
        assert_eq!(off.take().0, Duration::ZERO);
        assert_eq!(off.active(), 0);
    }

    #[test]
    fn racing_takers_never_exceed_the_bound() {
        let spinners = Spinners::new(Duration::from_micros(1), 3);
        let (holders, peak) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let spinners = spinners.clone();
                let (holders, peak) = (holders.clone(), peak.clone());
                std::thread::spawn(move || {
                    let mut held = 0u64;
                    for _ in 0..20_000 {
                        let (_, permit) = spinners.take();
                        if permit.is_some() {
                            held += 1;
                            let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                            peak.fetch_max(now, Ordering::SeqCst);
                            holders.fetch_sub(1, Ordering::SeqCst);
                        }
                        drop(permit);
                    }
                    held
                })
            })
            .collect();
        let held: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert!(held > 0);
        assert!(peak.load(Ordering::SeqCst) <= 3, "{peak:?} held at once");
        assert_eq!(spinners.active(), 0);
    }

    #[test]
    fn an_executor_and_the_front_share_one_bound_and_a_dead_executors_permits_are_cleared() {
        let front = Spinners::new(Duration::from_micros(50), 2);
        let (fd, slot) = front.inheritable(5).unwrap();
        // What the executor maps: its own descriptor for the same page.
        let page = Page::map(fd.try_clone_to_owned().unwrap()).unwrap();
        let executor = Arc::new(Spinners {
            spin: Duration::from_micros(50),
            page,
            own: slot as usize,
        });
        let (_, a) = executor.take();
        let (_, b) = executor.take();
        assert!(a.is_some() && b.is_some());
        assert_eq!(front.active(), 2, "the front sees the executor's permits");
        let (spin, none) = front.take();
        assert_eq!((spin, none.is_none()), (Duration::ZERO, true));
        // The executor dies holding both: the front clears its slot.
        std::mem::forget((a, b));
        front.clear_executor(5);
        assert_eq!(front.active(), 0);
        let (spin, permit) = front.take();
        assert!(spin > Duration::ZERO && permit.is_some());
        drop(permit);
        // A straggler's late return does not wrap the cleared slot.
        executor.give_back();
        assert_eq!(executor.active(), 0);
    }
}
