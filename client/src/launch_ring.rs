//! A session's launch ring, as the SDK offers it: launches written to shared
//! memory that the device's executor takes directly, without gRPC.
//!
//! ```no_run
//! # async fn demo(session: &ptxd_client::Session, kernel: &ptxd_client::Kernel,
//! #               a: &ptxd_client::Buffer, b: &ptxd_client::Buffer,
//! #               out: &ptxd_client::Buffer) -> Result<(), ptxd_client::Error> {
//! use std::time::Duration;
//! let mut ring = session.open_ring(256, 0).await?;
//! let ticket = ring.launch(kernel, &[(a, 0), (b, 0)], (out, 0), 1024, &[])?;
//! let done = ring.wait(Duration::from_secs(1))?.expect("a completion");
//! assert_eq!(done.ticket, ticket);
//! assert_eq!(done.outcome, Ok(()), "refused: {:?}", done.outcome);
//! # Ok(()) }
//! ```
//!
//! Completions come back in submission order. A refused launch did not run;
//! its completion carries the same reason a unary `Launch` would have been
//! refused with. The ring lives as long as this value and the session, and
//! ends with the executor's generation.
//!
//! # No waiter blocks forever
//!
//! A launch's signal ("after the kernel, write b to this word") is written
//! by the executor whether the launch runs, fails or is refused. When the
//! executor dies, or the daemon exits, the SDK writes the signals that may
//! not have been written itself, from this process, as soon as the
//! session's lease reports it (an executor restart naming the ring's
//! generation, or the lease's end), before the event reaches
//! [`Session::events`](crate::Session::events): each word gets the value of
//! the last signal submitted for it. For that, the memory of every buffer a
//! signal names must be bound to the ring with
//! [`LaunchRing::bind_semaphores`]; a signal on an unbound buffer is
//! refused before it is submitted. The ring is then orphaned:
//! [`LaunchRing::orphaned`] says why and which words were written, and
//! submissions fail with [`Error::RingOrphaned`] (open a new ring in the new
//! generation, or a new session).
//!
//! A signal counts as written only once an `Ok` completion of a `sync`
//! launch (this one or a later one) came back: an async launch completes
//! once accepted (on CUDA before its enqueue, which follows at once), and
//! on CUDA its enqueued signal dies with the executor.
//! So the release may write a word the executor already wrote, with the
//! same value. The launches themselves did not run, or their results are
//! undefined (the session was dropped with launches in flight).

#[cfg(feature = "cuda")]
mod ordering;
mod release;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ptxd_proto::v1::Reason;

#[cfg(feature = "cuda")]
pub use ordering::{
    RawStreamLaunch, RawStreamOptions, RawStreamOutcome, RawStreamPhases, ORDERING_BYTES,
};
pub use release::{OrphanCause, Orphaned, ReleasedWord, SemaphoreMemory, WordWriteError};
pub(crate) use release::{ReleaseOnEnd, RingRegistry, RingShared};

use crate::session::Kernel;
use crate::types::{Arg, Buffer};
use crate::Error;
use ptxd_ipc::ring::{
    Completion, CompletionStatus, Descriptor, OperandRef, SemaphoreOp, SubmitError, Submitter,
    TypedArg,
};

/// A typed arg as the ring descriptor carries it.
fn typed_arg(arg: Arg) -> TypedArg {
    match arg {
        Arg::I32(v) => TypedArg::I32(v),
        Arg::U32(v) => TypedArg::U32(v),
        Arg::I64(v) => TypedArg::I64(v),
        Arg::U64(v) => TypedArg::U64(v),
        Arg::F32(v) => TypedArg::F32(v),
        Arg::F64(v) => TypedArg::F64(v),
    }
}

/// Why a ring launch did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ring launch {ticket} {}: {reason}", if *.failed { "failed" } else { "was refused" })]
pub struct RingRefusal {
    /// The launch's ticket.
    pub ticket: u64,
    /// The reason's wire name (`BUFFER_TOO_SMALL`, …), as in a refusal of
    /// a unary `Launch`; `UNKNOWN_<n>` for a number this SDK does not know.
    pub reason: String,
    /// True when the launch passed its checks and then failed (a fault, a
    /// lost executor); false when it was refused and nothing ran.
    pub failed: bool,
}

