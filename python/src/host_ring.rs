//! A launch ring without GPU ordering (`Session._native.open_ring`): launches on
//! registered memory by ring index, each answer awaited or deferred, on any
//! backend. The host backend has no CUDA stream to order on, so this is
//! the ring that runs there; `python/examples/ring_wait.py` times the
//! awaited round trip with it (what an awaited torch launch pays over a
//! deferred one, without a GPU), and the tests run refusals through a real
//! daemon with it.
//!
//! The awaited path waits as `Ring.launch_plan` does (`answers`): the GIL
//! released once around the submission and the wait, the answer polled
//! for the client's `reply_spin` before the SDK's `LaunchRing::wait` (which
//! polls 30 µs more, then sleeps on the futex word), nothing allocated per
//! launch but the descriptor's own work, and `True` for an accepted launch.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use ptxd_client::ring::OperandRef;
use ptxd_client::{Error, LaunchRing, RingRefusal};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyList};

use crate::answers::{no_answer, own_answer};
use crate::{
    drain_list, f32_params_of, ring_refusal, ring_refusal_as, timeout_of, to_pyerr, NativeKernel,
};

/// The most operands of one launch this measurement ring takes (the ring
/// descriptor allows 64 inputs; this ring refuses more than 16 before
/// anything is sent, to keep its operand list on the stack).
const MAX_OPERANDS: usize = 16;

/// A session's plain launch ring (see the module docs).
#[pyclass(module = "ptxd._native", name = "HostRing", frozen)]
pub(crate) struct HostRing {
    ring: Mutex<LaunchRing>,
    /// The ring's slots (what it was opened with).
    slots: u64,
    /// How long an awaited call polls for its answer (see `answers`).
    spin: Duration,
}

impl HostRing {
    pub(crate) fn new(ring: LaunchRing, slots: u32, spin: Duration) -> Self {
        HostRing {
            ring: Mutex::new(ring),
            slots: u64::from(slots),
            spin,
        }
    }
}

/// What one launch call did, before it becomes Python.
enum Answer {
    /// Submitted; awaited and accepted, or deferred.
    Launched,
    /// Awaited and refused (or failed).
    Refused(RingRefusal),
    /// Deferred: earlier launches' refusals read first; nothing sent.
    Earlier(Vec<RingRefusal>),
}

