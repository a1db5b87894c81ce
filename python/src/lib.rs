//! `ptxd._native`: the Rust half of the `ptxd` Python package.
//!
//! It wraps the SDK (`ptxd-client`) one call at a time; the Python half
//! (`python/ptxd/`) turns tensors, arrays and streams into the handles,
//! offsets and raw stream addresses these calls take. There is no gRPC code
//! here: every request goes through the SDK.
//!
//! Invariants:
//! - Every call that talks to the daemon or the driver runs with the GIL
//!   released (`Python::detach`) on the one tokio runtime of the process, so
//!   other Python threads run meanwhile.
//! - The runtime belongs to the process that made it: after `fork` a call
//!   raises instead of blocking forever on worker threads that did not
//!   survive the fork.
//! - Every SDK error becomes a Python exception through one function,
//!   `to_pyerr`, which hands the parts to `ptxd._errors._from_native`; a
//!   refusal keeps its wire reason, message, gRPC code and metadata.
//! - A session's lease ends when its `Session` object is closed or
//!   collected (the SDK ends the lease when its `Session` drops).

use std::collections::BTreeMap;
use std::future::Future;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use ptxd_client::cuda::{
    preserving_current_context, AllocationRange, CudaDevice, CudaError, DeviceAllocation,
    ExportableAllocation, IpcEvent,
};
use ptxd_client::ring::OperandRef;
use ptxd_client::{
    Arg, Client, DaemonInfo, DeviceSelector, Error, FdBufferSpec, HostMemfd, HostShm, Kernel,
    KernelSignature, Launch, LaunchRing, Operand, RawStreamLaunch, RawStreamOptions,
    RawStreamPhases, RingRefusal, Session, SessionEvent, SessionOptions, ORDERING_BYTES,
};
use pyo3::exceptions::{PyOverflowError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

mod answers;
mod host_ring;
mod operand_table;

use operand_table::Plan;

/// The process's runtime and the pid that made it.
struct Runtime {
    tokio: tokio::runtime::Runtime,
    pid: u32,
}

static RUNTIME: OnceLock<Result<Runtime, String>> = OnceLock::new();

fn runtime() -> PyResult<&'static tokio::runtime::Runtime> {
    let made = RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("ptxd-client")
            .enable_all()
            .build()
            .map(|tokio| Runtime {
                tokio,
                pid: std::process::id(),
            })
            .map_err(|e| format!("starting the ptxd client runtime: {e}"))
    });
    match made {
        Ok(rt) if rt.pid == std::process::id() => Ok(&rt.tokio),
        Ok(_) => Err(PyRuntimeError::new_err(
            "ptxd was used before fork(): its runtime does not survive a fork; \
             create clients in the child (multiprocessing's 'spawn' or 'forkserver' start methods avoid this)",
        )),
        Err(message) => Err(PyRuntimeError::new_err(message.clone())),
    }
}

/// Runs `future` to completion with the GIL released.
fn block<F>(py: Python<'_>, future: F) -> PyResult<F::Output>
where
    F: Future + Send,
    F::Output: Send,
{
    let rt = runtime()?;
    Ok(py.detach(|| rt.block_on(future)))
}

/// gRPC code names, indexed by the code's value.
const CODE_NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

fn code_name(code: tonic::Code) -> &'static str {
    CODE_NAMES.get(code as usize).copied().unwrap_or("UNKNOWN")
}

/// The message of an error with its causes, `: `-joined.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Builds the exception `ptxd._errors._from_native` makes of these parts.
fn make_error(
    py: Python<'_>,
    kind: &str,
    reason: &str,
    message: String,
    code: (&str, i32),
    metadata: &BTreeMap<String, String>,
) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let factory = py.import("ptxd._errors")?.getattr("_from_native")?;
        let exception = factory.call1((kind, reason, message.clone(), code.0, code.1, metadata))?;
        Ok(PyErr::from_value(exception))
    };
    build().unwrap_or_else(|e| e)
}

/// The one mapping from an SDK error to a Python exception (a driver
/// error of this process's own CUDA calls as `cuda_err` maps it).
fn to_pyerr(py: Python<'_>, error: Error) -> PyErr {
    let error = match error {
        Error::Cuda(e) => return cuda_err(py, e),
        other => other,
    };
    let none = BTreeMap::new();
    match &error {
        Error::Refused(refusal) => make_error(
            py,
            "refused",
            refusal.wire_name(),
            refusal.message().to_owned(),
            (code_name(refusal.code()), refusal.code() as i32),
            refusal.metadata(),
        ),
        Error::Transport(_) => make_error(
            py,
            "unavailable",
            error.reason_name(),
            chain(&error),
            ("UNAVAILABLE", 14),
            &none,
        ),
        Error::Status(status) => {
            let kind = match status.code() {
                tonic::Code::Unavailable
                | tonic::Code::Cancelled
                | tonic::Code::DeadlineExceeded => "unavailable",
                _ => "status",
            };
            make_error(
                py,
                kind,
                error.reason_name(),
                chain(&error),
                (code_name(status.code()), status.code() as i32),
                &none,
            )
        }
        Error::SessionClosed => make_error(
            py,
            "closed",
            error.reason_name(),
            error.to_string(),
            ("FAILED_PRECONDITION", 9),
            &none,
        ),
        Error::InvalidInput(_) => make_error(
            py,
            "invalid",
            error.reason_name(),
            error.to_string(),
            ("INVALID_ARGUMENT", 3),
            &none,
        ),
        _ => make_error(
            py,
            "protocol",
            error.reason_name(),
            chain(&error),
            ("UNKNOWN", 2),
            &none,
        ),
    }
}

fn cuda_err(py: Python<'_>, error: CudaError) -> PyErr {
    let kind = match error {
        CudaError::NotIpcExportable { .. }
        | CudaError::NotFdExportable { .. }
        | CudaError::SpansAllocations { .. } => "not_exportable",
        _ => "cuda",
    };
    make_error(
        py,
        kind,
        "CUDA",
        error.to_string(),
        ("UNKNOWN", 2),
        &BTreeMap::new(),
    )
}

fn shm_err(py: Python<'_>, error: ptxd_client::ShmError) -> PyErr {
    make_error(
        py,
        "os",
        "SHM",
        error.to_string(),
        ("UNKNOWN", 2),
        &BTreeMap::new(),
    )
}

/// This process's own reference to the descriptor number `fd`, which the
/// caller holds: a `dup`, so that the registration keeps naming the same
/// file for the whole call even if another thread closes `fd` meanwhile.
fn duplicate_fd(py: Python<'_>, fd: i64) -> PyResult<OwnedFd> {
    let raw = RawFd::try_from(fd)
        .ok()
        .filter(|raw| *raw >= 0)
        .ok_or_else(|| {
            to_pyerr(
                py,
                Error::InvalidInput(format!("a file descriptor is a non-negative int, not {fd}")),
            )
        })?;
    // SAFETY: `raw` is not -1 (checked above), and the borrow lives only for
    // the `F_DUPFD_CLOEXEC` below, which runs with the GIL held, so no
    // Python code can close the descriptor meanwhile; a number that names
    // no open file makes that call fail with EBADF, reported as an OSError.
    let borrowed = unsafe { BorrowedFd::borrow_raw(raw) };
    borrowed.try_clone_to_owned().map_err(|e| {
        make_error(
            py,
            "os",
            "FD",
            format!("duplicating file descriptor {raw}: {e}"),
            ("UNKNOWN", 2),
            &BTreeMap::new(),
        )
    })
}

