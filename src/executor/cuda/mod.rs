//! The CUDA executor backend: one process drives one device through the
//! driver API, by way of [`driver`] (the SDK's layer over cudarc, shared with
//! the SDK's own CUDA helpers).
//!
//! The front has verified every artifact and checked every launch (owner,
//! device, generation, bounds); this backend still re-checks what it can
//! cheaply (parameter layout, operand bounds and alignment, grid size) so a
//! front bug becomes a typed failure rather than a device fault.
//!
//! Invariants:
//! - The driver is touched only after [`driver::library_present`] and
//!   `cuInit` succeeded, so a machine without `libcuda` gets an error, never
//!   cudarc's panic.
//! - All work runs in the device's primary context, current on the request
//!   thread, on every stream waiter thread and on the watchdog thread (the
//!   driver layer's objects assume the context current and never bind it).
//! - No driver object is destroyed while another thread may still use it:
//!   streams are destroyed by their own waiter thread, after its last
//!   synchronization; modules and mappings by the request thread, after
//!   draining; events by whichever thread drops the last use (the driver
//!   defers destroying an event still pending).
//! - An IPC handle is opened once per executor however many buffers name it
//!   (the driver would hand back the same pointer anyway); the mapping is
//!   closed when the last buffer naming it closes, after the context has
//!   drained, so no in-flight kernel reads a closed mapping. Modules are
//!   unloaded after draining for the same reason.
//! - A sticky driver error (illegal address, launch failure, ...) poisons
//!   every context in the process: whichever request meets it is answered
//!   `KERNEL_FAULT` with the driver's error name, and then the process sends
//!   `Fault` and exits ([`Channel::fatal`](super::child::Channel::fatal)).
//!   An async launch's fault is met by the next call that touches the
//!   device, so it is fatal there.
//! - The request loop never blocks on a kernel: a sync launch is enqueued
//!   here and its reply handed to the stream's waiter thread, which
//!   synchronizes the stream and replies (replies may overtake each other;
//!   the front matches them by id). Draining before an unload or a close
//!   is the one deliberate wait.
//! - With a per-launch budget (`--max-kernel-time`), every launch with a
//!   kernel is watched ([`watchdog`]): a kernel that outlives the budget
//!   cannot be stopped, so its launch is answered `KERNEL_TIMEOUT` (after
//!   the front was told, to count it against the session) and the process
//!   exits; the front restarts the device with a new generation.
//!
//! Block size: `.reqntid` when the kernel declares one (refused at load if
//! the compiled kernel cannot run that many threads); otherwise
//! min(`.maxntid` or 1024, the compiled kernel's
//! `CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK`, [`crate::ptx::DEFAULT_BLOCK`]). 256 threads
//! keep memory-bound elementwise kernels at full occupancy on every current
//! architecture while keeping the last, partial block small.
//!
//! Host shared memory is refused (`INVALID_HANDLE` with a message saying
//! so): the CUDA backend maps device memory only; sessions that hold host
//! tensors use the host backend.

mod watchdog;

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use ptxd_proto::executor::{
    open_buffer::Source, reply, request::Op, ArtifactKind, DeviceDesc, FailureKind, Hello, Launch,
    LoadModule, LoadModuleOk, OpenBuffer, OpenBufferOk,
};

use super::child::{serve_stdio, Backend, Channel, Replier};
use super::ring::{self, CheckedSemaphore, RingBackend, RingHandle, RingLaunch};
use ptxd_client::cuda::driver::{
    self, DeviceInfo, DriverError, Event, Function, IpcMapping, Module, PrimaryContext, Stream,
};
use ptxd_client::ring::{SemaphoreWidth, Server as RingServer};
use watchdog::{take_reply, SharedReply, Watchdog, Watched};

/// The largest grid x-dimension the driver accepts.
const MAX_GRID_X: u64 = (1 << 31) - 1;

/// Size of a device pointer and of the `long long n` parameter.
const POINTER_BYTES: usize = 8;
/// Size of each trailing scalar (`float`) parameter.
const SCALAR_BYTES: usize = 4;

/// Why a CUDA executor could not start.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("libcuda is not installed or cannot be loaded")]
    LibraryMissing,
    #[error(transparent)]
    Driver(#[from] DriverError),
    #[error("no CUDA device has UUID {uuid} (devices: {seen:?})")]
    NoSuchDevice { uuid: String, seen: Vec<String> },
}

fn driver_devices() -> Result<Vec<DeviceInfo>, CudaError> {
    if !driver::library_present() {
        return Err(CudaError::LibraryMissing);
    }
    driver::init()?;
    Ok(driver::devices()?)
}

