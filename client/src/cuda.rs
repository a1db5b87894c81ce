//! CUDA helpers for sessions (feature `cuda`): device memory and events that
//! ptxd can open from another process.
//!
//! ptxd never copies a session's tensors: the session allocates device memory
//! here, exports a CUDA IPC handle for it, and registers the handle (plus its
//! device UUID and size) with ptxd; a tensor inside an allocation is the pair
//! (handle, byte offset). Work ordering across the two processes goes through
//! IPC events: the session records an [`IpcEvent`] on its own stream and
//! names it as a launch's wait event, or waits on the event ptxd signals.
//!
//! Invariants:
//! - libcuda is probed before the first driver call, so a machine without it
//!   gets [`CudaError::LibraryMissing`], never a panic.
//! - Memory comes from `cuMemAlloc`, never from a stream-ordered pool: pool
//!   memory cannot be exported with `cuIpcGetMemHandle`.
//! - Every operation makes the device's primary context current on the
//!   calling thread first, so the types work from any thread (async tasks
//!   move between threads).
//! - Every handle-owning type frees its driver object on drop and keeps its
//!   [`CudaDevice`] (and so the retained context) alive until then.

use std::ffi::{c_void, CStr, CString};
use std::mem::MaybeUninit;
use std::sync::Arc;

use cudarc::driver::result::DriverError as RawError;
use cudarc::driver::sys;

/// A failure of the CUDA helpers.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CudaError {
    #[error("libcuda is not installed or cannot be loaded")]
    LibraryMissing,
    #[error("{call} failed: {name}")]
    Driver {
        /// The driver entry point.
        call: &'static str,
        /// The driver's error name, e.g. `CUDA_ERROR_INVALID_VALUE`.
        name: String,
    },
    #[error("no CUDA device has UUID {0}")]
    NoSuchDevice(String),
    #[error("{len} bytes at offset {offset} overrun the {size}-byte allocation")]
    OutOfBounds {
        offset: usize,
        len: usize,
        size: usize,
    },
    #[error("kernel name {0:?} contains a NUL byte")]
    BadName(String),
    #[error("address {ptr:#x} is not device memory of this process (memory type {memory_type})")]
    NotDeviceMemory { ptr: u64, memory_type: u32 },
    #[error("address {ptr:#x} lives on device {found}, not on device {expected}")]
    WrongDevice { ptr: u64, expected: u32, found: u32 },
    /// Memory legacy CUDA IPC cannot export: `cuMemCreate` (VMM) memory,
    /// such as PyTorch's `expandable_segments`, or stream-ordered pool memory.
    #[error("address {ptr:#x} belongs to memory that legacy CUDA IPC cannot export (cuMemCreate/VMM memory such as PyTorch's expandable_segments, or a cudaMallocAsync pool)")]
    NotIpcExportable { ptr: u64 },
}

fn check(call: &'static str, code: sys::CUresult) -> Result<(), CudaError> {
    if code == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let name = match RawError(code).error_name() {
        Ok(name) => name.to_string_lossy().into_owned(),
        Err(_) => format!("CUresult({})", code as u32),
    };
    Err(CudaError::Driver { call, name })
}

/// Whether libcuda can be loaded on this machine.
pub fn available() -> bool {
    // SAFETY: only tries to dlopen the library names; calls no driver function.
    unsafe { sys::is_culib_present() }
}

fn init() -> Result<(), CudaError> {
    if !available() {
        return Err(CudaError::LibraryMissing);
    }
    // SAFETY: the library is present (checked above); cuInit takes flags 0.
    check("cuInit", unsafe { sys::cuInit(0) })
}

