//! A session's launch ring on the host backend (see
//! [`crate::executor::ring`]): launches run on the ring's thread, one at a
//! time, in descriptor order, through the same engine path as a queued
//! launch ([`execute`]); semaphores are words in the session's shared
//! memory, reached only through [`super::memory::WatchedWord`].
//!
//! Invariants:
//! - A launch holds clones of its mappings and releases the table lock
//!   before it waits or runs: the request loop never waits on a ring.
//! - A signal is written whatever the launch's outcome, and when it is
//!   refused, so a waiter never blocks forever on it.
//! - A semaphore wait is bounded ([`semaphore_wait_limit`]): it spins only
//!   under a permit of the daemon-wide spin bound, then sleeps in growing
//!   slices (at most [`MAX_NAP`]), so a waiting ring costs next to no CPU;
//!   a wait that runs out fails `KERNEL_TIMEOUT` (counted like any kernel
//!   timeout) and still signals; a ring that is closed stops waiting.
//! - A semaphore word on an object the client shrank fails the launch
//!   (`OUT_OF_BOUNDS`), never the executor.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ptxd_proto::executor::FailureKind;

use super::memory::{Mapping, MemoryFault, WatchedWord};
use super::{execute, HostBackend, HostKernel, RunConfig};
use crate::error::Error;
use crate::executor::child::Replier;
use crate::executor::kernel_timeouts::TimeoutAllowance;
use crate::executor::ring::{
    self, CheckedSemaphore, RingBackend, RingHandle, RingLaunch, RingSession, TableHold,
};

impl HostBackend {
    pub(super) fn start_ring(&mut self, open: ptxd_proto::executor::OpenRing, reply: Replier) {
        let server = match ring::open_server(&open, self.fd_inbox.as_mut()) {
            Ok(server) => server,
            Err(message) => return reply.fail(FailureKind::InvalidHandle, message, &[]),
        };
        let name = format!("ptxd-ring-{}", open.stream);
        let timeouts = Arc::new(TimeoutAllowance::new(
            open.kernel_timeouts,
            open.max_kernel_timeouts,
        ));
        let session = RingSession {
            stream: open.stream,
            channel: reply.channel().clone(),
            timeouts: timeouts.clone(),
        };
        // The ring it replaces is stopped now and waited for on the new
        // ring's thread, never here.
        let previous = self.rings.remove(&open.stream);
        match RingHandle::spawn(server, HostRing { run: self.run }, name, session, previous) {
            Ok(ring) => {
                self.rings.insert(open.stream, ring);
                self.timeouts.insert(open.stream, timeouts);
                reply.ok()
            }
            Err(e) => reply.fail(
                FailureKind::Internal,
                format!("cannot start the ring's thread: {e}"),
                &[],
            ),
        }
    }
}

/// The longest a host ring launch waits for its semaphore: the per-launch
/// budget (`--max-kernel-time`), at most 10 s, 10 s without one.
fn semaphore_wait_limit(budget: Option<Duration>) -> Duration {
    const CAP: Duration = Duration::from_secs(10);
    budget.map_or(CAP, |budget| budget.min(CAP))
}

/// The longest single sleep between two looks at a semaphore word: the
/// latency a long wait adds, against 250 looks a second (a few
/// microseconds of CPU each). Short waits are seen sooner: the sleeps grow
/// from [`FIRST_NAP`].
const MAX_NAP: Duration = Duration::from_millis(4);
/// The first sleep after the spin.
const FIRST_NAP: Duration = Duration::from_micros(20);

/// A session's ring on the host backend: launches run on the ring's thread,
/// one at a time, in descriptor order; semaphores are words in the
/// session's shared memory.
struct HostRing {
    run: RunConfig,
}

fn failure(fault: MemoryFault) -> Error {
    ring::failure(fault.kind, fault.message)
}

/// Writes a launch's signal; a word the client shrank away is reported,
/// not written.
fn signal(semaphore: &CheckedSemaphore<Arc<Mapping>>) -> Result<(), Error> {
    semaphore
        .buffer
        .word(semaphore.op.offset, semaphore.op.width)
        .and_then(|word| word.store(semaphore.op.value))
        .map_err(failure)
}

