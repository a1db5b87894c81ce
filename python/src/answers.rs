//! How an awaited ring call waits for ptxd's answers: the GIL is released
//! once by the caller around the whole call (submission and wait), and the
//! answer is polled for up to the client's reply spin (`ptxd.Client(...,
//! reply_spin=)`, 200 µs by default, as the fd socket's calls poll for
//! their replies) before the SDK's own wait takes over, which polls 30 µs
//! more and then sleeps on the ring's futex word. An answer that comes
//! within the spin is read without a sleep and a wake-up; one that takes
//! longer costs one futex wake, as before. A spin of 0 leaves the wait to
//! the SDK from the start.

use std::time::{Duration, Instant};

use ptxd_client::{Error, LaunchRing, RingCompletion, RingRefusal};

/// Polls between two reads of the clock (a poll is one atomic load when
/// nothing is there; a clock read costs about as much).
const CLOCK_EVERY: u32 = 16;

/// Polls between two `sched_yield`s (a few microseconds), as the SDK's own
/// spin does: on a machine with more runnable threads than cores, ptxd's
/// ring thread may need this core to write the answer polled for (without
/// the yield, a 2-core host measured 250 us per awaited launch against 54
/// with no spin at all). A multiple of `CLOCK_EVERY`.
const YIELD_EVERY: u32 = 128;

/// The next answer on `ring` if one comes within `spin` of polling
/// (`None` at once for a spin of 0); the caller then waits with the SDK.
fn polled_answer(ring: &mut LaunchRing, spin: Duration) -> Result<Option<RingCompletion>, Error> {
    if spin.is_zero() {
        return Ok(None);
    }
    let start = Instant::now();
    let mut polls: u32 = 0;
    loop {
        if let Some(completion) = ring.poll()? {
            return Ok(Some(completion));
        }
        polls = polls.wrapping_add(1);
        if polls.is_multiple_of(CLOCK_EVERY) && start.elapsed() >= spin {
            return Ok(None);
        }
        if polls.is_multiple_of(YIELD_EVERY) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// The next answer on `ring`: polled for up to `spin`, then waited for by
/// the SDK for up to `timeout`. `None`: none came in time. On an orphaned
/// ring the SDK's wait fails with `RING_ORPHANED` once the answers posted
/// before the loss are read.
fn next_answer(
    ring: &mut LaunchRing,
    spin: Duration,
    timeout: Duration,
) -> Result<Option<RingCompletion>, Error> {
    match polled_answer(ring, spin)? {
        Some(completion) => Ok(Some(completion)),
        None => ring.wait(timeout),
    }
}

/// The answer of the one launch outstanding on `ring` (an awaited call's
/// own: it drained the ring before it submitted): `Some` refusal when it
/// was refused or failed. Polled for up to `spin`, then waited for by the
/// SDK's `LaunchRing::drain`, whose error says that none came within
/// `timeout`.
pub(crate) fn own_answer(
    ring: &mut LaunchRing,
    spin: Duration,
    timeout: Duration,
) -> Result<Option<RingRefusal>, Error> {
    match polled_answer(ring, spin)? {
        Some(completion) => Ok(completion.outcome.err()),
        None => Ok(ring.drain(timeout)?.pop()),
    }
}

/// Reads the answers of the `count` launches an awaited call submitted
/// (`read`: those the submission itself read while it waited for room),
/// in order, and returns the refused or failed ones with their index in
/// the call: empty (no allocation) when every launch was accepted. An
/// error when an answer does not come within `timeout`.
pub(crate) fn await_refusals(
    ring: &mut LaunchRing,
    read: Vec<RingCompletion>,
    count: usize,
    spin: Duration,
    timeout: Duration,
) -> Result<Vec<(usize, RingRefusal)>, Error> {
    let mut refused = Vec::new();
    let already = read.len();
    for (index, completion) in read.into_iter().enumerate() {
        if let Err(refusal) = completion.outcome {
            refused.push((index, refusal));
        }
    }
    for index in already..count {
        match next_answer(ring, spin, timeout)? {
            Some(completion) => {
                if let Err(refusal) = completion.outcome {
                    refused.push((index, refusal));
                }
            }
            None => return Err(no_answer(timeout)),
        }
    }
    Ok(refused)
}

/// The error of an answer that did not come in time: the SDK's own words
/// (its `completion_timeout` is private). Only where the SDK's
/// `LaunchRing::drain` cannot serve: `await_refusals` needs each answer's
/// index in its call (a drain returns refusals by ticket, and this side
/// does not learn the call's tickets), and `HostRing`'s deferred call
/// waits for one free slot, not for every launch outstanding.
pub(crate) fn no_answer(timeout: Duration) -> Error {
    Error::Protocol(format!(
        "launch ring: no completion within {timeout:?} (the executor is stalled, or a sync launch is still running)"
    ))
}