/// Runs `f`, then makes current again the context the calling thread had
/// before. Every helper here makes its device's primary context current;
/// a caller that shares its thread with a framework (PyTorch's runtime takes
/// the thread's current context as its device's) wraps its calls in this.
pub fn preserving_current_context<T>(f: impl FnOnce() -> T) -> T {
    if init().is_err() {
        return f();
    }
    let mut previous: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the library is loaded and initialized.
    let saved = check("cuCtxGetCurrent", unsafe {
        sys::cuCtxGetCurrent(&mut previous)
    });
    let result = f();
    if saved.is_ok() {
        // SAFETY: `previous` was the thread's current context a moment ago
        // (or null, which unbinds); restoring it is what the caller had.
        let restored = check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(previous) });
        if let Err(e) = restored {
            tracing::warn!(error = %e, "restoring the thread's CUDA context");
        }
    }
    result
}

/// Formats a device UUID as `nvidia-smi -L` prints it (and ptxd expects).
pub fn format_uuid(bytes: &[u8; 16]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// One visible device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSummary {
    pub ordinal: u32,
    pub uuid: String,
    pub name: String,
}

fn device_summary(ordinal: u32) -> Result<(sys::CUdevice, DeviceSummary), CudaError> {
    let mut device: sys::CUdevice = 0;
    // SAFETY: valid out-pointer; the driver checks the ordinal.
    check("cuDeviceGet", unsafe {
        sys::cuDeviceGet(&mut device, ordinal as i32)
    })?;
    let mut name = [0 as std::ffi::c_char; 256];
    // SAFETY: the buffer holds `len` bytes and the driver NUL-terminates.
    check("cuDeviceGetName", unsafe {
        sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, device)
    })?;
    // SAFETY: cuDeviceGetName wrote a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(name.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    let mut uuid = MaybeUninit::<sys::CUuuid>::uninit();
    // SAFETY: valid out-pointer for one CUuuid.
    check("cuDeviceGetUuid", unsafe {
        sys::cuDeviceGetUuid_v2(uuid.as_mut_ptr(), device)
    })?;
    // SAFETY: initialized by the successful call above.
    let uuid = unsafe { uuid.assume_init() }.bytes.map(|b| b as u8);
    Ok((
        device,
        DeviceSummary {
            ordinal,
            uuid: format_uuid(&uuid),
            name,
        },
    ))
}

/// Every device this process sees.
pub fn devices() -> Result<Vec<DeviceSummary>, CudaError> {
    init()?;
    let mut count = 0i32;
    // SAFETY: valid out-pointer.
    check("cuDeviceGetCount", unsafe {
        sys::cuDeviceGetCount(&mut count)
    })?;
    (0..count.max(0) as u32)
        .map(|o| device_summary(o).map(|(_, s)| s))
        .collect()
}

#[derive(Debug)]
struct DeviceInner {
    device: sys::CUdevice,
    context: sys::CUcontext,
    summary: DeviceSummary,
}

// SAFETY: a context handle may be made current on any thread.
unsafe impl Send for DeviceInner {}
// SAFETY: as above; the handle is only read.
unsafe impl Sync for DeviceInner {}

impl Drop for DeviceInner {
    fn drop(&mut self) {
        // SAFETY: balances the retain in `CudaDevice::open`.
        let code = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.device) };
        if let Err(e) = check("cuDevicePrimaryCtxRelease", code) {
            tracing::warn!(error = %e, "releasing the primary context");
        }
    }
}

/// A device with its primary context retained. Cheap to clone.
#[derive(Debug, Clone)]
pub struct CudaDevice {
    inner: Arc<DeviceInner>,
}

