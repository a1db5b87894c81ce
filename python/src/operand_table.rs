//! The session's operand cache, native: what a torch tensor at an address
//! resolved to (its registration's ring index, the byte offset in it, the
//! sizes the launch checks), and the one call that turns a launch's tensors
//! into a [`Plan`] for the ring without building a Python tuple per operand.
//!
//! `ptxd._client._OperandCache` wraps an [`OperandTable`]; the Python half
//! registers what misses and puts it here. An entry is only a guess (the
//! memory at an address may have been freed and allocated again): a plan
//! carries `(address, allocation id)` checks that the ring verifies before
//! it submits anything (`Ring.launch_plan`), and an entry whose registration
//! was released (its [`Released`] flag set) is a miss.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use ptxd_client::ring::OperandRef;
use ptxd_client::{Arg, Kernel};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyList, PyTuple};

use crate::{timeout_of, to_arg, NativeKernel, NativeRing, PlanOutcome};

/// (device ordinal, address, length in bytes, element size): the key the
/// Python half's `_OperandCache` uses.
pub(crate) type Key = (i64, u64, u64, u64);

/// Whether a registration was released: shared by the registration (the
/// Python half sets it) and every cache entry made of it.
#[pyclass(module = "ptxd._native", name = "Released", frozen)]
pub(crate) struct Released {
    flag: Arc<AtomicBool>,
}