/// One answered ring launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingCompletion {
    /// The launch's ticket.
    pub ticket: u64,
    /// Ok, or why not.
    pub outcome: Result<(), RingRefusal>,
}

fn reason_name(number: u32) -> String {
    i32::try_from(number)
        .ok()
        .and_then(|n| Reason::try_from(n).ok())
        .map(|r| r.wire_name().to_string())
        .unwrap_or_else(|| format!("UNKNOWN_{number}"))
}

impl From<Completion> for RingCompletion {
    fn from(completion: Completion) -> Self {
        let ticket = completion.ticket;
        let outcome = match completion.status {
            CompletionStatus::Ok => Ok(()),
            CompletionStatus::Refused { reason } => Err(RingRefusal {
                ticket,
                reason: reason_name(reason),
                failed: false,
            }),
            CompletionStatus::Failed { reason } => Err(RingRefusal {
                ticket,
                reason: reason_name(reason),
                failed: true,
            }),
        };
        RingCompletion { ticket, outcome }
    }
}

/// How often [`LaunchRing::wait`] looks whether the ring was orphaned while
/// it waits for a completion that will then never come.
const ORPHAN_CHECK: Duration = Duration::from_millis(20);

/// A session's open launch ring (see the module docs).
#[derive(Debug)]
pub struct LaunchRing {
    submitter: Submitter,
    next_ticket: u64,
    shared: Arc<RingShared>,
    /// Set by [`order_with`](Self::order_with).
    #[cfg(feature = "cuda")]
    ordering: Option<ordering::GpuOrdering>,
}

fn ring_error(error: impl std::fmt::Display) -> Error {
    Error::Protocol(format!("launch ring: {error}"))
}

impl LaunchRing {
    pub(crate) fn new(submitter: Submitter, shared: Arc<RingShared>) -> Self {
        LaunchRing {
            submitter,
            next_ticket: 1,
            shared,
            #[cfg(feature = "cuda")]
            ordering: None,
        }
    }

    /// The shared-memory object's name (what the daemon opened).
    pub fn shm_name(&self) -> &str {
        self.submitter.name()
    }

    /// The device whose executor serves the ring.
    pub fn device_uuid(&self) -> &str {
        self.shared.device_uuid()
    }

    /// The executor generation serving the ring.
    pub fn generation(&self) -> u64 {
        self.shared.generation()
    }

    /// Launches not answered yet.
    pub fn outstanding(&self) -> u64 {
        self.submitter.outstanding()
    }

    /// Binds `memory`, this process's own view of `buffer` (the memory it
    /// registered), as where `buffer`'s semaphore words live: a signal may
    /// name `buffer` only once it is bound, so that the SDK can write the
    /// word itself if the executor is lost (see the module docs). A
    /// [`HostShm`](crate::HostShm) on the host backend, a
    /// [`cuda::DeviceAllocation`](crate::cuda::DeviceAllocation) or
    /// [`cuda::ExportableAllocation`](crate::cuda::ExportableAllocation) on
    /// CUDA.
    /// `memory` must hold at least the registered size, and `buffer` must
    /// be on the ring's device.
    pub fn bind_semaphores(
        &mut self,
        buffer: &Buffer,
        memory: Arc<dyn SemaphoreMemory>,
    ) -> Result<(), Error> {
        if buffer.device_uuid != self.device_uuid() {
            return Err(Error::InvalidInput(format!(
                "the buffer is on {}, the ring on {}",
                buffer.device_uuid,
                self.device_uuid()
            )));
        }
        if memory.byte_len() < buffer.size {
            return Err(Error::InvalidInput(format!(
                "the memory holds {} bytes, less than the {} registered",
                memory.byte_len(),
                buffer.size
            )));
        }
        self.shared.lock().bind(buffer.ring_index, memory);
        Ok(())
    }

    /// Why the ring was orphaned and which semaphore words the SDK wrote
    /// then; `None` while its executor lives (see the module docs).
    pub fn orphaned(&self) -> Option<Orphaned> {
        self.shared.lock().orphaned.clone()
    }