impl CudaDevice {
    /// Opens the device with this ordinal (as this process numbers them).
    pub fn open(ordinal: u32) -> Result<Self, CudaError> {
        init()?;
        let (device, summary) = device_summary(ordinal)?;
        let mut context: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer; `device` came from cuDeviceGet.
        check("cuDevicePrimaryCtxRetain", unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut context, device)
        })?;
        Ok(CudaDevice {
            inner: Arc::new(DeviceInner {
                device,
                context,
                summary,
            }),
        })
    }

    /// Opens the device with this UUID (`GPU-…`).
    pub fn by_uuid(uuid: &str) -> Result<Self, CudaError> {
        let found = devices()?
            .into_iter()
            .find(|d| d.uuid == uuid)
            .ok_or_else(|| CudaError::NoSuchDevice(uuid.to_string()))?;
        Self::open(found.ordinal)
    }

    /// The device's UUID, as ptxd identifies devices.
    pub fn uuid(&self) -> &str {
        &self.inner.summary.uuid
    }

    /// The device's ordinal in this process.
    pub fn ordinal(&self) -> u32 {
        self.inner.summary.ordinal
    }

    /// The device's marketing name.
    pub fn name(&self) -> &str {
        &self.inner.summary.name
    }

    /// Makes the primary context current on this thread.
    fn bind(&self) -> Result<(), CudaError> {
        // SAFETY: the context is retained while `self.inner` lives.
        check("cuCtxSetCurrent", unsafe {
            sys::cuCtxSetCurrent(self.inner.context)
        })
    }

    /// Allocates `bytes` of IPC-exportable device memory (`cuMemAlloc`).
    pub fn alloc(&self, bytes: usize) -> Result<DeviceAllocation, CudaError> {
        self.bind()?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer; the context is current.
        check("cuMemAlloc", unsafe {
            sys::cuMemAlloc_v2(&mut ptr, bytes.max(1))
        })?;
        Ok(DeviceAllocation {
            ptr,
            size: bytes,
            device: self.clone(),
        })
    }

    /// Creates a non-blocking stream for this session's own work.
    pub fn stream(&self) -> Result<ClientStream, CudaError> {
        self.bind()?;
        let mut raw: sys::CUstream = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the context is current.
        check("cuStreamCreate", unsafe {
            sys::cuStreamCreate(&mut raw, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        })?;
        Ok(ClientStream {
            raw,
            device: self.clone(),
        })
    }

    /// Creates an event another process can open (interprocess, no timing).
    pub fn ipc_event(&self) -> Result<IpcEvent, CudaError> {
        self.bind()?;
        let mut raw: sys::CUevent = std::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32
            | sys::CUevent_flags::CU_EVENT_INTERPROCESS as u32;
        // SAFETY: valid out-pointer; the context is current.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut raw, flags)
        })?;
        Ok(IpcEvent {
            raw,
            device: self.clone(),
        })
    }

    /// Loads a module into this process (for in-process baselines and
    /// tests; sessions send artifacts to ptxd instead). A PTX image gets a
    /// terminating NUL appended if it lacks one.
    pub fn load_module(&self, image: &[u8]) -> Result<LocalModule, CudaError> {
        self.bind()?;
        let mut owned = image.to_vec();
        if owned.last() != Some(&0) {
            owned.push(0);
        }
        let mut raw: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: `owned` is NUL-terminated (PTX) or a complete cubin/fatbin
        // image supplied by this process; it outlives the call.
        check("cuModuleLoadData", unsafe {
            sys::cuModuleLoadData(&mut raw, owned.as_ptr().cast())
        })?;
        Ok(LocalModule {
            raw,
            device: self.clone(),
        })
    }

    /// Waits for all work of this process on the device.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.bind()?;
        // SAFETY: the context is current; no pointers.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
    }
}

/// The allocation a device address lies in, as the driver reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocationRange {
    /// The allocation's first address (`CU_POINTER_ATTRIBUTE_RANGE_START_ADDR`).
    pub base: u64,
    /// The allocation's size in bytes (`CU_POINTER_ATTRIBUTE_RANGE_SIZE`).
    pub size: u64,
    /// An id unique to the allocation over the process's lifetime
    /// (`CU_POINTER_ATTRIBUTE_BUFFER_ID`): a new allocation at a reused
    /// address gets a new id.
    pub buffer_id: u64,
    /// Whether `cuIpcGetMemHandle` can export it.
    pub ipc_capable: bool,
}

