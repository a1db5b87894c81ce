//! Sleeping on, and waking, a futex word in the shared mapping.
//!
//! Both calls are *shared* futexes (no `FUTEX_PRIVATE_FLAG`): the kernel keys
//! them by the object's page, so a waiter in one process is found by a waker
//! in another, each through its own mapping. nix 0.32 has no futex wrapper,
//! so this is the raw syscall (libc through nix's re-export).
//!
//! The protocol around the word (who sets it, when to wake) lives in
//! [`Waiter`]; this module only makes the calls.

use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::libc;

/// Spin iterations (a few microseconds) between two `sched_yield`s.
const YIELD_EVERY: u32 = 128;

/// Spin iterations between two reads of the clock: a read costs about as
/// much as a poll of the ring (a vDSO `clock_gettime`, 20-30 ns; it was a
/// third of a spinning thread's samples when read every iteration), and 16
/// iterations overshoot a spin's end by well under a microsecond. A
/// divisor of [`YIELD_EVERY`], so a yield is always followed by a read.
const CLOCK_EVERY: u32 = 16;

/// The consumer is awake (or about to re-check before sleeping).
pub(crate) const AWAKE: u32 = 0;
/// The consumer announced it is going to sleep; a producer that publishes
/// must swap the word back to `AWAKE` and wake it.
pub(crate) const SLEEPING: u32 = 1;

/// Sleeps while `*word == expected`, for at most `timeout`. Returns when
/// woken, when the word no longer holds `expected` (EAGAIN), on timeout or
/// on a signal: the caller re-checks its condition in every case.
pub(crate) fn wait(word: &AtomicU32, expected: u32, timeout: Duration) -> Result<(), Errno> {
    let timeout = libc::timespec {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        // Below 1e9, so it fits every c_long.
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT reads the aligned u32 at `word.as_ptr()`, which the
    // borrow keeps mapped for the call; the timespec outlives the call; the
    // last two arguments are ignored by FUTEX_WAIT.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &timeout as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    match Errno::last() {
        Errno::EAGAIN | Errno::ETIMEDOUT | Errno::EINTR => Ok(()),
        errno => Err(errno),
    }
}

/// Wakes every sleeper on `word`: one in the protocol, but a peer that
/// parks threads of its own on the word cannot absorb the wake meant for
/// the consumer.
pub(crate) fn wake(word: &AtomicU32) -> Result<(), Errno> {
    // SAFETY: FUTEX_WAKE only uses the address as a key (the borrow keeps it
    // mapped); the remaining arguments are ignored by FUTEX_WAKE.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            libc::c_int::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        )
    };
    if rc < 0 {
        return Err(Errno::last());
    }
    Ok(())
}

/// How a consumer waits: spin, then sleep in bounded slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitConfig {
    /// How long to poll (`spin_loop`, yielding the core every few
    /// microseconds) before the first sleep. A spinning consumer sees a
    /// publish within a fraction of a microsecond; a sleeping one needs a
    /// futex wake, about 10 us across cores. 0: sleep at once.
    pub spin: Duration,
    /// The longest single futex sleep. A wake the peer never sends (a
    /// hostile or dead peer, or a bug) costs at most this much latency.
    pub max_sleep: Duration,
}

impl Default for WaitConfig {
    fn default() -> Self {
        WaitConfig {
            spin: Duration::from_micros(30),
            max_sleep: Duration::from_millis(100),
        }
    }
}

/// Futex calls made by one side, for tests and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WaitStats {
    /// FUTEX_WAIT calls (sleeps) this side made.
    pub sleeps: u64,
    /// FUTEX_WAKE calls this side made to wake its peer.
    pub wakes: u64,
}