/// Runs an SDK future with the GIL released and maps its error.
fn call<T, F>(py: Python<'_>, future: F) -> PyResult<T>
where
    F: Future<Output = Result<T, Error>> + Send,
    T: Send,
{
    block(py, future)?.map_err(|e| to_pyerr(py, e))
}

fn info_dict<'py>(py: Python<'py>, info: &DaemonInfo) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("version", &info.version)?;
    dict.set_item("backend", &info.backend)?;
    dict.set_item("slots_used", info.slots_used)?;
    dict.set_item("sessions", info.sessions)?;
    dict.set_item("boot_id", &info.boot_id)?;
    let devices = PyList::empty(py);
    for d in &info.devices {
        let device = PyDict::new(py);
        device.set_item("ordinal", d.ordinal)?;
        device.set_item("uuid", &d.uuid)?;
        device.set_item("name", &d.name)?;
        device.set_item("compute_capability", (d.compute_major, d.compute_minor))?;
        device.set_item("generation", d.generation)?;
        device.set_item("total_memory", d.total_memory)?;
        device.set_item("available", d.available)?;
        device.set_item("restarts", d.restarts)?;
        devices.append(device)?;
    }
    dict.set_item("devices", devices)?;
    let l = &info.limits;
    let limits = PyDict::new(py);
    limits.set_item("slots", l.slots)?;
    limits.set_item("max_artifact_bytes", l.max_artifact_bytes)?;
    limits.set_item("max_request_bytes", l.max_request_bytes)?;
    limits.set_item("max_sessions", l.max_sessions)?;
    limits.set_item("max_buffers_per_session", l.max_buffers_per_session)?;
    limits.set_item("max_kernels_per_session", l.max_kernels_per_session)?;
    limits.set_item(
        "max_buffer_bytes_per_session",
        l.max_buffer_bytes_per_session,
    )?;
    limits.set_item("max_events_per_session", l.max_events_per_session)?;
    dict.set_item("limits", limits)?;
    Ok(dict)
}

/// The longest duration a Python argument may give, in whole seconds (as
/// the daemon's duration flags: 2^32 - 1 s, about 136 years). The SDK adds
/// a reply spin to the clock, which panics past about 2^63 s.
const MAX_DURATION_SECS: u64 = u32::MAX as u64;

/// The duration a Python argument `what` gives in seconds, from 0 to
/// [`MAX_DURATION_SECS`]; anything else (negative, NaN, too long) raises
/// `ValueError` naming it (`note` adds what else it may be).
fn seconds_arg(what: &str, seconds: f64, note: &str) -> PyResult<std::time::Duration> {
    std::time::Duration::try_from_secs_f64(seconds)
        .ok()
        .filter(|d| d.as_secs() <= MAX_DURATION_SECS)
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "{what} must be a number of seconds from 0 to {MAX_DURATION_SECS}{note}; \
                 got {seconds}"
            ))
        })
}

/// A connection to ptxd (`ptxd.Client` wraps it).
#[pyclass(module = "ptxd._native", name = "Client", frozen)]
struct NativeClient {
    inner: Client,
    /// How long an awaited ring call polls for its answers before the
    /// SDK's wait (`reply_spin`; see `answers`).
    answer_spin: std::time::Duration,
}

#[pymethods]
impl NativeClient {
    /// Connects to `socket` (a path, `unix:PATH`, `HOST:PORT` or
    /// `http://HOST:PORT`), or by the SDK's default rules when `None`.
    /// `reply_spin`: seconds a call on the fd socket polls for its reply
    /// before it sleeps (`None`: the SDK's default; 0: not at all).
    #[new]
    #[pyo3(signature = (socket=None, reply_spin=None))]
    fn new(py: Python<'_>, socket: Option<String>, reply_spin: Option<f64>) -> PyResult<Self> {
        let spin = match reply_spin {
            None => None,
            Some(seconds) => Some(seconds_arg("reply_spin", seconds, "")?),
        };
        let inner = call(py, async move {
            match socket {
                Some(target) => Client::connect(&target).await,
                None => Client::connect_default().await,
            }
        })?;
        let inner = match spin {
            Some(spin) => inner.with_reply_spin(spin),
            None => inner,
        };
        Ok(NativeClient {
            inner,
            answer_spin: spin.unwrap_or(ptxd_client::DEFAULT_REPLY_SPIN),
        })
    }

    /// The daemon's version, backend, devices, slot use and limits.
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let client = self.inner.clone();
        let info = call(py, async move { client.info().await })?;
        info_dict(py, &info)
    }

    /// Opens a session; its lease lasts until `close` or collection.
    #[pyo3(signature = (label, auto_reload=false))]
    fn open_session(
        &self,
        py: Python<'_>,
        label: String,
        auto_reload: bool,
    ) -> PyResult<NativeSession> {
        let client = self.inner.clone();
        let options = SessionOptions::new(label).auto_reload_stale(auto_reload);
        let session = call(py, async move { client.open_session_with(options).await })?;
        // Subscribed at once, so no event after the open is missed.
        let events = session.events();
        Ok(NativeSession {
            inner: Mutex::new(Some(Arc::new(session))),
            events: tokio::sync::Mutex::new(events),
            answer_spin: self.answer_spin,
        })
    }
}

/// A session (`ptxd.Session` wraps it).
#[pyclass(module = "ptxd._native", name = "Session", frozen)]
struct NativeSession {
    inner: Mutex<Option<Arc<Session>>>,
    /// The session's lease events since it opened, for `next_event`.
    events: tokio::sync::Mutex<tokio::sync::broadcast::Receiver<SessionEvent>>,
    /// The client's answer spin, for the session's rings.
    answer_spin: std::time::Duration,
}

/// A lease event as the Python half sees it: a dict with `kind` and the
/// event's fields (durations in seconds).
fn event_dict<'py>(py: Python<'py>, event: &SessionEvent) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    match event {
        SessionEvent::ExecutorRestarted {
            device_uuid,
            old_generation,
            new_generation,
            cause,
        } => {
            dict.set_item("kind", "executor_restarted")?;
            dict.set_item("device_uuid", device_uuid)?;
            dict.set_item("old_generation", old_generation)?;
            dict.set_item("new_generation", new_generation)?;
            dict.set_item("cause", cause)?;
        }
        SessionEvent::ExecutorDown {
            device_uuid,
            generation,
            cause,
            failed_restarts,
            restart_error,
            retry_in,
        } => {
            dict.set_item("kind", "executor_down")?;
            dict.set_item("device_uuid", device_uuid)?;
            dict.set_item("generation", generation)?;
            dict.set_item("cause", cause)?;
            dict.set_item("failed_restarts", failed_restarts)?;
            dict.set_item("restart_error", restart_error)?;
            dict.set_item("retry_in", retry_in.as_secs_f64())?;
        }
        SessionEvent::Draining { reason } => {
            dict.set_item("kind", "draining")?;
            dict.set_item("reason", reason)?;
        }
        SessionEvent::Ended { why } => {
            dict.set_item("kind", "ended")?;
            dict.set_item("why", why)?;
        }
        // The SDK's enum is non-exhaustive: a kind this build does not know
        // is still reported, by name.
        other => {
            dict.set_item("kind", "other")?;
            dict.set_item("debug", format!("{other:?}"))?;
        }
    }
    Ok(dict)
}

impl NativeSession {
    fn session(&self, py: Python<'_>) -> PyResult<Arc<Session>> {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or_else(|| to_pyerr(py, Error::SessionClosed))
    }
}

/// Opens a launch ring of `slots` slots on `device`, its shared memory by
/// name, or by descriptor when the name does not open (no common
/// `/dev/shm` with ptxd).
async fn open_ring(
    session: &Session,
    slots: u32,
    device: DeviceSelector,
) -> Result<LaunchRing, Error> {
    match session.open_ring(slots, device.clone()).await {
        Ok(ring) => Ok(ring),
        Err(_) => session.open_ring_fd(slots, device).await,
    }
}

fn device_selector(device: &Bound<'_, PyAny>) -> PyResult<DeviceSelector> {
    if let Ok(ordinal) = device.extract::<u32>() {
        return Ok(DeviceSelector::Ordinal(ordinal));
    }
    let uuid: String = device.extract()?;
    Ok(DeviceSelector::Uuid(uuid))
}

fn buffer_dict<'py>(py: Python<'py>, buffer: &ptxd_client::Buffer) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("handle", &buffer.handle)?;
    dict.set_item("size", buffer.size)?;
    dict.set_item("device_uuid", &buffer.device_uuid)?;
    dict.set_item("generation", buffer.generation)?;
    dict.set_item("ring_index", buffer.ring_index)?;
    Ok(dict)
}

/// One launch as the Python half passes it: kernel, inputs, output, n,
/// params, sync, wait event, signal event.
type LaunchArgs = (
    Py<NativeKernel>,
    Vec<(String, u64)>,
    (String, u64),
    u64,
    Vec<f64>,
    bool,
    Option<String>,
    Option<String>,
);