    /// Writes a prepared descriptor (its ticket is the caller's). Fails
    /// with `INVALID_INPUT` when the ring is full (wait for a completion)
    /// or when its signal names a buffer whose memory is not bound
    /// ([`bind_semaphores`](Self::bind_semaphores)), and with
    /// [`Error::RingOrphaned`] once the ring is orphaned.
    pub fn submit(&mut self, descriptor: &Descriptor) -> Result<(), Error> {
        // Held until the submission is in the ledger: an orphaning either
        // sees it or happened before it (and refuses it here).
        let mut state = self.shared.lock();
        state.admit(descriptor.signal())?;
        match self.submitter.try_submit(descriptor) {
            Ok(()) => {
                state.ledger.submitted(descriptor.sync, descriptor.signal());
                Ok(())
            }
            Err(SubmitError::Full) => Err(Error::InvalidInput(
                "the launch ring is full: wait for a completion".into(),
            )),
            Err(e) => Err(ring_error(e)),
        }
    }

    /// A descriptor for `kernel` over `n` elements (operands are a buffer and
    /// a byte offset), with a fresh ticket, to add semaphores to before
    /// [`submit`](Self::submit).
    pub fn descriptor(
        &mut self,
        kernel: &Kernel,
        inputs: &[(&Buffer, u64)],
        output: (&Buffer, u64),
        n: u64,
        scalars: &[f32],
    ) -> Result<Descriptor, Error> {
        let operand = |(buffer, offset): (&Buffer, u64)| OperandRef {
            buffer: buffer.ring_index,
            offset,
        };
        let inputs: Vec<OperandRef> = inputs.iter().copied().map(operand).collect();
        self.indexed_descriptor(kernel, &inputs, operand(output), n, scalars)
    }

    /// As [`descriptor`](Self::descriptor), with the operands already as
    /// the ring names them (a buffer's [`Buffer::ring_index`] and a byte
    /// offset).
    pub fn indexed_descriptor(
        &mut self,
        kernel: &Kernel,
        inputs: &[OperandRef],
        output: OperandRef,
        n: u64,
        scalars: &[f32],
    ) -> Result<Descriptor, Error> {
        let ticket = self.next_ticket;
        self.next_ticket = self.next_ticket.wrapping_add(1);
        Descriptor::new(ticket, kernel.ring_index(), inputs, output, n)
            .and_then(|d| d.with_scalars(scalars))
            .map_err(|e| Error::InvalidInput(e.to_string()))
    }

    /// As [`indexed_descriptor`](Self::indexed_descriptor), with typed
    /// scalar args (the kernel's scalar params in order, each exactly its
    /// param's type) instead of f32 scalars. The executor checks them
    /// against the kernel's contract and packs them by its param layout;
    /// a mismatch is refused in the launch's completion
    /// (`SCALAR_ARGS_MISMATCH`).
    pub fn indexed_descriptor_args(
        &mut self,
        kernel: &Kernel,
        inputs: &[OperandRef],
        output: OperandRef,
        n: u64,
        args: &[Arg],
    ) -> Result<Descriptor, Error> {
        let typed: Vec<TypedArg> = args.iter().map(|a| typed_arg(*a)).collect();
        self.indexed_descriptor(kernel, inputs, output, n, &[])?
            .with_args(&typed)
            .map_err(|e| Error::InvalidInput(e.to_string()))
    }

    /// As [`launch`](Self::launch), with typed scalar args (see
    /// [`indexed_descriptor_args`](Self::indexed_descriptor_args)): how a
    /// Triton-family kernel (`.u32` count, typed scalars, null scratch
    /// pointers, several elements per thread) is launched through the
    /// ring. ptxd passes the count, the nulls and computes the grid.
    pub fn launch_args(
        &mut self,
        kernel: &Kernel,
        inputs: &[(&Buffer, u64)],
        output: (&Buffer, u64),
        n: u64,
        args: &[Arg],
    ) -> Result<u64, Error> {
        let operand = |(buffer, offset): (&Buffer, u64)| OperandRef {
            buffer: buffer.ring_index,
            offset,
        };
        let inputs: Vec<OperandRef> = inputs.iter().copied().map(operand).collect();
        let descriptor = self.indexed_descriptor_args(kernel, &inputs, operand(output), n, args)?;
        self.send(descriptor, None, None)
    }