impl CudaDevice {
    fn pointer_attribute<T: Element>(
        ptr: u64,
        attribute: sys::CUpointer_attribute,
    ) -> Result<T, CudaError> {
        let mut value = MaybeUninit::<T>::zeroed();
        // SAFETY: `value` is a zeroed, writable `T` of the size the
        // attribute's documented result type has (callers pick `T` per
        // attribute); the driver validates `ptr`.
        check("cuPointerGetAttribute", unsafe {
            sys::cuPointerGetAttribute(value.as_mut_ptr().cast(), attribute, ptr)
        })?;
        // SAFETY: zero-initialized above and every bit pattern is a valid `T`.
        Ok(unsafe { value.assume_init() })
    }

    /// The allocation holding device address `ptr` (memory this process
    /// allocated on this device by any means, e.g. a framework's caching
    /// allocator). Memory legacy IPC cannot export is refused here as
    /// [`CudaError::NotIpcExportable`].
    pub fn locate(&self, ptr: u64) -> Result<AllocationRange, CudaError> {
        use sys::CUpointer_attribute as Attr;
        self.bind()?;
        let memory_type: u32 =
            Self::pointer_attribute(ptr, Attr::CU_POINTER_ATTRIBUTE_MEMORY_TYPE)?;
        if memory_type != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
            return Err(CudaError::NotDeviceMemory { ptr, memory_type });
        }
        let ordinal: i32 = Self::pointer_attribute(ptr, Attr::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)?;
        if u32::try_from(ordinal).ok() != Some(self.ordinal()) {
            return Err(CudaError::WrongDevice {
                ptr,
                expected: self.ordinal(),
                found: ordinal.max(0) as u32,
            });
        }
        // The driver writes a C `bool` here; a zeroed u32 read as != 0
        // does not depend on how many bytes it writes.
        let ipc_capable: u32 =
            Self::pointer_attribute(ptr, Attr::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE)?;
        // Checked before the range queries, which VMM memory may not answer.
        if ipc_capable == 0 {
            return Err(CudaError::NotIpcExportable { ptr });
        }
        let base: u64 = Self::pointer_attribute(ptr, Attr::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)?;
        let size: u64 = Self::pointer_attribute(ptr, Attr::CU_POINTER_ATTRIBUTE_RANGE_SIZE)?;
        let buffer_id: u64 = Self::pointer_attribute(ptr, Attr::CU_POINTER_ATTRIBUTE_BUFFER_ID)?;
        Ok(AllocationRange {
            base,
            size,
            buffer_id,
            ipc_capable: ipc_capable != 0,
        })
    }

    /// The 64-byte CUDA IPC handle of the allocation starting at `base`
    /// (from [`CudaDevice::locate`]); memory legacy IPC cannot export is
    /// refused as [`CudaError::NotIpcExportable`] before the driver is asked.
    pub fn export(&self, range: &AllocationRange) -> Result<[u8; 64], CudaError> {
        if !range.ipc_capable {
            return Err(CudaError::NotIpcExportable { ptr: range.base });
        }
        self.bind()?;
        let mut handle = MaybeUninit::<sys::CUipcMemHandle>::uninit();
        // SAFETY: valid out-pointer; the driver checks that `base` starts an
        // allocation of the current context.
        let code = unsafe { sys::cuIpcGetMemHandle(handle.as_mut_ptr(), range.base) };
        // A driver that reports VMM memory as capable still refuses it here.
        if matches!(
            code,
            sys::CUresult::CUDA_ERROR_NOT_SUPPORTED | sys::CUresult::CUDA_ERROR_INVALID_VALUE
        ) {
            return Err(CudaError::NotIpcExportable { ptr: range.base });
        }
        check("cuIpcGetMemHandle", code)?;
        // SAFETY: initialized by the successful call above.
        let handle = unsafe { handle.assume_init() };
        Ok(handle.reserved.map(|b| b as u8))
    }
}

/// Plain numeric element types that can be copied to and from the device
/// as raw bytes (no padding, every bit pattern valid).
pub trait Element: Copy + sealed::Sealed {}

mod sealed {
    pub trait Sealed {}
}

