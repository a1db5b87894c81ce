//! Ordering between a launch ring and the session's own CUDA streams, on
//! the GPU: no reply from ptxd is waited for in either direction.
//!
//! ```no_run
//! # async fn demo(session: &ptxd_client::Session, kernel: &ptxd_client::Kernel,
//! #               a: &ptxd_client::Buffer, b: &ptxd_client::Buffer,
//! #               out: &ptxd_client::Buffer,
//! #               dev: &ptxd_client::cuda::CudaDevice) -> Result<(), ptxd_client::Error> {
//! use std::sync::Arc;
//! let words = Arc::new(dev.alloc(ptxd_client::ORDERING_BYTES)?);
//! let words_buf = session
//!     .register_cuda_ipc(words.ipc_handle()?, dev.uuid(), ptxd_client::ORDERING_BYTES as u64)
//!     .await?;
//! let stream = dev.stream()?;
//! let mut ring = session.open_ring(256, dev.uuid()).await?;
//! ring.order_with(&words_buf, words)?;
//! // ... the session's own kernels on `stream` write `a` ...
//! ring.after(&stream)?; // the next launch waits for them
//! let ticket = ring.launch(kernel, &[(a, 0), (b, 0)], (out, 0), 1024, &[])?;
//! ring.stream_wait(ticket, &stream)?; // later work on `stream` waits for it
//! // ... the session's kernels on `stream` read `out` ...
//! # Ok(()) }
//! ```
//!
//! Two 64-bit words of a buffer the session registered carry the order:
//!
//! - word 0 (`done`): every launch of an ordered ring signals its ticket
//!   there, after its kernel (ptxd writes it also when the launch is refused
//!   or fails, and the SDK writes it when the executor is lost), so
//!   "ticket t is done" is "done >= t": tickets only grow.
//! - word 1 (`after`): [`LaunchRing::after`] enqueues on the session's
//!   stream a write of a count that only grows, and the ring's next launch
//!   waits until the word reaches it.
//!
//! One pair of words serves one ring: two rings ordered on the same words
//! would overwrite each other's tickets.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ptxd_cuda::{batch_mem_ops_raw, CUstream, MemOp};

use crate::cuda::{ClientStream, CudaError, DeviceWords};
use crate::ring::{Descriptor, OperandRef, SemaphoreOp, SemaphoreWidth};
use crate::session::Kernel;
use crate::types::Buffer;
use crate::Error;

use super::{LaunchRing, RingCompletion, RingRefusal};

/// Bytes of the semaphore buffer [`LaunchRing::order_with`] needs: the
/// `done` and `after` words.
pub const ORDERING_BYTES: usize = 16;

/// Byte offset of the word ptxd signals each launch's ticket to.
const DONE_WORD: u64 = 0;
/// Byte offset of the word the session's stream writes for `after`.
const AFTER_WORD: u64 = 8;

/// A ring's ordering state.
#[derive(Debug)]
pub(super) struct GpuOrdering {
    /// The semaphore buffer's index in the session's table.
    buffer: u32,
    /// This process's view of it (what stream operations address).
    memory: Arc<dyn DeviceWords>,
    /// The first ticket launched with ordering on.
    first_ticket: u64,
    /// The last count `after` enqueued.
    after: u64,
    /// A wait the next launch takes: `after >= this`.
    pending: Option<u64>,
}

impl GpuOrdering {
    fn op(&self, offset: u64, value: u64) -> SemaphoreOp {
        SemaphoreOp {
            buffer: self.buffer,
            offset,
            value,
            width: SemaphoreWidth::Bits64,
        }
    }

    /// `descriptor` with the ordering's wait (if `after` was called since
    /// the last launch) and its signal.
    pub(super) fn apply(&self, descriptor: Descriptor) -> Result<Descriptor, Error> {
        let invalid = |e: crate::ring::DescriptorError| Error::InvalidInput(e.to_string());
        let done = self.op(DONE_WORD, descriptor.ticket);
        let mut descriptor = descriptor.with_signal(done).map_err(invalid)?;
        if let Some(count) = self.pending {
            descriptor = descriptor
                .with_wait(self.op(AFTER_WORD, count))
                .map_err(invalid)?;
        }
        Ok(descriptor)
    }

