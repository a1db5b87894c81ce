//! A session's launch ring on a CUDA device (see [`crate::executor::ring`]):
//! the ring's thread enqueues each checked launch on the session's stream,
//! with its semaphore wait before and its signal after, as stream memory
//! operations on words of the session's registered buffers.
//!
//! Invariants:
//! - A launch's addresses come from the ring's capability table, checked by
//!   the launch checks; a buffer leaves the table (under its lock) before
//!   the request loop unmaps it, and a close drains the context first.
//! - A signal is written whether the kernel runs or the launch is refused
//!   (before the grid check fails, too), so no stream waits forever on it.
//! - A sticky driver error ends the process, as it does on the request
//!   loop's path: the context is poisoned for every session.
//! - With `--max-kernel-time`, every ring launch with a kernel is watched
//!   ([`super::watchdog`]): up to `RING_GROUP` launches share a marker (the
//!   stream's next sequence number, written by a stream memory operation
//!   into the queue's pinned progress word: no event, and no driver call
//!   for the watchdog to read it) and an allowance of the budget per
//!   launch; a launch that waits on a semaphore, a sync launch and the last
//!   launch before the ring sleeps (its spin found nothing more) close
//!   their group at once; past the allowance the executor reports
//!   `KERNEL_TIMEOUT` against the session and restarts.
//! - A kernel is launched through the parameter block prepared when it was
//!   granted ([`super::prepared`]): per launch only its operand, count and
//!   scalar words are written; it is enqueued through the kernel's graph,
//!   re-aimed per launch, and a watchdog marker due after it goes in the
//!   same graph (its write node), unless a signal follows, which carries
//!   the marker in its own batch.

use std::sync::Arc;

use ptxd_cuda::{DriverError, HostWord, MemOp, PrimaryContext, Stream, WordWrite};
use ptxd_ipc::ring::SemaphoreWidth;
use ptxd_proto::executor::FailureKind;

use super::prepared::{RingKernel, Submit};
use super::watchdog::{Marker, Progress, RingWatch};
use super::{fail_driver, CudaBackend, MAX_GRID_X};
use crate::executor::child::{Channel, Replier};
use crate::executor::kernel_timeouts::TimeoutAllowance;
use crate::executor::ring::{
    self, CheckedSemaphore, RingBackend, RingHandle, RingLaunch, RingSession, TableHold,
};