    /// Launches `kernel` and returns its ticket as soon as the descriptor
    /// is written; the completion says whether it ran. On an ordered ring
    /// ([`order_with`](Self::order_with)) the launch signals its ticket and
    /// takes the wait an [`after`](Self::after) left for it.
    pub fn launch(
        &mut self,
        kernel: &Kernel,
        inputs: &[(&Buffer, u64)],
        output: (&Buffer, u64),
        n: u64,
        scalars: &[f32],
    ) -> Result<u64, Error> {
        self.launch_ordered(kernel, inputs, output, n, scalars, None, None)
    }

    /// As [`launch`](Self::launch), with GPU semaphore operations: before
    /// the kernel, wait until the word `wait` names is at least its value;
    /// after it, write `signal`'s value. The signal is written also when
    /// the launch is refused or fails, and by the SDK itself when the
    /// executor is lost, so nothing waits on it forever: its buffer's
    /// memory must be bound ([`bind_semaphores`](Self::bind_semaphores)).
    /// An ordered ring manages its semaphores itself and refuses any here.
    #[allow(clippy::too_many_arguments)]
    pub fn launch_ordered(
        &mut self,
        kernel: &Kernel,
        inputs: &[(&Buffer, u64)],
        output: (&Buffer, u64),
        n: u64,
        scalars: &[f32],
        wait: Option<SemaphoreOp>,
        signal: Option<SemaphoreOp>,
    ) -> Result<u64, Error> {
        let descriptor = self.descriptor(kernel, inputs, output, n, scalars)?;
        self.send(descriptor, wait, signal)
    }

    /// Adds the semaphores (or an ordered ring's) and submits.
    fn send(
        &mut self,
        mut descriptor: Descriptor,
        wait: Option<SemaphoreOp>,
        signal: Option<SemaphoreOp>,
    ) -> Result<u64, Error> {
        if let Some(op) = wait {
            descriptor = descriptor
                .with_wait(op)
                .map_err(|e| Error::InvalidInput(e.to_string()))?;
        }
        if let Some(op) = signal {
            descriptor = descriptor
                .with_signal(op)
                .map_err(|e| Error::InvalidInput(e.to_string()))?;
        }
        #[cfg(feature = "cuda")]
        if let Some(ordering) = &self.ordering {
            if wait.is_some() || signal.is_some() {
                return Err(Error::InvalidInput(
                    "an ordered ring's launches take no semaphores of their own: use after and stream_wait".into(),
                ));
            }
            descriptor = ordering.apply(descriptor)?;
        }
        self.submit(&descriptor)?;
        #[cfg(feature = "cuda")]
        if let Some(ordering) = &mut self.ordering {
            ordering.submitted();
        }
        Ok(descriptor.ticket)
    }

    /// Records `completion` in the ledger and hands it to the caller.
    fn answered(&self, completion: Completion) -> RingCompletion {
        let ok = completion.status == CompletionStatus::Ok;
        self.shared.lock().ledger.completed(ok);
        completion.into()
    }

    /// The next completion, if one is there (also on an orphaned ring: what
    /// the executor answered before it was lost).
    pub fn poll(&mut self) -> Result<Option<RingCompletion>, Error> {
        let completion = self.submitter.poll_completion().map_err(ring_error)?;
        Ok(completion.map(|c| self.answered(c)))
    }

    /// The next completion, waiting up to `timeout` (spinning briefly, then
    /// sleeping). `None`: none came in time. On an orphaned ring, once the
    /// completions posted before the loss are read, fails with
    /// [`Error::RingOrphaned`] rather than waiting for one that cannot come.
    pub fn wait(&mut self, timeout: Duration) -> Result<Option<RingCompletion>, Error> {
        let start = Instant::now();
        loop {
            if let Some(orphaned) = self.orphaned() {
                return match self.poll()? {
                    Some(completion) => Ok(Some(completion)),
                    None => Err(Error::RingOrphaned(orphaned.cause)),
                };
            }
            let remaining = timeout.saturating_sub(start.elapsed());
            let completion = self
                .submitter
                .wait_completion(remaining.min(ORPHAN_CHECK))
                .map_err(ring_error)?;
            if let Some(completion) = completion {
                return Ok(Some(self.answered(completion)));
            }
            if remaining <= ORPHAN_CHECK {
                return Ok(None);
            }
        }
    }
}