fn describe(device: &DeviceInfo) -> DeviceDesc {
    DeviceDesc {
        ordinal: device.ordinal,
        uuid: device.uuid.clone(),
        name: device.name.clone(),
        compute_major: device.compute_major,
        compute_minor: device.compute_minor,
        total_memory: device.total_memory,
    }
}

/// Looks for libcuda and a working driver without panicking; returns the
/// devices it can see.
pub fn probe() -> Result<Vec<DeviceDesc>, String> {
    driver_devices()
        .map(|devices| devices.iter().map(describe).collect())
        .map_err(|e| e.to_string())
}

/// `ptxd executor --backend cuda --probe`: writes one Hello frame listing
/// every device on stdout (empty when CUDA is unavailable) and exits.
pub fn probe_stdio() -> i32 {
    let devices = match probe() {
        Ok(devices) => devices,
        Err(reason) => {
            tracing::info!(%reason, "CUDA probe found no usable driver");
            Vec::new()
        }
    };
    let hello = ptxd_proto::executor::ExecutorMessage {
        body: Some(ptxd_proto::executor::executor_message::Body::Hello(Hello {
            backend: "cuda".into(),
            devices,
            pid: std::process::id(),
        })),
    };
    match super::protocol::write_frame(&mut std::io::stdout().lock(), &hello) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

/// Runs a CUDA executor process for the device with `uuid`. Returns the
/// process exit code.
pub fn run_executor(uuid: &str, max_kernel_time: Option<Duration>) -> i32 {
    match CudaBackend::open(uuid, max_kernel_time) {
        Ok(mut backend) => serve_stdio(&mut backend),
        Err(e) => {
            tracing::error!(uuid, error = %e, "cannot start the CUDA executor");
            2
        }
    }
}

/// Picks the block size for a kernel (see the module docs).
fn choose_block(reqntid: u32, maxntid: u32, kernel_max: u32) -> Result<u32, String> {
    if reqntid > 0 {
        if reqntid > kernel_max {
            return Err(format!(
                "the kernel requires {reqntid} threads per block but its compiled form allows {kernel_max}"
            ));
        }
        return Ok(reqntid);
    }
    let declared = if maxntid > 0 { maxntid } else { 1024 };
    Ok(declared.min(kernel_max).clamp(1, crate::ptx::DEFAULT_BLOCK))
}

/// The parameter sizes the scalar ABI prescribes: input pointers, the
/// output pointer, `long long n`, then the `float` scalars.
fn expected_param_sizes(inputs: u32, scalar_params: u32) -> Vec<usize> {
    let mut sizes = vec![POINTER_BYTES; inputs as usize + 1];
    sizes.push(POINTER_BYTES);
    sizes.extend(std::iter::repeat_n(SCALAR_BYTES, scalar_params as usize));
    sizes
}

fn read_u16(bytes: &[u8], at: usize) -> Option<u64> {
    let b = bytes.get(at..at + 2)?;
    Some(u64::from(u16::from_le_bytes([b[0], b[1]])))
}

fn read_u64(bytes: &[u8], at: usize) -> Option<u64> {
    let b: [u8; 8] = bytes.get(at..at + 8)?.try_into().ok()?;
    Some(u64::from_le_bytes(b))
}

/// Checks that a cubin's ELF headers lie within the bytes we hold: the
/// driver trusts the offsets written inside an image, so a truncated or
/// forged one must not reach it.
fn check_cubin(image: &[u8]) -> Result<(), String> {
    const ELFCLASS64: u8 = 2;
    if image.len() < 64 || &image[..4] != b"\x7fELF" || image[4] != ELFCLASS64 {
        return Err("not a 64-bit ELF cubin".into());
    }
    let len = image.len() as u64;
    let table_fits = |offset: Option<u64>, entry: Option<u64>, count: Option<u64>| match (
        offset, entry, count,
    ) {
        (Some(o), Some(e), Some(c)) => o.checked_add(e * c).is_some_and(|end| end <= len),
        _ => false,
    };
    // ELF64 header: e_phoff at 0x20, e_shoff at 0x28, e_phentsize 0x36,
    // e_phnum 0x38, e_shentsize 0x3a, e_shnum 0x3c.
    if !table_fits(
        read_u64(image, 0x20),
        read_u16(image, 0x36),
        read_u16(image, 0x38),
    ) || !table_fits(
        read_u64(image, 0x28),
        read_u16(image, 0x3a),
        read_u16(image, 0x3c),
    ) {
        return Err("the cubin's header tables reach past its end".into());
    }
    Ok(())
}

/// Checks a fatbin's header against its length (see [`check_cubin`]).
fn check_fatbin(image: &[u8]) -> Result<(), String> {
    const FATBIN_MAGIC: u32 = 0xBA55_ED50;
    let magic = image
        .get(..4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    if magic != Some(FATBIN_MAGIC) {
        return Err("not a fatbin (bad magic)".into());
    }
    // Header: magic u32, version u16, header size u16, payload size u64.
    match (read_u16(image, 6), read_u64(image, 8)) {
        (Some(header), Some(payload))
            if header
                .checked_add(payload)
                .is_some_and(|end| end <= image.len() as u64) =>
        {
            Ok(())
        }
        _ => Err("the fatbin's declared size reaches past its end".into()),
    }
}

/// A loaded kernel and the ABI it was loaded with.
struct LoadedKernel {
    function: Function,
    block: u32,
    inputs: u32,
    scalar_params: u32,
    /// Per operand (inputs, then output); empty when the front gave none.
    element_sizes: Vec<u32>,
    // Dropped after `function`, which points into it.
    _module: Module,
}

/// One registration of a buffer: a window onto a shared mapping.
struct OpenedBuffer {
    key: [u8; 64],
    base: u64,
    size: u64,
}

/// One opened IPC handle, shared by every buffer that names it.
struct SharedMapping {
    mapping: IpcMapping,
    refs: usize,
    device_uuid: String,
    allocation_size: u64,
}

/// What a stream's waiter thread does.
enum WaitJob {
    /// Synchronize, then reply to a sync launch (unless the watchdog
    /// answered it already).
    Sync(SharedReply),
    /// Synchronize, destroy the stream, reply, and exit.
    Close(Replier),
}

struct SessionStream {
    stream: Arc<Stream>,
    waiter: mpsc::Sender<WaitJob>,
    thread: JoinHandle<()>,
}

/// Answers a request whose driver call failed: a sticky error is a kernel
/// fault that ends the process, anything else is an internal failure.
fn fail_driver(reply: Replier, error: &DriverError, doing: &str) {
    let metadata = [("cuda_error", error.name.clone())];
    if error.is_sticky() {
        let channel = reply.channel().clone();
        let message = format!("the device faulted ({doing}: {error}); the executor restarts");
        reply.fail(FailureKind::KernelFault, message.clone(), &metadata);
        channel.fatal(&error.name, &message);
    }
    reply.fail(
        FailureKind::Internal,
        format!("{doing}: {error}"),
        &metadata,
    )
}

fn stream_waiter(stream: Arc<Stream>, context: Arc<PrimaryContext>, jobs: mpsc::Receiver<WaitJob>) {
    let current = context.set_current();
    for job in jobs {
        let result = current.clone().and_then(|()| stream.synchronize());
        let (reply, closing) = match job {
            WaitJob::Sync(reply) => match take_reply(&reply) {
                Some(reply) => (reply, false),
                None => continue,
            },
            WaitJob::Close(reply) => (reply, true),
        };
        match result {
            Ok(()) => {
                if closing {
                    // The backend dropped its handle before sending Close, so
                    // this is the last one: the stream is destroyed here.
                    drop(stream);
                    reply.ok();
                    return;
                }
                reply.ok()
            }
            Err(e) => {
                fail_driver(reply, &e, "synchronizing the session's stream");
                if closing {
                    return;
                }
            }
        }
    }
}

/// The CUDA backend for one device.
pub struct CudaBackend {
    device: DeviceInfo,
    /// Every device this process sees, to name the device of a mapping.
    devices: Vec<DeviceInfo>,
    context: Arc<PrimaryContext>,
    kernels: HashMap<u64, Arc<LoadedKernel>>,
    buffers: HashMap<u64, OpenedBuffer>,
    /// Session rings by stream: kernels by Arc (a ring's table keeps its
    /// module loaded until the revoke), buffers by device address.
    rings: HashMap<u64, RingHandle<Arc<LoadedKernel>, u64>>,
    mappings: HashMap<[u8; 64], SharedMapping>,
    events: HashMap<u64, Event>,
    streams: HashMap<u64, SessionStream>,
    /// The per-launch budget (none: launches may run forever).
    budget: Option<Duration>,
    /// Started with the first launch (it needs the channel to the front).
    watchdog: Option<Arc<Watchdog>>,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("device", &self.device.uuid)
            .field("kernels", &self.kernels.len())
            .field("buffers", &self.buffers.len())
            .field("mappings", &self.mappings.len())
            .finish_non_exhaustive()
    }
}

impl CudaBackend {
    /// Opens the device with `uuid` and makes its primary context current.
    /// Launches that run longer than `budget` end the executor (see
    /// [`watchdog`]).
    pub fn open(uuid: &str, budget: Option<Duration>) -> Result<Self, CudaError> {
        let devices = driver_devices()?;
        let device = devices
            .iter()
            .find(|d| d.uuid == uuid)
            .cloned()
            .ok_or_else(|| CudaError::NoSuchDevice {
                uuid: uuid.to_string(),
                seen: devices.iter().map(|d| d.uuid.clone()).collect(),
            })?;
        let context = Arc::new(PrimaryContext::retain(device.device)?);
        context.set_current()?;
        Ok(CudaBackend {
            device,
            devices,
            context,
            kernels: HashMap::new(),
            rings: HashMap::new(),
            buffers: HashMap::new(),
            mappings: HashMap::new(),
            events: HashMap::new(),
            streams: HashMap::new(),
            budget,
            watchdog: None,
        })
    }

    /// The watchdog, started on first use; none without a budget.
    fn watchdog(&mut self, reply: &Replier) -> Result<Option<Arc<Watchdog>>, DriverError> {
        let Some(budget) = self.budget else {
            return Ok(None);
        };
        if self.watchdog.is_none() {
            let started = Watchdog::start(budget, self.context.clone(), reply.channel().clone())
                .map_err(|e| DriverError {
                    call: "spawning the watchdog",
                    name: e.to_string(),
                })?;
            self.watchdog = Some(started);
        }
        Ok(self.watchdog.clone())
    }

    fn load(&mut self, load: LoadModule, reply: Replier) {
        if self.kernels.contains_key(&load.module_id) {
            return reply.fail(
                FailureKind::Internal,
                format!("module {} is already loaded", load.module_id),
                &[],
            );
        }
        let image = match ArtifactKind::try_from(load.kind) {
            Ok(ArtifactKind::Ptx) => {
                // The JIT reads PTX up to a NUL byte.
                let mut text = load.artifact;
                if text.last() != Some(&0) {
                    text.push(0);
                }
                Ok(text)
            }
            Ok(ArtifactKind::Cubin) => check_cubin(&load.artifact).map(|()| load.artifact),
            Ok(ArtifactKind::Fatbin) => check_fatbin(&load.artifact).map(|()| load.artifact),
            Ok(ArtifactKind::Unspecified) | Err(_) => {
                return reply.fail(
                    FailureKind::UnsupportedArtifact,
                    format!("artifact kind {} is not PTX, cubin or fatbin", load.kind),
                    &[],
                )
            }
        };
        let image = match image {
            Ok(image) => image,
            Err(message) => return reply.fail(FailureKind::InvalidArtifact, message, &[]),
        };
        let Ok(symbol) = CString::new(load.symbol.clone()) else {
            return reply.fail(
                FailureKind::SymbolNotFound,
                format!("symbol {:?} contains a NUL byte", load.symbol),
                &[],
            );
        };
        // SAFETY: a PTX image ends in the NUL pushed above; a cubin's or
        // fatbin's headers were checked against its length.
        let (module, info_log) = match unsafe { Module::load_with_logs(&image) } {
            Ok(loaded) => loaded,
            Err(failure) if failure.error.is_sticky() => {
                return fail_driver(reply, &failure.error, "loading a module")
            }
            Err(failure) => {
                return reply.fail(
                    FailureKind::InvalidArtifact,
                    format!(
                        "the driver did not load the artifact ({}): {}",
                        failure.error.name, failure.error_log
                    ),
                    &[
                        ("cuda_error", failure.error.name.clone()),
                        ("jit_log", failure.error_log),
                        ("jit_info_log", failure.info_log),
                    ],
                )
            }
        };
        let function = match module.function(&symbol) {
            Ok(f) => f,
            Err(e) if e.name == "CUDA_ERROR_NOT_FOUND" => {
                return reply.fail(
                    FailureKind::SymbolNotFound,
                    format!("the artifact has no kernel named {:?}", load.symbol),
                    &[("cuda_error", e.name), ("symbol", load.symbol)],
                )
            }
            Err(e) => return fail_driver(reply, &e, "resolving the kernel"),
        };
        let found = match function.param_sizes() {
            Ok(sizes) => sizes,
            Err(e) => return fail_driver(reply, &e, "reading the kernel's parameters"),
        };
        let expected = expected_param_sizes(load.inputs, load.scalar_params);
        if found != expected {
            return reply.fail(
                FailureKind::AbiMismatch,
                format!(
                    "the kernel's parameters are {found:?} bytes; the scalar ABI with {} inputs and {} scalars needs {expected:?}",
                    load.inputs, load.scalar_params
                ),
                &[
                    ("expected", format!("{expected:?}")),
                    ("found", format!("{found:?}")),
                ],
            );
        }
        let operands = load.inputs as usize + 1;
        if !load.element_sizes.is_empty() && load.element_sizes.len() != operands {
            return reply.fail(
                FailureKind::AbiMismatch,
                format!(
                    "{} element sizes for {operands} operands",
                    load.element_sizes.len()
                ),
                &[],
            );
        }
        let kernel_max = match function.max_threads_per_block() {
            Ok(m) => m,
            Err(e) => return fail_driver(reply, &e, "reading the kernel's block limit"),
        };
        let block = match choose_block(load.reqntid, load.maxntid, kernel_max) {
            Ok(b) => b,
            Err(message) => return reply.fail(FailureKind::InvalidArtifact, message, &[]),
        };
        self.kernels.insert(
            load.module_id,
            Arc::new(LoadedKernel {
                function,
                block,
                inputs: load.inputs,
                scalar_params: load.scalar_params,
                element_sizes: load.element_sizes,
                _module: module,
            }),
        );
        reply.send(reply::Result::LoadModule(LoadModuleOk {
            block_size: block,
            info_log,
        }))
    }

    /// Waits for every in-flight kernel, before releasing memory or code
    /// that one might still use. Returns the reply back if that fails
    /// (a non-sticky failure: a sticky one has ended the process).
    fn drain(&self, reply: Replier, doing: &str) -> Option<Replier> {
        match self.context.synchronize() {
            Ok(()) => Some(reply),
            Err(e) => {
                fail_driver(reply, &e, doing);
                None
            }
        }
    }

    fn unload(&mut self, module_id: u64, reply: Replier) {
        if !self.kernels.contains_key(&module_id) {
            return reply.fail(
                FailureKind::UnknownObject,
                format!("module {module_id} is not loaded"),
                &[],
            );
        }
        let Some(reply) = self.drain(reply, "draining before an unload") else {
            return;
        };
        for ring in self.rings.values() {
            ring.table().forget_module(module_id);
        }
        self.kernels.remove(&module_id);
        reply.ok()
    }

    fn device_uuid_of(&self, ordinal: u32) -> String {
        self.devices
            .iter()
            .find(|d| d.ordinal == ordinal)
            .map(|d| d.uuid.clone())
            .unwrap_or_else(|| format!("ordinal {ordinal}"))
    }

    fn open_buffer(&mut self, open: OpenBuffer, reply: Replier) {
        let handle = match open.source {
            Some(Source::CudaIpc(bytes)) => bytes,
            Some(Source::ShmName(_)) => {
                return reply.fail(
                    FailureKind::InvalidHandle,
                    "the CUDA backend maps device memory only; register host shared memory with a host-backend device",
                    &[],
                )
            }
            None => return reply.fail(FailureKind::InvalidHandle, "buffer without a source", &[]),
        };
        let Ok(key) = <[u8; 64]>::try_from(handle.as_slice()) else {
            return reply.fail(
                FailureKind::InvalidHandle,
                format!("a CUDA IPC handle is 64 bytes, not {}", handle.len()),
                &[],
            );
        };
        if self.buffers.contains_key(&open.buffer_id) {
            return reply.fail(
                FailureKind::Internal,
                format!("buffer {} is already open", open.buffer_id),
                &[],
            );
        }
        let fresh = if self.mappings.contains_key(&key) {
            None
        } else {
            let mapping = match IpcMapping::open(&key) {
                Ok(m) => m,
                Err(e) if e.is_sticky() => return fail_driver(reply, &e, "opening an IPC handle"),
                Err(e) => {
                    return reply.fail(
                        FailureKind::InvalidHandle,
                        format!("the CUDA IPC handle does not open: {e}"),
                        &[("cuda_error", e.name)],
                    )
                }
            };
            let facts = mapping
                .device_ordinal()
                .and_then(|o| Ok((o, mapping.allocation_size()?)));
            match facts {
                Ok((ordinal, allocation_size)) => Some(SharedMapping {
                    device_uuid: self.device_uuid_of(ordinal),
                    allocation_size,
                    mapping,
                    refs: 0,
                }),
                Err(e) => return fail_driver(reply, &e, "inspecting an IPC mapping"),
            }
        };
        let shared = match &fresh {
            Some(shared) => shared,
            None => match self.mappings.get(&key) {
                Some(shared) => shared,
                None => return reply.fail(FailureKind::Internal, "mapping vanished", &[]),
            },
        };
        if shared.device_uuid != open.claimed_device_uuid || shared.device_uuid != self.device.uuid
        {
            return reply.fail(
                FailureKind::DeviceMismatch,
                format!(
                    "the buffer lives on {}, not on the claimed {} (this executor drives {})",
                    shared.device_uuid, open.claimed_device_uuid, self.device.uuid
                ),
                &[
                    ("actual_device", shared.device_uuid.clone()),
                    ("claimed_device", open.claimed_device_uuid),
                ],
            );
        }
        if open.size > shared.allocation_size {
            return reply.fail(
                FailureKind::InvalidHandle,
                format!(
                    "the allocation behind the handle holds {} bytes, fewer than the {} registered",
                    shared.allocation_size, open.size
                ),
                &[("allocation_size", shared.allocation_size.to_string())],
            );
        }
        let device_uuid = shared.device_uuid.clone();
        let base = shared.mapping.ptr();
        if let Some(shared) = fresh {
            self.mappings.insert(key, shared);
        }
        if let Some(shared) = self.mappings.get_mut(&key) {
            shared.refs += 1;
        }
        self.buffers.insert(
            open.buffer_id,
            OpenedBuffer {
                key,
                base,
                size: open.size,
            },
        );
        reply.send(reply::Result::OpenBuffer(OpenBufferOk { device_uuid }))
    }

    fn close_buffer(&mut self, buffer_id: u64, reply: Replier) {
        for ring in self.rings.values() {
            ring.table().forget_buffer(buffer_id);
        }
        let Some(buffer) = self.buffers.remove(&buffer_id) else {
            return reply.fail(
                FailureKind::UnknownObject,
                format!("buffer {buffer_id} is not open"),
                &[],
            );
        };
        let last = match self.mappings.get_mut(&buffer.key) {
            Some(shared) => {
                shared.refs = shared.refs.saturating_sub(1);
                shared.refs == 0
            }
            None => false,
        };
        if last {
            let Some(reply) = self.drain(reply, "draining before closing a mapping") else {
                return;
            };
            self.mappings.remove(&buffer.key);
            return reply.ok();
        }
        reply.ok()
    }

    fn open_event(&mut self, event_id: u64, handle: &[u8], reply: Replier) {
        let Ok(key) = <[u8; 64]>::try_from(handle) else {
            return reply.fail(
                FailureKind::InvalidHandle,
                format!("a CUDA IPC event handle is 64 bytes, not {}", handle.len()),
                &[],
            );
        };
        if self.events.contains_key(&event_id) {
            return reply.fail(
                FailureKind::Internal,
                format!("event {event_id} is already open"),
                &[],
            );
        }
        match Event::open_ipc(&key) {
            Ok(event) => {
                self.events.insert(event_id, event);
                reply.ok()
            }
            Err(e) if e.is_sticky() => fail_driver(reply, &e, "opening an IPC event"),
            Err(e) => reply.fail(
                FailureKind::InvalidHandle,
                format!("the CUDA IPC event handle does not open: {e}"),
                &[("cuda_error", e.name)],
            ),
        }
    }

    fn stream(&mut self, id: u64) -> Result<Arc<Stream>, DriverError> {
        if let Some(s) = self.streams.get(&id) {
            return Ok(s.stream.clone());
        }
        let stream = Arc::new(Stream::new()?);
        let (waiter, jobs) = mpsc::channel();
        let (for_waiter, context) = (stream.clone(), self.context.clone());
        let thread = std::thread::Builder::new()
            .name(format!("ptxd-stream-{id}"))
            .spawn(move || stream_waiter(for_waiter, context, jobs))
            .map_err(|e| DriverError {
                call: "spawning a stream waiter",
                name: e.to_string(),
            })?;
        self.streams.insert(
            id,
            SessionStream {
                stream: stream.clone(),
                waiter,
                thread,
            },
        );
        Ok(stream)
    }

    fn close_stream(&mut self, id: u64, reply: Replier) {
        // Stops the ring (after its current launch), which drops its hold
        // on the stream, so the waiter below destroys it.
        self.rings.remove(&id);
        // A session that never launched has no stream: nothing to close.
        let Some(session) = self.streams.remove(&id) else {
            return reply.ok();
        };
        let SessionStream {
            stream,
            waiter,
            thread,
        } = session;
        drop(stream);
        if let Err(mpsc::SendError(WaitJob::Close(reply))) = waiter.send(WaitJob::Close(reply)) {
            reply.fail(FailureKind::Internal, "the stream's waiter is gone", &[]);
        }
        // The waiter exits after the Close job; it is not joined here so the
        // request loop does not wait for the stream to drain.
        drop(thread);
    }

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

    fn launch(&mut self, launch: Launch, reply: Replier) {
        let Some(kernel) = self.kernels.get(&launch.module_id) else {
            return reply.fail(
                FailureKind::UnknownObject,
                format!("module {} is not loaded", launch.module_id),
                &[],
            );
        };
        if launch.inputs.len() != kernel.inputs as usize
            || launch.params.len() != kernel.scalar_params as usize
        {
            return reply.fail(
                FailureKind::AbiMismatch,
                format!(
                    "the launch passes {} inputs and {} scalars; the kernel takes {} and {}",
                    launch.inputs.len(),
                    launch.params.len(),
                    kernel.inputs,
                    kernel.scalar_params
                ),
                &[],
            );
        }
        let Some(output) = launch.output.as_ref() else {
            return reply.fail(FailureKind::AbiMismatch, "the launch has no output", &[]);
        };
        let (function, block) = (kernel.function, kernel.block);
        let mut addresses = Vec::with_capacity(launch.inputs.len() + 1);
        for (index, operand) in launch.inputs.iter().chain([output]).enumerate() {
            let element_size = kernel.element_sizes.get(index).copied();
            match self.operand_address(operand.buffer_id, operand.offset, launch.n, element_size) {
                Ok(address) => addresses.push(address),
                Err((kind, message)) => return reply.fail(kind, message, &[]),
            }
        }
        let grid = launch.n.div_ceil(u64::from(block));
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
            Ok(w) => w.filter(|_| launch.n > 0),
            Err(e) => return fail_driver(reply, &e, "starting the watchdog"),
        };
        let stream = match self.stream(launch.stream) {
            Ok(s) => s,
            Err(e) => return fail_driver(reply, &e, "creating the session's stream"),
        };
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
            // Each kernel parameter is passed as a pointer to its value; the
            // values live in these locals until cuLaunchKernel returns (the
            // driver copies them during the call).
            let mut n = launch.n as i64;
            let mut scalars = launch.params.clone();
            let mut params: Vec<*mut c_void> = addresses
                .iter_mut()
                .map(|a| (a as *mut u64).cast())
                .collect();
            params.push((&mut n as *mut i64).cast());
            params.extend(scalars.iter_mut().map(|p| (p as *mut f32).cast::<c_void>()));
            // SAFETY: `params` holds one pointer per kernel parameter, whose
            // sizes were checked at load against the scalar ABI (8-byte
            // pointers and n, 4-byte floats); every address lies inside an
            // open IPC mapping with room for n elements (checked above, and by
            // the front), and mappings are only closed after draining.
            let launched = unsafe { function.launch(grid as u32, block, &stream, &mut params) };
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
        if !launch.sync {
            if let (Some(watchdog), Some((started, done))) = (&watchdog, watched) {
                watchdog.push(
                    launch.stream,
                    Watched {
                        started,
                        done,
                        reply: None,
                    },
                );
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
            watchdog.push(
                launch.stream,
                Watched {
                    started,
                    done,
                    reply: Some(shared.clone()),
                },
            );
        }
        if let Err(mpsc::SendError(WaitJob::Sync(shared))) = waiter.send(WaitJob::Sync(shared)) {
            if let Some(reply) = take_reply(&shared) {
                reply.fail(FailureKind::Internal, "the stream's waiter is gone", &[]);
            }
        }
    }
}

impl CudaBackend {
    fn open_ring(&mut self, open: ptxd_proto::executor::OpenRing, reply: Replier) {
        let server = match RingServer::open(&open.shm_name, open.owner_uid) {
            Ok(server) => server,
            Err(e) => {
                return reply.fail(
                    FailureKind::InvalidHandle,
                    format!("cannot open the ring {}: {e}", open.shm_name),
                    &[],
                )
            }
        };
        let stream = match self.stream(open.stream) {
            Ok(s) => s,
            Err(e) => return fail_driver(reply, &e, "creating the session's stream"),
        };
        let backend = CudaRing {
            stream,
            context: self.context.clone(),
            current: false,
            channel: reply.channel().clone(),
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

impl Backend for CudaBackend {
    fn hello(&self) -> Hello {
        Hello {
            backend: "cuda".into(),
            devices: vec![describe(&self.device)],
            pid: std::process::id(),
        }
    }

    fn handle(&mut self, op: Op, reply: Replier) {
        match op {
            Op::LoadModule(load) => self.load(load, reply),
            Op::UnloadModule(unload) => self.unload(unload.module_id, reply),
            Op::OpenBuffer(open) => self.open_buffer(open, reply),
            Op::CloseBuffer(close) => self.close_buffer(close.buffer_id, reply),
            Op::OpenEvent(open) => self.open_event(open.event_id, &open.handle, reply),
            Op::CloseEvent(close) => match self.events.remove(&close.event_id) {
                Some(_) => reply.ok(),
                None => reply.fail(
                    FailureKind::UnknownObject,
                    format!("event {} is not open", close.event_id),
                    &[],
                ),
            },
            Op::Launch(launch) => self.launch(launch, reply),
            Op::CloseStream(close) => self.close_stream(close.stream, reply),
            Op::OpenRing(open) => self.open_ring(open, reply),
            Op::CloseRing(close) => {
                self.rings.remove(&close.stream);
                reply.ok()
            }
            Op::RingGrant(grant) => match self.rings.get(&grant.stream) {
                Some(ring) => {
                    let (kernels, buffers) = (&self.kernels, &self.buffers);
                    ring.table().apply(
                        &grant,
                        |id| kernels.get(&id).cloned(),
                        |id| buffers.get(&id).map(|b| b.base),
                    );
                    reply.ok()
                }
                None => reply.fail(
                    FailureKind::UnknownObject,
                    format!("stream {} has no ring", grant.stream),
                    &[("object", "ring".into())],
                ),
            },
            Op::Shutdown(_) | Op::Ping(_) => reply.ok(),
        }
    }

    fn shutdown(&mut self) {
        self.rings.clear();
        // Waiters drain their streams and exit once their senders are gone.
        for (_, session) in self.streams.drain() {
            drop(session.waiter);
            drop(session.stream);
            if session.thread.join().is_err() {
                tracing::warn!("a stream waiter panicked");
            }
        }
        if let Err(e) = self.context.synchronize() {
            tracing::warn!(error = %e, "draining the device at shutdown");
        }
        self.events.clear();
        self.buffers.clear();
        self.mappings.clear();
        self.kernels.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_size_prefers_reqntid_then_caps_at_256() {
        assert_eq!(choose_block(128, 0, 1024), Ok(128));
        assert_eq!(choose_block(512, 0, 1024), Ok(512));
        assert!(choose_block(1024, 0, 512).is_err());
        assert_eq!(choose_block(0, 0, 1024), Ok(256));
        assert_eq!(choose_block(0, 64, 1024), Ok(64));
        assert_eq!(choose_block(0, 0, 128), Ok(128));
        assert_eq!(choose_block(0, 0, 0), Ok(1));
    }

    #[test]
    fn scalar_abi_layout_is_pointers_then_n_then_floats() {
        assert_eq!(expected_param_sizes(2, 0), vec![8, 8, 8, 8]);
        assert_eq!(expected_param_sizes(1, 2), vec![8, 8, 8, 4, 4]);
        assert_eq!(expected_param_sizes(0, 0), vec![8, 8]);
    }

    #[test]
    fn truncated_or_forged_images_are_refused_before_the_driver() {
        assert!(check_cubin(b"not an elf").is_err());
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        assert!(check_cubin(&elf).is_ok(), "empty tables fit");
        // A section table at offset 64 with 10 entries of 64 bytes.
        elf[0x28..0x30].copy_from_slice(&64u64.to_le_bytes());
        elf[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        elf[0x3c..0x3e].copy_from_slice(&10u16.to_le_bytes());
        assert!(check_cubin(&elf).is_err());
        elf.resize(64 + 640, 0);
        assert!(check_cubin(&elf).is_ok());

        let mut fat = vec![0u8; 16];
        fat[..4].copy_from_slice(&0xBA55_ED50u32.to_le_bytes());
        fat[6..8].copy_from_slice(&16u16.to_le_bytes());
        fat[8..16].copy_from_slice(&100u64.to_le_bytes());
        assert!(check_fatbin(&fat).is_err());
        fat.resize(116, 0);
        assert!(check_fatbin(&fat).is_ok());
        assert!(check_fatbin(b"\0\0\0\0").is_err());
    }

    #[test]
    fn probe_without_a_driver_is_an_error_not_a_panic() {
        // On a machine with a GPU this lists it; without one it must return
        // an error. Either way it returns.
        match probe() {
            Ok(devices) => assert!(devices.iter().all(|d| d.uuid.starts_with("GPU-"))),
            Err(message) => assert!(!message.is_empty()),
        }
    }
}