    /// The launch that [`apply`](Self::apply) prepared was submitted: its
    /// wait is taken.
    pub(super) fn submitted(&mut self) {
        self.pending = None;
    }
}

impl LaunchRing {
    /// Orders this ring's launches against the session's own CUDA streams
    /// on the GPU (see the module docs): `buffer` is a registration of
    /// `memory` (at least [`ORDERING_BYTES`]; a
    /// [`DeviceAllocation`](crate::cuda::DeviceAllocation) registered by
    /// CUDA IPC handle, or an
    /// [`ExportableAllocation`](crate::cuda::ExportableAllocation)
    /// registered by descriptor), on the ring's device, used by no other
    /// ring. Its two words are zeroed here, and it is bound for
    /// release ([`bind_semaphores`](Self::bind_semaphores)). From then on
    /// every launch signals its ticket, [`stream_wait`](Self::stream_wait)
    /// and [`after`](Self::after) work, and
    /// [`launch_ordered`](Self::launch_ordered) takes no semaphores of its
    /// own. Call it before the first launch; a second call is refused.
    pub fn order_with<M: DeviceWords + 'static>(
        &mut self,
        buffer: &Buffer,
        memory: Arc<M>,
    ) -> Result<(), Error> {
        if self.ordering.is_some() {
            return Err(Error::InvalidInput("the ring is already ordered".into()));
        }
        if buffer.size < ORDERING_BYTES as u64 {
            return Err(Error::InvalidInput(format!(
                "the ordering buffer holds {} bytes; it needs {ORDERING_BYTES}",
                buffer.size
            )));
        }
        if self.outstanding() > 0 {
            return Err(Error::InvalidInput(
                "order the ring before launching on it: launches are outstanding".into(),
            ));
        }
        self.bind_semaphores(buffer, memory.clone())?;
        DeviceWords::store_word(&*memory, DONE_WORD as usize, SemaphoreWidth::Bits64, 0)?;
        DeviceWords::store_word(&*memory, AFTER_WORD as usize, SemaphoreWidth::Bits64, 0)?;
        self.ordering = Some(GpuOrdering {
            buffer: buffer.ring_index,
            memory,
            first_ticket: self.next_ticket,
            after: 0,
            pending: None,
        });
        Ok(())
    }

    fn ordering(&self) -> Result<&GpuOrdering, Error> {
        self.ordering
            .as_ref()
            .ok_or_else(|| Error::InvalidInput("the ring is not ordered: call order_with".into()))
    }

    /// Makes the work enqueued on `stream` after this call wait until the
    /// launch `ticket` of this ring has ended on the GPU (or was refused,
    /// or its executor was lost): `cuStreamWaitValue64` on the ring's
    /// `done` word. Returns at once; nothing waits for ptxd's reply.
    pub fn stream_wait(&self, ticket: u64, stream: &ClientStream) -> Result<(), Error> {
        let ordering = self.ordering()?;
        if ticket < ordering.first_ticket || ticket >= self.next_ticket {
            return Err(Error::InvalidInput(format!(
                "ticket {ticket} was not launched on this ring since it was ordered (tickets {}..{})",
                ordering.first_ticket, self.next_ticket
            )));
        }
        stream.wait_until(
            &*ordering.memory,
            DONE_WORD as usize,
            SemaphoreWidth::Bits64,
            ticket,
        )?;
        Ok(())
    }

    /// Makes the ring's next launch wait on the GPU until the work enqueued
    /// on `stream` so far has ended: `cuStreamWriteValue64` of a new count
    /// on `stream`, and a wait for it in the next launch's descriptor.
    /// Returns at once.
    pub fn after(&mut self, stream: &ClientStream) -> Result<(), Error> {
        let ordering = self.ordering()?;
        let count = ordering.after + 1;
        stream.write_after(
            &*ordering.memory,
            AFTER_WORD as usize,
            SemaphoreWidth::Bits64,
            count,
        )?;
        if let Some(ordering) = self.ordering.as_mut() {
            ordering.after = count;
            ordering.pending = Some(count);
        }
        Ok(())
    }
}

