//! A launch over the executor protocol: the executor re-checks what the
//! front checked (module loaded, arity, every operand's buffer open, span
//! and alignment, the grid), enqueues the kernel on the session's stream
//! between its event wait and signal and the watchdog's markers, and
//! answers at once (async) or once the stream is synchronized (sync).

use std::sync::{mpsc, Arc, Mutex};

use ptxd_cuda::{DriverError, Event};
use ptxd_proto::executor::{FailureKind, Launch};

use super::params::f32_bits;
use super::watchdog::{take_reply, Marker, SharedReply, Watched};
use super::{fail_driver, CudaBackend, WaitJob, MAX_GRID_X};
use crate::executor::child::Replier;

impl CudaBackend {
    /// Resolves an operand to a device address, re-checking what the front
    /// checked: the buffer is open, the span fits, the address is aligned.
    fn operand_address(
        &self,
        buffer_id: u64,
        offset: u64,
        n: u64,
        element_size: Option<u32>,
    ) -> Result<u64, (FailureKind, String)> {
        let buffer = self.buffers.get(&buffer_id).ok_or_else(|| {
            (
                FailureKind::UnknownObject,
                format!("buffer {buffer_id} is not open"),
            )
        })?;
        if let Some(size) = element_size.map(u64::from) {
            let end = n
                .checked_mul(size)
                .and_then(|bytes| bytes.checked_add(offset));
            if end.is_none_or(|end| end > buffer.size) {
                return Err((
                    FailureKind::OutOfBounds,
                    format!(
                        "{n} elements of {size} bytes at offset {offset} overrun buffer {buffer_id} ({} bytes)",
                        buffer.size
                    ),
                ));
            }
            // A misaligned operand would fault the kernel (a sticky error).
            if size > 0 && !offset.is_multiple_of(size) {
                return Err((
                    FailureKind::OutOfBounds,
                    format!("offset {offset} is not a multiple of the {size}-byte element"),
                ));
            }
        } else if offset > buffer.size {
            return Err((
                FailureKind::OutOfBounds,
                format!("offset {offset} is past the end of buffer {buffer_id}"),
            ));
        }
        Ok(buffer.base + offset)
    }