macro_rules! elements {
    ($($t:ty),*) => {$(impl sealed::Sealed for $t {} impl Element for $t {})*};
}
elements!(u8, i8, u16, i16, u32, i32, u64, i64, f32, f64);

/// Device memory from `cuMemAlloc`, freed on drop.
#[derive(Debug)]
pub struct DeviceAllocation {
    ptr: sys::CUdeviceptr,
    size: usize,
    device: CudaDevice,
}

// SAFETY: a device address is an integer; every access goes through the
// driver, which is thread-safe.
unsafe impl Send for DeviceAllocation {}
// SAFETY: as above; `&self` methods only read the address.
unsafe impl Sync for DeviceAllocation {}

impl DeviceAllocation {
    /// The allocation's size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The device address (for in-process launches).
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// The device the memory lives on.
    pub fn device(&self) -> &CudaDevice {
        &self.device
    }

    /// The UUID of the device the memory lives on.
    pub fn device_uuid(&self) -> &str {
        self.device.uuid()
    }

    fn span(&self, offset: usize, len: usize) -> Result<(), CudaError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(CudaError::OutOfBounds {
                offset,
                len,
                size: self.size,
            }),
        }
    }

    /// Copies `data` to the device at byte `offset`, and returns once the
    /// bytes are in device memory.
    ///
    /// From pageable host memory `cuMemcpyHtoD` returns as soon as the data
    /// is staged, before the DMA lands. That is enough for this process's
    /// later work (the legacy stream orders it), but not for ptxd's kernels,
    /// which run in another process on another stream: a launch sent right
    /// after could read the old bytes, or have its output overwritten by the
    /// late copy. So the upload ends with a synchronization of the context.
    pub fn upload<T: Element>(&self, offset: usize, data: &[T]) -> Result<(), CudaError> {
        let len = std::mem::size_of_val(data);
        self.span(offset, len)?;
        self.device.bind()?;
        // SAFETY: `[offset, offset + len)` lies inside the allocation
        // (checked); `data` is `len` readable bytes of a padding-free type.
        check("cuMemcpyHtoD", unsafe {
            sys::cuMemcpyHtoD_v2(self.ptr + offset as u64, data.as_ptr().cast(), len)
        })?;
        // SAFETY: the device's context is current (bound above).
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
    }

    /// Copies from the device at byte `offset` into `out` (synchronous).
    pub fn download<T: Element>(&self, offset: usize, out: &mut [T]) -> Result<(), CudaError> {
        let len = std::mem::size_of_val(out);
        self.span(offset, len)?;
        self.device.bind()?;
        // SAFETY: the span is inside the allocation (checked); `out` is `len`
        // writable bytes of a type for which every bit pattern is valid.
        check("cuMemcpyDtoH", unsafe {
            sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), self.ptr + offset as u64, len)
        })
    }

    /// The 64-byte CUDA IPC handle naming this whole allocation.
    pub fn ipc_handle(&self) -> Result<[u8; 64], CudaError> {
        self.device.bind()?;
        let mut handle = MaybeUninit::<sys::CUipcMemHandle>::uninit();
        // SAFETY: valid out-pointer; `ptr` is the base of a cuMemAlloc block.
        check("cuIpcGetMemHandle", unsafe {
            sys::cuIpcGetMemHandle(handle.as_mut_ptr(), self.ptr)
        })?;
        // SAFETY: initialized by the successful call above.
        let handle = unsafe { handle.assume_init() };
        Ok(handle.reserved.map(|b| b as u8))
    }
}

impl Drop for DeviceAllocation {
    fn drop(&mut self) {
        if self.device.bind().is_err() {
            return;
        }
        // SAFETY: `ptr` came from cuMemAlloc and is freed once.
        let code = unsafe { sys::cuMemFree_v2(self.ptr) };
        if let Err(e) = check("cuMemFree", code) {
            tracing::warn!(error = %e, "freeing device memory");
        }
    }
}

/// An interprocess event, destroyed on drop.
#[derive(Debug)]
pub struct IpcEvent {
    raw: sys::CUevent,
    device: CudaDevice,
}