/// One launch's typed scalar args as Python passes them: `(type, value)`.
type TypedArgs<'py> = Vec<(String, Bound<'py, PyAny>)>;

/// A typed scalar argument from Python's `(type, value)`: the value must be
/// exactly representable as the type (an int out of range raises
/// OverflowError; a float for an integer type raises TypeError).
fn to_arg(ty: &str, value: &Bound<'_, PyAny>) -> PyResult<Arg> {
    Ok(match ty {
        "i32" => Arg::I32(value.extract()?),
        "u32" => Arg::U32(value.extract()?),
        "i64" => Arg::I64(value.extract()?),
        "u64" => Arg::U64(value.extract()?),
        "f32" => {
            let wide: f64 = value.extract()?;
            Arg::F32(f32_of(wide).ok_or_else(|| {
                PyOverflowError::new_err(format!(
                    "an f32 arg: {wide} is finite but does not fit an f32"
                ))
            })?)
        }
        "f64" => Arg::F64(value.extract()?),
        other => {
            return Err(PyValueError::new_err(format!(
                "scalar arg type {other:?} is not one of i32, u32, i64, u64, f32, f64"
            )))
        }
    })
}

/// `value` rounded to the nearest f32, or `None` when it is finite and
/// rounds past the f32 range (an infinity it was not: `ptxd._args.f32_value`
/// refuses the same values first). Infinities and NaN are f32 values.
pub(crate) fn f32_of(value: f64) -> Option<f32> {
    let rounded = value as f32;
    (rounded.is_finite() || !value.is_finite()).then_some(rounded)
}

/// A launch's f32 params as Python passes them (floats), each rounded to
/// an f32; one finite but past the f32 range raises `OverflowError`
/// rather than becoming an infinity.
pub(crate) fn f32_params_of(values: &[f64]) -> PyResult<Vec<f32>> {
    values
        .iter()
        .enumerate()
        .map(|(index, &wide)| {
            f32_of(wide).ok_or_else(|| {
                PyOverflowError::new_err(format!(
                    "param {index}: {wide} is finite but does not fit an f32"
                ))
            })
        })
        .collect()
}

fn to_launch(args: &LaunchArgs) -> (Kernel, Launch) {
    let (kernel, inputs, output, n, params, sync, wait, signal) = args;
    let operand = |(buffer, offset): &(String, u64)| Operand {
        buffer: buffer.clone(),
        offset: *offset,
    };
    let mut launch = Launch::new(inputs.iter().map(operand), operand(output), *n)
        .params(params.iter().copied())
        .sync(*sync);
    launch.wait_event = wait.clone();
    launch.signal_event = signal.clone();
    (kernel.get().inner.clone(), launch)
}

