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
//!   like a gRPC launch ([`super::watchdog`]): past the budget the executor
//!   reports `KERNEL_TIMEOUT` against the session and restarts.

use std::ffi::c_void;
use std::sync::Arc;

use ptxd_client::cuda::driver::{DriverError, PrimaryContext, Stream};
use ptxd_client::ring::SemaphoreWidth;
use ptxd_proto::executor::FailureKind;

use super::watchdog::{StreamQueue, Watched};
use super::{fail_driver, CudaBackend, LoadedKernel, MAX_GRID_X};
use crate::executor::child::{Channel, Replier};
use crate::executor::ring::{self, CheckedSemaphore, RingBackend, RingHandle, RingLaunch};

impl CudaBackend {
    pub(super) fn open_ring(&mut self, open: ptxd_proto::executor::OpenRing, reply: Replier) {
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
        let backend = CudaRing {
            stream,
            context: self.context.clone(),
            current: false,
            channel: reply.channel().clone(),
            watch: watchdog.map(|w| w.queue(open.stream)),
        };
        match RingHandle::spawn(server, backend, format!("ptxd-ring-{}", open.stream)) {
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
    /// The watchdog's queue of the session's stream (none without
    /// `--max-kernel-time`): the ring's own lock, shared with nothing but
    /// the session's gRPC launches and the poller.
    watch: Option<Arc<StreamQueue>>,
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

    fn semaphore(
        &self,
        semaphore: &CheckedSemaphore<'_, u64>,
        wait: bool,
    ) -> Result<(), crate::error::Error> {
        let addr = semaphore.buffer + semaphore.op.offset;
        let wide = semaphore.op.width == SemaphoreWidth::Bits64;
        // SAFETY: the ring's checks put the word inside a granted buffer,
        // aligned to its width; the buffer stays mapped until the stream is
        // drained (a close drains the context first).
        let done = unsafe {
            if wait {
                self.stream.wait_value(addr, semaphore.op.value, wide)
            } else {
                self.stream.write_value(addr, semaphore.op.value, wide)
            }
        };
        done.map_err(|e| self.driver(e, "a semaphore operation"))
    }
}

impl RingBackend for CudaRing {
    type Kernel = Arc<LoadedKernel>;
    type Buffer = u64;

    fn launch(
        &mut self,
        launch: RingLaunch<'_, Arc<LoadedKernel>, u64>,
    ) -> Result<(), crate::error::Error> {
        if !self.current {
            self.context
                .set_current()
                .map_err(|e| self.driver(e, "binding the device's context"))?;
            self.current = true;
        }
        let kernel = &launch.kernel.kernel;
        let grid = launch.n.div_ceil(u64::from(kernel.block));
        if grid > MAX_GRID_X {
            if let Some(signal) = &launch.signal {
                self.semaphore(signal, false)?;
            }
            return Err(ring::failure(
                FailureKind::OutOfBounds,
                format!(
                    "n = {} needs {grid} blocks; one launch covers at most {MAX_GRID_X}",
                    launch.n
                ),
            ));
        }
        if let Some(wait) = &launch.wait {
            self.semaphore(wait, true)?;
        }
        // Watched like a gRPC launch: a marker after the semaphore wait
        // starts its clock (a launch waiting for its client is not running),
        // one after the kernel stops it.
        let watched = match self.watch.as_ref().filter(|_| launch.n > 0) {
            Some(watchdog) => {
                let markers = (|| {
                    let started = match launch.wait {
                        Some(_) => {
                            let event = watchdog.marker()?;
                            self.stream.record(&event)?;
                            Some(event)
                        }
                        None => None,
                    };
                    Ok::<_, DriverError>((started, watchdog.marker()?))
                })();
                Some(markers.map_err(|e| self.driver(e, "marking the launch for the watchdog"))?)
            }
            None => None,
        };
        if launch.n > 0 {
            let mut addresses: Vec<u64> = launch
                .operands
                .iter()
                .map(|(base, offset)| **base + offset)
                .collect();
            let mut n = launch.n as i64;
            let mut scalars = launch.scalars.clone();
            let mut params: Vec<*mut c_void> = addresses
                .iter_mut()
                .map(|a| (a as *mut u64).cast())
                .collect();
            params.push((&mut n as *mut i64).cast());
            params.extend(scalars.iter_mut().map(|p| (p as *mut f32).cast::<c_void>()));
            // SAFETY: one pointer per kernel parameter, sizes checked at
            // load against the scalar ABI; every address lies in a granted
            // buffer with room for n elements (the launch checks), and a
            // buffer is unmapped only after its revoke and a drain.
            let launched = unsafe {
                kernel
                    .function
                    .launch(grid as u32, kernel.block, &self.stream, &mut params)
            };
            if let Err(e) = launched {
                return Err(self.driver(e, "launching the kernel"));
            }
        }
        if let (Some(watch), Some((started, done))) = (&self.watch, watched) {
            self.stream
                .record(&done)
                .map_err(|e| self.driver(e, "marking the launch's end for the watchdog"))?;
            // The ring and the request loop both push onto the session
            // stream's queue; each pushes right after it enqueued, so the
            // queue follows the stream's order up to that instant.
            watch.push(Watched {
                started,
                done,
                reply: None,
            });
        }
        // Written whatever the kernel does: a waiter on the client's stream
        // is released once the kernel has ended.
        if let Some(signal) = &launch.signal {
            self.semaphore(signal, false)?;
        }
        if launch.sync {
            self.stream
                .synchronize()
                .map_err(|e| self.driver(e, "synchronizing the session's stream"))?;
        }
        Ok(())
    }

    fn release_signal(&mut self, signal: CheckedSemaphore<'_, u64>) {
        if let Err(e) = self.semaphore(&signal, false) {
            tracing::warn!(error = %e, "cannot release a refused launch's semaphore");
        }
    }
}