impl CudaBackend {
    pub(super) fn start_ring(&mut self, open: ptxd_proto::executor::OpenRing, reply: Replier) {
        let server = match ring::open_server(&open, self.fd_inbox.as_mut()) {
            Ok(server) => server,
            Err(message) => return reply.fail(FailureKind::InvalidHandle, message, &[]),
        };
        let stream = match self.stream(open.stream) {
            Ok(s) => s,
            Err(e) => return fail_driver(reply, &e, "creating the session's stream"),
        };
        let watchdog = match self.watchdog(&reply) {
            Ok(w) => w,
            Err(e) => return fail_driver(reply, &e, "starting the watchdog"),
        };
        // The ring's groups are marked in a word of pinned host memory,
        // made once per session stream (a later ring of the stream goes on
        // with its sequence).
        let watch = match watchdog.map(|w| {
            RingWatch::attach(w.queue(open.stream), Arc::downgrade(&stream), || {
                HostWord::new().map(|word| Arc::new(word) as Arc<dyn Progress>)
            })
        }) {
            None => None,
            Some(Ok(watch)) => Some(watch),
            Some(Err(e)) => return fail_driver(reply, &e, "making the ring's progress word"),
        };
        let backend = CudaRing {
            stream,
            context: self.context.clone(),
            current: false,
            channel: reply.channel().clone(),
            watch,
            wait_limit: self.budget,
            addresses: Vec::with_capacity(crate::ptx::MAX_INPUTS + 1),
            scalar_bits: Vec::with_capacity(crate::ptx::MAX_SCALAR_PARAMS),
            busy: false,
        };
        let session = RingSession {
            stream: open.stream,
            channel: reply.channel().clone(),
            timeouts: Arc::new(TimeoutAllowance::new(
                open.kernel_timeouts,
                open.max_kernel_timeouts,
            )),
        };
        // The ring it replaces is stopped now and waited for on the new
        // ring's thread, never here.
        let previous = self.rings.remove(&open.stream);
        let name = format!("ptxd-ring-{}", open.stream);
        match RingHandle::spawn(server, backend, name, session, previous) {
            Ok(ring) => {
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

/// A session's ring on a CUDA device: launches are enqueued by the ring's
/// thread on the session's stream; semaphores are stream memory operations
/// on words of the session's buffers.
struct CudaRing {
    stream: Arc<Stream>,
    context: Arc<PrimaryContext>,
    current: bool,
    channel: Channel,
    /// The ring's side of the watchdog (none without `--max-kernel-time`):
    /// its queue is the ring's own lock, shared with nothing but the
    /// session's gRPC launches and the poller.
    watch: Option<RingWatch>,
    /// How long a semaphore wait may stay unsatisfied on the stream before
    /// the watchdog treats it as a kernel timeout (the per-launch budget).
    wait_limit: Option<std::time::Duration>,
    /// The operands' device addresses of the launch being enqueued, kept
    /// for the next one (at most `MAX_INPUTS + 1`).
    addresses: Vec<u64>,
    /// The scalars' bits of the launch being enqueued, kept for the next
    /// one (at most `MAX_SCALAR_PARAMS`).
    scalar_bits: Vec<u64>,
    /// Whether this ring counts in [`BUSY_RINGS`]: from its first launch
    /// after it was idle until its spin finds nothing more.
    busy: bool,
}

/// The executor's rings that are launching (not idle) now. A kernel goes
/// through its graph only while its ring is the one launching: a graph
/// launch costs about half a `cuLaunchKernel` on one thread (2.2 against
/// 4.3 µs on the H200), but nearly all of it is serialized inside the
/// driver, so 16 rings launching at once through graphs enqueued 400k–452k
/// launches a second against 593k–630k through `cuLaunchKernel` (runs AW,
/// AX in docs/benchmarks-history.md).
static BUSY_RINGS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl CudaRing {
    /// Counts this ring as launching (once per busy spell); whether it is
    /// the only one, so its kernels go through their graphs.
    fn launching_alone(&mut self) -> bool {
        use std::sync::atomic::Ordering;
        if !self.busy {
            self.busy = true;
            BUSY_RINGS.fetch_add(1, Ordering::Relaxed);
        }
        BUSY_RINGS.load(Ordering::Relaxed) <= 1
    }

    /// Counts this ring as idle again.
    fn rest(&mut self) {
        if std::mem::take(&mut self.busy) {
            BUSY_RINGS.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl CudaRing {
    fn driver(&self, error: DriverError, doing: &str) -> crate::error::Error {
        if error.is_sticky() {
            // The context is poisoned for every session: end the process,
            // as the request loop does (the front restarts the executor).
            self.channel.fatal(
                &error.name,
                &format!("the device faulted ({doing}: {error}); the executor restarts"),
            );
        }
        ring::failure(FailureKind::Internal, format!("{doing}: {error}"))
    }

    /// Closes the watchdog's group of the launches enqueued since the last
    /// marker: the stream writes the group's sequence number after them.
    fn close_group(&mut self) -> Result<(), crate::error::Error> {
        let Some(watch) = self.watch.as_mut() else {
            return Ok(());
        };
        let stream = &self.stream;
        let closed = watch.close(|address, sequence| {
            // SAFETY: `address` is the device address of the queue's pinned
            // progress word, which the queue keeps until every group of it
            // has retired (the watchdog forgets only an empty queue no ring
            // holds), so it outlives this write.
            unsafe { stream.write_value(address, sequence, true) }
        });
        closed.map_err(|e| self.driver(e, "marking the launches' end for the watchdog"))
    }

    /// Enqueues `ops` with one driver call (none when empty).
    fn enqueue(&self, ops: &[MemOp], doing: &str) -> Result<(), crate::error::Error> {
        if ops.is_empty() {
            return Ok(());
        }
        // SAFETY: every semaphore word lies inside a granted buffer, aligned
        // to its width (the ring's checks), and stays mapped until the
        // stream is drained (a close drains the context first); a device
        // allocation cannot shrink under the executor, so no host access
        // and no SIGBUS is involved. The progress word is the queue's pinned
        // word, kept until every group of it has retired.
        let done = unsafe { self.stream.batch(ops) };
        done.map_err(|e| self.driver(e, doing))
    }
}

/// A semaphore's stream memory operation: wait until its word is at least
/// its value, or write its value.
fn semaphore_op(semaphore: &CheckedSemaphore<u64>, wait: bool) -> MemOp {
    let addr = semaphore.buffer + semaphore.op.offset;
    let value = semaphore.op.value;
    let wide = semaphore.op.width == SemaphoreWidth::Bits64;
    if wait {
        MemOp::WaitGeq { addr, value, wide }
    } else {
        MemOp::Write { addr, value, wide }
    }
}

/// The stream memory operations enqueued around one ring launch, at most
/// [`MemOps::MAX`], on the stack.
struct MemOps {
    ops: [MemOp; MemOps::MAX],
    len: usize,
}

impl MemOps {
    /// Before a kernel: the previous group's marker, the wait, the wait's
    /// start marker; after it: its group's marker and the signal.
    const MAX: usize = 3;

    fn new() -> Self {
        let none = MemOp::Write {
            addr: 0,
            value: 0,
            wide: false,
        };
        MemOps {
            ops: [none; MemOps::MAX],
            len: 0,
        }
    }

    /// Adds `op` (the launch path pushes at most [`MemOps::MAX`]).
    fn push(&mut self, op: MemOp) {
        if let Some(slot) = self.ops.get_mut(self.len) {
            *slot = op;
            self.len += 1;
        }
    }

    fn as_slice(&self) -> &[MemOp] {
        &self.ops[..self.len]
    }
}

impl Drop for CudaRing {
    fn drop(&mut self) {
        self.rest();
        // The ring's thread may drop the session stream's last handle (the
        // request loop no longer waits for the thread): destroy it with the
        // device's context current, as every other thread does.
        if !self.current {
            if let Err(e) = self.context.set_current() {
                tracing::warn!(error = %e, "cannot bind the device's context to release a ring");
            }
        }
    }
}

/// The grid of a launch: the contract's, where a Triton-family kernel
/// covers several elements per thread; refused past the driver's limit.
fn grid_of(launch: &RingLaunch<Arc<RingKernel>, u64>) -> Result<u64, crate::error::Error> {
    let kernel = &launch.kernel.kernel;
    let per_block = u64::from(kernel.block) * u64::from(kernel.elements_per_thread.max(1));
    let grid = launch.n.div_ceil(per_block);
    if grid > MAX_GRID_X {
        return Err(ring::failure(
            FailureKind::OutOfBounds,
            format!(
                "n = {} needs {grid} blocks; one launch covers at most {MAX_GRID_X}",
                launch.n
            ),
        ));
    }
    Ok(grid)
}

impl CudaRing {
    /// After a failed enqueue: the launch's signal is still written (a
    /// best effort: a waiter on the client's stream must not wait forever
    /// on a launch that will not run; after a sticky error the executor
    /// ends and the SDK writes it). Returns `error`.
    fn release_after_failure(
        &self,
        launch: &RingLaunch<Arc<RingKernel>, u64>,
        error: crate::error::Error,
    ) -> crate::error::Error {
        if let Some(signal) = &launch.signal {
            if let Err(e) = self.enqueue(&[semaphore_op(signal, false)], "a semaphore operation") {
                tracing::warn!(error = %e, "cannot release a failed launch's semaphore");
            }
        }
        error
    }
}

impl RingBackend for CudaRing {
    type Kernel = Arc<RingKernel>;
    type Buffer = u64;

    fn admit(&self, launch: &RingLaunch<Arc<RingKernel>, u64>) -> Result<(), crate::error::Error> {
        grid_of(launch).map(|_| ())
    }

    /// An async launch's answer means "in the session's stream, in
    /// order": it is given once the checks passed, before the driver's
    /// enqueue (see `ring::launch`).
    fn answers_on_acceptance(&self) -> bool {
        true
    }

    fn launch(
        &mut self,
        launch: RingLaunch<Arc<RingKernel>, u64>,
        mut hold: TableHold<'_, Arc<RingKernel>, u64>,
        _stop: &std::sync::atomic::AtomicBool,
    ) -> Result<(), crate::error::Error> {
        // The table stays locked until the launch is enqueued: a buffer's
        // address is unmapped only after its revoke (under this lock) and a
        // drain, so nothing enqueued here can name an unmapped buffer.
        if !self.current {
            self.context
                .set_current()
                .map_err(|e| self.driver(e, "binding the device's context"))?;
            self.current = true;
        }
        // Checked before the answer (`admit`); again here, as the launch's
        // own precondition.
        let grid = grid_of(&launch)?;
        // Watched like a gRPC launch, but a marker (a sequence number the
        // stream writes into the progress word) closes up to RING_GROUP
        // launches at once. A launch that waits on a semaphore gets a group
        // of its own, whose clock starts at a marker after the wait (a
        // launch waiting for its client is not running): the group before
        // it is closed before the wait. The operations before the kernel
        // go in one driver call, those after it in another.
        let watched = self.watch.is_some() && launch.n > 0;
        let progress = self
            .watch
            .as_ref()
            .filter(|_| watched)
            .map(RingWatch::progress_address);
        let mut before = MemOps::new();
        let mut previous = None;
        let mut started = None;
        if let Some(wait) = &launch.wait {
            if let (Some(watch), Some(at)) = (&self.watch, progress) {
                previous = watch.closing();
                if let Some(sequence) = previous {
                    before.push(MemOp::Write {
                        addr: at,
                        value: sequence,
                        wide: true,
                    });
                }
            }
            before.push(semaphore_op(wait, true));
            if let (Some(watch), Some(at)) = (&self.watch, progress) {
                let sequence = watch.start_marker();
                before.push(MemOp::Write {
                    addr: at,
                    value: sequence,
                    wide: true,
                });
                started = Some(sequence);
            }
        }
        if let Err(e) = self.enqueue(before.as_slice(), "a semaphore wait") {
            return Err(self.release_after_failure(&launch, e));
        }
        if let (Some(sequence), Some(watch)) = (previous, self.watch.as_mut()) {
            watch.commit(sequence, None, None);
        }
        // A semaphore that never fires is a timeout too: the watchdog
        // blames the wait once it has been pending for the budget.
        let wait_deadline = started
            .and(self.wait_limit)
            .map(|limit| std::time::Instant::now() + limit);
        // The group closes with this kernel when it fills it, or when the
        // launch waited or syncs. Its marker goes in the kernel's own
        // submission (the graph's write node) unless a signal follows,
        // which the batch after the kernel then carries with it.
        let closing = match (&self.watch, progress) {
            (Some(watch), Some(_)) => watch.closing_with_next(launch.sync || started.is_some()),
            _ => None,
        };
        let mut marker_in_launch = match (closing, progress) {
            (Some(value), Some(addr)) if launch.signal.is_none() => Some(WordWrite { addr, value }),
            _ => None,
        };
        let graph = self.launching_alone();
        if launch.n > 0 {
            // Reused from launch to launch: no allocation of its own here.
            let mut addresses = std::mem::take(&mut self.addresses);
            addresses.clear();
            addresses.extend(launch.operands.iter().map(|(base, offset)| base + offset));
            // Typed args' bits, or the f32 scalars' (the launch check let
            // through one or the other, never both).
            let mut scalars = std::mem::take(&mut self.scalar_bits);
            scalars.clear();
            if launch.args.is_empty() {
                scalars.extend(launch.scalars.iter().map(|s| u64::from(s.to_bits())));
            } else {
                scalars.extend_from_slice(&launch.args);
            }
            // SAFETY: every address lies in a granted buffer with room for
            // its operand's footprint at n (the launch checks, against the
            // kernel's contract or its signature), and a buffer is unmapped
            // only after its revoke and a drain; the marker's word is the
            // queue's pinned progress word, kept until every group of it
            // has retired.
            let launched = unsafe {
                launch.kernel.enqueue(
                    &self.stream,
                    grid as u32,
                    &addresses,
                    launch.n,
                    &scalars,
                    Submit {
                        marker: marker_in_launch,
                        graph,
                    },
                )
            };
            self.addresses = addresses;
            self.scalar_bits = scalars;
            match launched {
                Ok(true) => {}
                // The kernel is enqueued but its marker is not: the batch
                // after it writes the marker instead.
                Ok(false) => marker_in_launch = None,
                Err(e) => {
                    let e = self.driver(e, "launching the kernel");
                    return Err(self.release_after_failure(&launch, e));
                }
            }
        }
        let mut after = MemOps::new();
        if let Some(watch) = self.watch.as_mut().filter(|_| watched) {
            watch.count();
        }
        if let (Some(sequence), Some(at), None) = (closing, progress, marker_in_launch) {
            after.push(MemOp::Write {
                addr: at,
                value: sequence,
                wide: true,
            });
        }
        // Written whatever the kernel does: a waiter on the client's stream
        // is released once the kernel has ended.
        if let Some(signal) = &launch.signal {
            after.push(semaphore_op(signal, false));
        }
        if let Err(e) = self.enqueue(after.as_slice(), "marking the launch's end") {
            // The batch carried the signal: it is written on its own.
            return Err(self.release_after_failure(&launch, e));
        }
        if let (Some(sequence), Some(watch)) = (closing, self.watch.as_mut()) {
            watch.commit(sequence, started.map(Marker::Sequence), wait_deadline);
        }
        // Everything is enqueued: what follows waits on the stream, which
        // a client's semaphore can hold up, so the table is let go first.
        hold.release();
        if launch.sync {
            self.stream
                .synchronize()
                .map_err(|e| self.driver(e, "synchronizing the session's stream"))?;
        }
        Ok(())
    }

    fn idle(&mut self) {
        self.rest();
        // The last launches get their marker once the ring's spin found
        // nothing more to enqueue (tens of microseconds, against a budget
        // of seconds), so a kernel that never ends is always watched.
        if let Err(e) = self.close_group() {
            tracing::warn!(error = %e, "cannot mark ring launches for the watchdog");
        }
    }

    fn release_signal(
        &mut self,
        signal: CheckedSemaphore<u64>,
        _hold: TableHold<'_, Arc<RingKernel>, u64>,
    ) {
        // Enqueued under the table lock (see `launch`).
        if let Err(e) = self.enqueue(&[semaphore_op(&signal, false)], "a semaphore operation") {
            tracing::warn!(error = %e, "cannot release a refused launch's semaphore");
        }
    }
}
