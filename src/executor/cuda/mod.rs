//! The CUDA executor backend: one process drives one device through the
//! driver API, by way of [`driver`] (the `ptxd-cuda` crate: the one layer
//! over cudarc, shared with the SDK's own CUDA helpers).
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
//!   unloaded after draining for the same reason. A buffer passed by file
//!   descriptor owns its own mapping (`fd_mapping`), unmapped when it
//!   closes, after draining likewise.
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
//!   kernel is watched (`watchdog`): a kernel that outlives the budget
//!   cannot be stopped, so its launch is answered `KERNEL_TIMEOUT` (after
//!   the front was told, to count it against the session) and the process
//!   exits; the front restarts the device with a new generation.
//! - Both launch paths (the protocol's, the ring's) enqueue a kernel with
//!   `params`' layout: the protocol's packs it per launch, the ring's
//!   patches a block laid out once per grant (`prepared`), byte for byte
//!   what the packer builds.
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
//! tensors use the host backend. A descriptor must name a CUDA allocation
//! (`cuMemCreate` memory exported as a POSIX file descriptor).

mod fd_mapping;
mod images;
mod launch;
mod launch_ring;
mod params;
mod prepared;
mod watchdog;

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use ptxd_proto::executor::{
    open_buffer::Source, reply, ArtifactKind, DeviceDesc, FailureKind, Hello, Launch, LoadModule,
    LoadModuleOk, OpenBuffer, OpenBufferOk, OpenEvent, OpenRing,
};

use super::child::{serve_stdio, Backend, Replier};
use super::fd_inbox::FdInbox;
use super::kernel_cache::{CacheKey, KernelCache, Lookup};
use super::ring::RingHandle;
use super::supervisor::recovery_mark;
use images::{check_cubin, check_fatbin, choose_block, expected_param_sizes};
use ptxd_cuda as driver;
use ptxd_cuda::{
    DeviceInfo, DriverError, Event, Function, IpcMapping, Module, PrimaryContext, Stream,
};
use watchdog::{take_reply, SharedReply, Watchdog};

/// The largest grid x-dimension the driver accepts.
const MAX_GRID_X: u64 = (1 << 31) - 1;

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
        mps_enabled: device.mps_enabled,
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
pub fn run_executor(
    uuid: &str,
    max_kernel_time: Option<Duration>,
    fd_inbox: Option<FdInbox>,
    channel_spin: Duration,
    kernel_cache: Option<KernelCache>,
) -> i32 {
    match CudaBackend::open(uuid, max_kernel_time) {
        Ok(mut backend) => {
            backend.fd_inbox = fd_inbox;
            backend.use_kernel_cache(kernel_cache);
            serve_stdio(&mut backend, channel_spin)
        }
        Err(e) => {
            tracing::error!(uuid, error = %e, "cannot start the CUDA executor");
            2
        }
    }
}

/// A loaded kernel and the ABI it was loaded with.
pub struct LoadedKernel {
    function: Function,
    block: u32,
    inputs: u32,
    scalar_params: u32,
    /// Per operand (inputs, then output); empty when the front gave none.
    element_sizes: Vec<u32>,
    /// What each param is passed as (the contract's, or the scalar ABI's).
    layout: Vec<crate::executor::layout::Slot>,
    /// Elements each thread covers: the grid is ceil(n / (block × this)).
    elements_per_thread: u32,
    // Dropped after `function`, which points into it.
    _module: Module,
}

impl std::fmt::Debug for LoadedKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedKernel")
            .field("block", &self.block)
            .field("inputs", &self.inputs)
            .field("scalar_params", &self.scalar_params)
            .finish_non_exhaustive()
    }
}

/// One registration of a buffer: a window onto a mapping.
struct OpenedBuffer {
    backing: Backing,
    base: u64,
    size: u64,
}

