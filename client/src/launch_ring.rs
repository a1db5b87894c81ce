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
//! ends with the executor's generation (the session's lease stream reports
//! a restart; open a new ring then).

use std::time::Duration;

use ptxd_proto::v1::Reason;

use crate::ring::{
    Completion, CompletionStatus, Descriptor, OperandRef, SemaphoreOp, SubmitError, Submitter,
};
use crate::session::Kernel;
use crate::types::Buffer;
use crate::Error;

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

/// A session's open launch ring (see the module docs).
#[derive(Debug)]
pub struct LaunchRing {
    submitter: Submitter,
    next_ticket: u64,
    device_uuid: String,
    generation: u64,
}

fn ring_error(error: impl std::fmt::Display) -> Error {
    Error::Protocol(format!("launch ring: {error}"))
}

impl LaunchRing {
    pub(crate) fn new(submitter: Submitter, device_uuid: String, generation: u64) -> Self {
        LaunchRing {
            submitter,
            next_ticket: 1,
            device_uuid,
            generation,
        }
    }

    /// The shared-memory object's name (what the daemon opened).
    pub fn shm_name(&self) -> &str {
        self.submitter.name()
    }

    /// The device whose executor serves the ring.
    pub fn device_uuid(&self) -> &str {
        &self.device_uuid
    }

    /// The executor generation serving the ring.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Launches not answered yet.
    pub fn outstanding(&self) -> u64 {
        self.submitter.outstanding()
    }

    /// Writes a prepared descriptor (its ticket is the caller's). Fails
    /// with `INVALID_INPUT` when the ring is full: wait for a completion.
    pub fn submit(&mut self, descriptor: &Descriptor) -> Result<(), Error> {
        match self.submitter.try_submit(descriptor) {
            Ok(()) => Ok(()),
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
        let ticket = self.next_ticket;
        self.next_ticket = self.next_ticket.wrapping_add(1);
        Descriptor::new(
            ticket,
            kernel.state().ring_index,
            &inputs,
            operand(output),
            n,
        )
        .and_then(|d| d.with_scalars(scalars))
        .map_err(|e| Error::InvalidInput(e.to_string()))
    }

    /// Launches `kernel` and returns its ticket as soon as the descriptor
    /// is written; the completion says whether it ran.
    pub fn launch(
        &mut self,
        kernel: &Kernel,
        inputs: &[(&Buffer, u64)],
        output: (&Buffer, u64),
        n: u64,
        scalars: &[f32],
    ) -> Result<u64, Error> {
        let descriptor = self.descriptor(kernel, inputs, output, n, scalars)?;
        self.submit(&descriptor)?;
        Ok(descriptor.ticket)
    }

    /// As [`launch`](Self::launch), with GPU semaphore operations: before
    /// the kernel, wait until the word `wait` names is at least its value;
    /// after it, write `signal`'s value (also written when the launch is
    /// refused, so nothing waits forever).
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
        let mut descriptor = self.descriptor(kernel, inputs, output, n, scalars)?;
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
        self.submit(&descriptor)?;
        Ok(descriptor.ticket)
    }

    /// The next completion, if one is there.
    pub fn poll(&mut self) -> Result<Option<RingCompletion>, Error> {
        self.submitter
            .poll_completion()
            .map(|c| c.map(Into::into))
            .map_err(ring_error)
    }

    /// The next completion, waiting up to `timeout` (spinning briefly, then
    /// sleeping). `None`: none came in time.
    pub fn wait(&mut self, timeout: Duration) -> Result<Option<RingCompletion>, Error> {
        self.submitter
            .wait_completion(timeout)
            .map(|c| c.map(Into::into))
            .map_err(ring_error)
    }
}