#[pymethods]
impl NativeSession {
    /// The next lease event since the session opened (a dict, see
    /// `event_dict`), waiting up to `timeout` seconds (none: until one
    /// comes); `None` when none came in time or none will come. Events a
    /// caller left unread for long may be skipped (the SDK keeps a backlog).
    #[pyo3(signature = (timeout=None))]
    fn next_event<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        // `Duration::from_secs_f64` panics past 2^64 s: the bound is the
        // reply spin's (the daemon's longest duration).
        let limit = match timeout {
            Some(t) => Some(seconds_arg("timeout", t, " (None: no limit)")?),
            None => None,
        };
        let events = &self.events;
        let next = async move {
            let mut events = events.lock().await;
            loop {
                match events.recv().await {
                    Ok(event) => return Some(event),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                }
            }
        };
        let event = block(py, async move {
            match limit {
                Some(limit) => tokio::time::timeout(limit, next).await.ok().flatten(),
                None => next.await,
            }
        })?;
        event.map(|e| event_dict(py, &e)).transpose()
    }

    /// True while the lease is open.
    fn is_open(&self) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_some_and(|s| s.is_open())
    }

    /// Ends the session; returns what the daemon released, or `None` when it
    /// was already closed or calls are still in flight on other threads
    /// (the lease then ends when the last of them returns).
    fn close<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let taken = self
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Some(session) = taken.and_then(|s| Arc::try_unwrap(s).ok()) else {
            return Ok(None);
        };
        if !session.is_open() {
            return Ok(None);
        }
        let report = call(py, async move { session.close().await })?;
        let dict = PyDict::new(py);
        dict.set_item("buffers_released", report.buffers_released)?;
        dict.set_item("kernels_released", report.kernels_released)?;
        dict.set_item("events_released", report.events_released)?;
        Ok(Some(dict))
    }

    /// Loads PTX text on `device` (an ordinal as ptxd numbers devices, or a
    /// UUID).
    #[pyo3(signature = (ptx, symbol, device, label=String::new()))]
    fn load_ptx(
        &self,
        py: Python<'_>,
        ptx: String,
        symbol: String,
        device: &Bound<'_, PyAny>,
        label: String,
    ) -> PyResult<NativeKernel> {
        let session = self.session(py)?;
        let device = device_selector(device)?;
        let options = ptxd_client::LoadOptions {
            label,
            declared: None,
        };
        let inner = call(py, async move {
            session.load_ptx(device, ptx, &symbol, options).await
        })?;
        Ok(NativeKernel { inner })
    }

    /// Creates a zero-filled POSIX shared-memory object of `size` bytes and
    /// registers it (host backend); returns it with the registration.
    #[pyo3(signature = (size, device_uuid=None))]
    fn create_shm<'py>(
        &self,
        py: Python<'py>,
        size: u64,
        device_uuid: Option<String>,
    ) -> PyResult<(NativeShm, Bound<'py, PyDict>)> {
        let session = self.session(py)?;
        let shm = block(py, async move { HostShm::create(size) })?.map_err(|e| shm_err(py, e))?;
        let shm = Arc::new(shm);
        let registered = shm.clone();
        let buffer = call(py, async move {
            session
                .register_shm(&registered, device_uuid.as_deref())
                .await
        })?;
        Ok((NativeShm { inner: shm }, buffer_dict(py, &buffer)?))
    }

    /// Creates a zero-filled memfd of `size` bytes, sealed against shrinking
    /// and growing, and registers it by descriptor over the fd socket (host
    /// backend); returns it with the registration.
    #[pyo3(signature = (size, device_uuid=None))]
    fn create_memfd<'py>(
        &self,
        py: Python<'py>,
        size: u64,
        device_uuid: Option<String>,
    ) -> PyResult<(NativeMemfd, Bound<'py, PyDict>)> {
        let session = self.session(py)?;
        let memfd =
            block(py, async move { HostMemfd::create(size) })?.map_err(|e| shm_err(py, e))?;
        let memfd = Arc::new(memfd);
        let registered = memfd.clone();
        let buffer = call(py, async move {
            session
                .register_memfd(&registered, device_uuid.as_deref())
                .await
        })?;
        Ok((NativeMemfd { inner: memfd }, buffer_dict(py, &buffer)?))
    }

    /// Registers `size` bytes from `offset` of the memory behind the
    /// caller's descriptor `fd` (a memfd sealed with `F_SEAL_SHRINK` on the
    /// host backend, an exported allocation's fd on CUDA). ptxd keeps its
    /// own reference; the caller's `fd` is used only during the call. On
    /// CUDA, `allocation_size` is the whole allocation's size (the driver
    /// maps an imported allocation only at its exact size).
    #[pyo3(signature = (fd, size, device_uuid=None, offset=0, label=String::new(), allocation_size=None))]
    #[allow(clippy::too_many_arguments)]
    fn register_fd<'py>(
        &self,
        py: Python<'py>,
        fd: i64,
        size: u64,
        device_uuid: Option<String>,
        offset: u64,
        label: String,
        allocation_size: Option<u64>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let session = self.session(py)?;
        let fd = duplicate_fd(py, fd)?;
        let spec = FdBufferSpec {
            device_uuid,
            offset,
            label,
            allocation_size,
        };
        let buffer = call(py, async move {
            session.register_fd_buffer(fd.as_fd(), size, spec).await
        })?;
        buffer_dict(py, &buffer)
    }

    /// Registers a 64-byte CUDA IPC memory handle of a `size`-byte
    /// allocation on the device `device_uuid`.
    #[pyo3(signature = (handle, device_uuid, size, label=String::new()))]
    fn register_cuda_ipc<'py>(
        &self,
        py: Python<'py>,
        handle: [u8; 64],
        device_uuid: String,
        size: u64,
        label: String,
    ) -> PyResult<Bound<'py, PyDict>> {
        let session = self.session(py)?;
        let source = ptxd_client::BufferSource::CudaIpc {
            handle,
            device_uuid,
        };
        let buffer = call(py, async move {
            session.register_buffer(source, size, &label).await
        })?;
        buffer_dict(py, &buffer)
    }

    /// Releases a buffer registration by handle.
    fn release_buffer(&self, py: Python<'_>, handle: String) -> PyResult<()> {
        let session = self.session(py)?;
        let buffer = ptxd_client::Buffer {
            handle,
            size: 0,
            device_uuid: String::new(),
            generation: 0,
            ring_index: 0,
        };
        call(py, async move { session.release_buffer(&buffer).await })
    }

    /// The session's buffer registrations.
    fn list_buffers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let session = self.session(py)?;
        let buffers = call(py, async move { session.list_buffers().await })?;
        let list = PyList::empty(py);
        for b in buffers {
            let dict = PyDict::new(py);
            dict.set_item("handle", b.handle)?;
            dict.set_item("label", b.label)?;
            dict.set_item("kind", b.kind)?;
            dict.set_item("device_uuid", b.device_uuid)?;
            dict.set_item("size", b.size)?;
            dict.set_item("generation", b.generation)?;
            dict.set_item("live", b.live)?;
            list.append(dict)?;
        }
        Ok(list)
    }

    /// Registers a 64-byte CUDA IPC event handle; returns the event handle.
    fn register_event(
        &self,
        py: Python<'_>,
        handle: [u8; 64],
        device_uuid: String,
    ) -> PyResult<String> {
        let session = self.session(py)?;
        let event = call(py, async move {
            session.register_event(handle, &device_uuid, "python").await
        })?;
        Ok(event.handle)
    }

    /// Opens a plain launch ring on `device` (an ordinal or a UUID) with
    /// `slots` slots (a power of two): launches on registered memory by
    /// ring index, with no GPU ordering (`HostRing`; the host backend's
    /// ring). By name, or by descriptor when the name does not open.
    fn open_ring(
        &self,
        py: Python<'_>,
        device: &Bound<'_, PyAny>,
        slots: u32,
    ) -> PyResult<host_ring::HostRing> {
        let session = self.session(py)?;
        let device = device_selector(device)?;
        let ring = call(py, async move { open_ring(&session, slots, device).await })?;
        Ok(host_ring::HostRing::new(ring, slots, self.answer_spin))
    }

    /// Opens a launch ring on `device`'s executor, ordered on this
    /// process's streams through two words of a fresh 16-byte allocation of
    /// `device` (see `Ring`): `cuMemAlloc` memory registered by CUDA IPC
    /// handle, or, where ptxd cannot open that (no common IPC namespace),
    /// `cuMemCreate` memory registered by file descriptor. The ring's
    /// shared memory goes by name, or by descriptor when the name does not
    /// open (no common `/dev/shm`).
    fn open_ordered_ring(
        &self,
        py: Python<'_>,
        device: PyRef<'_, NativeCudaDevice>,
        slots: u32,
    ) -> PyResult<NativeRing> {
        let session = self.session(py)?;
        let device = device.inner.clone();
        let uuid = device.uuid().to_owned();
        let words = py
            .detach(|| preserving_current_context(|| device.alloc(ORDERING_BYTES)))
            .map(Arc::new)
            .map_err(|e| cuda_err(py, e))?;
        let handle = py
            .detach(|| preserving_current_context(|| words.ipc_handle()))
            .map_err(|e| cuda_err(py, e))?;
        let registered = call(py, {
            let session = session.clone();
            let uuid = uuid.clone();
            async move {
                let source = ptxd_client::BufferSource::CudaIpc {
                    handle,
                    device_uuid: uuid,
                };
                session
                    .register_buffer(source, ORDERING_BYTES as u64, RING_WORDS_LABEL)
                    .await
            }
        });
        let (ring_words, words_buffer): (RingWords, ptxd_client::Buffer) = match registered {
            Ok(buffer) => (RingWords::Ipc(words), buffer),
            Err(ipc_error) => {
                // The words by descriptor instead (memory passed by fd works
                // as semaphore words as well: `cuda::DeviceWords`).
                let exportable = py
                    .detach(|| {
                        preserving_current_context(|| {
                            let memory = device.alloc_exportable(ORDERING_BYTES)?;
                            let fd = memory.export_fd()?;
                            Ok::<_, CudaError>((Arc::new(memory), fd))
                        })
                    })
                    .map_err(|_| ipc_error)?;
                let (memory, fd) = exportable;
                let spec = FdBufferSpec {
                    device_uuid: Some(uuid.clone()),
                    offset: 0,
                    label: RING_WORDS_LABEL.to_owned(),
                    allocation_size: Some(memory.allocation_size()),
                };
                let session = session.clone();
                let buffer = call(py, async move {
                    session
                        .register_fd_buffer(fd.as_fd(), ORDERING_BYTES as u64, spec)
                        .await
                })?;
                (RingWords::Fd(memory), buffer)
            }
        };
        let device_uuid = DeviceSelector::Uuid(uuid.clone());
        let mut ring = call(
            py,
            async move { open_ring(&session, slots, device_uuid).await },
        )?;
        let ordered = py.detach(|| {
            preserving_current_context(|| match &ring_words {
                RingWords::Ipc(words) => ring.order_with(&words_buffer, words.clone()),
                RingWords::Fd(words) => ring.order_with(&words_buffer, words.clone()),
            })
        });
        ordered.map_err(|e| to_pyerr(py, e))?;
        Ok(NativeRing {
            ring: Mutex::new(ring),
            device,
            _words: ring_words,
            words_handle: words_buffer.handle,
            answer_spin: self.answer_spin,
        })
    }

    /// Launches one kernel; returns `(micros, reloaded)`.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (kernel, inputs, output, n, params, sync, wait_event=None, signal_event=None, args=Vec::new()))]
    fn launch(
        &self,
        py: Python<'_>,
        kernel: Py<NativeKernel>,
        inputs: Vec<(String, u64)>,
        output: (String, u64),
        n: u64,
        params: Vec<f64>,
        sync: bool,
        wait_event: Option<String>,
        signal_event: Option<String>,
        args: Vec<(String, Bound<'_, PyAny>)>,
    ) -> PyResult<(u64, bool)> {
        let args = args
            .iter()
            .map(|(ty, value)| to_arg(ty, value))
            .collect::<PyResult<Vec<Arg>>>()?;
        let session = self.session(py)?;
        let (kernel, mut launch) = to_launch(&(
            kernel,
            inputs,
            output,
            n,
            params,
            sync,
            wait_event,
            signal_event,
        ));
        launch.args = args;
        let launched = call(py, async move { session.launch(&kernel, &launch).await })?;
        Ok((launched.micros, launched.reloaded))
    }

    /// Pipelines launches on one launch stream; returns one entry per
    /// launch, in order: its micros, or the exception it was refused with.
    /// `args`, when given, holds each launch's typed scalar args as
    /// `(type, value)` pairs (an empty list for a launch without any).
    #[pyo3(signature = (launches, args=None))]
    fn launch_many(
        &self,
        py: Python<'_>,
        launches: Vec<LaunchArgs>,
        args: Option<Vec<TypedArgs<'_>>>,
    ) -> PyResult<Py<PyList>> {
        let session = self.session(py)?;
        let mut launches: Vec<(Kernel, Launch)> = launches.iter().map(to_launch).collect();
        if let Some(args) = args {
            if args.len() != launches.len() {
                return Err(PyValueError::new_err(format!(
                    "{} launches but {} lists of args",
                    launches.len(),
                    args.len()
                )));
            }
            for ((_, launch), typed) in launches.iter_mut().zip(&args) {
                launch.args = typed
                    .iter()
                    .map(|(ty, value)| to_arg(ty, value))
                    .collect::<PyResult<Vec<Arg>>>()?;
            }
        }
        let count = launches.len();
        let replies = call(py, async move {
            let (mut sender, mut receiver) = session.launch_stream().await?.split();
            let send = async move {
                for (kernel, launch) in &launches {
                    sender.send(kernel, launch).await?;
                }
                Ok::<(), Error>(())
            };
            let receive = async {
                let mut replies = Vec::with_capacity(count);
                while replies.len() < count {
                    match receiver.next().await? {
                        Some(reply) => replies.push(reply.outcome),
                        None => break,
                    }
                }
                Ok::<_, Error>(replies)
            };
            let (sent, received) = tokio::join!(send, receive);
            sent?;
            received
        })?;
        if replies.len() != count {
            return Err(to_pyerr(
                py,
                Error::Protocol(format!(
                    "the launch stream ended after {} of {count} replies",
                    replies.len()
                )),
            ));
        }
        let list = PyList::empty(py);
        for outcome in replies {
            match outcome {
                Ok(launched) => list.append(launched.micros)?,
                Err(error) => list.append(to_pyerr(py, error).value(py))?,
            }
        }
        Ok(list.unbind())
    }
}

