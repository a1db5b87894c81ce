//! A session's launch ring on the host backend (see
//! [`crate::executor::ring`]): launches run on the ring's thread, one at a
//! time, in descriptor order, through the same engine path as a queued
//! launch ([`execute`]); semaphores are words in the session's shared
//! memory.
//!
//! Invariants:
//! - A signal is written whatever the launch's outcome, and when it is
//!   refused, so a waiter never blocks forever on it.
//! - A semaphore wait is bounded ([`HOST_SEMAPHORE_WAIT`]); a launch whose
//!   wait runs out fails `KERNEL_TIMEOUT` and still signals.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ptxd_client::ring::SemaphoreWidth;
use ptxd_proto::executor::FailureKind;

use super::{execute, HostBackend, HostKernel, Mapping, RunConfig};
use crate::error::Error;
use crate::executor::child::Replier;
use crate::executor::ring::{self, RingBackend, RingHandle, RingLaunch};

impl HostBackend {
    pub(super) fn open_ring(&mut self, open: ptxd_proto::executor::OpenRing, reply: Replier) {
        let server = match ring::open_server(&open, self.fd_inbox.as_mut()) {
            Ok(server) => server,
            Err(message) => return reply.fail(FailureKind::InvalidHandle, message, &[]),
        };
        let name = format!("ptxd-ring-{}", open.stream);
        match RingHandle::spawn(server, HostRing { run: self.run }, name) {
            Ok(ring) => {
                // Replaces (and stops) a ring the stream had.
                self.rings.insert(open.stream, ring);
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

/// How long a host ring launch waits for its semaphore before it fails.
const HOST_SEMAPHORE_WAIT: Duration = Duration::from_secs(10);

/// A session's ring on the host backend: launches run on the ring's thread,
/// one at a time, in descriptor order; semaphores are words in the
/// session's shared memory.
struct HostRing {
    run: RunConfig,
}

/// The semaphore word of a checked operation: aligned to its width (the
/// descriptor's decoder checks the offset, and mappings are page aligned)
/// and inside its mapping (the ring's checks).
fn semaphore_word(semaphore: &ring::CheckedSemaphore<'_, Arc<Mapping>>) -> *mut u8 {
    // SAFETY: the ring's checks put `offset + width` inside the mapping.
    unsafe {
        semaphore
            .buffer
            .base
            .as_ptr()
            .add(semaphore.op.offset as usize)
    }
}

fn semaphore_load(semaphore: &ring::CheckedSemaphore<'_, Arc<Mapping>>) -> u64 {
    let word = semaphore_word(semaphore);
    match semaphore.op.width {
        // SAFETY: an aligned word inside a live shared mapping (see
        // `semaphore_word`); other processes write it, hence atomics.
        SemaphoreWidth::Bits32 => unsafe {
            u64::from((*word.cast::<std::sync::atomic::AtomicU32>()).load(Ordering::Acquire))
        },
        // SAFETY: as above.
        SemaphoreWidth::Bits64 => unsafe {
            (*word.cast::<std::sync::atomic::AtomicU64>()).load(Ordering::Acquire)
        },
    }
}

fn semaphore_store(semaphore: &ring::CheckedSemaphore<'_, Arc<Mapping>>) {
    let word = semaphore_word(semaphore);
    let value = semaphore.op.value;
    match semaphore.op.width {
        // SAFETY: as in `semaphore_load`; a 32-bit operation's value fits
        // (the descriptor's decoder checks it).
        SemaphoreWidth::Bits32 => unsafe {
            (*word.cast::<std::sync::atomic::AtomicU32>()).store(value as u32, Ordering::Release)
        },
        // SAFETY: as above.
        SemaphoreWidth::Bits64 => unsafe {
            (*word.cast::<std::sync::atomic::AtomicU64>()).store(value, Ordering::Release)
        },
    }
}

impl RingBackend for HostRing {
    type Kernel = Arc<HostKernel>;
    type Buffer = Arc<Mapping>;

    fn launch(
        &mut self,
        launch: RingLaunch<'_, Arc<HostKernel>, Arc<Mapping>>,
    ) -> Result<(), Error> {
        if let Some(wait) = &launch.wait {
            let deadline = Instant::now() + HOST_SEMAPHORE_WAIT;
            while semaphore_load(wait) < wait.op.value {
                if Instant::now() > deadline {
                    if let Some(signal) = &launch.signal {
                        semaphore_store(signal);
                    }
                    return Err(ring::failure(
                        FailureKind::KernelTimeout,
                        "the launch's semaphore wait did not end within 10 s",
                    ));
                }
                std::thread::yield_now();
            }
        }
        let mut operands = Vec::with_capacity(launch.operands.len());
        for (index, (mapping, offset)) in launch.operands.iter().enumerate() {
            let name = if index + 1 == launch.operands.len() {
                "output".to_string()
            } else {
                format!("input {index}")
            };
            let offset = usize::try_from(*offset)
                .ok()
                .filter(|o| *o <= mapping.len)
                .ok_or_else(|| {
                    ring::failure(
                        FailureKind::OutOfBounds,
                        format!("{name}: offset past the mapping"),
                    )
                })?;
            operands.push((name, Arc::clone(mapping), offset));
        }
        let result = execute(
            &launch.kernel.kernel,
            &operands,
            launch.n,
            &launch.scalars,
            self.run,
        );
        // The signal is written whatever the outcome: a waiter must not
        // block forever on a launch that failed.
        if let Some(signal) = &launch.signal {
            semaphore_store(signal);
        }
        result.map_err(|f| ring::failure(f.kind, f.message))
    }

    fn release_signal(&mut self, signal: ring::CheckedSemaphore<'_, Arc<Mapping>>) {
        semaphore_store(&signal);
    }
}
