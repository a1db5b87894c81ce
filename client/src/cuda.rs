//! CUDA helpers for sessions (feature `cuda`): device memory and events that
//! ptxd can open from another process.
//!
//! ptxd never copies a session's tensors: the session allocates device memory
//! here, exports a CUDA IPC handle for it, and registers the handle (plus its
//! device UUID and size) with ptxd; a tensor inside an allocation is the pair
//! (handle, byte offset). Memory legacy IPC cannot export (`cuMemCreate`,
//! such as PyTorch's `expandable_segments`) travels as a POSIX file
//! descriptor instead: [`CudaDevice::alloc_exportable`] allocates it, and
//! [`CudaDevice::export_allocation_fd`] exports a framework's tensor by
//! address. Work ordering across the two processes goes through
//! IPC events: the session records an [`IpcEvent`] on its own stream and
//! names it as a launch's wait event, or waits on the event ptxd signals.
//!
//! Invariants:
//! - libcuda is probed before the first driver call, so a machine without it
//!   gets [`CudaError::LibraryMissing`], never a panic.
//! - IPC memory comes from `cuMemAlloc`, never from a stream-ordered pool:
//!   pool memory cannot be exported with `cuIpcGetMemHandle`. Memory shared
//!   by file descriptor comes from `cuMemCreate` and is exported one whole
//!   physical allocation at a time: a range must lie inside one.
//! - Every operation makes the device's primary context current on the
//!   calling thread first, so the types work from any thread (async tasks
//!   move between threads).
//! - Every handle-owning type frees its driver object on drop, with its
//!   device's context current, and keeps its [`CudaDevice`] (and so the
//!   retained context) alive until then.
//! - The driver calls themselves live in the `ptxd-cuda` crate, the layer
//!   this module shares with ptxd's executor; this module adds binding,
//!   bounds checks and the session-facing errors.

use std::ffi::{c_void, CString};
use std::mem::ManuallyDrop;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use crate::ring::SemaphoreWidth;

// The driver layer is its own crate (`ptxd-cuda`), below the SDK and the
// daemon; the SDK's API shows only these two of its items.
pub use driver::{format_uuid, DriverError};
use driver::{
    CUstream, DeviceMemory, Event, ExportableMemory, Module, PrimaryContext, SavedContext, Stream,
};
use ptxd_cuda as driver;

/// A failure of the CUDA helpers.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CudaError {
    /// libcuda cannot be loaded: no driver on this machine, or not on the
    /// loader's path. Nothing was called.
    #[error("libcuda is not installed or cannot be loaded")]
    LibraryMissing,
    /// A driver call failed; [`DriverError::is_sticky`] tells whether the
    /// process's contexts are poisoned for good.
    #[error(transparent)]
    Driver(#[from] DriverError),
    /// No visible device has this UUID (it may be hidden by
    /// `CUDA_VISIBLE_DEVICES`).
    #[error("no CUDA device has UUID {0}")]
    NoSuchDevice(String),
    /// A copy or fill would leave its allocation; nothing was enqueued.
    #[error("{len} bytes at offset {offset} overrun the {size}-byte allocation")]
    OutOfBounds {
        /// Where the span starts, in bytes from the allocation's start.
        offset: usize,
        /// The span's length in bytes.
        len: usize,
        /// The allocation's size in bytes.
        size: usize,
    },
    /// A semaphore word whose offset is not a multiple of its width.
    #[error("a {width}-byte word at offset {offset} is not aligned to its width")]
    Misaligned {
        /// The word's byte offset in its allocation.
        offset: usize,
        /// The word's width in bytes (4 or 8).
        width: usize,
    },
    /// A kernel name the driver cannot be given (C strings end at a NUL).
    #[error("kernel name {0:?} contains a NUL byte")]
    BadName(String),
    /// [`CudaDevice::locate`] was given host, managed or foreign memory.
    #[error("address {ptr:#x} is not device memory of this process (memory type {memory_type})")]
    NotDeviceMemory {
        /// The address asked about.
        ptr: u64,
        /// The driver's `CUmemorytype` for it.
        memory_type: u32,
    },
    /// [`CudaDevice::locate`] was given memory of another device.
    #[error("address {ptr:#x} lives on device {found}, not on device {expected}")]
    WrongDevice {
        /// The address asked about.
        ptr: u64,
        /// The ordinal of the device asked.
        expected: u32,
        /// The ordinal of the device the memory lives on.
        found: u32,
    },
    /// Memory legacy CUDA IPC cannot export: `cuMemCreate` (VMM) memory,
    /// such as PyTorch's `expandable_segments`, or stream-ordered pool memory.
    #[error("address {ptr:#x} belongs to memory that legacy CUDA IPC cannot export (cuMemCreate/VMM memory such as PyTorch's expandable_segments, or a cudaMallocAsync pool)")]
    NotIpcExportable {
        /// The address asked about (an allocation's base for
        /// [`CudaDevice::export`]).
        ptr: u64,
    },
    /// [`CudaDevice::export_allocation_fd`] was given memory that cannot be
    /// exported as a POSIX file descriptor: `cuMemAlloc`/`cudaMalloc` memory
    /// (share it by CUDA IPC instead), or `cuMemCreate` memory created
    /// without `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
    #[error("address {ptr:#x} belongs to memory that cannot be exported as a file descriptor ({cuda_error}): cudaMalloc memory (use CUDA IPC), or cuMemCreate memory made without CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR")]
    NotFdExportable {
        /// The address asked about.
        ptr: u64,
        /// The driver's name for its refusal.
        cuda_error: String,
    },
    /// [`CudaDevice::export_allocation_fd`] was given a range that runs past
    /// the physical allocation holding its first byte. One descriptor names
    /// one allocation; with PyTorch's `expandable_segments` a tensor larger
    /// than a segment page (measured with torch 2.11: 2 MiB pages for small
    /// tensors, 20 MiB for large ones) or straddling two pages spans
    /// several.
    #[error("{len} bytes at {ptr:#x} run past the {allocation_size}-byte physical allocation at {allocation_base:#x} that holds the first: a range shared by file descriptor must lie in one allocation")]
    SpansAllocations {
        /// The range's first address.
        ptr: u64,
        /// The range's length in bytes.
        len: u64,
        /// The first address of the allocation holding `ptr`.
        allocation_base: u64,
        /// That allocation's size in bytes.
        allocation_size: u64,
    },
}