/// What keeps a buffer's memory mapped.
enum Backing {
    /// The shared mapping of this IPC handle (in `CudaBackend::mappings`).
    Ipc([u8; 64]),
    /// The buffer's own mapping of an allocation passed by descriptor, held
    /// for its drop, which unmaps (`base` and `size` come from it).
    Fd {
        _mapping: fd_mapping::ImportedBuffer,
    },
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
    if error.name == "CUDA_ERROR_DEINITIALIZED" {
        // The process is already exiting on another thread (another
        // request's sticky fault): this request met the executor's absence,
        // not a fault of its own, and is answered so (EXECUTOR_UNAVAILABLE,
        // retryable). Running the exit handlers a second time, at once, is
        // not safe, so leave without them.
        let channel = reply.channel().clone();
        let message = format!("the executor was exiting ({doing}: {error})");
        reply.fail(FailureKind::ExecutorExiting, message.clone(), &metadata);
        channel.fatal_now(&error.name, &message);
    }
    if error.is_sticky() {
        recovery_mark!("fault_raised", error = %error.name);
        let channel = reply.channel().clone();
        let message = format!("the device faulted ({doing}: {error}); the executor restarts");
        reply.fail(FailureKind::KernelFault, message.clone(), &metadata);
        recovery_mark!("exit_begins");
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

/// A session ring served by the CUDA backend.
type CudaRingHandle = RingHandle<Arc<prepared::RingKernel>, u64>;

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
    rings: HashMap<u64, CudaRingHandle>,
    mappings: HashMap<[u8; 64], SharedMapping>,
    events: HashMap<u64, Event>,
    streams: HashMap<u64, SessionStream>,
    /// The per-launch budget (none: launches may run forever).
    budget: Option<Duration>,
    /// Started with the first launch (it needs the channel to the front).
    watchdog: Option<Arc<Watchdog>>,
    /// Descriptors the front passed for fd buffers.
    fd_inbox: Option<FdInbox>,
    /// The persistent compiled-kernel cache, and what its entries of this
    /// executor are compiled for (see [`CudaBackend::use_kernel_cache`]).
    kernel_cache: Option<(KernelCache, String)>,
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
    /// `watchdog`).
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
            fd_inbox: None,
            kernel_cache: None,
        })
    }

    /// Keeps the machine code of the PTX this executor loads in `cache`,
    /// keyed by the text's hash, the device's architecture and the
    /// driver's version (code from another driver or for another
    /// architecture is never looked up). Without the driver's version no
    /// cache is used.
    fn use_kernel_cache(&mut self, cache: Option<KernelCache>) {
        let Some(cache) = cache else {
            return;
        };
        match driver::driver_version() {
            Ok(version) => {
                let target = format!(
                    "cuda sm_{}{} driver {version}",
                    self.device.compute_major, self.device.compute_minor
                );
                tracing::debug!(dir = %cache.dir().display(), target, "kernel cache in use");
                self.kernel_cache = Some((cache, target));
            }
            Err(e) => tracing::warn!(error = %e, "no driver version: the kernel cache is not used"),
        }
    }

    /// Loads PTX (`image` ends in a NUL byte; `text` is the same without
    /// it) through the kernel cache: the cached machine code when there is
    /// a sound entry, else the JIT's, which is then cached. A cached entry
    /// the driver refuses (not sticky) is discarded and compiled again.
    fn load_ptx_cached(
        &self,
        cache: &KernelCache,
        target: &str,
        image: &[u8],
        text: &[u8],
    ) -> Result<(Module, String), driver::LoadFailure> {
        let key = CacheKey::new(text, target);
        if let Lookup::Hit(cubin) = cache.get(&key) {
            // SAFETY: the entry passed its integrity check, so it is the
            // complete cubin the driver's JIT produced for this key.
            match unsafe { Module::load_with_logs(&cubin) } {
                Ok(loaded) => return Ok(loaded),
                Err(failure) if failure.error.is_sticky() => return Err(failure),
                Err(failure) => {
                    tracing::warn!(error = %failure.error, "the driver refused a cached kernel; compiling it again");
                }
            }
        }
        // SAFETY: `image` ends in the NUL the caller pushed.
        let (cubin, info_log) = unsafe { driver::compile_ptx(image) }?;
        cache.put(&key, &cubin);
        // SAFETY: the driver's JIT just produced this complete cubin.
        let (module, _) = unsafe { Module::load_with_logs(&cubin) }?;
        Ok((module, info_log))
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
        // The param layout first: one that does not match the module is
        // refused before anything is compiled.
        let layout = match crate::executor::layout::decode(&load) {
            Ok(layout) => layout,
            Err(message) => return reply.fail(FailureKind::AbiMismatch, message, &[]),
        };
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
        let cache = match &self.kernel_cache {
            Some((cache, target)) if load.kind == ArtifactKind::Ptx as i32 => Some((cache, target)),
            _ => None,
        };
        let loaded = match cache {
            Some((cache, target)) => {
                let text = image.strip_suffix(&[0]).unwrap_or(&image);
                self.load_ptx_cached(cache, target, &image, text)
            }
            // SAFETY: a PTX image ends in the NUL pushed above; a cubin's or
            // fatbin's headers were checked against its length.
            None => unsafe { Module::load_with_logs(&image) },
        };
        let (module, info_log) = match loaded {
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
        let expected = expected_param_sizes(&layout);
        if found != expected {
            return reply.fail(
                FailureKind::AbiMismatch,
                format!(
                    "the kernel's parameters are {found:?} bytes; its layout ({} inputs, {} scalars) needs {expected:?}",
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
                layout,
                elements_per_thread: load.elements_per_thread.max(1),
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

    fn unload_loaded(&mut self, module_id: u64, reply: Replier) {
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

    fn map_buffer(&mut self, open: OpenBuffer, reply: Replier) {
        let handle = match open.source {
            Some(Source::CudaIpc(bytes)) => bytes,
            Some(Source::ShmName(_)) => {
                return reply.fail(
                    FailureKind::InvalidHandle,
                    "the CUDA backend maps device memory only; register host shared memory with a host-backend device",
                    &[],
                )
            }
            Some(Source::FdTag(tag)) => return self.open_fd_buffer(tag, open, reply),
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
                backing: Backing::Ipc(key),
                base,
                size: open.size,
            },
        );
        reply.send(reply::Result::OpenBuffer(OpenBufferOk { device_uuid }))
    }

    /// Unmaps a buffer (the dispatcher took it out of every ring's table
    /// first).
    fn unmap_buffer(&mut self, buffer_id: u64, reply: Replier) {
        let Some(buffer) = self.buffers.remove(&buffer_id) else {
            return reply.fail(
                FailureKind::UnknownObject,
                format!("buffer {buffer_id} is not open"),
                &[],
            );
        };
        let last = match &buffer.backing {
            Backing::Ipc(key) => match self.mappings.get_mut(key) {
                Some(shared) => {
                    shared.refs = shared.refs.saturating_sub(1);
                    shared.refs == 0
                }
                None => false,
            },
            Backing::Fd { .. } => true,
        };
        if last {
            let Some(reply) = self.drain(reply, "draining before closing a mapping") else {
                // A kernel may still use a buffer's own mapping: it stays.
                if let Backing::Fd { .. } = buffer.backing {
                    self.buffers.insert(buffer_id, buffer);
                }
                return;
            };
            if let Backing::Ipc(key) = &buffer.backing {
                self.mappings.remove(key);
            }
            // Unmaps a buffer's own mapping, now that nothing runs.
            drop(buffer);
            return reply.ok();
        }
        reply.ok()
    }

    fn open_ipc_event(&mut self, event_id: u64, handle: &[u8], reply: Replier) {
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

    fn end_stream(&mut self, id: u64, reply: Replier) {
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
}

impl Backend for CudaBackend {
    type RingKernel = Arc<prepared::RingKernel>;
    type RingBuffer = u64;

    fn hello(&self) -> Hello {
        Hello {
            backend: "cuda".into(),
            devices: vec![describe(&self.device)],
            pid: std::process::id(),
        }
    }

    fn load_module(&mut self, load: LoadModule, reply: Replier) {
        self.load(load, reply)
    }

    fn unload_module(&mut self, module_id: u64, reply: Replier) {
        self.unload_loaded(module_id, reply)
    }

    fn open_buffer(&mut self, open: OpenBuffer, reply: Replier) {
        self.map_buffer(open, reply)
    }

    fn close_buffer(&mut self, buffer_id: u64, reply: Replier) {
        self.unmap_buffer(buffer_id, reply)
    }

    fn open_event(&mut self, open: OpenEvent, reply: Replier) {
        self.open_ipc_event(open.event_id, &open.handle, reply)
    }

    fn close_event(&mut self, event_id: u64, reply: Replier) {
        match self.events.remove(&event_id) {
            Some(_) => reply.ok(),
            None => reply.fail(
                FailureKind::UnknownObject,
                format!("event {event_id} is not open"),
                &[],
            ),
        }
    }

    fn launch(&mut self, launch: Launch, reply: Replier) {
        self.launch_on_stream(launch, reply)
    }

    fn close_stream(&mut self, stream: u64, reply: Replier) {
        self.end_stream(stream, reply)
    }

    fn open_ring(&mut self, open: OpenRing, reply: Replier) {
        self.start_ring(open, reply)
    }

    fn rings(&self) -> &HashMap<u64, CudaRingHandle> {
        &self.rings
    }

    fn rings_mut(&mut self) -> &mut HashMap<u64, CudaRingHandle> {
        &mut self.rings
    }

    fn ring_kernel(&self, module_id: u64) -> Option<Arc<prepared::RingKernel>> {
        // Called once per grant: the kernel's parameter block is laid out
        // here, and each ring launch only patches it.
        self.kernels
            .get(&module_id)
            .cloned()
            .map(prepared::RingKernel::prepare)
    }

    fn ring_buffer(&self, buffer_id: u64) -> Option<u64> {
        self.buffers.get(&buffer_id).map(|b| b.base)
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
    fn probe_without_a_driver_is_an_error_not_a_panic() {
        // On a machine with a GPU this lists it; without one it must return
        // an error. Either way it returns.
        match probe() {
            Ok(devices) => assert!(devices.iter().all(|d| d.uuid.starts_with("GPU-"))),
            Err(message) => assert!(!message.is_empty()),
        }
    }
}