#[pymethods]
impl HostRing {
    /// Launches `kernel` over `n` elements on operands given as `(ring
    /// index, byte offset)` (a `Buffer`'s `ring_index`). First it reads the
    /// answers of earlier (deferred) launches: the awaited call all of
    /// them, the deferred one those already there (and as many as it needs
    /// a free slot); when any was refused it returns the list of their
    /// exceptions and sends nothing. Then, awaited (`defer` false): returns
    /// `True` once ptxd accepted it (ran it, with `sync`), or the
    /// exception it was refused with; deferred: `True` once sent. Raises
    /// when the ring fails (`RING_ORPHANED`, a timeout).
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (kernel, inputs, output, n, params, sync, defer, timeout))]
    fn launch(
        &self,
        py: Python<'_>,
        kernel: &Bound<'_, NativeKernel>,
        inputs: Vec<(u32, u64)>,
        output: (u32, u64),
        n: u64,
        params: Vec<f64>,
        sync: bool,
        defer: bool,
        timeout: f64,
    ) -> PyResult<Py<PyAny>> {
        let timeout = timeout_of(timeout)?;
        let params = f32_params_of(&params)?;
        if inputs.len() > MAX_OPERANDS {
            return Err(to_pyerr(
                py,
                Error::InvalidInput(format!(
                    "{} inputs; this ring takes at most {MAX_OPERANDS} per launch",
                    inputs.len()
                )),
            ));
        }
        let mut refs = [OperandRef {
            buffer: 0,
            offset: 0,
        }; MAX_OPERANDS];
        for (slot, &(buffer, offset)) in refs.iter_mut().zip(&inputs) {
            *slot = OperandRef { buffer, offset };
        }
        let refs = &refs[..inputs.len()];
        let output = OperandRef {
            buffer: output.0,
            offset: output.1,
        };
        let kernel = &kernel.get().inner;
        let defer = defer && !sync;
        let answer = py.detach(|| {
            let mut ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
            // The answers earlier launches left: a deferred call reads
            // those already there and waits for a free slot; an awaited
            // one reads them all (its own answer is then the only one
            // outstanding). Their refusals are reported here and this
            // launch is not sent, as the ring path does (the SDK's
            // deferred call: `RawStreamOutcome::deferred`).
            let mut earlier = Vec::new();
            if defer {
                while let Some(completion) = ring.poll()? {
                    earlier.extend(completion.outcome.err());
                }
                while earlier.is_empty() && ring.outstanding() >= self.slots {
                    match ring.wait(timeout)? {
                        Some(completion) => earlier.extend(completion.outcome.err()),
                        None => return Err(no_answer(timeout)),
                    }
                }
            } else {
                earlier = ring.drain(timeout)?;
            }
            if !earlier.is_empty() {
                return Ok(Answer::Earlier(earlier));
            }
            let descriptor = ring
                .indexed_descriptor(kernel, refs, output, n, &params)?
                .with_sync(sync);
            ring.submit(&descriptor)?;
            if defer {
                return Ok(Answer::Launched);
            }
            // Sync or not, the one answer outstanding is this launch's.
            Ok(match own_answer(&mut ring, self.spin, timeout)? {
                None => Answer::Launched,
                Some(refusal) => Answer::Refused(refusal),
            })
        });
        match answer {
            Ok(Answer::Launched) => Ok(PyBool::new(py, true).to_owned().into_any().unbind()),
            Ok(Answer::Refused(refusal)) => {
                Ok(ring_refusal(py, &refusal).into_value(py).into_any())
            }
            Ok(Answer::Earlier(refused)) => Ok(crate::deferred_list(py, &refused)?.into_any()),
            Err(e) => Err(to_pyerr(py, e)),
        }
    }

    /// Waits for the answers of every launch still outstanding; returns the
    /// exceptions of those refused or failed, in order.
    fn drain(&self, py: Python<'_>, timeout: f64) -> PyResult<Py<PyList>> {
        drain_list(py, &self.ring, timeout)
    }

    /// Launches not answered yet.
    fn outstanding(&self) -> u64 {
        self.ring
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .outstanding()
    }

    /// Times `calls` awaited launches of `kernel` as `launch` makes them,
    /// phase by phase: returns `{phase: [nanoseconds per call]}` with the
    /// GIL release and reacquire, the descriptor's build and submission,
    /// the wait for ptxd's answer, and the whole call. For
    /// `ring_wait.py`; a refusal raises.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (kernel, inputs, output, n, params, calls, timeout))]
    fn profile<'py>(
        &self,
        py: Python<'py>,
        kernel: &Bound<'_, NativeKernel>,
        inputs: Vec<(u32, u64)>,
        output: (u32, u64),
        n: u64,
        params: Vec<f64>,
        calls: usize,
        timeout: f64,
    ) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let timeout = timeout_of(timeout)?;
        let params = f32_params_of(&params)?;
        let refs: Vec<OperandRef> = inputs
            .iter()
            .map(|&(buffer, offset)| OperandRef { buffer, offset })
            .collect();
        let output = OperandRef {
            buffer: output.0,
            offset: output.1,
        };
        let kernel = &kernel.get().inner;
        let ns = |since: std::time::Instant| {
            u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
        };
        // Each call below reads one answer, its own: what earlier launches
        // left is read first, and a refusal among it raises.
        let earlier = py.detach(|| {
            let mut ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
            ring.drain(timeout)
        });
        if let Some(refusal) = earlier.map_err(|e| to_pyerr(py, e))?.first() {
            return Err(ring_refusal_as(py, refusal, true));
        }
        let mut phases: [Vec<u64>; 4] =
            std::array::from_fn(|_| Vec::with_capacity(calls.min(1 << 16)));
        for _ in 0..calls {
            let start = std::time::Instant::now();
            py.detach(|| {});
            phases[0].push(ns(start));
            let timed = py.detach(|| {
                let mut ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
                let submitting = std::time::Instant::now();
                let descriptor = ring.indexed_descriptor(kernel, &refs, output, n, &params)?;
                ring.submit(&descriptor)?;
                let submit = ns(submitting);
                let waiting = std::time::Instant::now();
                let answer = own_answer(&mut ring, self.spin, timeout)?;
                Ok::<_, Error>((submit, ns(waiting), answer))
            });
            let (submit, wait, answer) = timed.map_err(|e| to_pyerr(py, e))?;
            if let Some(refusal) = answer {
                return Err(ring_refusal(py, &refusal));
            }
            phases[1].push(submit);
            phases[2].push(wait);
            phases[3].push(ns(start));
        }
        let dict = pyo3::types::PyDict::new(py);
        let names = [
            "GIL release and reacquire (an empty detach)",
            "descriptor build and submit",
            "wait for ptxd's answer (polled for reply_spin, then LaunchRing::wait)",
            "whole call",
        ];
        for (name, values) in names.iter().zip(phases) {
            dict.set_item(name, values)?;
        }
        Ok(dict)
    }
}