/// The label of a ring's ordering words in `Session.list_buffers`.
const RING_WORDS_LABEL: &str = "ptxd:ring-order";

/// One launch as `Ring.launch` takes it: kernel, inputs and output as
/// (ring index, byte offset), n, params.
/// One ring launch as the Python half passes it: kernel, inputs, output,
/// n, f32 scalars, typed args as `(type, value)`.
type RingLaunchArgs = (
    Py<NativeKernel>,
    Vec<(u32, u64)>,
    (u32, u64),
    u64,
    Vec<f32>,
    Vec<(String, Py<PyAny>)>,
);

/// The gRPC code a unary launch refused for `reason` comes with (the
/// daemon's own table), so that a refusal through the ring raises the same
/// exception, code included.
fn ring_code(reason: &str) -> (&'static str, i32) {
    match reason {
        "BUFFER_TOO_SMALL" => ("OUT_OF_RANGE", 11),
        "ABI_MISMATCH"
        | "INVALID_ARGUMENT"
        | "INVALID_ARTIFACT"
        | "INVALID_HANDLE"
        | "NON_SCALAR_ABI"
        | "SCALAR_ARGS_MISMATCH"
        | "UNSUPPORTED_ARTIFACT" => ("INVALID_ARGUMENT", 3),
        "KERNEL_FAULT" => ("ABORTED", 10),
        "KERNEL_TIMEOUT" => ("DEADLINE_EXCEEDED", 4),
        "LIMIT_EXCEEDED" | "SLOT_BANK_FULL" => ("RESOURCE_EXHAUSTED", 8),
        "EXECUTOR_UNAVAILABLE" | "DRAINING" => ("UNAVAILABLE", 14),
        "INTERNAL" => ("INTERNAL", 13),
        "UNKNOWN_SESSION" | "UNKNOWN_DEVICE" | "SYMBOL_NOT_FOUND" => ("NOT_FOUND", 5),
        "NOT_OWNER" | "UNVERIFIED_ARTIFACT" => ("PERMISSION_DENIED", 7),
        "IDENTITY_REQUIRED" => ("UNAUTHENTICATED", 16),
        _ => ("FAILED_PRECONDITION", 9),
    }
}

/// The exception a refused or failed ring launch raises: the class of its
/// reason, as for a unary launch.
fn ring_refusal(py: Python<'_>, refusal: &RingRefusal) -> PyErr {
    ring_refusal_as(py, refusal, false)
}

/// As `ring_refusal`; a `deferred` one (a launch that returned before ptxd
/// answered) says so in its message and metadata (`deferred: "true"`).
pub(crate) fn ring_refusal_as(py: Python<'_>, refusal: &RingRefusal, deferred: bool) -> PyErr {
    let mut metadata = BTreeMap::from([
        ("path".to_owned(), "ring".to_owned()),
        ("ticket".to_owned(), refusal.ticket.to_string()),
    ]);
    let mut message = refusal.to_string();
    if deferred {
        metadata.insert("deferred".to_owned(), "true".to_owned());
        message = format!("an earlier deferred launch: {message}");
    }
    make_error(
        py,
        "refused",
        &refusal.reason,
        message,
        ring_code(&refusal.reason),
        &metadata,
    )
}

/// A timeout in seconds as a `Duration`.
pub(crate) fn timeout_of(seconds: f64) -> PyResult<std::time::Duration> {
    std::time::Duration::try_from_secs_f64(seconds)
        .map_err(|_| PyValueError::new_err(format!("bad timeout {seconds}")))
}

/// The parts of ring launches the SDK borrows, owned while the GIL is
/// released.
struct OwnedLaunches {
    kernels: Vec<Kernel>,
    inputs: Vec<Vec<OperandRef>>,
    args: Vec<Vec<Arg>>,
}

fn operand((buffer, offset): (u32, u64)) -> OperandRef {
    OperandRef { buffer, offset }
}

impl OwnedLaunches {
    fn of(py: Python<'_>, launches: &[RingLaunchArgs]) -> PyResult<Self> {
        let kernels = launches.iter().map(|l| l.0.get().inner.clone()).collect();
        let inputs = launches
            .iter()
            .map(|l| l.1.iter().copied().map(operand).collect())
            .collect();
        let args = launches
            .iter()
            .map(|l| {
                l.5.iter()
                    .map(|(ty, value)| to_arg(ty, value.bind(py)))
                    .collect::<PyResult<Vec<Arg>>>()
            })
            .collect::<PyResult<_>>()?;
        Ok(OwnedLaunches {
            kernels,
            inputs,
            args,
        })
    }

    fn raw<'a>(&'a self, launches: &'a [RingLaunchArgs]) -> Vec<RawStreamLaunch<'a>> {
        launches
            .iter()
            .zip(&self.kernels)
            .zip(&self.inputs)
            .zip(&self.args)
            .map(|(((l, kernel), inputs), args)| RawStreamLaunch {
                kernel,
                inputs,
                output: operand(l.2),
                n: l.3,
                scalars: &l.4,
                args,
            })
            .collect()
    }
}

/// The exceptions of deferred launches' refusals, as a list.
fn deferred_list(py: Python<'_>, refused: &[RingRefusal]) -> PyResult<Py<PyList>> {
    let list = PyList::empty(py);
    for refusal in refused {
        list.append(ring_refusal_as(py, refusal, true).value(py))?;
    }
    Ok(list.unbind())
}

/// Waits for the answers of every launch still outstanding on `ring`
/// (`Ring.drain`, `HostRing.drain`): the exceptions of those refused or
/// failed, in order.
pub(crate) fn drain_list(
    py: Python<'_>,
    ring: &Mutex<LaunchRing>,
    timeout: f64,
) -> PyResult<Py<PyList>> {
    let timeout = timeout_of(timeout)?;
    let refused = py.detach(|| {
        ring.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(timeout)
    });
    match refused {
        Ok(refused) => deferred_list(py, &refused),
        Err(e) => Err(to_pyerr(py, e)),
    }
}

/// A ring's ordering words: memory registered by CUDA IPC handle, or by
/// file descriptor.
enum RingWords {
    Ipc(Arc<DeviceAllocation>),
    Fd(Arc<ExportableAllocation>),
}

/// A session's launch ring on one device, ordered on a framework's stream
/// by two GPU words (`LaunchRing::launch_on_raw_stream`). One per stream:
/// its words order one stream's work (see the SDK's ordering docs).
#[pyclass(module = "ptxd._native", name = "Ring", frozen)]
pub(crate) struct NativeRing {
    ring: Mutex<LaunchRing>,
    device: CudaDevice,
    /// The ordering words; ptxd maps them, the ring writes them.
    _words: RingWords,
    words_handle: String,
    /// How long an awaited call polls for its answers (see `answers`).
    answer_spin: std::time::Duration,
}

#[pymethods]
impl NativeRing {
    /// The registration handle of the ordering words.
    #[getter]
    fn words_handle(&self) -> String {
        self.words_handle.clone()
    }