/// One launch of [`LaunchRing::launch_on_raw_stream`]: operands by the
/// session's ring indices (what [`Buffer::ring_index`] holds) and byte
/// offsets.
#[derive(Debug, Clone, Copy)]
pub struct RawStreamLaunch<'a> {
    /// The kernel.
    pub kernel: &'a Kernel,
    /// The inputs.
    pub inputs: &'a [OperandRef],
    /// The output.
    pub output: OperandRef,
    /// The element count.
    pub n: u64,
    /// The trailing f32 parameters.
    pub scalars: &'a [f32],
    /// Typed scalar args (the kernel's scalar params in order), instead of
    /// `scalars`; empty for none.
    pub args: &'a [crate::Arg],
}

/// How [`LaunchRing::launch_on_raw_stream_with`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawStreamOptions {
    /// Each launch completes once it ran, not once ptxd enqueued it.
    pub sync: bool,
    /// The longest wait for any one completion.
    pub timeout: Duration,
    /// Deferred completions: an async call returns once its descriptors are
    /// published and its stream operations enqueued, without waiting for
    /// ptxd's answers; a later call reads them (see
    /// [`RawStreamOutcome::deferred`]). A sync call still waits.
    pub defer: bool,
}

/// What [`LaunchRing::launch_on_raw_stream_with`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawStreamOutcome {
    /// Whether this call's launches were submitted. A deferred call
    /// submits nothing when it read a refusal of an earlier launch first
    /// (in [`deferred`](Self::deferred)): the caller reports that one, and
    /// this call's launches were not sent.
    pub submitted: bool,
    /// This call's completions, in order, once all came back; empty for a
    /// deferred async call (a later call reads them).
    pub completions: Vec<RingCompletion>,
    /// With [`RawStreamOptions::defer`]: the refusals and failures of
    /// earlier calls' launches this call read (their completions came back
    /// since). Empty otherwise (a call that is not deferred reads the
    /// completions an earlier, failed call left, and drops them).
    pub deferred: Vec<RingRefusal>,
}

/// Nanoseconds each phase of one
/// [`LaunchRing::launch_on_raw_stream_with`] call took (what the Python
/// client's `profile_launch.py` prints).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RawStreamPhases {
    /// Reading the completions earlier calls left.
    pub earlier_ns: u64,
    /// The stream memory operations (one `cuStreamBatchMemOp`, the
    /// context binding included).
    pub memops_ns: u64,
    /// Building and publishing the descriptors (and waking the executor).
    pub submit_ns: u64,
    /// Waiting for this call's completions (0 when deferred).
    pub wait_ns: u64,
}

/// Nanoseconds since `*mark`, which moves to now.
fn lap(mark: &mut Instant) -> u64 {
    let now = Instant::now();
    let ns = now.duration_since(*mark).as_nanos();
    *mark = now;
    u64::try_from(ns).unwrap_or(u64::MAX)
}

