//! A daemon-wide bound on the waits that spin (`--front-spin`).
//!
//! A spinning wait (a fd socket connection polling for its next call, a
//! call polling for its executor's reply) keeps a runtime worker busy until
//! what it waits for comes or its spin ends. The spin bounds each wait; this
//! bounds how many spin at once, so that a flood of connections cannot keep
//! every worker busy: past the bound a wait sleeps at once, as with
//! `--front-spin 0`.
//!
//! Invariant: at most `max` permits are out at any time, and a permit is
//! returned when dropped, however its wait ends.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The daemon's spin and how many waits may spin at once.
#[derive(Debug)]
pub struct Spinners {
    spin: Duration,
    max: usize,
    active: AtomicUsize,
}

/// One wait's right to spin; returned on drop.
#[derive(Debug)]
pub struct SpinPermit(Arc<Spinners>);

impl Drop for SpinPermit {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Spinners {
    /// Waits spin for up to `spin`, at most `max` of them at once.
    pub fn new(spin: Duration, max: usize) -> Arc<Spinners> {
        Arc::new(Spinners {
            spin,
            max,
            active: AtomicUsize::new(0),
        })
    }

    /// Half of this machine's cores (at least one) may spin at once: the
    /// runtime has a worker per core, so at least half of them are always
    /// free for everything else.
    pub fn for_this_machine(spin: Duration) -> Arc<Spinners> {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        Spinners::new(spin, (cores / 2).max(1))
    }

    /// How long this wait may spin, and the permit to hold while it does:
    /// the configured spin, or zero (and no permit) when the spin is off or
    /// `max` waits are spinning already.
    pub fn take(self: &Arc<Self>) -> (Duration, Option<SpinPermit>) {
        if self.spin.is_zero() {
            return (Duration::ZERO, None);
        }
        let mut active = self.active.load(Ordering::Acquire);
        loop {
            if active >= self.max {
                return (Duration::ZERO, None);
            }
            match self.active.compare_exchange_weak(
                active,
                active + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return (self.spin, Some(SpinPermit(self.clone()))),
                Err(now) => active = now,
            }
        }
    }

    /// Waits spinning now.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::Acquire)
    }
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
        let peak = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let spinners = spinners.clone();
                let peak = peak.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        let (_, permit) = spinners.take();
                        peak.fetch_max(spinners.active(), Ordering::AcqRel);
                        drop(permit);
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert!(peak.load(Ordering::Acquire) <= 3);
        assert_eq!(spinners.active(), 0);
    }
}