    /// Launches `launches` in order on the ring, ordered on the stream at
    /// address `stream`: the first waits on the GPU for the stream's earlier
    /// work, the stream's later work for the last. `checks` are `(address,
    /// allocation id)` pairs the caller's registration cache resolved the
    /// operands with; when the allocation at an address has another id now
    /// (the memory was freed and allocated again), nothing is launched and
    /// `None` comes back: resolve again. Otherwise returns one entry per
    /// launch: `None`, or the exception it was refused with.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (stream, launches, checks, sync, timeout))]
    fn launch(
        &self,
        py: Python<'_>,
        stream: usize,
        launches: Vec<RingLaunchArgs>,
        checks: Vec<(u64, u64)>,
        sync: bool,
        timeout: f64,
    ) -> PyResult<Option<Py<PyList>>> {
        let timeout = timeout_of(timeout)?;
        let owned = OwnedLaunches::of(py, &launches)?;
        let outcome = py.detach(|| {
            preserving_current_context(|| {
                if !self.checks_hold(&checks)? {
                    return Ok(None);
                }
                let raw = owned.raw(&launches);
                let mut ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
                // SAFETY: `stream` is the `CUstream` of the framework's stream
                // on this ring's device, resolved by `ptxd._client` from the
                // framework itself (its current raw stream, or the stream
                // object the caller passed); the Python half keeps one ring
                // per stream, and the lock above serializes its callers.
                unsafe { ring.launch_on_raw_stream(stream, &raw, sync, timeout) }.map(Some)
            })
        });
        let completions = match outcome {
            Ok(Some(completions)) => completions,
            Ok(None) => return Ok(None),
            Err(e) => return Err(to_pyerr(py, e)),
        };
        let list = PyList::empty(py);
        for completion in completions {
            match completion.outcome {
                Ok(()) => list.append(py.None())?,
                Err(refusal) => list.append(ring_refusal(py, &refusal).value(py))?,
            }
        }
        Ok(Some(list.unbind()))
    }

    /// As `launch`, with deferred completions (a session opened with
    /// `defer_errors=True`): the launches are submitted and the stream
    /// operations enqueued, and the call returns without waiting for
    /// ptxd's answers. Returns `None` when a check failed (nothing
    /// launched, as `launch`), else the exceptions of earlier deferred
    /// launches that ptxd refused (or that failed), read during this call:
    /// empty when none, and when not empty nothing of this call was sent.
    #[pyo3(signature = (stream, launches, checks, timeout))]
    fn launch_deferred(
        &self,
        py: Python<'_>,
        stream: usize,
        launches: Vec<RingLaunchArgs>,
        checks: Vec<(u64, u64)>,
        timeout: f64,
    ) -> PyResult<Option<Py<PyList>>> {
        let timeout = timeout_of(timeout)?;
        let owned = OwnedLaunches::of(py, &launches)?;
        let options = RawStreamOptions {
            sync: false,
            timeout,
            defer: true,
        };
        let outcome = py.detach(|| {
            preserving_current_context(|| {
                if !self.checks_hold(&checks)? {
                    return Ok(None);
                }
                let raw = owned.raw(&launches);
                let mut ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
                // SAFETY: as in `launch`.
                unsafe { ring.launch_on_raw_stream_with(stream, &raw, options, None) }.map(Some)
            })
        });
        match outcome {
            Ok(Some(outcome)) => deferred_list(py, &outcome.deferred).map(Some),
            Ok(None) => Ok(None),
            Err(e) => Err(to_pyerr(py, e)),
        }
    }

    /// Launches `plan` (one `Plan` from `OperandTable.resolve`, or a list
    /// of them, in order) on the ring, ordered on the stream at address
    /// `stream`, as `launch` (or, with `defer` and not `sync`, as
    /// `launch_deferred`) does, and returns what that call returns: `None`
    /// when a check failed (nothing launched), else the outcome list (or
    /// the earlier deferred refusals). No Python tuple is read: a plan
    /// holds its launch as the SDK takes it.
    #[pyo3(signature = (stream, plan, sync, defer, timeout))]
    fn launch_plan(
        &self,
        py: Python<'_>,
        stream: usize,
        plan: &Bound<'_, PyAny>,
        sync: bool,
        defer: bool,
        timeout: f64,
    ) -> PyResult<Option<Py<PyList>>> {
        let timeout = timeout_of(timeout)?;
        let one;
        let many: Vec<Bound<'_, Plan>>;
        let plans: Vec<&Plan> = if let Ok(plan) = plan.cast::<Plan>() {
            one = plan.clone();
            vec![one.get()]
        } else {
            many = plan.extract()?;
            many.iter().map(|p| p.get()).collect()
        };
        Ok(
            match self.launch_plans(py, stream, &plans, sync, defer, timeout)? {
                PlanOutcome::Stale => None,
                PlanOutcome::Listed(list) => Some(list),
                PlanOutcome::Accepted if defer && !sync => Some(PyList::empty(py).unbind()),
                PlanOutcome::Accepted => {
                    Some(PyList::new(py, plans.iter().map(|_| py.None()))?.unbind())
                }
            },
        )
    }

    /// Waits for the completions of every launch still outstanding on the
    /// ring (deferred ones included); returns the exceptions of those ptxd
    /// refused or that failed, in order.
    fn drain(&self, py: Python<'_>, timeout: f64) -> PyResult<Py<PyList>> {
        drain_list(py, &self.ring, timeout)
    }

    /// Launches `launches` `calls` times as `launch` (or `launch_deferred`
    /// with `defer`) does, timing each phase of each call: returns a dict
    /// of phase name -> a list of nanoseconds, one per call. For
    /// `profile_launch.py`; refusals are not reported.
    #[pyo3(signature = (stream, launches, checks, calls, defer=false))]
    fn profile<'py>(
        &self,
        py: Python<'py>,
        stream: usize,
        launches: Bound<'py, PyList>,
        checks: Vec<(u64, u64)>,
        calls: usize,
        defer: bool,
    ) -> PyResult<Bound<'py, PyDict>> {
        const PHASES: [&str; 9] = [
            "argument conversion (PyO3)",
            "GIL release and reacquire",
            "the rest (context save and restore, ring lock)",
            "allocation-id checks",
            "reading earlier completions",
            "stream memops (cuStreamBatchMemOp)",
            "descriptor build and publish",
            "wait for ptxd's completion",
            "total",
        ];
        let mut samples: Vec<Vec<u64>> = vec![Vec::with_capacity(calls.min(1 << 16)); PHASES.len()];
        let options = RawStreamOptions {
            sync: false,
            timeout: std::time::Duration::from_secs(60),
            defer,
        };
        let ns = |since: std::time::Instant| {
            u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
        };
        for _ in 0..calls {
            let start = std::time::Instant::now();
            let args: Vec<RingLaunchArgs> = launches.extract()?;
            let owned = OwnedLaunches::of(py, &args)?;
            samples[0].push(ns(start));
            let detach = std::time::Instant::now();
            py.detach(|| {});
            samples[1].push(ns(detach));
            let mut phases = RawStreamPhases::default();
            let mut checks_ns = 0u64;
            let outcome = py.detach(|| {
                preserving_current_context(|| {
                    let checked = std::time::Instant::now();
                    let held = self.checks_hold(&checks);
                    checks_ns = ns(checked);
                    if !held? {
                        return Ok(None);
                    }
                    let raw = owned.raw(&args);
                    let mut ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
                    // SAFETY: as in `launch`.
                    unsafe {
                        ring.launch_on_raw_stream_with(stream, &raw, options, Some(&mut phases))
                    }
                    .map(Some)
                })
            });
            let total = ns(start);
            match outcome {
                Ok(Some(_)) => {}
                Ok(None) => {
                    return Err(PyValueError::new_err("a check failed: the operands moved"))
                }
                Err(e) => return Err(to_pyerr(py, e)),
            }
            let accounted = samples[0].last().copied().unwrap_or(0)
                + samples[1].last().copied().unwrap_or(0)
                + checks_ns
                + phases.earlier_ns
                + phases.memops_ns
                + phases.submit_ns
                + phases.wait_ns;
            samples[2].push(total.saturating_sub(accounted));
            samples[3].push(checks_ns);
            samples[4].push(phases.earlier_ns);
            samples[5].push(phases.memops_ns);
            samples[6].push(phases.submit_ns);
            samples[7].push(phases.wait_ns);
            samples[8].push(total);
        }
        let dict = PyDict::new(py);
        for (name, values) in PHASES.iter().zip(samples) {
            dict.set_item(name, values)?;
        }
        Ok(dict)
    }
}