// SAFETY: event handles may be used from any thread of their context.
unsafe impl Send for IpcEvent {}
// SAFETY: as above.
unsafe impl Sync for IpcEvent {}

impl IpcEvent {
    /// The 64-byte handle another process opens with cuIpcOpenEventHandle.
    pub fn ipc_handle(&self) -> Result<[u8; 64], CudaError> {
        self.device.bind()?;
        let mut handle = MaybeUninit::<sys::CUipcEventHandle>::uninit();
        // SAFETY: valid out-pointer; the event was created INTERPROCESS.
        check("cuIpcGetEventHandle", unsafe {
            sys::cuIpcGetEventHandle(handle.as_mut_ptr(), self.raw)
        })?;
        // SAFETY: initialized by the successful call above.
        let handle = unsafe { handle.assume_init() };
        Ok(handle.reserved.map(|b| b as u8))
    }

    /// Records the event on a stream this crate did not create (a
    /// framework's stream, given as its `CUstream` address; 0 is the legacy
    /// default stream).
    ///
    /// # Safety
    /// `stream` must be 0, `CU_STREAM_LEGACY` (1), `CU_STREAM_PER_THREAD`
    /// (2) or a live stream of this device's primary context.
    pub unsafe fn record_on_raw(&self, stream: usize) -> Result<(), CudaError> {
        self.device.bind()?;
        // SAFETY: the event is live; the stream is the caller's contract.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(self.raw, stream as sys::CUstream)
        })
    }

    /// Makes later work on a foreign stream (as in
    /// [`IpcEvent::record_on_raw`]) wait for the event's last record.
    ///
    /// # Safety
    /// As for [`IpcEvent::record_on_raw`].
    pub unsafe fn wait_on_raw(&self, stream: usize) -> Result<(), CudaError> {
        self.device.bind()?;
        // SAFETY: the event is live; the stream is the caller's contract;
        // flags must be 0.
        check("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(stream as sys::CUstream, self.raw, 0)
        })
    }

    /// Blocks until the work before the event's last record is done (also
    /// when ptxd recorded it).
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.device.bind()?;
        // SAFETY: the event is live.
        check("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(self.raw)
        })
    }
}

impl Drop for IpcEvent {
    fn drop(&mut self) {
        if self.device.bind().is_err() {
            return;
        }
        // SAFETY: `raw` came from cuEventCreate and is destroyed once.
        let code = unsafe { sys::cuEventDestroy_v2(self.raw) };
        if let Err(e) = check("cuEventDestroy", code) {
            tracing::warn!(error = %e, "destroying an event");
        }
    }
}

/// A stream of the session's own work, destroyed on drop.
#[derive(Debug)]
pub struct ClientStream {
    raw: sys::CUstream,
    device: CudaDevice,
}

// SAFETY: streams may be used from any thread of their context.
unsafe impl Send for ClientStream {}
// SAFETY: as above; the driver serializes operations on one stream.
unsafe impl Sync for ClientStream {}

impl ClientStream {
    /// Records `event` after the work enqueued so far.
    pub fn record(&self, event: &IpcEvent) -> Result<(), CudaError> {
        self.device.bind()?;
        // SAFETY: stream and event are live.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(event.raw, self.raw)
        })
    }

    /// Makes later work on this stream wait for `event` (e.g. one ptxd
    /// signals after a launch).
    pub fn wait(&self, event: &IpcEvent) -> Result<(), CudaError> {
        self.device.bind()?;
        // SAFETY: stream and event are live; flags must be 0.
        check("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(self.raw, event.raw, 0)
        })
    }

    /// Blocks until the stream's work is done.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.device.bind()?;
        // SAFETY: the stream is live.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(self.raw)
        })
    }

    /// Enqueues filling `count` 32-bit words at byte `offset` with `value`.
    pub fn fill_u32(
        &self,
        memory: &DeviceAllocation,
        offset: usize,
        value: u32,
        count: usize,
    ) -> Result<(), CudaError> {
        memory.span(offset, count.saturating_mul(4))?;
        self.device.bind()?;
        // SAFETY: the span is inside the allocation (checked); the stream is
        // live; the allocation outlives the enqueued fill as long as the
        // caller keeps it until the stream is synchronized (documented).
        check("cuMemsetD32Async", unsafe {
            sys::cuMemsetD32Async(memory.ptr + offset as u64, value, count, self.raw)
        })
    }
}