#[pymethods]
impl Released {
    #[new]
    fn new() -> Self {
        Released {
            flag: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Marks the registration released (for good).
    fn set(&self) {
        self.flag.store(true, Ordering::Release);
    }

    fn __bool__(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }
}

/// One cached operand.
struct Entry {
    /// The Python `Buffer` (what `_OperandCache.get` returns).
    buffer: Py<PyAny>,
    released: Arc<AtomicBool>,
    ring_index: u32,
    offset: u64,
    nbytes: u64,
    itemsize: u64,
    /// The registration's size in bytes.
    registered: u64,
    /// The driver's allocation id the registration was made of (`None`:
    /// unknown, and the entry serves only the general path).
    buffer_id: Option<u64>,
}

/// The entries behind [`OperandTable`]'s lock. Every method takes the lock
/// with the GIL held and calls no Python under it; an entry removed is
/// dropped (its `Buffer` let go of, which can run Python code) only after
/// the lock is released, so that code cannot find the lock held.
struct Table {
    entries: HashMap<Key, Entry>,
    limit: usize,
}

/// The operand cache (see the module docs).
#[pyclass(module = "ptxd._native", name = "OperandTable", frozen)]
pub(crate) struct OperandTable {
    table: Mutex<Table>,
}

impl OperandTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What one launch operand read of a tensor: its key and address.
struct Seen {
    key: Key,
    ptr: u64,
}

/// Reads the key of a contiguous torch tensor; `None` when `obj` is not
/// one (or reads as something the general path should judge).
fn seen(obj: &Bound<'_, PyAny>, tensor: &Bound<'_, PyAny>) -> PyResult<Option<Seen>> {
    let py = obj.py();
    if !obj.is_instance(tensor)? {
        return Ok(None);
    }
    if !obj
        .call_method0(intern!(py, "is_contiguous"))?
        .is_truthy()?
    {
        return Ok(None);
    }
    // A CPU tensor's device is -1: no cached operand has it.
    let Ok(device) = obj
        .call_method0(intern!(py, "get_device"))?
        .extract::<i64>()
    else {
        return Ok(None);
    };
    let Ok(itemsize) = obj
        .call_method0(intern!(py, "element_size"))?
        .extract::<u64>()
    else {
        return Ok(None);
    };
    let Ok(ptr) = obj.call_method0(intern!(py, "data_ptr"))?.extract::<u64>() else {
        return Ok(None);
    };
    let Ok(numel) = obj.call_method0(intern!(py, "numel"))?.extract::<u64>() else {
        return Ok(None);
    };
    let Some(nbytes) = numel.checked_mul(itemsize) else {
        return Ok(None);
    };
    Ok(Some(Seen {
        key: (device, ptr, nbytes, itemsize),
        ptr,
    }))
}

/// A launch's f32 params as the lean path takes them: any sized sequence
/// of numbers (a tuple, a list, a numpy array: what the general path's
/// `[float(p) for p in params]` takes), read without its truth value (a
/// numpy array of two or more has none). `None` for anything else, a
/// one-shot iterator included (the general path must still find it
/// whole), for an item that is not a number, and for one past the f32
/// range: the general path then decides, and raises what it raises.
fn f32_params(params: &Bound<'_, PyAny>) -> Option<Vec<f32>> {
    if params.is_none() {
        return Some(Vec::new());
    }
    let len = params.len().ok()?;
    let items = params.try_iter().ok()?;
    let mut scalars = Vec::with_capacity(len);
    for item in items {
        // A finite value past the f32 range is the general path's to
        // refuse (OverflowError), not an infinity here.
        match item
            .and_then(|item| item.extract::<f64>())
            .map(crate::f32_of)
        {
            Ok(Some(value)) => scalars.push(value),
            _ => return None,
        }
    }
    Some(scalars)
}

#[pymethods]
impl OperandTable {
    #[new]
    fn new(limit: usize) -> Self {
        OperandTable {
            table: Mutex::new(Table {
                entries: HashMap::new(),
                limit,
            }),
        }
    }

    /// The cached `Buffer` at `key`, or `None` (an entry whose registration
    /// was released is dropped, and a miss).
    fn get(&self, py: Python<'_>, key: Key) -> Option<Py<PyAny>> {
        let mut table = self.lock();
        let entry = table.entries.get(&key)?;
        if entry.released.load(Ordering::Acquire) {
            let removed = table.entries.remove(&key);
            // Python objects are let go of after the lock (see `Table`).
            drop(table);
            drop(removed);
            return None;
        }
        Some(entry.buffer.clone_ref(py))
    }

    /// Caches `buffer` (a `Buffer` of the registration whose flag is
    /// `released`) at `key`; a full table starts over.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (key, buffer, released, ring_index, offset, nbytes, itemsize, registered, buffer_id))]
    fn put(
        &self,
        key: Key,
        buffer: Py<PyAny>,
        released: &Bound<'_, Released>,
        ring_index: u32,
        offset: u64,
        nbytes: u64,
        itemsize: u64,
        registered: u64,
        buffer_id: Option<u64>,
    ) {
        let entry = Entry {
            buffer,
            released: released.get().flag.clone(),
            ring_index,
            offset,
            nbytes,
            itemsize,
            registered,
            buffer_id,
        };
        let mut table = self.lock();
        let dropped = if table.entries.len() >= table.limit {
            std::mem::take(&mut table.entries)
        } else {
            HashMap::new()
        };
        let replaced = table.entries.insert(key, entry);
        drop(table);
        drop((dropped, replaced));
    }

    fn forget(&self, key: Key) {
        let removed = self.lock().entries.remove(&key);
        drop(removed);
    }

    fn clear(&self) {
        let entries = std::mem::take(&mut self.lock().entries);
        drop(entries);
    }

    fn __len__(&self) -> usize {
        self.lock().entries.len()
    }

    /// The lean path's resolution, for `kernel` (a native kernel; its
    /// element sizes `sizes`) on torch tensors `inputs` and `output`:
    /// `(device ordinal, Plan)` when every operand is a contiguous CUDA
    /// tensor of `tensor` (torch.Tensor) this table holds, all on one
    /// device, and the element-size and bounds checks pass; `None`
    /// otherwise (the general path then decides, and raises what it
    /// raises). `n` is the element count (`None`: the output's), `params`
    /// the f32 params, `args` the typed args as `(type, value)`.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (kernel, sizes, inputs, output, n, params, args, tensor))]
    fn resolve(
        &self,
        py: Python<'_>,
        kernel: Py<PyAny>,
        sizes: &Bound<'_, PyAny>,
        inputs: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        n: &Bound<'_, PyAny>,
        params: &Bound<'_, PyAny>,
        args: &Bound<'_, PyAny>,
        tensor: &Bound<'_, PyAny>,
    ) -> PyResult<Option<(i64, Plan)>> {
        // Read every operand before taking the lock: the reads call Python.
        let mut seen_all: Vec<Seen> = Vec::with_capacity(4);
        let operands: Vec<Bound<'_, PyAny>> = if let Ok(tuple) = inputs.cast::<PyTuple>() {
            tuple.iter().collect()
        } else if let Ok(list) = inputs.cast::<PyList>() {
            list.iter().collect()
        } else {
            return Ok(None);
        };
        for obj in operands.iter().chain(std::iter::once(output)) {
            match seen(obj, tensor)? {
                Some(s) => seen_all.push(s),
                None => return Ok(None),
            }
        }
        let ordinal = seen_all.last().map_or(-1, |s| s.key.0);
        if seen_all.iter().any(|s| s.key.0 != ordinal) {
            return Ok(None);
        }
        let Ok(sizes) = sizes.extract::<Vec<u64>>() else {
            return Ok(None);
        };
        let requested = if n.is_none() {
            None
        } else if n.is_instance_of::<PyBool>() {
            return Ok(None); // a bool is no count: the general path refuses it
        } else {
            match n.extract::<i64>() {
                Ok(count) => Some(count),
                Err(_) => return Ok(None),
            }
        };
        let Some(scalars) = f32_params(params) else {
            return Ok(None);
        };
        let args: Vec<(String, Py<PyAny>)> = if args.is_truthy()? {
            args.extract()?
        } else {
            Vec::new()
        };
        let typed = args
            .iter()
            .map(|(ty, value)| to_arg(ty, value.bind(py)))
            .collect::<PyResult<Vec<Arg>>>()?;
        let native = kernel
            .bind(py)
            .cast::<NativeKernel>()
            .ok()
            .map(|k| k.get().inner.clone());

        let mut table = self.lock();
        let mut refs: Vec<OperandRef> = Vec::with_capacity(seen_all.len());
        // (address, allocation id) of each operand; the ring asks about
        // one address per id (`NativeRing::checks_hold`).
        let mut checks: Vec<(u64, u64)> = Vec::with_capacity(seen_all.len());
        let mut count: Option<u64> = requested.map(|c| u64::try_from(c).ok()).unwrap_or(None);
        if requested.is_some() && count.is_none() {
            return Ok(None); // a negative n: the general path refuses it
        }
        let last = seen_all.len() - 1;
        let mut bounds: Vec<(u64, u64, u64, u64)> = Vec::with_capacity(seen_all.len());
        for (index, s) in seen_all.iter().enumerate() {
            let Some(entry) = table.entries.get(&s.key) else {
                return Ok(None);
            };
            if entry.released.load(Ordering::Acquire) {
                let removed = table.entries.remove(&s.key);
                drop(table);
                drop(removed);
                return Ok(None);
            }
            let Some(buffer_id) = entry.buffer_id else {
                return Ok(None);
            };
            checks.push((s.ptr, buffer_id));
            refs.push(OperandRef {
                buffer: entry.ring_index,
                offset: entry.offset,
            });
            bounds.push((entry.itemsize, entry.nbytes, entry.offset, entry.registered));
            if index == last && count.is_none() {
                count = Some(entry.nbytes / entry.itemsize.max(1));
            }
        }
        drop(table);
        let Some(count) = count else {
            return Ok(None);
        };
        for (&(itemsize, nbytes, offset, registered), &size) in bounds.iter().zip(&sizes) {
            if size != 0 && size != itemsize {
                return Ok(None);
            }
            let Some(needed) = count.checked_mul(size) else {
                return Ok(None);
            };
            // Where the operand ends before its registration does (a tensor
            // inside a larger segment), ptxd's own bound is the segment's:
            // the general path refuses what would spill into a neighbour.
            if needed > nbytes && offset.saturating_add(nbytes) < registered {
                return Ok(None);
            }
        }
        let Some(output) = refs.pop() else {
            return Ok(None);
        };
        Ok(Some((
            ordinal,
            Plan {
                kernel,
                native,
                inputs: refs,
                output,
                n: count,
                scalars,
                typed,
                args,
                checks,
                keys: seen_all.into_iter().map(|s| s.key).collect(),
            },
        )))
    }

    /// The lean path in one call: `resolve`, the stream (`stream`, or
    /// `current(ordinal)` when `None`), the ring of `(ordinal, stream)` in
    /// `rings` (the session's dict), and the ring's `launch_plan`. Returns
    /// `True` when launched with nothing refused; `None` when the general
    /// path must decide (a miss, a check that would refuse, no ring open
    /// for the stream, or memory freed and allocated again: the plan's
    /// keys are forgotten then, nothing launched); a list when something
    /// was refused (awaited: the outcomes; deferred: the earlier refusals,
    /// nothing of this call sent); `(ordinal, stream, ring, exception)`
    /// when the ring call raised. A ring that is not a native one (a test
    /// fake) is called through its `launch_plan` method.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (kernel, sizes, inputs, output, n, params, args, tensor, stream, current, rings, sync, defer, timeout))]
    fn launch(
        &self,
        py: Python<'_>,
        kernel: Py<PyAny>,
        sizes: &Bound<'_, PyAny>,
        inputs: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        n: &Bound<'_, PyAny>,
        params: &Bound<'_, PyAny>,
        args: &Bound<'_, PyAny>,
        tensor: &Bound<'_, PyAny>,
        stream: Option<usize>,
        current: &Bound<'_, PyAny>,
        rings: &Bound<'_, PyDict>,
        sync: bool,
        defer: bool,
        timeout: f64,
    ) -> PyResult<Py<PyAny>> {
        let duration = timeout_of(timeout)?;
        let Some((ordinal, plan)) =
            self.resolve(py, kernel, sizes, inputs, output, n, params, args, tensor)?
        else {
            return Ok(py.None());
        };
        let stream = match stream {
            Some(stream) => stream,
            None if current.is_none() => return Ok(py.None()),
            None => current.call1((ordinal,))?.extract::<usize>()?,
        };
        let Some(ring) = rings.get_item((ordinal, stream))? else {
            return Ok(py.None());
        };
        if let Ok(native) = ring.cast::<NativeRing>() {
            let outcome = native
                .get()
                .launch_plans(py, stream, &[&plan], sync, defer, duration);
            return match outcome {
                Ok(PlanOutcome::Accepted) => {
                    Ok(PyBool::new(py, true).to_owned().into_any().unbind())
                }
                Ok(PlanOutcome::Stale) => {
                    self.forget_plan(&plan);
                    Ok(py.None())
                }
                Ok(PlanOutcome::Listed(list)) => finish(py, ordinal, stream, &ring, Ok(Some(list))),
                Err(error) => finish(py, ordinal, stream, &ring, Err(error)),
            };
        }
        if !ring.is_truthy()? {
            return Ok(py.None()); // False: this stream takes the unary path
        }
        let plan_object = Bound::new(py, plan)?;
        let outcome = ring
            .call_method1(
                intern!(py, "launch_plan"),
                (stream, &plan_object, sync, defer, timeout),
            )
            .and_then(|o| o.extract::<Option<Py<PyList>>>().map_err(PyErr::from));
        if let Ok(None) = outcome {
            self.forget_plan(plan_object.get());
            return Ok(py.None());
        }
        finish(py, ordinal, stream, &ring, outcome)
    }
}

/// What `OperandTable.launch` returns for a ring call's outcome (not a
/// failed check: the caller handled that).
fn finish(
    py: Python<'_>,
    ordinal: i64,
    stream: usize,
    ring: &Bound<'_, PyAny>,
    outcome: PyResult<Option<Py<PyList>>>,
) -> PyResult<Py<PyAny>> {
    match outcome {
        Ok(Some(list)) => {
            let list = list.bind(py);
            if list.iter().all(|o| o.is_none()) {
                Ok(PyBool::new(py, true).to_owned().into_any().unbind())
            } else {
                Ok(list.clone().into_any().unbind())
            }
        }
        Ok(None) => Ok(py.None()),
        Err(error) => Ok((ordinal, stream, ring, error.into_value(py))
            .into_pyobject(py)?
            .into_any()
            .unbind()),
    }
}

impl OperandTable {
    /// Forgets the keys of a plan whose checks failed (its memory was freed
    /// and allocated again).
    fn forget_plan(&self, plan: &Plan) {
        let mut table = self.lock();
        let removed: Vec<Entry> = plan
            .keys
            .iter()
            .filter_map(|key| table.entries.remove(key))
            .collect();
        drop(table);
        drop(removed);
    }
}

/// One launch resolved by [`OperandTable::resolve`], for `Ring.launch_plan`.
#[pyclass(module = "ptxd._native", name = "Plan", frozen)]
pub(crate) struct Plan {
    kernel: Py<PyAny>,
    /// The kernel, when it is a native one (always, but for test fakes).
    pub(crate) native: Option<Kernel>,
    pub(crate) inputs: Vec<OperandRef>,
    pub(crate) output: OperandRef,
    pub(crate) n: u64,
    pub(crate) scalars: Vec<f32>,
    pub(crate) typed: Vec<Arg>,
    /// The typed args as the caller passed them, `(type, value)`.
    args: Vec<(String, Py<PyAny>)>,
    /// `(address, allocation id)` pairs the ring verifies first.
    pub(crate) checks: Vec<(u64, u64)>,
    keys: Vec<Key>,
}

#[pymethods]
impl Plan {
    /// The launch as `Ring.launch` takes it: `(kernel, inputs, output, n,
    /// params, args)`, inputs and output as `(ring index, offset)`.
    #[allow(clippy::type_complexity)]
    fn wire(
        &self,
        py: Python<'_>,
    ) -> (
        Py<PyAny>,
        Vec<(u32, u64)>,
        (u32, u64),
        u64,
        Vec<f32>,
        Vec<(String, Py<PyAny>)>,
    ) {
        (
            self.kernel.clone_ref(py),
            self.inputs.iter().map(|r| (r.buffer, r.offset)).collect(),
            (self.output.buffer, self.output.offset),
            self.n,
            self.scalars.clone(),
            self.args
                .iter()
                .map(|(ty, value)| (ty.clone(), value.clone_ref(py)))
                .collect(),
        )
    }

    /// The `(address, allocation id)` checks.
    fn checks(&self) -> Vec<(u64, u64)> {
        self.checks.clone()
    }

    /// The cache keys of the operands (forgotten when a check fails).
    fn keys(&self) -> Vec<Key> {
        self.keys.clone()
    }
}