/// Whether libcuda can be loaded on this machine. Asked of the loader
/// once per process: the question is a `dlopen` and `dlclose` of every
/// candidate name (measured on an H200 at 3.6–5 µs, which every
/// [`preserving_current_context`] call paid before, i.e. every launch of
/// the Python client's ring path).
pub fn available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(driver::library_present)
}

fn init() -> Result<(), CudaError> {
    // `cuInit` once it succeeded is a no-op for the process's lifetime; a
    // failure is not remembered (it is asked again next time).
    static INITIALIZED: AtomicBool = AtomicBool::new(false);
    if INITIALIZED.load(Ordering::Acquire) {
        return Ok(());
    }
    if !available() {
        return Err(CudaError::LibraryMissing);
    }
    driver::init()?;
    INITIALIZED.store(true, Ordering::Release);
    Ok(())
}

/// Runs `f`, then makes current again the context the calling thread had
/// before. Every helper here makes its device's primary context current;
/// a caller that shares its thread with a framework (PyTorch's runtime takes
/// the thread's current context as its device's) wraps its calls in this.
pub fn preserving_current_context<T>(f: impl FnOnce() -> T) -> T {
    if init().is_err() {
        return f();
    }
    let saved = SavedContext::save();
    let result = f();
    if let Ok(saved) = saved {
        if let Err(e) = saved.restore() {
            tracing::warn!(error = %e, "restoring the thread's CUDA context");
        }
    }
    result
}

/// One visible device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSummary {
    /// The ordinal in this process (it depends on `CUDA_VISIBLE_DEVICES`).
    pub ordinal: u32,
    /// The UUID (`GPU-…`), as ptxd names devices.
    pub uuid: String,
    /// The marketing name.
    pub name: String,
}

impl From<driver::DeviceInfo> for DeviceSummary {
    fn from(info: driver::DeviceInfo) -> Self {
        DeviceSummary {
            ordinal: info.ordinal,
            uuid: info.uuid,
            name: info.name,
        }
    }
}

/// Every device this process sees.
pub fn devices() -> Result<Vec<DeviceSummary>, CudaError> {
    init()?;
    Ok(driver::devices()?.into_iter().map(Into::into).collect())
}