/// Why a semaphore wait ended without its value.
enum WaitEnd {
    TimedOut(Duration),
    Stopped,
    Fault(MemoryFault),
}

/// Waits until the word holds at least `value`: spins while the
/// daemon-wide bound grants a permit, then sleeps in growing slices.
fn wait_for(
    word: &WatchedWord,
    value: u64,
    limit: Duration,
    stop: &AtomicBool,
) -> Result<(), WaitEnd> {
    let started = Instant::now();
    let deadline = started + limit;
    let spinners = crate::spin::executor_spinners().map(|s| s.with_spin(ring::RING_SPIN));
    let (spin, permit) = spinners
        .as_ref()
        .map_or((Duration::ZERO, None), |s| s.take());
    let spin_until = started + spin;
    let mut nap = FIRST_NAP;
    let mut permit = permit;
    loop {
        if word.load().map_err(WaitEnd::Fault)? >= value {
            return Ok(());
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(WaitEnd::TimedOut(limit));
        }
        if stop.load(Ordering::Acquire) {
            return Err(WaitEnd::Stopped);
        }
        if now < spin_until {
            std::hint::spin_loop();
            continue;
        }
        // The spin is over: give its permit back before the first sleep.
        drop(permit.take());
        std::thread::sleep(nap.min(deadline.saturating_duration_since(now)));
        nap = (nap * 2).min(MAX_NAP);
    }
}

impl RingBackend for HostRing {
    type Kernel = Arc<HostKernel>;
    type Buffer = Arc<Mapping>;

    fn launch(
        &mut self,
        launch: RingLaunch<Arc<HostKernel>, Arc<Mapping>>,
        mut hold: TableHold<'_, Arc<HostKernel>, Arc<Mapping>>,
        stop: &AtomicBool,
    ) -> Result<(), Error> {
        // The launch's clones keep its mappings alive: the request loop may
        // revoke and close them while it waits or runs.
        hold.release();
        if let Some(wait) = &launch.wait {
            let waited = wait
                .buffer
                .word(wait.op.offset, wait.op.width)
                .map_err(WaitEnd::Fault)
                .and_then(|word| {
                    wait_for(
                        &word,
                        wait.op.value,
                        semaphore_wait_limit(self.run.budget),
                        stop,
                    )
                });
            if let Err(end) = waited {
                if matches!(end, WaitEnd::Stopped) {
                    // Abandoned, not answered: whoever serves the ring next
                    // (or the SDK, if the executor is going away) releases
                    // its signal, with the values the client expects.
                    return Err(ring::abandoned());
                }
                // Written whatever happened: a waiter must not block on it.
                if let Some(semaphore) = &launch.signal {
                    let _ = signal(semaphore);
                }
                return Err(match end {
                    WaitEnd::TimedOut(limit) => ring::failure(
                        FailureKind::KernelTimeout,
                        format!("the launch's semaphore wait did not end within {limit:?}"),
                    ),
                    WaitEnd::Stopped => ring::abandoned(),
                    WaitEnd::Fault(fault) => failure(fault),
                });
            }
        }
        let count = launch.operands.len();
        let operands: Vec<_> = launch
            .operands
            .into_iter()
            .enumerate()
            .map(|(index, (mapping, offset))| {
                let name = if index + 1 == count {
                    "output".to_string()
                } else {
                    format!("input {index}")
                };
                // An offset past the mapping (or usize) is refused by the
                // watched accessor.
                (name, mapping, usize::try_from(offset).unwrap_or(usize::MAX))
            })
            .collect();
        let result = execute(
            &launch.kernel,
            &operands,
            launch.n,
            (&launch.scalars, &launch.args),
            self.run,
        );
        // The signal is written whatever the outcome: a waiter must not
        // block forever on a launch that failed.
        let signalled = launch.signal.as_ref().map_or(Ok(()), signal);
        result.map_err(|f| ring::failure(f.kind, f.message))?;
        signalled
    }

    fn release_signal(
        &mut self,
        semaphore: CheckedSemaphore<Arc<Mapping>>,
        mut hold: TableHold<'_, Arc<HostKernel>, Arc<Mapping>>,
    ) {
        hold.release();
        if let Err(e) = signal(&semaphore) {
            tracing::debug!(error = %e, "cannot release a refused launch's semaphore");
        }
    }
}