/// A plan's launch as the SDK takes it.
fn raw_launch<'a>(plan: &'a Plan, kernel: &'a Kernel) -> RawStreamLaunch<'a> {
    RawStreamLaunch {
        kernel,
        inputs: &plan.inputs,
        output: plan.output,
        n: plan.n,
        scalars: &plan.scalars,
        args: &plan.typed,
    }
}

/// What a ring call on plans did (`NativeRing::launch_plans`).
pub(crate) enum PlanOutcome {
    /// A check failed: the memory at a cached address was freed and
    /// allocated again; nothing was launched.
    Stale,
    /// Launched, and nothing refused: awaited, every launch accepted;
    /// deferred, no earlier refusal read. No Python object is built for it.
    Accepted,
    /// Awaited: one entry per launch, `None` or the exception it was
    /// refused with. Deferred: the exceptions of earlier launches read by
    /// this call (nothing of it sent).
    Listed(Py<PyList>),
}

impl NativeRing {
    /// `launch_plan`'s body, for plans already borrowed (`OperandTable.
    /// launch` calls it too). One plan, the common case, allocates nothing
    /// here: its checks are borrowed and its one launch lives on the stack.
    pub(crate) fn launch_plans(
        &self,
        py: Python<'_>,
        stream: usize,
        plans: &[&Plan],
        sync: bool,
        defer: bool,
        timeout: std::time::Duration,
    ) -> PyResult<PlanOutcome> {
        // The plans' kernels (a test's fake plan has none); one plan's
        // needs no Vec.
        let not_native = || PyTypeError::new_err("a plan's kernel is not a ptxd kernel");
        let mut kernels: Vec<&Kernel> = Vec::new();
        let single = match plans {
            [plan] => Some(plan.native.as_ref().ok_or_else(not_native)?),
            _ => {
                for plan in plans {
                    kernels.push(plan.native.as_ref().ok_or_else(not_native)?);
                }
                None
            }
        };
        let defer = defer && !sync;
        // An awaited async call submits as a deferred one does and then
        // reads its own answers itself (`answers::await_answers`: polled
        // for the client's reply spin before the SDK's wait sleeps); a
        // sync call leaves the waiting to the SDK (its launches must run
        // one after the other).
        let own_wait = !sync && !defer;
        let options = RawStreamOptions {
            sync,
            timeout,
            defer: defer || own_wait,
        };
        let count = plans.len();
        let spin = self.answer_spin;
        // One GIL release for the checks, the stream operations, the
        // submission and (awaited) the wait.
        let outcome = py.detach(|| {
            preserving_current_context(|| {
                if !self.checks_hold(plans.iter().flat_map(|plan| &plan.checks))? {
                    return Ok(None);
                }
                let mut ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
                if own_wait {
                    // What an earlier, failed call left is not this call's
                    // (the SDK's awaited call drops it the same way): read
                    // and dropped, so that every answer outstanding after
                    // the submission is this call's.
                    ring.drain(timeout)?;
                }
                let submitted = match (plans, single) {
                    ([plan], Some(kernel)) => {
                        let raw = [raw_launch(plan, kernel)];
                        // SAFETY: as in `launch`.
                        unsafe { ring.launch_on_raw_stream_with(stream, &raw, options, None) }
                    }
                    _ => {
                        let raw: Vec<RawStreamLaunch<'_>> = plans
                            .iter()
                            .zip(&kernels)
                            .map(|(plan, kernel)| raw_launch(plan, kernel))
                            .collect();
                        // SAFETY: as in `launch`.
                        unsafe { ring.launch_on_raw_stream_with(stream, &raw, options, None) }
                    }
                };
                let mut outcome = submitted?;
                if !own_wait {
                    return Ok(Some((outcome, None)));
                }
                // Submitted (when there was anything to submit): the
                // drain above left nothing outstanding, so the deferred
                // call's read of earlier answers found none, and it needed
                // no free slot it did not have; nothing else stops it but
                // an error, returned above.
                let read = std::mem::take(&mut outcome.completions);
                let refused = answers::await_refusals(&mut ring, read, count, spin, timeout)?;
                Ok(Some((outcome, Some(refused))))
            })
        });
        let (outcome, awaited) = match outcome {
            Ok(Some(outcome)) => outcome,
            Ok(None) => return Ok(PlanOutcome::Stale),
            Err(e) => return Err(to_pyerr(py, e)),
        };
        if let Some(refused) = awaited {
            if refused.is_empty() {
                return Ok(PlanOutcome::Accepted);
            }
            let list = PyList::new(py, (0..count).map(|_| py.None()))?;
            for (index, refusal) in &refused {
                list.set_item(*index, ring_refusal(py, refusal).value(py))?;
            }
            return Ok(PlanOutcome::Listed(list.unbind()));
        }
        if defer {
            // A deferred call returns no completions of its own, but for a
            // batch longer than the ring's free slots it reads some while
            // it submits: their refusals are reported with the earlier
            // ones, never dropped (the Python half defers no such batch).
            let mut refused = outcome.deferred;
            refused.extend(
                outcome
                    .completions
                    .into_iter()
                    .filter_map(|c| c.outcome.err()),
            );
            if refused.is_empty() {
                return Ok(PlanOutcome::Accepted);
            }
            return deferred_list(py, &refused).map(PlanOutcome::Listed);
        }
        if outcome.completions.iter().all(|c| c.outcome.is_ok()) {
            return Ok(PlanOutcome::Accepted);
        }
        let list = PyList::empty(py);
        for completion in outcome.completions {
            match completion.outcome {
                Ok(()) => list.append(py.None())?,
                Err(refusal) => list.append(ring_refusal(py, &refusal).value(py))?,
            }
        }
        Ok(PlanOutcome::Listed(list.unbind()))
    }