#[derive(Debug)]
struct DeviceInner {
    context: PrimaryContext,
    summary: DeviceSummary,
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
        let info = driver::device(ordinal)?;
        let context = PrimaryContext::retain(info.device)?;
        Ok(CudaDevice {
            inner: Arc::new(DeviceInner {
                context,
                summary: info.into(),
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
        Ok(self.inner.context.set_current()?)
    }

    /// Allocates `bytes` of IPC-exportable device memory (`cuMemAlloc`).
    pub fn alloc(&self, bytes: usize) -> Result<DeviceAllocation, CudaError> {
        self.bind()?;
        Ok(DeviceAllocation {
            memory: OnDevice::new(DeviceMemory::alloc(bytes)?, self),
            size: bytes,
        })
    }

    /// Allocates `bytes` of device memory that ptxd maps from a POSIX file
    /// descriptor ([`ExportableAllocation::export_fd`]): `cuMemCreate`, the
    /// size rounded up to the driver's granularity (2 MiB on an H200).
    pub fn alloc_exportable(&self, bytes: usize) -> Result<ExportableAllocation, CudaError> {
        self.bind()?;
        let memory = ExportableMemory::create(self.ordinal(), bytes as u64)?;
        Ok(ExportableAllocation {
            memory: OnDevice::new(memory, self),
            size: bytes,
        })
    }

    /// Creates a non-blocking stream for this session's own work.
    pub fn stream(&self) -> Result<ClientStream, CudaError> {
        self.bind()?;
        Ok(ClientStream {
            stream: OnDevice::new(Stream::new()?, self),
        })
    }

    /// Creates an event another process can open (interprocess, no timing).
    pub fn ipc_event(&self) -> Result<IpcEvent, CudaError> {
        self.bind()?;
        Ok(IpcEvent {
            event: OnDevice::new(Event::interprocess()?, self),
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
        // SAFETY: `owned` is NUL-terminated (PTX) or a complete cubin/fatbin
        // image supplied by this process; it outlives the call.
        let module = unsafe { Module::load(&owned) }?;
        Ok(LocalModule {
            module: OnDevice::new(module, self),
        })
    }

    /// Waits for all work of this process on the device.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.bind()?;
        Ok(driver::synchronize_current()?)
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

/// A range of device memory exported as a POSIX file descriptor
/// ([`CudaDevice::export_allocation_fd`]): the descriptor names the whole
/// physical allocation, and the range starts `offset` bytes into it.
#[derive(Debug)]
pub struct ExportedRange {
    /// A fresh descriptor naming the allocation, owned by the caller (send
    /// it to ptxd, then drop it).
    pub fd: OwnedFd,
    /// Where the range starts, in bytes from the allocation's start.
    pub offset: u64,
    /// The allocation's size in bytes.
    pub allocation_size: u64,
}

impl CudaDevice {
    /// The allocation holding device address `ptr` (memory this process
    /// allocated on this device by any means, e.g. a framework's caching
    /// allocator). Memory legacy IPC cannot export (VMM memory) comes back
    /// with `ipc_capable` false and the range of the physical allocation
    /// mapped at `ptr`: [`CudaDevice::export`] refuses it
    /// ([`CudaError::NotIpcExportable`]), [`CudaDevice::export_allocation_fd`]
    /// exports it.
    pub fn locate(&self, ptr: u64) -> Result<AllocationRange, CudaError> {
        use driver::{
            pointer_attribute as attribute, BUFFER_ID, IS_LEGACY_CUDA_IPC_CAPABLE, RANGE_SIZE,
            RANGE_START_ADDR,
        };
        self.bind()?;
        self.check_own_memory(ptr)?;
        let ipc_capable = attribute(ptr, IS_LEGACY_CUDA_IPC_CAPABLE)?;
        if ipc_capable == 0 {
            // VMM memory (cuMemCreate, e.g. PyTorch's expandable segments):
            // the range attributes may not answer for it, but
            // cuMemGetAddressRange gives the one physical allocation mapped
            // at `ptr` (measured on an H200), which is what a file
            // descriptor exports ([`CudaDevice::export_allocation_fd`]).
            let (base, size) = driver::address_range(ptr)?;
            return Ok(AllocationRange {
                base,
                size,
                buffer_id: attribute(ptr, BUFFER_ID).unwrap_or(base),
                ipc_capable: false,
            });
        }
        Ok(AllocationRange {
            base: attribute(ptr, RANGE_START_ADDR)?,
            size: attribute(ptr, RANGE_SIZE)?,
            buffer_id: attribute(ptr, BUFFER_ID)?,
            ipc_capable: true,
        })
    }

    /// The driver's id of the allocation holding device address `ptr`
    /// (`CU_POINTER_ATTRIBUTE_BUFFER_ID`, unique over the process's
    /// lifetime: memory freed and allocated again at the same address gets
    /// a new id), as [`locate`](Self::locate) reports it, for one driver
    /// call instead of its five: a cache of registrations keyed by address
    /// checks with it that the memory behind an address is still the one it
    /// registered. VMM memory whose id the driver does not report answers
    /// with its physical allocation's base, as in `locate`.
    pub fn allocation_id(&self, ptr: u64) -> Result<u64, CudaError> {
        self.bind()?;
        match driver::pointer_attribute(ptr, driver::BUFFER_ID) {
            Ok(id) => Ok(id),
            Err(e) => match driver::address_range(ptr) {
                Ok((base, _)) => Ok(base),
                Err(_) => Err(e.into()),
            },
        }
    }

    /// Refuses an address that is not device memory of this device (the
    /// context must be bound).
    fn check_own_memory(&self, ptr: u64) -> Result<(), CudaError> {
        use driver::{
            pointer_attribute as attribute, DEVICE_ORDINAL, MEMORY_TYPE, MEMORY_TYPE_DEVICE,
        };
        let memory_type = attribute(ptr, MEMORY_TYPE)?;
        if memory_type != MEMORY_TYPE_DEVICE {
            return Err(CudaError::NotDeviceMemory { ptr, memory_type });
        }
        let ordinal = attribute(ptr, DEVICE_ORDINAL)?;
        if u32::try_from(ordinal).ok() != Some(self.ordinal()) {
            return Err(CudaError::WrongDevice {
                ptr,
                expected: self.ordinal(),
                found: ordinal.max(0) as u32,
            });
        }
        Ok(())
    }

    /// Exports the physical allocation holding the `len` bytes at device
    /// address `ptr` as a POSIX file descriptor, for memory this process
    /// mapped with `cuMemCreate`/`cuMemMap`: a PyTorch tensor under
    /// `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`, say (pass its
    /// `data_ptr()` and its size in bytes). The session registers the
    /// descriptor with ptxd together with [`ExportedRange::offset`].
    ///
    /// A range running past the allocation that holds `ptr` is refused
    /// ([`CudaError::SpansAllocations`]), and so is memory without an
    /// exportable allocation handle ([`CudaError::NotFdExportable`]). Call it
    /// inside [`preserving_current_context`] on a framework's thread.
    pub fn export_allocation_fd(&self, ptr: u64, len: u64) -> Result<ExportedRange, CudaError> {
        self.bind()?;
        self.check_own_memory(ptr)?;
        let (allocation_base, allocation_size) = driver::address_range(ptr)?;
        let allocation_end = allocation_base.saturating_add(allocation_size);
        if ptr.checked_add(len).is_none_or(|end| end > allocation_end) {
            return Err(CudaError::SpansAllocations {
                ptr,
                len,
                allocation_base,
                allocation_size,
            });
        }
        // The driver's answers for memory without an exportable handle:
        // INVALID_VALUE both for `cuMemAlloc` memory and for `cuMemCreate`
        // memory made without the descriptor handle type (measured).
        let refused = [
            "CUDA_ERROR_INVALID_VALUE",
            "CUDA_ERROR_NOT_SUPPORTED",
            "CUDA_ERROR_NOT_PERMITTED",
        ];
        let fd = match driver::export_mapped_allocation(ptr) {
            Ok(fd) => fd,
            Err(e) if refused.contains(&e.name.as_str()) => {
                return Err(CudaError::NotFdExportable {
                    ptr,
                    cuda_error: e.name,
                })
            }
            Err(e) => return Err(e.into()),
        };
        // A mapping covers its allocation whole from the allocation's first
        // byte (the driver maps nothing else), so the range's offset in the
        // mapping is its offset in the allocation (checked on an H200 with
        // PyTorch tensors: the bytes read through the imported descriptor at
        // this offset are the tensor's).
        Ok(ExportedRange {
            fd,
            offset: ptr - allocation_base,
            allocation_size,
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
        // A driver that reports VMM memory as capable still refuses it here.
        let refused = ["CUDA_ERROR_NOT_SUPPORTED", "CUDA_ERROR_INVALID_VALUE"];
        match driver::ipc_mem_handle(range.base) {
            Ok(handle) => Ok(handle),
            Err(e) if refused.contains(&e.name.as_str()) => {
                Err(CudaError::NotIpcExportable { ptr: range.base })
            }
            Err(e) => Err(e.into()),
        }
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

/// A driver object of one device, used with that device's context current.
/// On drop the object is released with its context current, and before the
/// [`CudaDevice`] it holds (so before the context itself may be released);
/// if the context cannot be made current (the driver is shutting down) the
/// object is left to the driver rather than released in another context.
#[derive(Debug)]
struct OnDevice<T> {
    object: ManuallyDrop<T>,
    device: CudaDevice,
}

impl<T> OnDevice<T> {
    fn new(object: T, device: &CudaDevice) -> Self {
        OnDevice {
            object: ManuallyDrop::new(object),
            device: device.clone(),
        }
    }

    /// Makes the device's context current on this thread, for a use of the
    /// object.
    fn bind(&self) -> Result<&T, CudaError> {
        self.device.bind()?;
        Ok(&self.object)
    }
}

impl<T> Drop for OnDevice<T> {
    fn drop(&mut self) {
        if self.device.bind().is_err() {
            return;
        }
        // SAFETY: `object` is dropped here, once; `self` is never used again.
        unsafe { ManuallyDrop::drop(&mut self.object) }
    }
}

/// Device memory from `cuMemAlloc`, freed on drop.
#[derive(Debug)]
pub struct DeviceAllocation {
    memory: OnDevice<DeviceMemory>,
    size: usize,
}

impl DeviceAllocation {
    /// The allocation's size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The device address (for in-process launches).
    pub fn device_ptr(&self) -> u64 {
        self.memory.object.ptr()
    }

    /// The device the memory lives on.
    pub fn device(&self) -> &CudaDevice {
        &self.memory.device
    }

    /// The UUID of the device the memory lives on.
    pub fn device_uuid(&self) -> &str {
        self.memory.device.uuid()
    }

    /// The device address of byte `offset`, if `len` bytes from there lie
    /// inside the allocation.
    fn span(&self, offset: usize, len: usize) -> Result<u64, CudaError> {
        span(self.device_ptr(), self.size, offset, len)
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
        let dst = self.span(offset, std::mem::size_of_val(data))?;
        self.memory.bind()?;
        // SAFETY: the span lies inside the allocation (checked), which the
        // borrow keeps alive, in the context just made current.
        unsafe { upload_bound(dst, data) }
    }

    /// Copies from the device at byte `offset` into `out` (synchronous).
    pub fn download<T: Element>(&self, offset: usize, out: &mut [T]) -> Result<(), CudaError> {
        let src = self.span(offset, std::mem::size_of_val(out))?;
        self.memory.bind()?;
        // SAFETY: as in `upload`.
        unsafe { download_bound(out, src) }
    }

    /// Writes `value` to the semaphore word of `width` at byte `offset`
    /// now (see [`DeviceWords::store_word`]).
    pub fn store_word(
        &self,
        offset: usize,
        width: SemaphoreWidth,
        value: u64,
    ) -> Result<(), CudaError> {
        DeviceWords::store_word(self, offset, width, value)
    }

    /// The 64-byte CUDA IPC handle naming this whole allocation.
    pub fn ipc_handle(&self) -> Result<[u8; 64], CudaError> {
        let memory = self.memory.bind()?;
        Ok(driver::ipc_mem_handle(memory.ptr())?)
    }
}

/// The device address of byte `offset` of an allocation of `size` bytes at
/// `base`, if `len` bytes from there lie inside it.
fn span(base: u64, size: usize, offset: usize, len: usize) -> Result<u64, CudaError> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(base + offset as u64),
        _ => Err(CudaError::OutOfBounds { offset, len, size }),
    }
}

/// Copies `data` to device address `dst` and synchronizes the context (see
/// [`DeviceAllocation::upload`] for why).
///
/// # Safety
/// `[dst, dst + size_of_val(data))` must lie in live device memory of the
/// context current on this thread.
unsafe fn upload_bound<T: Element>(dst: u64, data: &[T]) -> Result<(), CudaError> {
    // SAFETY: the caller's contract; `T` is padding-free.
    unsafe { driver::copy_to_device(dst, data) }?;
    Ok(driver::synchronize_current()?)
}

/// Copies from device address `src` into `out` (synchronous).
///
/// # Safety
/// `[src, src + size_of_val(out))` must lie in live device memory of the
/// context current on this thread.
unsafe fn download_bound<T: Element>(out: &mut [T], src: u64) -> Result<(), CudaError> {
    // SAFETY: the caller's contract; every bit pattern is a valid `T`.
    Ok(unsafe { driver::copy_to_host(out, src) }?)
}

/// Device memory ptxd maps from a POSIX file descriptor
/// ([`CudaDevice::alloc_exportable`]); unmapped and freed on drop (ptxd's
/// own mapping keeps the memory alive until ptxd closes it).
#[derive(Debug)]
pub struct ExportableAllocation {
    memory: OnDevice<ExportableMemory>,
    size: usize,
}

impl ExportableAllocation {
    /// The size asked for, in bytes; copies are bounded by it.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The size of the physical allocation the descriptor names: the size
    /// asked for, rounded up to the driver's granularity.
    pub fn allocation_size(&self) -> u64 {
        self.memory.object.size()
    }

    /// The device address (for in-process launches).
    pub fn device_ptr(&self) -> u64 {
        self.memory.object.ptr()
    }

    /// The device the memory lives on.
    pub fn device(&self) -> &CudaDevice {
        &self.memory.device
    }

    /// The UUID of the device the memory lives on.
    pub fn device_uuid(&self) -> &str {
        self.memory.device.uuid()
    }

    /// Copies `data` to the device at byte `offset`, and returns once the
    /// bytes are in device memory (as [`DeviceAllocation::upload`]).
    pub fn upload<T: Element>(&self, offset: usize, data: &[T]) -> Result<(), CudaError> {
        let dst = span(self.device_ptr(), self.size, offset, size_of_val(data))?;
        self.memory.bind()?;
        // SAFETY: the span lies inside the mapping (checked), which the
        // borrow keeps alive, in the context just made current.
        unsafe { upload_bound(dst, data) }
    }

    /// Copies from the device at byte `offset` into `out` (synchronous).
    pub fn download<T: Element>(&self, offset: usize, out: &mut [T]) -> Result<(), CudaError> {
        let src = span(self.device_ptr(), self.size, offset, size_of_val(out))?;
        self.memory.bind()?;
        // SAFETY: as in `upload`.
        unsafe { download_bound(out, src) }
    }

    /// A fresh POSIX file descriptor naming the whole allocation, owned by
    /// the caller (send it to ptxd, then drop it). Each call opens another.
    pub fn export_fd(&self) -> Result<OwnedFd, CudaError> {
        Ok(self.memory.bind()?.export_fd()?)
    }

    /// Writes `value` to the semaphore word of `width` at byte `offset`
    /// now (see [`DeviceWords::store_word`]).
    pub fn store_word(
        &self,
        offset: usize,
        width: SemaphoreWidth,
        value: u64,
    ) -> Result<(), CudaError> {
        DeviceWords::store_word(self, offset, width, value)
    }
}

/// Device memory of this process whose words serve as GPU semaphores
/// between the session's streams and ptxd's (a launch ring's, see
/// [`LaunchRing::order_with`](crate::LaunchRing::order_with)): a
/// [`DeviceAllocation`] (registered by CUDA IPC handle) or an
/// [`ExportableAllocation`] (registered by file descriptor).
pub trait DeviceWords: sealed::Sealed + crate::SemaphoreMemory {
    /// The device address of the allocation's first byte, and its size.
    #[doc(hidden)]
    fn extent(&self) -> (u64, usize);

    /// Makes the allocation's context current on this thread.
    #[doc(hidden)]
    fn bind_context(&self) -> Result<(), CudaError>;

    /// The device address of the word of `width` at byte `offset`: inside
    /// the allocation and aligned to the width.
    fn word_address(&self, offset: usize, width: SemaphoreWidth) -> Result<u64, CudaError> {
        let (base, size) = self.extent();
        let bytes = width.bytes() as usize;
        let addr = span(base, size, offset, bytes)?;
        // Allocations are at least 256-byte aligned (`cuMemAlloc`, and a
        // VMM mapping at the driver's granularity), so an offset aligned to
        // the width makes an aligned address.
        if !offset.is_multiple_of(bytes) {
            return Err(CudaError::Misaligned {
                offset,
                width: bytes,
            });
        }
        Ok(addr)
    }

    /// Writes `value` to the word of `width` at byte `offset` now, from
    /// this process, and returns once the word holds it: a
    /// `cuStreamWriteValue32/64` on a private non-blocking stream, which
    /// runs behind none of the session's streams (they may be blocked
    /// waiting on this very word), then a synchronization of that stream.
    /// The SDK uses it to release a launch ring's waiters when the ring's
    /// executor is lost (see [`LaunchRing`](crate::LaunchRing)). A 32-bit
    /// word takes the low 32 bits of `value`.
    fn store_word(
        &self,
        offset: usize,
        width: SemaphoreWidth,
        value: u64,
    ) -> Result<(), CudaError> {
        let addr = self.word_address(offset, width)?;
        self.bind_context()?;
        let stream = Stream::new()?;
        // SAFETY: the word lies inside the allocation (checked) and aligned
        // to its width; `self` keeps the allocation alive until the stream
        // is synchronized below.
        unsafe { stream.write_value(addr, value, width == SemaphoreWidth::Bits64) }?;
        Ok(stream.synchronize()?)
    }
}

/// The two allocation types hold their words the same way: a device
/// pointer, a size, and the memory whose context they bind.
macro_rules! allocation_words {
    ($($allocation:ty),*) => {$(
        impl sealed::Sealed for $allocation {}
        impl DeviceWords for $allocation {
            fn extent(&self) -> (u64, usize) {
                (self.device_ptr(), self.size)
            }

            fn bind_context(&self) -> Result<(), CudaError> {
                self.memory.bind().map(|_| ())
            }
        }
    )*};
}

allocation_words!(DeviceAllocation, ExportableAllocation);

/// Shared memory is the same memory: a `&Arc<DeviceAllocation>` is taken
/// wherever a `&DeviceAllocation` is.
impl<T: DeviceWords + ?Sized> sealed::Sealed for Arc<T> {}
impl<T: DeviceWords + ?Sized> DeviceWords for Arc<T> {
    fn extent(&self) -> (u64, usize) {
        (**self).extent()
    }

    fn bind_context(&self) -> Result<(), CudaError> {
        (**self).bind_context()
    }
}

/// An interprocess event, destroyed on drop.
#[derive(Debug)]
pub struct IpcEvent {
    event: OnDevice<Event>,
}

impl IpcEvent {
    /// The 64-byte handle another process opens with cuIpcOpenEventHandle.
    pub fn ipc_handle(&self) -> Result<[u8; 64], CudaError> {
        Ok(self.event.bind()?.ipc_handle()?)
    }

    /// Records the event on a stream this crate did not create (a
    /// framework's stream, given as its `CUstream` address; 0 is the legacy
    /// default stream).
    ///
    /// # Safety
    /// `stream` must be 0, `CU_STREAM_LEGACY` (1), `CU_STREAM_PER_THREAD`
    /// (2) or a live stream of this device's primary context.
    pub unsafe fn record_on_raw(&self, stream: usize) -> Result<(), CudaError> {
        let event = self.event.bind()?;
        // SAFETY: the stream is the caller's contract, and its context is
        // now current.
        Ok(unsafe { event.record_raw(stream as CUstream) }?)
    }

    /// Makes later work on a foreign stream (as in
    /// [`IpcEvent::record_on_raw`]) wait for the event's last record.
    ///
    /// # Safety
    /// As for [`IpcEvent::record_on_raw`].
    pub unsafe fn wait_on_raw(&self, stream: usize) -> Result<(), CudaError> {
        let event = self.event.bind()?;
        // SAFETY: as in `record_on_raw`.
        Ok(unsafe { event.wait_raw(stream as CUstream) }?)
    }

    /// Blocks until the work before the event's last record is done (also
    /// when ptxd recorded it).
    pub fn synchronize(&self) -> Result<(), CudaError> {
        Ok(self.event.bind()?.synchronize()?)
    }
}

/// A stream of the session's own work, destroyed on drop.
#[derive(Debug)]
pub struct ClientStream {
    stream: OnDevice<Stream>,
}

impl ClientStream {
    /// Records `event` after the work enqueued so far.
    pub fn record(&self, event: &IpcEvent) -> Result<(), CudaError> {
        Ok(self.stream.bind()?.record(&event.event.object)?)
    }

    /// Makes later work on this stream wait for `event` (e.g. one ptxd
    /// signals after a launch).
    pub fn wait(&self, event: &IpcEvent) -> Result<(), CudaError> {
        Ok(self.stream.bind()?.wait(&event.event.object)?)
    }

    /// Blocks until the stream's work is done.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        Ok(self.stream.bind()?.synchronize()?)
    }

    /// The stream's `CUstream` address, as a framework's stream is handed
    /// to [`LaunchRing::launch_on_raw_stream`](crate::LaunchRing::launch_on_raw_stream);
    /// valid while this value lives.
    pub fn raw_handle(&self) -> usize {
        self.stream.object.raw() as usize
    }

    /// Makes later work on this stream wait until the 32-bit word at byte
    /// `offset` of `memory` is at least `value` (`cuStreamWaitValue32`).
    /// A launch ring's semaphore: ptxd's stream writes the word when its
    /// kernel ends, so this orders the session's work after ptxd's without
    /// waiting for any reply. The caller keeps `memory` alive until the
    /// stream is synchronized.
    pub fn wait_word(
        &self,
        memory: &(impl DeviceWords + ?Sized),
        offset: usize,
        value: u32,
    ) -> Result<(), CudaError> {
        self.wait_until(memory, offset, SemaphoreWidth::Bits32, u64::from(value))
    }

    /// Enqueues writing `value` to the 32-bit word at byte `offset` of
    /// `memory` once the work before it on this stream is done
    /// (`cuStreamWriteValue32`): a ring launch that waits on the word then
    /// runs after this stream's work. The caller keeps `memory` alive until
    /// the stream is synchronized.
    pub fn write_word(
        &self,
        memory: &(impl DeviceWords + ?Sized),
        offset: usize,
        value: u32,
    ) -> Result<(), CudaError> {
        self.write_after(memory, offset, SemaphoreWidth::Bits32, u64::from(value))
    }

    /// As [`wait_word`](Self::wait_word), for a word of either width (a
    /// 64-bit one with `cuStreamWaitValue64`) at an offset aligned to it.
    pub fn wait_until(
        &self,
        memory: &(impl DeviceWords + ?Sized),
        offset: usize,
        width: SemaphoreWidth,
        value: u64,
    ) -> Result<(), CudaError> {
        let addr = memory.word_address(offset, width)?;
        let stream = self.stream.bind()?;
        // SAFETY: the word lies inside the allocation, aligned (checked),
        // and stays allocated while the caller keeps `memory` (documented).
        Ok(unsafe { stream.wait_value(addr, value, width == SemaphoreWidth::Bits64) }?)
    }

    /// As [`write_word`](Self::write_word), for a word of either width at
    /// an offset aligned to it.
    pub fn write_after(
        &self,
        memory: &(impl DeviceWords + ?Sized),
        offset: usize,
        width: SemaphoreWidth,
        value: u64,
    ) -> Result<(), CudaError> {
        let addr = memory.word_address(offset, width)?;
        let stream = self.stream.bind()?;
        // SAFETY: as in `wait_until`.
        Ok(unsafe { stream.write_value(addr, value, width == SemaphoreWidth::Bits64) }?)
    }

    /// Enqueues filling `count` 32-bit words at byte `offset` with `value`.
    /// The caller keeps `memory` alive until the stream is synchronized.
    pub fn fill_u32(
        &self,
        memory: &DeviceAllocation,
        offset: usize,
        value: u32,
        count: usize,
    ) -> Result<(), CudaError> {
        let dst = memory.span(offset, count.saturating_mul(4))?;
        let stream = self.stream.bind()?;
        // SAFETY: the span lies inside the allocation (checked); the
        // allocation outlives the enqueued fill as long as the caller keeps
        // it until the stream is synchronized (documented).
        Ok(unsafe { stream.fill_u32(dst, value, count) }?)
    }
}

/// A module loaded into this process, unloaded on drop.
#[derive(Debug)]
pub struct LocalModule {
    module: OnDevice<Module>,
}

impl LocalModule {
    /// Resolves a kernel.
    pub fn function(&self, name: &str) -> Result<LocalFunction<'_>, CudaError> {
        let cname = CString::new(name).map_err(|_| CudaError::BadName(name.to_string()))?;
        let function = self.module.bind()?.function(&cname)?;
        Ok(LocalFunction {
            function,
            module: self,
        })
    }
}

/// A kernel of a [`LocalModule`]; the borrow keeps the module loaded.
#[derive(Debug, Clone, Copy)]
pub struct LocalFunction<'m> {
    function: driver::Function,
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
        self.module.module.bind()?;
        // SAFETY: forwarded from the caller's contract; the stream is live
        // and the module loaded (borrowed).
        Ok(unsafe {
            self.function
                .launch(grid, block, &stream.stream.object, params)
        }?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