/// The consumer's half of the sleep protocol over one futex word.
///
/// The lost-wakeup argument (a Dekker pattern over two SeqCst fences). The
/// "publication" is the Release store of the next slot's sequence word (the
/// slot the consumer polls), and the consumer's re-check is an Acquire load
/// of that same word:
///
/// - consumer: `word = SLEEPING`; fence(SeqCst); re-check (load the next
///   slot's sequence word); only if it is not yet published,
///   `FUTEX_WAIT(word, SLEEPING)`.
/// - producer: publish (`sequence.store(Release)`); fence(SeqCst); if
///   `word == SLEEPING`, swap it to `AWAKE` and `FUTEX_WAKE`.
///
/// The two fences are ordered one way or the other. If the consumer's comes
/// first, the producer's load sees `SLEEPING` and wakes it; if the
/// producer's comes first, the consumer's re-check sees the new sequence
/// word and it does not sleep. A wake that lands between the re-check and
/// the FUTEX_WAIT finds the word already `AWAKE`, so the FUTEX_WAIT returns
/// at once (EAGAIN). The same holds for any other condition `ready` checks
/// with a store before a SeqCst fence on the other side ([`kick`]: a stop
/// flag). A peer that scribbles on the futex word or on a sequence word can
/// only cause a spurious wake or a missed one (a sequence word it publishes
/// early or late moves only when its own work is seen), and every sleep is
/// bounded by `max_sleep` and the caller's deadline.
pub(crate) fn wait_until<E>(
    word: &AtomicU32,
    config: &WaitConfig,
    stats: &mut WaitStats,
    timeout: Duration,
    mut ready: impl FnMut() -> Result<bool, E>,
    futex_error: impl Fn(Errno) -> E,
) -> Result<bool, E> {
    let start = Instant::now();
    // None: a deadline past what Instant can hold, i.e. no deadline.
    let deadline = start.checked_add(timeout);
    if spin(config.spin.min(timeout), &mut ready)? {
        return Ok(true);
    }
    loop {
        let remaining = match deadline {
            Some(deadline) => deadline.saturating_duration_since(Instant::now()),
            None => config.max_sleep,
        };
        if remaining.is_zero() {
            return Ok(false);
        }
        word.store(SLEEPING, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        match ready() {
            Ok(false) => {}
            other => {
                word.store(AWAKE, Ordering::Relaxed);
                return other;
            }
        }
        stats.sleeps += 1;
        let slept = wait(word, SLEEPING, remaining.min(config.max_sleep));
        word.store(AWAKE, Ordering::Relaxed);
        slept.map_err(&futex_error)?;
        if ready()? {
            return Ok(true);
        }
    }
}

/// Polls `ready` for up to `how_long` without sleeping (`spin_loop`,
/// yielding the core every few microseconds; the clock is read every
/// [`CLOCK_EVERY`] polls); true once it was ready. A zero `how_long` polls
/// once.
pub(crate) fn spin<E>(
    how_long: Duration,
    mut ready: impl FnMut() -> Result<bool, E>,
) -> Result<bool, E> {
    let start = Instant::now();
    let spin_until = start.checked_add(how_long).unwrap_or(start);
    let mut spins: u32 = 0;
    loop {
        if ready()? {
            return Ok(true);
        }
        if spins.is_multiple_of(CLOCK_EVERY) && Instant::now() >= spin_until {
            return Ok(false);
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(YIELD_EVERY) {
            // On a machine with more runnable threads than cores the peer
            // may need this core to make the progress we are waiting for.
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// The producer's half: call after publishing (the Release store of the
/// counter). Issues the syscall only when the consumer announced a sleep.
pub(crate) fn wake_if_sleeping(word: &AtomicU32, stats: &mut WaitStats) -> Result<(), Errno> {
    fence(Ordering::SeqCst);
    if word.load(Ordering::Relaxed) == SLEEPING && word.swap(AWAKE, Ordering::Relaxed) == SLEEPING {
        stats.wakes += 1;
        return wake(word);
    }
    Ok(())
}

/// Wakes the consumer sleeping on `word` whatever the word says: for a
/// condition outside the ring (a stop) that the consumer's `ready` checks
/// and the caller set before this call. The fence orders that store before
/// the swap, as [`wake_if_sleeping`] orders a publication; the swap to
/// `AWAKE` makes a FUTEX_WAIT that has not started yet return at once, and
/// the FUTEX_WAKE ends one that has. Unconditional, because the peer may
/// have overwritten the word: a stop is rare, a syscall per stop is cheap.
pub(crate) fn kick(word: &AtomicU32) -> Result<(), Errno> {
    fence(Ordering::SeqCst);
    word.swap(AWAKE, Ordering::Relaxed);
    wake(word)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn wait_returns_at_once_when_the_word_differs_and_times_out_otherwise() {
        let word = AtomicU32::new(AWAKE);
        let start = Instant::now();
        wait(&word, SLEEPING, Duration::from_secs(5)).unwrap();
        assert!(start.elapsed() < Duration::from_secs(1));
        let start = Instant::now();
        wait(&word, AWAKE, Duration::from_millis(30)).unwrap();
        assert!(start.elapsed() >= Duration::from_millis(25));
        // Nobody sleeps: a wake is harmless.
        wake(&word).unwrap();
    }

    /// The lost-wake window of a kick, made deterministic: the consumer
    /// announced its sleep and found nothing (`SLEEPING`), the kick lands
    /// before its FUTEX_WAIT, and that wait must return at once, not at
    /// its timeout. Also a kick to a consumer already in FUTEX_WAIT.
    #[test]
    fn a_kick_before_or_during_the_futex_wait_is_not_lost() {
        let word = AtomicU32::new(AWAKE);
        word.store(SLEEPING, Ordering::Relaxed);
        kick(&word).unwrap();
        let start = Instant::now();
        wait(&word, SLEEPING, Duration::from_secs(10)).unwrap();
        assert!(start.elapsed() < Duration::from_secs(5));
        let word = std::sync::Arc::new(AtomicU32::new(SLEEPING));
        let sleeper = {
            let word = std::sync::Arc::clone(&word);
            std::thread::spawn(move || {
                let start = Instant::now();
                while word.load(Ordering::Relaxed) == SLEEPING
                    && start.elapsed() < Duration::from_secs(10)
                {
                    wait(&word, SLEEPING, Duration::from_secs(10)).unwrap();
                }
                start.elapsed()
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        kick(&word).unwrap();
        assert!(sleeper.join().unwrap() < Duration::from_secs(5));
    }

    /// A spin reads the clock every few polls, not every one, and still
    /// honours its length: a zero spin polls once, a spin returns at the
    /// poll that finds the ring ready (at a random poll, not only at a
    /// clock read), and one that never does ends after its length, not
    /// long past it.
    #[test]
    fn a_spin_polls_until_ready_or_its_length() {
        let mut polls = 0u32;
        let ready = |polls: &mut u32| -> Result<bool, ()> {
            *polls += 1;
            Ok(false)
        };
        assert_eq!(spin(Duration::ZERO, || ready(&mut polls)), Ok(false));
        assert_eq!(polls, 1);
        for _ in 0..50 {
            let at = rand::random_range(1..500u32);
            let mut polls = 0;
            let found = spin(Duration::from_secs(5), || {
                polls += 1;
                Ok::<bool, ()>(polls == at)
            });
            assert_eq!((found, polls), (Ok(true), at));
        }
        let how_long = Duration::from_millis(20);
        let start = Instant::now();
        assert_eq!(spin(how_long, || ready(&mut polls)), Ok(false));
        let took = start.elapsed();
        // The upper bound is loose: this machine's scheduler, not the
        // spin, decides how long a yield takes.
        assert!(took >= how_long && took < how_long * 10, "{took:?}");
    }
}