    /// Whether the allocation at each checked address still has the id the
    /// Python half's cache resolved it with. One address per allocation id
    /// is asked about (the first given): while the allocation a
    /// registration was made of lives (same id at one of its addresses),
    /// every address cached in it is still inside it. This is the one
    /// place checks are deduplicated; callers pass every operand's.
    ///
    /// The ids already asked about are kept in a set once there are more
    /// than a handful (a `launch_many` of thousands of launches over as
    /// many tensors stays linear).
    fn checks_hold<'a, I>(&self, checks: I) -> Result<bool, Error>
    where
        I: IntoIterator<Item = &'a (u64, u64)>,
    {
        const FEW: usize = 16;
        // On the stack: the hot path (a launch's few operands) allocates
        // nothing.
        let mut few = [0u64; FEW];
        let mut len = 0;
        let mut many: Option<std::collections::HashSet<u64>> = None;
        for &(ptr, id) in checks {
            let first = match &mut many {
                Some(set) => set.insert(id),
                None if few[..len].contains(&id) => false,
                None if len < FEW => {
                    few[len] = id;
                    len += 1;
                    true
                }
                None => {
                    let mut set: std::collections::HashSet<u64> = few.into_iter().collect();
                    set.insert(id);
                    many = Some(set);
                    true
                }
            };
            if first && self.device.allocation_id(ptr)? != id {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// A loaded kernel (`ptxd.Kernel` wraps it).
#[pyclass(module = "ptxd._native", name = "Kernel", frozen)]
struct NativeKernel {
    inner: Kernel,
}

fn signature_tuple(s: &KernelSignature) -> (u32, Vec<u32>, u32, u32, u32, u32) {
    (
        s.inputs,
        s.element_sizes.clone(),
        s.scalar_params,
        s.block_size,
        s.reqntid,
        s.maxntid,
    )
}

#[pymethods]
impl NativeKernel {
    /// `(inputs, element_sizes, scalar_params, block_size, reqntid, maxntid)`.
    fn signature(&self) -> (u32, Vec<u32>, u32, u32, u32, u32) {
        signature_tuple(&self.inner.signature())
    }

    #[getter]
    fn symbol(&self) -> String {
        self.inner.symbol().to_owned()
    }

    /// The launch contract ptxd checks every launch against, as one line.
    #[getter]
    fn contract(&self) -> String {
        self.inner.signature().contract
    }

    /// Whether ptxd grants this kernel to launch rings (its
    /// `KernelSignature.ring_launchable`): ring eligibility as data, not
    /// read from the contract's text.
    #[getter]
    fn ring_launchable(&self) -> bool {
        self.inner.signature().ring_launchable
    }

    /// `(handle, cache_hit, load_micros, device_uuid, generation)` of the
    /// current load.
    fn state(&self) -> (String, bool, u64, String, u64) {
        let s = self.inner.state();
        (
            s.handle,
            s.cache_hit,
            s.load_micros,
            s.device_uuid,
            s.generation,
        )
    }

    #[getter]
    fn reloads(&self) -> u64 {
        self.inner.reloads()
    }
}

/// A shared-memory object this process created (unlinked and unmapped when
/// the last reference goes).
#[pyclass(module = "ptxd._native", name = "Shm", frozen)]
struct NativeShm {
    inner: Arc<HostShm>,
}

#[pymethods]
impl NativeShm {
    #[getter]
    fn name(&self) -> String {
        self.inner.name().to_owned()
    }

    #[getter]
    fn size(&self) -> u64 {
        self.inner.size()
    }

    /// The mapping's address, for numpy's `__array_interface__`; valid while
    /// this object lives.
    #[getter]
    fn address(&self) -> usize {
        self.inner.as_slice().as_ptr() as usize
    }
}

/// A sealed memfd this process created and mapped (closed and unmapped when
/// the last reference goes; ptxd keeps its own reference while registered).
#[pyclass(module = "ptxd._native", name = "Memfd", frozen)]
struct NativeMemfd {
    inner: Arc<HostMemfd>,
}

#[pymethods]
impl NativeMemfd {
    #[getter]
    fn size(&self) -> u64 {
        self.inner.size()
    }

    /// The mapping's address, for numpy's `__array_interface__`; valid while
    /// this object lives.
    #[getter]
    fn address(&self) -> usize {
        self.inner.as_slice().as_ptr() as usize
    }
}

/// A CUDA device of this process, its primary context retained.
#[pyclass(module = "ptxd._native", name = "CudaDevice", frozen)]
struct NativeCudaDevice {
    inner: CudaDevice,
}

#[pymethods]
impl NativeCudaDevice {
    #[new]
    fn new(py: Python<'_>, ordinal: u32) -> PyResult<Self> {
        let inner = py
            .detach(|| preserving_current_context(|| CudaDevice::open(ordinal)))
            .map_err(|e| cuda_err(py, e))?;
        Ok(NativeCudaDevice { inner })
    }

    #[getter]
    fn uuid(&self) -> String {
        self.inner.uuid().to_owned()
    }

    #[getter]
    fn ordinal(&self) -> u32 {
        self.inner.ordinal()
    }

    /// `(base, size, buffer_id, ipc_capable)` of the allocation holding
    /// device address `ptr`.
    fn locate(&self, py: Python<'_>, ptr: u64) -> PyResult<(u64, u64, u64, bool)> {
        let range = py
            .detach(|| preserving_current_context(|| self.inner.locate(ptr)))
            .map_err(|e| cuda_err(py, e))?;
        Ok((range.base, range.size, range.buffer_id, range.ipc_capable))
    }

    /// The IPC handle of the allocation `(base, size, buffer_id,
    /// ipc_capable)` from `locate`.
    fn export<'py>(
        &self,
        py: Python<'py>,
        range: (u64, u64, u64, bool),
    ) -> PyResult<Bound<'py, PyBytes>> {
        let (base, size, buffer_id, ipc_capable) = range;
        let range = AllocationRange {
            base,
            size,
            buffer_id,
            ipc_capable,
        };
        let handle = py
            .detach(|| preserving_current_context(|| self.inner.export(&range)))
            .map_err(|e| cuda_err(py, e))?;
        Ok(PyBytes::new(py, &handle))
    }

    /// A file descriptor for the physical allocation holding `[ptr, ptr +
    /// len)` (memory mapped with `cuMemMap`, such as PyTorch's expandable
    /// segments), with `ptr`'s offset in it and the allocation's size. The
    /// caller owns the descriptor and must close it.
    fn export_fd(&self, py: Python<'_>, ptr: u64, len: u64) -> PyResult<(i32, u64, u64)> {
        let exported = py
            .detach(|| preserving_current_context(|| self.inner.export_allocation_fd(ptr, len)))
            .map_err(|e| cuda_err(py, e))?;
        let fd = std::os::fd::IntoRawFd::into_raw_fd(exported.fd);
        Ok((fd, exported.offset, exported.allocation_size))
    }

    /// The driver's id of the allocation holding `ptr` (one driver call;
    /// see `locate` for the whole range).
    fn allocation_id(&self, py: Python<'_>, ptr: u64) -> PyResult<u64> {
        py.detach(|| preserving_current_context(|| self.inner.allocation_id(ptr)))
            .map_err(|e| cuda_err(py, e))
    }

    /// A new interprocess event of this device.
    fn ipc_event(&self, py: Python<'_>) -> PyResult<NativeIpcEvent> {
        let event = py
            .detach(|| preserving_current_context(|| self.inner.ipc_event()))
            .map_err(|e| cuda_err(py, e))?;
        Ok(NativeIpcEvent { inner: event })
    }
}

/// An interprocess CUDA event.
#[pyclass(module = "ptxd._native", name = "IpcEvent", frozen)]
struct NativeIpcEvent {
    inner: IpcEvent,
}

#[pymethods]
impl NativeIpcEvent {
    /// The 64-byte handle ptxd opens.
    fn handle<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let handle =
            preserving_current_context(|| self.inner.ipc_handle()).map_err(|e| cuda_err(py, e))?;
        Ok(PyBytes::new(py, &handle))
    }

    /// Records the event on the stream at address `stream`.
    fn record(&self, py: Python<'_>, stream: usize) -> PyResult<()> {
        // SAFETY: `stream` is the `CUstream` of a torch or CuPy stream object
        // (or 0/1/2 for the default streams), resolved by `ptxd._operands.stream_handle`
        // from the framework's own stream attribute; this private function
        // is not for arbitrary integers.
        preserving_current_context(|| unsafe { self.inner.record_on_raw(stream) })
            .map_err(|e| cuda_err(py, e))
    }

    /// Makes later work on the stream at address `stream` wait for the
    /// event's last record.
    fn wait(&self, py: Python<'_>, stream: usize) -> PyResult<()> {
        // SAFETY: as in `record`.
        preserving_current_context(|| unsafe { self.inner.wait_on_raw(stream) })
            .map_err(|e| cuda_err(py, e))
    }

    /// Blocks until the event's last record completed.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| preserving_current_context(|| self.inner.synchronize()))
            .map_err(|e| cuda_err(py, e))
    }
}

/// The gRPC code `(name, value)` a ring launch refused for `reason`
/// raises with (`ring_code`), for the tests' fakes to agree with.
#[pyfunction(name = "ring_code")]
fn ring_code_of(reason: &str) -> (&'static str, i32) {
    ring_code(reason)
}

/// Whether libcuda can be loaded in this process.
#[pyfunction]
fn cuda_available() -> bool {
    ptxd_client::cuda::available()
}

/// The wire names of every refusal reason this build knows, in the
/// proto's order.
fn reasons() -> Vec<&'static str> {
    (1..)
        .map_while(|value| ptxd_proto::v1::Reason::try_from(value).ok())
        .map(|reason| reason.wire_name())
        .collect()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NativeClient>()?;
    m.add_class::<NativeSession>()?;
    m.add_class::<NativeKernel>()?;
    m.add_class::<NativeShm>()?;
    m.add_class::<NativeMemfd>()?;
    m.add_class::<NativeCudaDevice>()?;
    m.add_class::<NativeIpcEvent>()?;
    m.add_class::<NativeRing>()?;
    m.add_class::<host_ring::HostRing>()?;
    m.add_class::<operand_table::OperandTable>()?;
    m.add_class::<operand_table::Plan>()?;
    m.add_class::<operand_table::Released>()?;
    m.add_function(wrap_pyfunction!(cuda_available, m)?)?;
    m.add_function(wrap_pyfunction!(ring_code_of, m)?)?;
    m.add("REASONS", reasons())?;
    m.add("VERSION", env!("CARGO_PKG_VERSION"))?;
    m.add("RING_WORDS_LABEL", RING_WORDS_LABEL)?;
    Ok(())
}