impl Drop for ClientStream {
    fn drop(&mut self) {
        if self.device.bind().is_err() {
            return;
        }
        // SAFETY: `raw` came from cuStreamCreate and is destroyed once.
        let code = unsafe { sys::cuStreamDestroy_v2(self.raw) };
        if let Err(e) = check("cuStreamDestroy", code) {
            tracing::warn!(error = %e, "destroying a stream");
        }
    }
}

/// A module loaded into this process, unloaded on drop.
#[derive(Debug)]
pub struct LocalModule {
    raw: sys::CUmodule,
    device: CudaDevice,
}

// SAFETY: module handles are usable from any thread of their context.
unsafe impl Send for LocalModule {}
// SAFETY: as above; only read.
unsafe impl Sync for LocalModule {}

impl LocalModule {
    /// Resolves a kernel.
    pub fn function(&self, name: &str) -> Result<LocalFunction<'_>, CudaError> {
        let cname = CString::new(name).map_err(|_| CudaError::BadName(name.to_string()))?;
        self.device.bind()?;
        let mut raw: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: the module is loaded; `cname` is NUL-terminated.
        check("cuModuleGetFunction", unsafe {
            sys::cuModuleGetFunction(&mut raw, self.raw, cname.as_ptr())
        })?;
        Ok(LocalFunction { raw, module: self })
    }
}

impl Drop for LocalModule {
    fn drop(&mut self) {
        if self.device.bind().is_err() {
            return;
        }
        // SAFETY: `raw` came from cuModuleLoadData and is unloaded once; the
        // borrow in LocalFunction keeps every function from outliving it.
        let code = unsafe { sys::cuModuleUnload(self.raw) };
        if let Err(e) = check("cuModuleUnload", code) {
            tracing::warn!(error = %e, "unloading a module");
        }
    }
}

/// A kernel of a [`LocalModule`].
#[derive(Debug, Clone, Copy)]
pub struct LocalFunction<'m> {
    raw: sys::CUfunction,
    module: &'m LocalModule,
}

impl LocalFunction<'_> {
    /// Enqueues the kernel on `stream` with a 1-D grid.
    ///
    /// # Safety
    /// `params` must hold one pointer per kernel parameter, each to a live
    /// value of the size the kernel declares, and the kernel must only touch
    /// memory that stays allocated until the stream is synchronized.
    pub unsafe fn launch(
        &self,
        stream: &ClientStream,
        grid: u32,
        block: u32,
        params: &mut [*mut c_void],
    ) -> Result<(), CudaError> {
        self.module.device.bind()?;
        // SAFETY: forwarded from the caller's contract; stream is live.
        check("cuLaunchKernel", unsafe {
            sys::cuLaunchKernel(
                self.raw,
                grid,
                1,
                1,
                block,
                1,
                1,
                0,
                stream.raw,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_format_matches_nvidia_smi() {
        let mut bytes = [0u8; 16];
        bytes[0] = 0xab;
        bytes[15] = 0x01;
        assert_eq!(
            format_uuid(&bytes),
            "GPU-ab000000-0000-0000-0000-000000000001"
        );
    }

    #[test]
    fn without_libcuda_the_helpers_return_typed_errors() {
        if available() {
            return; // A machine with a driver is covered by the GPU suite.
        }
        assert!(matches!(devices(), Err(CudaError::LibraryMissing)));
        assert_eq!(preserving_current_context(|| 7), 7);
        assert!(matches!(
            CudaDevice::open(0),
            Err(CudaError::LibraryMissing)
        ));
    }
}