impl LaunchRing {
    /// Launches `launches`, in order, ordered on a stream this SDK did not
    /// create (a framework's, given as its `CUstream` address) by the
    /// ring's words (see the module docs): the first launch waits on the
    /// GPU for the work enqueued on `stream` so far, and the work enqueued
    /// on `stream` after this call waits for the last launch. Returns each
    /// launch's completion, in order, once all came back (an async launch
    /// completes once ptxd enqueued it; with `sync`, once it ran).
    ///
    /// The stream operations are one `cuStreamBatchMemOp` (write the
    /// `after` count, then wait for `done` to reach the last ticket),
    /// enqueued once every launch is submitted, when the launches are async
    /// and fit in the ring's free slots; otherwise the write is enqueued
    /// before the first submission (a sync launch, or a wait for a free
    /// slot, needs the launches before it to run) and the wait after the
    /// last. Should a launch not be submitted (the ring was orphaned), the
    /// stream still waits for the ones that were, and the error is
    /// returned.
    ///
    /// # Safety
    /// `stream` must be 0, `CU_STREAM_LEGACY` (1), `CU_STREAM_PER_THREAD`
    /// (2) or a live stream of the primary context of the ring's device, as
    /// the ordering memory's context is (e.g. `torch.cuda.current_stream()`
    /// of that device); and no other thread enqueues work on the ring's
    /// words meanwhile (one ring per stream: two streams writing one
    /// `after` word could let a launch pass the other stream's work).
    pub unsafe fn launch_on_raw_stream(
        &mut self,
        stream: usize,
        launches: &[RawStreamLaunch<'_>],
        sync: bool,
        timeout: Duration,
    ) -> Result<Vec<RingCompletion>, Error> {
        let options = RawStreamOptions {
            sync,
            timeout,
            defer: false,
        };
        // SAFETY: the caller's contract, passed on.
        unsafe { self.launch_on_raw_stream_with(stream, launches, options, None) }
            .map(|outcome| outcome.completions)
    }

    /// As [`launch_on_raw_stream`](Self::launch_on_raw_stream), with
    /// deferred completions as `options` says, and each phase's time
    /// written to `phases` when given.
    ///
    /// A deferred async call first reads, without waiting, the completions
    /// that came back since the last call (and waits for as many as it
    /// needs free slots); when one of them is a refusal or a failure it
    /// submits nothing and returns them in
    /// [`RawStreamOutcome::deferred`]. Otherwise it submits, enqueues the
    /// one `cuStreamBatchMemOp` and returns: the order on the GPU is the
    /// same as with the completions awaited (ptxd writes the `done` word
    /// also for a refused launch), only the answer comes later.
    ///
    /// # Safety
    /// As [`launch_on_raw_stream`](Self::launch_on_raw_stream).
    pub unsafe fn launch_on_raw_stream_with(
        &mut self,
        stream: usize,
        launches: &[RawStreamLaunch<'_>],
        options: RawStreamOptions,
        mut phases: Option<&mut RawStreamPhases>,
    ) -> Result<RawStreamOutcome, Error> {
        let RawStreamOptions {
            sync,
            timeout,
            defer,
        } = options;
        let mut mark = Instant::now();
        self.ordering()?;
        let mut outcome = RawStreamOutcome {
            submitted: false,
            completions: Vec::new(),
            deferred: Vec::new(),
        };
        if launches.is_empty() && !defer {
            return Ok(outcome);
        }
        let slots = u64::from(self.submitter.layout().slots());
        let deferred_async = defer && !sync;
        if deferred_async {
            // What came back since the last call, then as many as this
            // call needs free slots.
            while let Some(completion) = self.poll()? {
                outcome.deferred.extend(completion.outcome.err());
            }
            let needed = (launches.len() as u64).min(slots);
            while slots.saturating_sub(self.outstanding()) < needed {
                match self.wait(timeout)? {
                    Some(completion) => outcome.deferred.extend(completion.outcome.err()),
                    None => return Err(completion_timeout(timeout)),
                }
            }
        } else {
            // Completions an earlier call left are not this call's: read
            // them first.
            while self.outstanding() > 0 {
                match self.wait(timeout)? {
                    Some(completion) if defer => outcome.deferred.extend(completion.outcome.err()),
                    Some(_) => {}
                    None => return Err(completion_timeout(timeout)),
                }
            }
        }
        if let Some(phases) = phases.as_deref_mut() {
            phases.earlier_ns = lap(&mut mark);
        }
        if launches.is_empty() || !outcome.deferred.is_empty() {
            return Ok(outcome);
        }
        let ordering = self.ordering()?;
        let memory = ordering.memory.clone();
        let after_addr = memory.word_address(AFTER_WORD as usize, SemaphoreWidth::Bits64)?;
        let done_addr = memory.word_address(DONE_WORD as usize, SemaphoreWidth::Bits64)?;
        let count = ordering.after + 1;
        let free = slots.saturating_sub(self.outstanding());
        let batched = !sync && (launches.len() as u64) <= free;
        let stream = stream as CUstream;
        let write = MemOp::Write {
            addr: after_addr,
            value: count,
            wide: true,
        };
        let mut memops_ns = 0;
        if !batched {
            memory.bind_context()?;
            // SAFETY: the word lies in the ordering memory (checked by
            // `word_address`), which the ring keeps alive; the stream is the
            // caller's contract and the memory's context is bound.
            unsafe { batch_mem_ops_raw(stream, &[write]) }.map_err(CudaError::from)?;
            memops_ns = lap(&mut mark);
        }
        if let Some(ordering) = self.ordering.as_mut() {
            ordering.after = count;
            ordering.pending = Some(count);
        }
        outcome.submitted = true;
        let mut completions = Vec::with_capacity(if deferred_async { 0 } else { launches.len() });
        let mut last = None;
        let mut failure = None;
        for launch in launches {
            if self.outstanding() >= slots {
                match self.wait(timeout) {
                    Ok(Some(completion)) => completions.push(completion),
                    Ok(None) => {
                        failure = Some(completion_timeout(timeout));
                        break;
                    }
                    Err(e) => {
                        failure = Some(e);
                        break;
                    }
                }
            }
            match self.submit_indexed(launch, sync) {
                Ok(ticket) => {
                    if let Some(ordering) = self.ordering.as_mut() {
                        ordering.submitted();
                    }
                    last = Some(ticket);
                }
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        let submit_ns = lap(&mut mark);
        let enqueued = match last {
            Some(ticket) => {
                let wait = MemOp::WaitGeq {
                    addr: done_addr,
                    value: ticket,
                    wide: true,
                };
                let ops: &[MemOp] = if batched { &[write, wait] } else { &[wait] };
                memory.bind_context().and_then(|()| {
                    // SAFETY: as above.
                    unsafe { batch_mem_ops_raw(stream, ops) }.map_err(CudaError::from)
                })
            }
            None => {
                // Nothing was submitted: no launch takes the wait.
                if let Some(ordering) = self.ordering.as_mut() {
                    ordering.pending = None;
                }
                Ok(())
            }
        };
        memops_ns += lap(&mut mark);
        if let Some(phases) = phases.as_deref_mut() {
            phases.memops_ns = memops_ns;
            phases.submit_ns = submit_ns;
        }
        if let Err(e) = enqueued {
            // The submitted launches wait on the GPU for a count the stream
            // will not write: write it from here, so ptxd's stream is not
            // blocked for good. Their order against `stream` is lost; the
            // error says so.
            if batched {
                if let Err(store) =
                    memory.store_word(AFTER_WORD as usize, SemaphoreWidth::Bits64, count)
                {
                    tracing::warn!(error = %store, "releasing a ring's launches after a failed stream operation");
                }
            }
            return Err(e.into());
        }
        if let Some(e) = failure {
            return Err(e);
        }
        if !deferred_async {
            while completions.len() < launches.len() {
                match self.wait(timeout)? {
                    Some(completion) => completions.push(completion),
                    None => return Err(completion_timeout(timeout)),
                }
            }
        }
        if let Some(phases) = phases {
            phases.wait_ns = lap(&mut mark);
        }
        outcome.completions = completions;
        Ok(outcome)
    }

    /// Waits for every outstanding launch's completion (deferred ones
    /// included) and returns the refusals and failures among them, in
    /// ticket order. A completion that does not come within `timeout` is
    /// an error.
    pub fn drain(&mut self, timeout: Duration) -> Result<Vec<RingRefusal>, Error> {
        let mut refused = Vec::new();
        while self.outstanding() > 0 {
            match self.wait(timeout)? {
                Some(completion) => refused.extend(completion.outcome.err()),
                None => return Err(completion_timeout(timeout)),
            }
        }
        Ok(refused)
    }
}

impl LaunchRing {
    /// Submits one launch of [`launch_on_raw_stream`](Self::launch_on_raw_stream)
    /// with the ordering's wait and signal; returns its ticket.
    fn submit_indexed(&mut self, launch: &RawStreamLaunch<'_>, sync: bool) -> Result<u64, Error> {
        let descriptor = if launch.args.is_empty() {
            self.indexed_descriptor(
                launch.kernel,
                launch.inputs,
                launch.output,
                launch.n,
                launch.scalars,
            )?
        } else {
            self.indexed_descriptor_args(
                launch.kernel,
                launch.inputs,
                launch.output,
                launch.n,
                launch.args,
            )?
            .with_scalars(launch.scalars)
            .map_err(|e| Error::InvalidInput(e.to_string()))?
        };
        let descriptor = self.ordering()?.apply(descriptor.with_sync(sync))?;
        self.submit(&descriptor)?;
        Ok(descriptor.ticket)
    }
}

fn completion_timeout(timeout: Duration) -> Error {
    Error::Protocol(format!(
        "launch ring: no completion within {timeout:?} (the executor is stalled, or a sync launch is still running)"
    ))
}