    pub(super) fn launch_on_stream(&mut self, launch: Launch, reply: Replier) {
        let Some(kernel) = self.kernels.get(&launch.module_id).cloned() else {
            return reply.fail(
                FailureKind::UnknownObject,
                format!("module {} is not loaded", launch.module_id),
                &[],
            );
        };
        // The scalars: typed args' bits, or the f32 params (never both).
        let scalars = if launch.args.is_empty() {
            f32_bits(&launch.params)
        } else if launch.params.is_empty() {
            launch.args.clone()
        } else {
            return reply.fail(
                FailureKind::AbiMismatch,
                "the launch passes both f32 params and typed args",
                &[],
            );
        };
        if launch.inputs.len() != kernel.inputs as usize
            || scalars.len() != kernel.scalar_params as usize
        {
            return reply.fail(
                FailureKind::AbiMismatch,
                format!(
                    "the launch passes {} inputs and {} scalars; the kernel takes {} and {}",
                    launch.inputs.len(),
                    scalars.len(),
                    kernel.inputs,
                    kernel.scalar_params
                ),
                &[],
            );
        }
        let Some(output) = launch.output.as_ref() else {
            return reply.fail(FailureKind::AbiMismatch, "the launch has no output", &[]);
        };
        let block = kernel.block;
        let mut addresses = Vec::with_capacity(launch.inputs.len() + 1);
        for (index, operand) in launch.inputs.iter().chain([output]).enumerate() {
            let element_size = kernel.element_sizes.get(index).copied();
            match self.operand_address(operand.buffer_id, operand.offset, launch.n, element_size) {
                Ok(address) => addresses.push(address),
                Err((kind, message)) => return reply.fail(kind, message, &[]),
            }
        }
        let per_block = u64::from(block) * u64::from(kernel.elements_per_thread.max(1));
        let grid = launch.n.div_ceil(per_block);
        if grid > MAX_GRID_X {
            return reply.fail(
                FailureKind::OutOfBounds,
                format!(
                    "n = {} needs {grid} blocks of {block}; one launch covers at most {MAX_GRID_X}",
                    launch.n
                ),
                &[],
            );
        }
        let event = |id: u64| -> Result<Option<&Event>, String> {
            if id == 0 {
                return Ok(None);
            }
            self.events
                .get(&id)
                .map(Some)
                .ok_or_else(|| format!("event {id} is not open"))
        };
        let (wait, signal) = match (event(launch.wait_event), event(launch.signal_event)) {
            (Ok(w), Ok(s)) => (w.is_some(), s.is_some()),
            (Err(e), _) | (_, Err(e)) => return reply.fail(FailureKind::UnknownObject, e, &[]),
        };
        let watchdog = match self.watchdog(&reply) {
            Ok(w) => w.filter(|_| launch.n > 0).map(|w| w.queue(launch.stream)),
            Err(e) => return fail_driver(reply, &e, "starting the watchdog"),
        };
        let stream = match self.stream(launch.stream) {
            Ok(s) => s,
            Err(e) => return fail_driver(reply, &e, "creating the session's stream"),
        };
        // A ring of this stream answers an async launch once it passed its
        // checks and enqueues it right after, holding its table's lock from
        // before the answer until the enqueue: held here, a launch the
        // client sends after a ring's answer is enqueued after that launch.
        let ring_order = self.rings.get(&launch.stream).map(|ring| ring.table());
        if wait {
            if let Some(event) = self.events.get(&launch.wait_event) {
                if let Err(e) = stream.wait(event) {
                    return fail_driver(reply, &e, "waiting on the launch's event");
                }
            }
        }
        let mut watched = None;
        if let Some(watchdog) = &watchdog {
            let markers = (|| {
                let started = if wait {
                    let event = watchdog.marker()?;
                    stream.record(&event)?;
                    Some(event)
                } else {
                    None
                };
                Ok::<_, DriverError>((started, watchdog.marker()?))
            })();
            match markers {
                Ok(markers) => watched = Some(markers),
                Err(e) => return fail_driver(reply, &e, "marking the launch for the watchdog"),
            }
        }
        if launch.n > 0 {
            // SAFETY: every address lies inside an open IPC mapping with
            // room for n elements (checked above, and by the front), and
            // mappings are only closed after draining.
            let launched =
                unsafe { kernel.enqueue(&stream, grid as u32, &addresses, launch.n, &scalars) };
            if let Err(e) = launched {
                return fail_driver(reply, &e, "launching the kernel");
            }
        }
        if let Some((_, done)) = &watched {
            if let Err(e) = stream.record(done) {
                return fail_driver(reply, &e, "marking the launch's end for the watchdog");
            }
        }
        if signal {
            if let Some(event) = self.events.get(&launch.signal_event) {
                if let Err(e) = stream.record(event) {
                    return fail_driver(reply, &e, "recording the launch's event");
                }
            }
        }
        drop(ring_order);
        if !launch.sync {
            if let (Some(watchdog), Some((started, done))) = (&watchdog, watched) {
                watchdog.push(Watched {
                    wait_deadline: None,
                    started: started.map(Marker::Event),
                    done: Marker::Event(done),
                    reply: None,
                    launches: 1,
                });
            }
            return reply.ok();
        }
        let Some(waiter) = self.streams.get(&launch.stream).map(|s| s.waiter.clone()) else {
            return reply.fail(FailureKind::Internal, "the stream vanished", &[]);
        };
        // The reply of a sync launch is shared by the stream's waiter and the
        // watchdog, which answers it KERNEL_TIMEOUT if the kernel outlives
        // the budget; whichever comes first replies.
        let shared: SharedReply = Arc::new(Mutex::new(Some(reply)));
        if let (Some(watchdog), Some((started, done))) = (&watchdog, watched) {
            watchdog.push(Watched {
                started: started.map(Marker::Event),
                wait_deadline: None,
                done: Marker::Event(done),
                reply: Some(shared.clone()),
                launches: 1,
            });
        }
        if let Err(mpsc::SendError(WaitJob::Sync(shared))) = waiter.send(WaitJob::Sync(shared)) {
            if let Some(reply) = take_reply(&shared) {
                reply.fail(FailureKind::Internal, "the stream's waiter is gone", &[]);
            }
        }
    }
}
