//! ptxd-cuda: the one layer over the CUDA driver API, below both ptxd's
//! CUDA executor and the SDK's CUDA helpers (`ptxd_client::cuda`, feature
//! `cuda`).
//!
//! It follows cudarc's layering: `cudarc::driver::sys` is the raw FFI,
//! `cudarc::driver::result` wraps one call each, and this crate is the only
//! place in ptxd that uses either (the RAII types here are ptxd's `safe`
//! layer). A user of the SDK never names this crate: the SDK re-exports the
//! one type its API shows ([`DriverError`], inside
//! `ptxd_client::cuda::CudaError`). A call cudarc wraps goes through
//! `result`; the few it lacks (legacy IPC handles, pointer attributes and
//! address ranges, `cuFuncGetParamInfo`, `cuModuleLoadDataEx` with the JIT's
//! logs, `cuMemsetD32Async`, `cuCtxSynchronize_v2`, `cuEventCreate`, whose
//! cudarc wrapper takes a single flag, and the virtual-memory-management
//! calls: `cuMemCreate`, `cuMemAddressReserve`, `cuMemMap`,
//! `cuMemSetAccess`, the shareable-handle export and import, and
//! `cuMemRetainAllocationHandle`) are written here on `sys`, once each,
//! as are the graph calls of [`KernelGraph`] (a kernel launched through an
//! instantiated graph, re-aimed per launch).
//! Every failure becomes a [`DriverError`] naming the entry point and the
//! driver's name for the result.
//!
//! Invariants, kept by the callers:
//! - Nothing here but [`library_present`] is called before it returned true
//!   and [`init`] succeeded: cudarc's loader panics when libcuda is missing.
//! - Every method of a driver object runs, and every object is dropped,
//!   while the context it was created in is current on the calling thread.
//!   Only [`PrimaryContext::set_current`] and [`SavedContext::restore`]
//!   change the current context: the SDK binds its device's context before
//!   each call, the executor keeps its one context current on every thread
//!   it starts.
//! - Each owning type releases its driver object exactly once, on drop; a
//!   failed release is logged (the driver object is gone or the context is
//!   poisoned either way), not returned.
//! - Memory shared by POSIX file descriptor (VMM: `cuMemCreate`) is always
//!   mapped whole, from its first byte: the driver maps nothing else
//!   (measured), so a mapping's range is its allocation's, and an imported
//!   allocation's size is learnt by mapping, never taken from its sender.
//! - Handles are `Send` and `Sync` because the driver API is thread-safe for
//!   distinct calls on one object; no object is destroyed while another
//!   thread may still use it, because destruction takes ownership.

use std::ffi::{c_int, c_uint, c_void, CStr};
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use cudarc::driver::result::{self, stream::StreamKind, DriverError as RawError};
use cudarc::driver::sys;

mod graph;
pub use graph::{KernelGraph, WordWrite};

/// A raw stream handle, for work on streams this layer did not create (a
/// framework's, or the legacy default stream).
pub use cudarc::driver::sys::CUstream;

/// A failed driver call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call} failed: {name}")]
pub struct DriverError {
    /// The driver entry point that failed (or, for a failure next to the
    /// driver such as spawning a thread that would drive it, what was being
    /// done).
    pub call: &'static str,
    /// The driver's name for the error, e.g. `CUDA_ERROR_INVALID_VALUE`
    /// (the code's name from cudarc's headers when `cuGetErrorName` itself
    /// fails, as it does once the driver is deinitialized). Callers match on
    /// it rather than on codes, so that codes newer than the headers need no
    /// feature gate.
    pub name: String,
}

/// Errors after which the process's every context is unusable (measured on
/// an H200: even `cuCtxCreate` fails afterwards), and the errors that say the
/// context is gone for good. Matched by name so that codes added in newer
/// headers (e.g. `CUDA_ERROR_CONTAINED`) need no feature gate.
const STICKY_ERRORS: &[&str] = &[
    // A kernel faulted: the context is poisoned.
    "CUDA_ERROR_ILLEGAL_ADDRESS",
    "CUDA_ERROR_LAUNCH_TIMEOUT",
    "CUDA_ERROR_ASSERT",
    "CUDA_ERROR_HARDWARE_STACK_ERROR",
    "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    "CUDA_ERROR_MISALIGNED_ADDRESS",
    "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    "CUDA_ERROR_INVALID_PC",
    "CUDA_ERROR_LAUNCH_FAILED",
    "CUDA_ERROR_TENSOR_MEMORY_LEAK",
    // The hardware reported an error the context cannot survive.
    "CUDA_ERROR_ECC_UNCORRECTABLE",
    "CUDA_ERROR_NVLINK_UNCORRECTABLE",
    "CUDA_ERROR_CONTAINED",
    "CUDA_ERROR_EXTERNAL_DEVICE",
    // The context or the driver is gone: nothing later can succeed.
    "CUDA_ERROR_CONTEXT_IS_DESTROYED",
    "CUDA_ERROR_DEINITIALIZED",
];

/// Whether the driver error named `name` (its `cuGetErrorName`, e.g.
/// `CUDA_ERROR_ILLEGAL_ADDRESS`) leaves the process's contexts unusable: a
/// process that meets one must serve nothing more and exit, so that a new
/// process (a new context) takes over. The one classification of sticky
/// errors; every other error is the failed call's own.
pub fn is_sticky_error(name: &str) -> bool {
    STICKY_ERRORS.contains(&name)
}

impl DriverError {
    fn from_code(call: &'static str, code: sys::CUresult) -> Self {
        let name = match RawError(code).error_name() {
            Ok(name) => name.to_string_lossy().into_owned(),
            // cuGetErrorName itself fails once the driver is torn down
            // (CUDA_ERROR_DEINITIALIZED while the process exits): the
            // code's own name, so that `is_sticky` still recognises it.
            Err(_) => format!("{code:?}"),
        };
        DriverError { call, name }
    }

    /// Whether this error poisoned the process's contexts for good: the
    /// process must exit before the device can be used again
    /// ([`is_sticky_error`]).
    pub fn is_sticky(&self) -> bool {
        is_sticky_error(&self.name)
    }
}

/// Names the failure of a cudarc `result` call after its entry point.
trait Named<T> {
    fn named(self, call: &'static str) -> Result<T, DriverError>;
}

impl<T> Named<T> for Result<T, RawError> {
    fn named(self, call: &'static str) -> Result<T, DriverError> {
        self.map_err(|RawError(code)| DriverError::from_code(call, code))
    }
}

/// The same for a raw `CUresult` of a call made on `sys`.
fn check(call: &'static str, code: sys::CUresult) -> Result<(), DriverError> {
    code.result().named(call)
}

/// Logs a failed release from a `Drop`: there is no caller to return it to,
/// and the object is gone (or its context poisoned) either way.
fn log_release(released: Result<(), DriverError>, doing: &str) {
    if let Err(e) = released {
        tracing::warn!(error = %e, "{doing}");
    }
}

/// Whether libcuda can be loaded; must be true before any other call here.
pub fn library_present() -> bool {
    // SAFETY: only tries to dlopen the candidate library names and drops the
    // handles; it calls no driver function.
    unsafe { sys::is_culib_present() }
}

/// Initializes the driver (idempotent). Call only after
/// [`library_present`] returned true.
pub fn init() -> Result<(), DriverError> {
    result::init().named("cuInit")
}

/// The driver's version, e.g. 12080 for 12.8 (`cuDriverGetVersion`).
pub fn driver_version() -> Result<i32, DriverError> {
    let mut version: c_int = 0;
    // SAFETY: writes one int through a pointer to a live local.
    check("cuDriverGetVersion", unsafe {
        sys::cuDriverGetVersion(&mut version)
    })?;
    Ok(version)
}

/// Formats a device UUID the way `nvidia-smi -L` prints it, which is how
/// ptxd and its sessions name devices.
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

/// What the driver reports about one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The ordinal in this process (it depends on `CUDA_VISIBLE_DEVICES`;
    /// the UUID does not).
    pub ordinal: u32,
    /// The driver's handle, for [`PrimaryContext::retain`].
    pub device: sys::CUdevice,
    /// The UUID as [`format_uuid`] writes it.
    pub uuid: String,
    /// The marketing name, e.g. `NVIDIA H200`.
    pub name: String,
    /// Compute capability, major part.
    pub compute_major: u32,
    /// Compute capability, minor part.
    pub compute_minor: u32,
    /// Device memory in bytes.
    pub total_memory: u64,
    /// Whether this process reaches the device as a client of the MPS
    /// control daemon (`CU_DEVICE_ATTRIBUTE_MPS_ENABLED`, 133; false on a
    /// driver too old to know the attribute).
    pub mps_enabled: bool,
}

/// The device with this ordinal (as this process numbers them).
pub fn device(ordinal: u32) -> Result<DeviceInfo, DriverError> {
    // A negative ordinal (from a huge u32) is refused by the driver.
    let device = result::device::get(ordinal as i32).named("cuDeviceGet")?;
    let name = result::device::get_name(device).named("cuDeviceGetName")?;
    let uuid = result::device::get_uuid(device).named("cuDeviceGetUuid")?;
    // SAFETY: `device` came from cuDeviceGet.
    let total_memory = unsafe { result::device::total_mem(device) }.named("cuDeviceTotalMem")?;
    let attribute = |attribute| {
        // SAFETY: `device` came from cuDeviceGet.
        unsafe { result::device::get_attribute(device, attribute) }
            .named("cuDeviceGetAttribute")
            .map(|value| value as u32)
    };
    use sys::CUdevice_attribute::*;
    Ok(DeviceInfo {
        ordinal,
        device,
        uuid: format_uuid(&uuid.bytes.map(|b| b as u8)),
        name,
        compute_major: attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        compute_minor: attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        total_memory: total_memory as u64,
        // A driver that does not know the attribute predates it: no MPS
        // report, not an unusable device.
        mps_enabled: attribute(CU_DEVICE_ATTRIBUTE_MPS_ENABLED).is_ok_and(|on| on != 0),
    })
}

/// Every device this process sees, in ordinal order.
pub fn devices() -> Result<Vec<DeviceInfo>, DriverError> {
    let count = result::device::get_count().named("cuDeviceGetCount")?;
    (0..count.max(0) as u32).map(device).collect()
}

/// A retained primary context of one device; released on drop.
#[derive(Debug)]
pub struct PrimaryContext {
    device: sys::CUdevice,
    context: sys::CUcontext,
}

// SAFETY: a CUcontext may be made current on any thread; the handle itself is
// an opaque pointer the driver synchronizes.
unsafe impl Send for PrimaryContext {}
// SAFETY: as above; every method only reads the handle.
unsafe impl Sync for PrimaryContext {}

impl PrimaryContext {
    /// Retains the device's primary context, without making it current: it
    /// and every object created in it live at least until this is dropped.
    pub fn retain(device: sys::CUdevice) -> Result<Self, DriverError> {
        // SAFETY: a CUdevice is an ordinal the driver validates (an unknown
        // one is CUDA_ERROR_INVALID_DEVICE); nothing is dereferenced.
        let context =
            unsafe { result::primary_ctx::retain(device) }.named("cuDevicePrimaryCtxRetain")?;
        Ok(PrimaryContext { device, context })
    }

    /// Makes the context current on the calling thread.
    pub fn set_current(&self) -> Result<(), DriverError> {
        // SAFETY: the context is retained for as long as `self` lives.
        unsafe { result::ctx::set_current(self.context) }.named("cuCtxSetCurrent")
    }

    /// Waits for all work in this context, whichever context is current
    /// (`cuCtxSynchronize_v2`, CUDA 13; cudarc wraps only the older call).
    pub fn synchronize(&self) -> Result<(), DriverError> {
        // SAFETY: the context is retained; the call takes no pointers.
        check("cuCtxSynchronize", unsafe {
            sys::cuCtxSynchronize_v2(self.context)
        })
    }
}

impl Drop for PrimaryContext {
    fn drop(&mut self) {
        // SAFETY: balances the one cuDevicePrimaryCtxRetain in `retain`.
        let released = unsafe { result::primary_ctx::release(self.device) };
        log_release(
            released.named("cuDevicePrimaryCtxRelease"),
            "releasing the primary context",
        );
    }
}

/// Waits for all work in the calling thread's current context
/// (`cuCtxSynchronize`, which every driver since CUDA 2 has, unlike
/// [`PrimaryContext::synchronize`]).
pub fn synchronize_current() -> Result<(), DriverError> {
    result::ctx::synchronize().named("cuCtxSynchronize")
}

/// The context current on the calling thread when this was made (or none),
/// to be made current again later: a caller sharing its thread with a
/// framework puts back what the framework had.
#[derive(Debug)]
pub struct SavedContext(Option<sys::CUcontext>);

impl SavedContext {
    /// Saves the calling thread's current context.
    pub fn save() -> Result<Self, DriverError> {
        result::ctx::get_current()
            .named("cuCtxGetCurrent")
            .map(SavedContext)
    }

    /// Makes the saved context current again (with none saved, unbinds).
    pub fn restore(self) -> Result<(), DriverError> {
        let context = self.0.unwrap_or(std::ptr::null_mut());
        // SAFETY: the context was current on this thread when saved (the
        // type is not Send), so its owner still holds it unless it destroyed
        // it since, which the driver reports; null unbinds.
        unsafe { result::ctx::set_current(context) }.named("cuCtxSetCurrent")
    }
}

/// Device memory from `cuMemAlloc`, never from a stream-ordered pool (pool
/// memory cannot be exported by legacy IPC); freed on drop.
#[derive(Debug)]
pub struct DeviceMemory {
    ptr: sys::CUdeviceptr,
}

impl DeviceMemory {
    /// Allocates `bytes` in the current context (at least one byte: the
    /// driver refuses zero).
    pub fn alloc(bytes: usize) -> Result<Self, DriverError> {
        // SAFETY: the memory is left uninitialized, which is fine for device
        // memory that host code only reads through copies of plain bytes.
        let ptr = unsafe { result::malloc_sync(bytes.max(1)) }.named("cuMemAlloc")?;
        Ok(DeviceMemory { ptr })
    }

    /// The device address of the first byte.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from cuMemAlloc and is freed once.
        let freed = unsafe { result::free_sync(self.ptr) };
        log_release(freed.named("cuMemFree"), "freeing device memory");
    }
}

/// Copies `src` to device address `dst`. From pageable memory this returns
/// once the bytes are staged, not once they are in device memory.
///
/// # Safety
/// `[dst, dst + size_of_val(src))` must lie in device memory of the current
/// context, and `T` must have no padding bytes.
pub unsafe fn copy_to_device<T: Copy>(dst: u64, src: &[T]) -> Result<(), DriverError> {
    // SAFETY: the caller's contract; `src` is readable for its whole length.
    unsafe { result::memcpy_htod_sync(dst, src) }.named("cuMemcpyHtoD")
}

/// Copies from device address `src` into `dst` (synchronous).
///
/// # Safety
/// `[src, src + size_of_val(dst))` must lie in device memory of the current
/// context, and every bit pattern must be a valid `T`.
pub unsafe fn copy_to_host<T: Copy>(dst: &mut [T], src: u64) -> Result<(), DriverError> {
    // SAFETY: the caller's contract; `dst` is writable for its whole length.
    unsafe { result::memcpy_dtoh_sync(dst, src) }.named("cuMemcpyDtoH")
}

/// The 64-byte legacy IPC handle of the allocation that starts at `base`
/// (in the current context); another process maps it with
/// [`IpcMapping::open`].
pub fn ipc_mem_handle(base: u64) -> Result<[u8; 64], DriverError> {
    let mut handle = MaybeUninit::<sys::CUipcMemHandle>::uninit();
    // SAFETY: valid out-pointer; the driver checks that `base` starts an
    // allocation of the current context.
    check("cuIpcGetMemHandle", unsafe {
        sys::cuIpcGetMemHandle(handle.as_mut_ptr(), base)
    })?;
    // SAFETY: initialized by the successful call above.
    let handle = unsafe { handle.assume_init() };
    Ok(handle.reserved.map(|b| b as u8))
}

/// A pointer attribute paired with the type the driver writes for it, so
/// that [`pointer_attribute`] cannot be asked to write past its value. Only
/// the constants below exist.
#[derive(Debug, Clone, Copy)]
pub struct PointerAttribute<T> {
    attribute: sys::CUpointer_attribute,
    value: PhantomData<fn() -> T>,
}

impl<T> PointerAttribute<T> {
    const fn new(attribute: sys::CUpointer_attribute) -> Self {
        PointerAttribute {
            attribute,
            value: PhantomData,
        }
    }
}

/// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE`: a `CUmemorytype` value, such as
/// [`MEMORY_TYPE_DEVICE`].
pub const MEMORY_TYPE: PointerAttribute<u32> =
    PointerAttribute::new(sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE);
/// The [`MEMORY_TYPE`] of device memory (rather than host or array memory).
pub const MEMORY_TYPE_DEVICE: u32 = sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32;
/// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`: the device the memory lives on.
pub const DEVICE_ORDINAL: PointerAttribute<i32> =
    PointerAttribute::new(sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL);
/// `CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE`: nonzero when
/// `cuIpcGetMemHandle` can export the memory. The driver writes a C `bool`;
/// read into a zeroed `u32`, nonzero means true however many bytes it
/// writes.
pub const IS_LEGACY_CUDA_IPC_CAPABLE: PointerAttribute<u32> = PointerAttribute::new(
    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
);
/// `CU_POINTER_ATTRIBUTE_RANGE_START_ADDR`: the allocation's first address.
pub const RANGE_START_ADDR: PointerAttribute<u64> =
    PointerAttribute::new(sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR);
/// `CU_POINTER_ATTRIBUTE_RANGE_SIZE`: the allocation's size in bytes.
pub const RANGE_SIZE: PointerAttribute<u64> =
    PointerAttribute::new(sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE);
/// `CU_POINTER_ATTRIBUTE_BUFFER_ID`: unique to the allocation over the
/// process's lifetime (a new allocation at a reused address gets a new id).
pub const BUFFER_ID: PointerAttribute<u64> =
    PointerAttribute::new(sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID);

/// One attribute of the memory at device address `ptr`.
pub fn pointer_attribute<T: Copy>(
    ptr: u64,
    attribute: PointerAttribute<T>,
) -> Result<T, DriverError> {
    let mut value = MaybeUninit::<T>::zeroed();
    // SAFETY: `value` is a writable `T`, and every PointerAttribute (all are
    // the constants above) pairs the attribute with the type of at least the
    // size the driver writes; the driver validates `ptr`.
    check("cuPointerGetAttribute", unsafe {
        sys::cuPointerGetAttribute(value.as_mut_ptr().cast(), attribute.attribute, ptr)
    })?;
    // SAFETY: zero-initialized above, and every `T` of a constant above is an
    // integer, for which every bit pattern is valid.
    Ok(unsafe { value.assume_init() })
}

/// A mapping of another process's device allocation; closed on drop.
#[derive(Debug)]
pub struct IpcMapping {
    ptr: sys::CUdeviceptr,
}

impl IpcMapping {
    /// Opens a 64-byte `CUipcMemHandle`, with peer access enabled lazily so
    /// a handle from a peer device maps too (and is then caught as a device
    /// mismatch rather than as an opaque failure).
    pub fn open(handle: &[u8; 64]) -> Result<Self, DriverError> {
        let raw_handle = sys::CUipcMemHandle {
            reserved: handle.map(|b| b as std::ffi::c_char),
        };
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` is a valid out-pointer; the handle is passed by value
        // and the driver validates its contents.
        check("cuIpcOpenMemHandle", unsafe {
            sys::cuIpcOpenMemHandle_v2(
                &mut ptr,
                raw_handle,
                sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
            )
        })?;
        Ok(IpcMapping { ptr })
    }

    /// The mapped base address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The ordinal (in this process) of the device the memory lives on.
    pub fn device_ordinal(&self) -> Result<u32, DriverError> {
        pointer_attribute(self.ptr, DEVICE_ORDINAL).map(|ordinal| ordinal.max(0) as u32)
    }

    /// The size of the whole allocation behind the handle.
    pub fn allocation_size(&self) -> Result<u64, DriverError> {
        let (base, size) = address_range(self.ptr)?;
        // An IPC handle names a whole allocation and maps at its base, so
        // the range starts at `ptr`; if it ever did not, count from `ptr`.
        Ok((base + size).saturating_sub(self.ptr))
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from cuIpcOpenMemHandle and is closed once.
        let code = unsafe { sys::cuIpcCloseMemHandle(self.ptr) };
        log_release(check("cuIpcCloseMemHandle", code), "closing an IPC mapping");
    }
}

/// The range of the allocation holding device address `ptr`
/// (`cuMemGetAddressRange`): its first address and its size in bytes.
///
/// For memory mapped with `cuMemMap` (VMM: `cuMemCreate`, PyTorch's
/// `expandable_segments`) it is the one mapping of one physical allocation
/// that holds `ptr`, not the reserved range around it: measured on an H200
/// (driver 580), two 2 MiB allocations mapped back to back into one
/// reservation answer two ranges, each of 2 MiB. And since a mapping always
/// covers its whole allocation from its start (see [`VirtualMapping`]), the
/// range is exactly the physical allocation.
pub fn address_range(ptr: u64) -> Result<(u64, u64), DriverError> {
    let (mut base, mut size) = (0u64, 0usize);
    // SAFETY: valid out-pointers; the driver validates `ptr`.
    check("cuMemGetAddressRange", unsafe {
        sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr)
    })?;
    Ok((base, size as u64))
}

/// `CUmemAllocationProp` with every field a plain integer: the driver fills
/// this in for an imported allocation, and a value the bindings' Rust enums
/// lack (a location type newer than the headers, say) must not be read as
/// one of them. Passed to the driver wherever it takes a
/// `CUmemAllocationProp`, whose layout it repeats (checked below).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct AllocationProp {
    kind: u32,
    requested_handle_types: u32,
    location_type: u32,
    location_id: i32,
    win32_handle_metadata: *mut c_void,
    alloc_flags: [u8; 8],
}

const _: () = {
    assert!(size_of::<AllocationProp>() == size_of::<sys::CUmemAllocationProp>());
    assert!(align_of::<AllocationProp>() == align_of::<sys::CUmemAllocationProp>());
    assert!(
        std::mem::offset_of!(AllocationProp, location_id)
            == std::mem::offset_of!(sys::CUmemAllocationProp, location)
                + std::mem::offset_of!(sys::CUmemLocation, id)
    );
    assert!(
        std::mem::offset_of!(AllocationProp, alloc_flags)
            == std::mem::offset_of!(sys::CUmemAllocationProp, allocFlags)
    );
};

const POSIX_FD: sys::CUmemAllocationHandleType =
    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
const LOCATION_DEVICE: u32 = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE as u32;

impl AllocationProp {
    /// Pinned memory on device `ordinal` that can be exported as a POSIX
    /// file descriptor.
    fn exportable_on(ordinal: u32) -> Self {
        AllocationProp {
            kind: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED as u32,
            requested_handle_types: POSIX_FD.0,
            location_type: LOCATION_DEVICE,
            // A negative id (from a huge ordinal) is refused by the driver.
            location_id: ordinal as i32,
            win32_handle_metadata: std::ptr::null_mut(),
            alloc_flags: [0; 8],
        }
    }

    fn as_raw(&self) -> *const sys::CUmemAllocationProp {
        (self as *const AllocationProp).cast()
    }

    /// The smallest size and alignment the driver maps memory of these
    /// properties in (2 MiB on an H200).
    fn granularity(&self) -> Result<usize, DriverError> {
        let mut granularity = 0usize;
        let minimum = sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
        // SAFETY: valid out-pointer; `as_raw` points at a live struct of the
        // driver's layout.
        check("cuMemGetAllocationGranularity", unsafe {
            sys::cuMemGetAllocationGranularity(&mut granularity, self.as_raw(), minimum)
        })?;
        // The driver never answers 0; were it to, 1 keeps the rounding sane.
        Ok(granularity.max(1))
    }
}

/// `bytes` rounded up to a multiple of `granularity` (at least one), or
/// `None` on overflow.
fn round_up(bytes: u64, granularity: u64) -> Option<u64> {
    let granularity = granularity.max(1);
    bytes.max(1).div_ceil(granularity).checked_mul(granularity)
}

/// One physical allocation handle (`CUmemGenericAllocationHandle`):
/// released on drop. Memory stays allocated while any handle or mapping of
/// it is alive, in any process.
#[derive(Debug)]
struct AllocationHandle(sys::CUmemGenericAllocationHandle);

impl AllocationHandle {
    /// Exports a fresh POSIX file descriptor for the allocation; the
    /// allocation must have been created with
    /// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR` among its handle types.
    fn export_fd(&self) -> Result<OwnedFd, DriverError> {
        let mut fd: c_int = -1;
        // SAFETY: for POSIX_FD the driver writes one `int` through the
        // out-pointer; the handle is live.
        check("cuMemExportToShareableHandle", unsafe {
            sys::cuMemExportToShareableHandle((&mut fd as *mut c_int).cast(), self.0, POSIX_FD, 0)
        })?;
        if fd < 0 {
            return Err(DriverError {
                call: "cuMemExportToShareableHandle",
                name: format!("no file descriptor (got {fd})"),
            });
        }
        // SAFETY: the driver opened `fd` for this call and hands it over;
        // nothing else owns or closes it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

impl Drop for AllocationHandle {
    fn drop(&mut self) {
        // SAFETY: the handle came from cuMemCreate, cuMemImportFromShareableHandle
        // or cuMemRetainAllocationHandle, and is released once, here.
        let code = unsafe { sys::cuMemRelease(self.0) };
        log_release(
            check("cuMemRelease", code),
            "releasing an allocation handle",
        );
    }
}

/// Physical device memory of known size, not yet mapped anywhere
/// (`cuMemCreate`); released on drop. [`VirtualMapping::map`] makes it
/// addressable.
#[derive(Debug)]
pub struct PhysicalMemory {
    handle: AllocationHandle,
    size: u64,
}

impl PhysicalMemory {
    /// Creates at least `bytes` (at least one) of pinned memory on device
    /// `ordinal`, exportable as a POSIX file descriptor; the size is rounded
    /// up to the driver's minimum granularity.
    pub fn create(ordinal: u32, bytes: u64) -> Result<Self, DriverError> {
        let prop = AllocationProp::exportable_on(ordinal);
        let granularity = prop.granularity()? as u64;
        let size = round_up(bytes, granularity).ok_or_else(|| DriverError {
            call: "cuMemCreate",
            name: format!("{bytes} bytes overflow when rounded up to {granularity}"),
        })?;
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out-pointer and properties; the driver validates the
        // size (a multiple of the granularity) and the device.
        check("cuMemCreate", unsafe {
            sys::cuMemCreate(&mut handle, size as usize, prop.as_raw(), 0)
        })?;
        Ok(PhysicalMemory {
            handle: AllocationHandle(handle),
            size,
        })
    }

    /// The size in bytes (a multiple of the granularity).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Exports a fresh POSIX file descriptor naming the allocation; another
    /// process maps it with [`ImportedMemory::import`].
    pub fn export_fd(&self) -> Result<OwnedFd, DriverError> {
        self.handle.export_fd()
    }
}

/// A reserved range of device addresses (`cuMemAddressReserve`), freed on
/// drop.
#[derive(Debug)]
struct Reservation {
    base: sys::CUdeviceptr,
    size: usize,
}

impl Reservation {
    fn new(size: usize) -> Result<Self, DriverError> {
        let mut base: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer; no fixed address is asked for (0) and
        // the default alignment; the driver validates the size.
        check("cuMemAddressReserve", unsafe {
            sys::cuMemAddressReserve(&mut base, size, 0, 0, 0)
        })?;
        Ok(Reservation { base, size })
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        // SAFETY: the range came from cuMemAddressReserve and is freed once,
        // after every mapping in it was unmapped (owners drop those first).
        let code = unsafe { sys::cuMemAddressFree(self.base, self.size) };
        log_release(
            check("cuMemAddressFree", code),
            "freeing a reserved address range",
        );
    }
}

/// Maps the whole of `handle` (`size` bytes) at `at`.
///
/// # Safety
/// `[at, at + size)` must lie in a live reservation and be unmapped.
unsafe fn map_whole(
    at: sys::CUdeviceptr,
    size: u64,
    handle: &AllocationHandle,
) -> Result<(), DriverError> {
    // SAFETY: the caller's contract; the driver checks `size` against the
    // allocation (offset 0 is the only one it accepts).
    check("cuMemMap", unsafe {
        sys::cuMemMap(at, size as usize, 0, handle.0, 0)
    })
}

/// Unmaps `[at, at + size)`, one whole earlier mapping.
///
/// # Safety
/// The range must be exactly one mapping made by [`map_whole`], unmapped
/// once, with no kernel still using it.
unsafe fn unmap(at: sys::CUdeviceptr, size: u64) -> Result<(), DriverError> {
    // SAFETY: the caller's contract.
    check("cuMemUnmap", unsafe { sys::cuMemUnmap(at, size as usize) })
}

/// Physical allocations mapped back to back into one reserved range of
/// device addresses, readable and writable by one device (the way PyTorch's
/// `expandable_segments` lays out a segment). On drop each allocation is
/// unmapped, then the range freed, then the handles released, each once.
///
/// A mapping always covers a whole allocation from its start: the driver
/// accepts only offset 0, and (measured on an H200, driver 580) refuses with
/// `CUDA_ERROR_NOT_SUPPORTED` any size but the allocation's own, smaller or
/// larger, for created and imported allocations alike.
#[derive(Debug)]
pub struct VirtualMapping {
    // Fields drop in order, after `Drop::drop` unmapped: the range is freed
    // first, then the handles released.
    reservation: Reservation,
    /// The allocations mapped so far, in address order from `reservation`'s
    /// base; only these are unmapped on drop.
    mapped: Vec<PhysicalMemory>,
    ordinal: u32,
}

impl VirtualMapping {
    /// Reserves one range for all of `allocations`, maps them in order and
    /// gives device `ordinal` read/write access to it. Each allocation must
    /// live on that device.
    pub fn map(allocations: Vec<PhysicalMemory>, ordinal: u32) -> Result<Self, DriverError> {
        let total = allocations
            .iter()
            .try_fold(0u64, |sum, a| sum.checked_add(a.size))
            .filter(|total| *total > 0 && usize::try_from(*total).is_ok())
            .ok_or_else(|| DriverError {
                call: "cuMemAddressReserve",
                name: "no memory to map, or more than the address space".into(),
            })?;
        let mut mapping = VirtualMapping {
            mapped: Vec::with_capacity(allocations.len()),
            reservation: Reservation::new(total as usize)?,
            ordinal,
        };
        let access = sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: ordinal as i32,
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        let mut at = mapping.reservation.base;
        for allocation in allocations {
            // SAFETY: `[at, at + size)` lies in the reservation (the sizes
            // sum to its size) past every earlier mapping, so is unmapped.
            unsafe { map_whole(at, allocation.size, &allocation.handle) }?;
            let size = allocation.size;
            // Recorded before anything can fail, so drop unmaps it.
            mapping.mapped.push(allocation);
            // SAFETY: the range was just mapped; `access` is one valid
            // descriptor, its count passed.
            check("cuMemSetAccess", unsafe {
                sys::cuMemSetAccess(at, size as usize, &access, 1)
            })?;
            at += size;
        }
        Ok(mapping)
    }

    /// The device address of the first byte.
    pub fn ptr(&self) -> u64 {
        self.reservation.base
    }

    /// The mapped size in bytes: the sum of the allocations' sizes.
    pub fn size(&self) -> u64 {
        self.reservation.size as u64
    }

    /// The device that may access the mapping.
    pub fn device_ordinal(&self) -> u32 {
        self.ordinal
    }

    /// The allocations, in address order.
    pub fn allocations(&self) -> &[PhysicalMemory] {
        &self.mapped
    }
}

impl Drop for VirtualMapping {
    fn drop(&mut self) {
        let mut at = self.reservation.base;
        for allocation in &self.mapped {
            // SAFETY: each recorded allocation was mapped whole at `at`, in
            // this order, and is unmapped once, here; owners drain the
            // device before dropping a mapping a kernel may use.
            let unmapped = unsafe { unmap(at, allocation.size) };
            log_release(unmapped, "unmapping device memory");
            at += allocation.size;
        }
        // The fields drop next: the reservation is freed, then the handles
        // released.
    }
}

/// Device memory of this process that another process can map from a POSIX
/// file descriptor: one exportable allocation ([`PhysicalMemory::create`])
/// mapped for its device. Unmapped, freed and released on drop.
#[derive(Debug)]
pub struct ExportableMemory {
    mapping: VirtualMapping,
}

impl ExportableMemory {
    /// Allocates at least `bytes` on device `ordinal` (rounded up to the
    /// granularity) and maps it in the current context's address space.
    pub fn create(ordinal: u32, bytes: u64) -> Result<Self, DriverError> {
        let allocation = PhysicalMemory::create(ordinal, bytes)?;
        Ok(ExportableMemory {
            mapping: VirtualMapping::map(vec![allocation], ordinal)?,
        })
    }

    /// The device address of the first byte.
    pub fn ptr(&self) -> u64 {
        self.mapping.ptr()
    }

    /// The allocation's size in bytes (the request rounded up).
    pub fn size(&self) -> u64 {
        self.mapping.size()
    }

    /// Exports a fresh POSIX file descriptor naming the allocation.
    pub fn export_fd(&self) -> Result<OwnedFd, DriverError> {
        match self.mapping.allocations() {
            [allocation] => allocation.export_fd(),
            _ => Err(DriverError {
                call: "cuMemExportToShareableHandle",
                name: "an exportable memory maps exactly one allocation".into(),
            }),
        }
    }
}

/// Errors of `cuMemMap` that mean "not this allocation's size" (measured:
/// `CUDA_ERROR_NOT_SUPPORTED` for any size but the exact one; an
/// older driver may say `CUDA_ERROR_INVALID_VALUE`).
fn is_wrong_size(error: &DriverError) -> bool {
    matches!(
        error.name.as_str(),
        "CUDA_ERROR_NOT_SUPPORTED" | "CUDA_ERROR_INVALID_VALUE"
    )
}

/// A physical allocation imported from a POSIX file descriptor another
/// process exported, not yet mapped; released on drop.
///
/// Its size is never taken from whoever sent the descriptor: the driver
/// offers no call that reports an allocation handle's size (the properties
/// carry none, and `fstat` on the descriptor says 0 bytes, measured), but
/// `cuMemMap` accepts only the exact size (see [`VirtualMapping`]), so
/// [`ImportedMemory::map`] learns it by mapping.
#[derive(Debug)]
pub struct ImportedMemory {
    handle: AllocationHandle,
    prop: AllocationProp,
}

impl ImportedMemory {
    /// Imports the allocation behind `fd` (`cuMemImportFromShareableHandle`)
    /// and closes `fd`: the handle holds its own reference to the memory.
    /// Measured on an H200 (driver 580), with the descriptor passed between
    /// processes: closing it right after the import, before mapping, leaves
    /// the memory mappable with its contents intact; so does the exporter
    /// releasing its own handle and mapping before the import; an exporting
    /// process that exits after the import leaves the mapping's contents
    /// intact; one that exits before it still leaves the descriptor
    /// importable and mappable. A descriptor that is not a CUDA
    /// allocation's (e.g. `/dev/null`) fails here, with `CUDA_ERROR_UNKNOWN`.
    pub fn import(fd: OwnedFd) -> Result<Self, DriverError> {
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // The driver takes a POSIX descriptor as the pointer-sized value
        // `(void *)(uintptr_t)fd`; it is never dereferenced.
        let os_handle = std::ptr::without_provenance_mut::<c_void>(fd.as_raw_fd() as usize);
        // SAFETY: valid out-pointer; `fd` is open for the whole call and the
        // driver validates what it names.
        check("cuMemImportFromShareableHandle", unsafe {
            sys::cuMemImportFromShareableHandle(&mut handle, os_handle, POSIX_FD)
        })?;
        drop(fd);
        let handle = AllocationHandle(handle);
        let mut prop = MaybeUninit::<AllocationProp>::zeroed();
        // SAFETY: the driver writes one CUmemAllocationProp, whose layout
        // AllocationProp repeats (checked at compile time); the handle is
        // live.
        check("cuMemGetAllocationPropertiesFromHandle", unsafe {
            sys::cuMemGetAllocationPropertiesFromHandle(prop.as_mut_ptr().cast(), handle.0)
        })?;
        // SAFETY: zeroed, then written by the driver; every field is an
        // integer or a raw pointer, valid for any bits.
        let prop = unsafe { prop.assume_init() };
        Ok(ImportedMemory { handle, prop })
    }

    /// The ordinal (in this process) of the device the memory lives on;
    /// `None` for memory that is not on a device (host memory made with
    /// `cuMemCreate`).
    pub fn device_ordinal(&self) -> Option<u32> {
        if self.prop.location_type != LOCATION_DEVICE {
            return None;
        }
        u32::try_from(self.prop.location_id).ok()
    }

    /// Maps the whole allocation for device `ordinal`. The driver maps an
    /// imported allocation only at its exact size (measured on an H200:
    /// smaller and larger sizes fail `CUDA_ERROR_NOT_SUPPORTED`) and has no
    /// call that reports it, so each of `sizes` (rounded up to the
    /// granularity) is tried in turn: the first the driver accepts is the
    /// allocation's size, proven by the driver rather than taken from
    /// whoever sent the descriptor. Nothing else is tried, so a wrong guess
    /// costs a few failed maps (about 5 µs each), never a search.
    pub fn map(self, sizes: &[u64], ordinal: u32) -> Result<VirtualMapping, DriverError> {
        let size = self.exact_size(sizes)?;
        VirtualMapping::map(
            vec![PhysicalMemory {
                handle: self.handle,
                size,
            }],
            ordinal,
        )
    }

    fn exact_size(&self, sizes: &[u64]) -> Result<u64, DriverError> {
        let granularity = self.prop.granularity()? as u64;
        let mut tried: Vec<u64> = Vec::new();
        let mut last = None;
        for size in sizes.iter().filter_map(|s| round_up(*s, granularity)) {
            if size == 0 || tried.contains(&size) || usize::try_from(size).is_err() {
                continue;
            }
            tried.push(size);
            let scratch = Reservation::new(size as usize)?;
            // SAFETY: `[base, base + size)` is the scratch reservation, which
            // nothing else maps; a successful try is unmapped at once.
            match unsafe { map_whole(scratch.base, size, &self.handle) } {
                Ok(()) => {
                    // SAFETY: the one mapping just made; nothing uses it.
                    unsafe { unmap(scratch.base, size) }?;
                    return Ok(size);
                }
                Err(e) if is_wrong_size(&e) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(DriverError {
            call: "cuMemMap",
            name: format!(
                "{} (the allocation is none of the sizes tried: {tried:?})",
                last.map_or_else(|| "no size to try".to_owned(), |e| e.name)
            ),
        })
    }
}

/// Exports a POSIX file descriptor for the physical allocation mapped at
/// device address `ptr` (any address inside it): memory this process mapped
/// with `cuMemMap`, such as PyTorch's `expandable_segments`, whose handles
/// request `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR` (measured with torch
/// 2.11 on an H200). The allocation starts at [`address_range`]'s base.
/// `cuMemAlloc` memory has no allocation handle: `CUDA_ERROR_INVALID_VALUE`
/// (measured).
pub fn export_mapped_allocation(ptr: u64) -> Result<OwnedFd, DriverError> {
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    let addr = std::ptr::without_provenance_mut::<c_void>(ptr as usize);
    // SAFETY: valid out-pointer; the address is only looked up by the driver,
    // never dereferenced on the host.
    check("cuMemRetainAllocationHandle", unsafe {
        sys::cuMemRetainAllocationHandle(&mut handle, addr)
    })?;
    // Released on return: the retain added a reference, the release drops it.
    AllocationHandle(handle).export_fd()
}

/// A stream that does not synchronize with the legacy default stream, so
/// one session's work never waits on another's by accident; destroyed on
/// drop.
#[derive(Debug)]
pub struct Stream {
    raw: sys::CUstream,
}

// SAFETY: streams may be used from any thread of their context; the driver
// serializes operations on one stream.
unsafe impl Send for Stream {}
// SAFETY: as above; every method takes `&self` and only passes the handle.
unsafe impl Sync for Stream {}

impl Stream {
    /// Creates a non-blocking stream in the current context.
    pub fn new() -> Result<Self, DriverError> {
        let raw = result::stream::create(StreamKind::NonBlocking).named("cuStreamCreate")?;
        Ok(Stream { raw })
    }

    /// The stream's `CUstream` handle, for calls that take a raw stream
    /// (e.g. [`batch_mem_ops_raw`]); valid while this value lives.
    pub fn raw(&self) -> sys::CUstream {
        self.raw
    }

    /// Waits for everything enqueued so far; reports the first error of a
    /// kernel on it (or a sticky error of the context).
    pub fn synchronize(&self) -> Result<(), DriverError> {
        // SAFETY: the stream is live.
        unsafe { result::stream::synchronize(self.raw) }.named("cuStreamSynchronize")
    }

    /// Whether everything enqueued so far has completed
    /// (`cuStreamQuery`); does not block. A sticky error of the context
    /// (a kernel of this process faulted) is returned as the error.
    pub fn query(&self) -> Result<bool, DriverError> {
        // SAFETY: the stream is live.
        let code = unsafe { sys::cuStreamQuery(self.raw) };
        match code {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            code => Err(DriverError::from_code("cuStreamQuery", code)),
        }
    }

    /// Makes later work on this stream wait for `event`'s last record.
    pub fn wait(&self, event: &Event) -> Result<(), DriverError> {
        // SAFETY: this is a live stream of the current context.
        unsafe { event.wait_raw(self.raw) }
    }

    /// Records `event` after the work enqueued so far.
    pub fn record(&self, event: &Event) -> Result<(), DriverError> {
        // SAFETY: this is a live stream of the current context.
        unsafe { event.record_raw(self.raw) }
    }

    /// Enqueues filling `count` 32-bit words at device address `dst` with
    /// `value` (cudarc wraps only the byte-wise fill).
    ///
    /// # Safety
    /// `[dst, dst + 4 * count)` must lie in device memory of the current
    /// context that stays allocated until the stream is synchronized.
    pub unsafe fn fill_u32(&self, dst: u64, value: u32, count: usize) -> Result<(), DriverError> {
        // SAFETY: the caller's contract; the stream is live.
        check("cuMemsetD32Async", unsafe {
            sys::cuMemsetD32Async(dst, value, count, self.raw)
        })
    }
}

impl Stream {
    /// Enqueues a wait until the 32- or 64-bit word at device address
    /// `addr` is at least `value` (`cuStreamWaitValue32/64`, GEQ): another
    /// process's stream may release it by writing the word.
    ///
    /// # Safety
    /// `addr` must be an aligned word of device memory (or memory mapped
    /// for the device) that stays allocated until the wait has ended.
    pub unsafe fn wait_value(&self, addr: u64, value: u64, wide: bool) -> Result<(), DriverError> {
        let geq = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
        if wide {
            // SAFETY: the caller's contract; the stream is live.
            check("cuStreamWaitValue64", unsafe {
                sys::cuStreamWaitValue64_v2(self.raw, addr, value, geq)
            })
        } else {
            // SAFETY: as above; a 32-bit wait takes the low word (callers
            // check the value fits).
            check("cuStreamWaitValue32", unsafe {
                sys::cuStreamWaitValue32_v2(self.raw, addr, value as u32, geq)
            })
        }
    }

    /// Enqueues `ops` in order with one `cuStreamBatchMemOp` call (see
    /// [`batch_mem_ops_raw`]).
    ///
    /// # Safety
    /// Every operation's `addr` as in [`Stream::wait_value`].
    pub unsafe fn batch(&self, ops: &[MemOp]) -> Result<(), DriverError> {
        // SAFETY: the stream is live (`self`); the addresses are the
        // caller's contract.
        unsafe { batch_mem_ops_raw(self.raw, ops) }
    }

    /// Enqueues writing `value` to the word at `addr` once the work before
    /// it on this stream is done (`cuStreamWriteValue32/64`).
    ///
    /// # Safety
    /// As [`Stream::wait_value`].
    pub unsafe fn write_value(&self, addr: u64, value: u64, wide: bool) -> Result<(), DriverError> {
        let default = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
        if wide {
            // SAFETY: the caller's contract; the stream is live.
            check("cuStreamWriteValue64", unsafe {
                sys::cuStreamWriteValue64_v2(self.raw, addr, value, default)
            })
        } else {
            // SAFETY: as above.
            check("cuStreamWriteValue32", unsafe {
                sys::cuStreamWriteValue32_v2(self.raw, addr, value as u32, default)
            })
        }
    }
}

/// One 64-bit word of pinned host memory that the device can write with
/// stream memory operations ([`Stream::write_value`] at
/// [`device_ptr`](HostWord::device_ptr)) and the host reads without a
/// driver call: a progress word a stream advances as its work completes.
/// Freed on drop.
#[derive(Debug)]
pub struct HostWord {
    host: *mut u64,
    device: u64,
}

// SAFETY: the word is only read through an atomic load (the device writes
// it; no host code writes it after `new`), and the memory is freed once,
// by the owner's drop.
unsafe impl Send for HostWord {}
// SAFETY: as above: `&self` methods only load the word atomically.
unsafe impl Sync for HostWord {}

impl HostWord {
    /// Allocates a zeroed word in pinned, device-mapped host memory of the
    /// current context (`cuMemHostAlloc` with `DEVICEMAP`, then
    /// `cuMemHostGetDevicePointer`).
    pub fn new() -> Result<Self, DriverError> {
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: 8 bytes of pinned memory; zeroed below before any read.
        let host = unsafe { result::malloc_host(8, flags) }.named("cuMemHostAlloc")?;
        let host = host.cast::<u64>();
        // The word is owned from here: a failure below frees it on drop.
        let mut word = HostWord { host, device: 0 };
        // SAFETY: `host` is a fresh, 8-byte, page-aligned allocation that
        // nothing else references yet.
        unsafe { host.write_volatile(0) };
        let mut device = MaybeUninit::<sys::CUdeviceptr>::uninit();
        // SAFETY: `host` came from cuMemHostAlloc with DEVICEMAP; `device`
        // is written by the call on success.
        check("cuMemHostGetDevicePointer", unsafe {
            sys::cuMemHostGetDevicePointer_v2(device.as_mut_ptr(), host.cast(), 0)
        })?;
        // SAFETY: initialized by the successful call above.
        word.device = unsafe { device.assume_init() };
        Ok(word)
    }

    /// The word's device address, for stream memory operations.
    pub fn device_ptr(&self) -> u64 {
        self.device
    }

    /// The word's current value (an acquire load: what the device wrote
    /// before it is visible after).
    pub fn load(&self) -> u64 {
        // SAFETY: `host` is a live, 8-byte-aligned allocation this value
        // owns; the device writes it whole (64-bit memory operations) and
        // the host only loads it atomically.
        let word = unsafe { std::sync::atomic::AtomicU64::from_ptr(self.host) };
        word.load(std::sync::atomic::Ordering::Acquire)
    }
}

impl Drop for HostWord {
    fn drop(&mut self) {
        // SAFETY: `host` came from cuMemHostAlloc and is freed once.
        let freed = unsafe { result::free_host(self.host.cast()) };
        log_release(freed.named("cuMemFreeHost"), "freeing a host word");
    }
}

/// One stream memory operation of a [`batch_mem_ops_raw`] batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemOp {
    /// Write `value` to the word at `addr` once the work before it is done
    /// (as `cuStreamWriteValue32/64`).
    Write {
        /// The word's device address, aligned to its width.
        addr: u64,
        /// The value (a 32-bit word takes the low 32 bits).
        value: u64,
        /// A 64-bit word when true, else a 32-bit one.
        wide: bool,
    },
    /// Block later work until the word at `addr` is at least `value` (as
    /// `cuStreamWaitValue32/64` with GEQ).
    WaitGeq {
        /// The word's device address, aligned to its width.
        addr: u64,
        /// The value waited for.
        value: u64,
        /// A 64-bit word when true, else a 32-bit one.
        wide: bool,
    },
}

/// The driver's parameters of one batch operation.
fn mem_op_params(op: MemOp) -> sys::CUstreamBatchMemOpParams {
    use sys::CUstreamBatchMemOpType as Op;
    // SAFETY: the params are a C union of plain integers, for which all-zero
    // bytes are valid (and what the driver expects in the fields an
    // operation does not use).
    let mut param: sys::CUstreamBatchMemOpParams = unsafe { std::mem::zeroed() };
    match op {
        MemOp::Write { addr, value, wide } => {
            let operation = if wide {
                Op::CU_STREAM_MEM_OP_WRITE_VALUE_64
            } else {
                Op::CU_STREAM_MEM_OP_WRITE_VALUE_32
            };
            param.writeValue.operation = operation;
            param.writeValue.address = addr;
            if wide {
                param.writeValue.__bindgen_anon_1.value64 = value;
            } else {
                param.writeValue.__bindgen_anon_1.value = value as u32;
            }
            param.writeValue.flags =
                sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
        }
        MemOp::WaitGeq { addr, value, wide } => {
            let operation = if wide {
                Op::CU_STREAM_MEM_OP_WAIT_VALUE_64
            } else {
                Op::CU_STREAM_MEM_OP_WAIT_VALUE_32
            };
            param.waitValue.operation = operation;
            param.waitValue.address = addr;
            if wide {
                param.waitValue.__bindgen_anon_1.value64 = value;
            } else {
                param.waitValue.__bindgen_anon_1.value = value as u32;
            }
            param.waitValue.flags = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
        }
    }
    param
}

/// The most operations one [`batch_mem_ops_raw`] call takes (the driver's
/// documented limit is 256).
pub const MAX_BATCH_MEM_OPS: usize = 256;

/// Batches of at most this many operations are built on the stack.
const INLINE_MEM_OPS: usize = 8;

/// Enqueues `ops` in order on `stream` with one `cuStreamBatchMemOp` call:
/// the same work as one `cuStreamWriteValue`/`cuStreamWaitValue` call per
/// operation, for one driver entry.
///
/// # Safety
/// `stream` must be 0, `CU_STREAM_LEGACY` (1), `CU_STREAM_PER_THREAD` (2)
/// or a live stream of the current context, and every operation's `addr`
/// an aligned word of device memory (or memory mapped for the device) that
/// stays allocated until the stream has passed the operation.
pub unsafe fn batch_mem_ops_raw(stream: sys::CUstream, ops: &[MemOp]) -> Result<(), DriverError> {
    if ops.is_empty() {
        return Ok(());
    }
    if ops.len() > MAX_BATCH_MEM_OPS {
        return Err(DriverError::from_code(
            "cuStreamBatchMemOp",
            sys::cudaError_enum::CUDA_ERROR_INVALID_VALUE,
        ));
    }
    // A launch's few operations go on the stack: no allocation per call on
    // the ring's path.
    // SAFETY: as in `mem_op_params`, all-zero params are valid.
    let mut inline: [sys::CUstreamBatchMemOpParams; INLINE_MEM_OPS] = unsafe { std::mem::zeroed() };
    let heap: Vec<sys::CUstreamBatchMemOpParams>;
    let params: &[sys::CUstreamBatchMemOpParams] = if ops.len() <= INLINE_MEM_OPS {
        for (slot, op) in inline.iter_mut().zip(ops) {
            *slot = mem_op_params(*op);
        }
        &inline[..ops.len()]
    } else {
        heap = ops.iter().map(|op| mem_op_params(*op)).collect();
        &heap
    };
    let count = ops.len() as c_uint; // at most MAX_BATCH_MEM_OPS (checked)
                                     // SAFETY: `params` holds `count` initialized operations and lives across
                                     // the call (the driver copies them); the stream and addresses are the
                                     // caller's contract.
    check("cuStreamBatchMemOp", unsafe {
        sys::cuStreamBatchMemOp_v2(stream, count, params.as_ptr().cast_mut(), 0)
    })
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: `raw` came from cuStreamCreate and is destroyed once.
        let destroyed = unsafe { result::stream::destroy(self.raw) };
        log_release(destroyed.named("cuStreamDestroy"), "destroying a stream");
    }
}

/// An event without timing, to mark a point in a stream; destroyed on drop.
#[derive(Debug)]
pub struct Event {
    raw: sys::CUevent,
}

// SAFETY: events may be used from any thread of their context.
unsafe impl Send for Event {}
// SAFETY: as above; every method takes `&self` and only passes the handle.
unsafe impl Sync for Event {}

impl Event {
    /// The one `cuEventCreate`: cudarc's wrapper takes a single
    /// `CUevent_flags` value, and an interprocess event needs two.
    fn create(flags: c_uint) -> Result<Self, DriverError> {
        let mut raw: sys::CUevent = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; callers pass valid
        // CUevent_flags bits.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut raw, flags)
        })?;
        Ok(Event { raw })
    }

    /// Creates an event in the current context, for this process only.
    pub fn marker() -> Result<Self, DriverError> {
        Self::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as c_uint)
    }

    /// Creates an event in the current context that another process can
    /// open from [`Event::ipc_handle`].
    pub fn interprocess() -> Result<Self, DriverError> {
        Self::create(
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as c_uint
                | sys::CUevent_flags::CU_EVENT_INTERPROCESS as c_uint,
        )
    }

    /// Opens a 64-byte `CUipcEventHandle` from another process.
    pub fn open_ipc(handle: &[u8; 64]) -> Result<Self, DriverError> {
        let raw_handle = sys::CUipcEventHandle {
            reserved: handle.map(|b| b as std::ffi::c_char),
        };
        let mut raw: sys::CUevent = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the handle is passed by value
        // and the driver validates its contents.
        check("cuIpcOpenEventHandle", unsafe {
            sys::cuIpcOpenEventHandle(&mut raw, raw_handle)
        })?;
        Ok(Event { raw })
    }

    /// The 64-byte handle another process opens with [`Event::open_ipc`]
    /// (the event must come from [`Event::interprocess`]).
    pub fn ipc_handle(&self) -> Result<[u8; 64], DriverError> {
        let mut handle = MaybeUninit::<sys::CUipcEventHandle>::uninit();
        // SAFETY: valid out-pointer; the event is live (the driver refuses
        // one not created interprocess).
        check("cuIpcGetEventHandle", unsafe {
            sys::cuIpcGetEventHandle(handle.as_mut_ptr(), self.raw)
        })?;
        // SAFETY: initialized by the successful call above.
        let handle = unsafe { handle.assume_init() };
        Ok(handle.reserved.map(|b| b as u8))
    }

    /// Whether the work before the event's last record has completed
    /// (an event never recorded counts as complete). Does not block.
    pub fn query(&self) -> Result<bool, DriverError> {
        // SAFETY: the event is live.
        match unsafe { result::event::query(self.raw) } {
            Ok(()) => Ok(true),
            Err(RawError(sys::CUresult::CUDA_ERROR_NOT_READY)) => Ok(false),
            Err(RawError(code)) => Err(DriverError::from_code("cuEventQuery", code)),
        }
    }

    /// Blocks until the work before the event's last record is done.
    pub fn synchronize(&self) -> Result<(), DriverError> {
        // SAFETY: the event is live.
        unsafe { result::event::synchronize(self.raw) }.named("cuEventSynchronize")
    }

    /// Records the event on `stream` after the work enqueued so far.
    ///
    /// # Safety
    /// `stream` must be 0, `CU_STREAM_LEGACY` (1), `CU_STREAM_PER_THREAD`
    /// (2) or a live stream of the current context.
    pub unsafe fn record_raw(&self, stream: sys::CUstream) -> Result<(), DriverError> {
        // SAFETY: the event is live; the stream is the caller's contract.
        unsafe { result::event::record(self.raw, stream) }.named("cuEventRecord")
    }

    /// Makes later work on `stream` wait for the event's last record.
    ///
    /// # Safety
    /// As for [`Event::record_raw`].
    pub unsafe fn wait_raw(&self, stream: sys::CUstream) -> Result<(), DriverError> {
        let flags = sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT;
        // SAFETY: the event is live; the stream is the caller's contract.
        unsafe { result::stream::wait_event(stream, self.raw, flags) }.named("cuStreamWaitEvent")
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: `raw` came from cuEventCreate or cuIpcOpenEventHandle and
        // is destroyed once.
        let destroyed = unsafe { result::event::destroy(self.raw) };
        log_release(destroyed.named("cuEventDestroy"), "destroying an event");
    }
}

/// Why a module did not load.
#[derive(Debug)]
pub struct LoadFailure {
    /// The failed `cuModuleLoadDataEx`.
    pub error: DriverError,
    /// What the JIT wrote to its error log (empty for a cubin the driver
    /// refused without compiling).
    pub error_log: String,
    /// What the JIT wrote to its info log.
    pub info_log: String,
}

const JIT_LOG_BYTES: usize = 16 * 1024;

fn log_text(buffer: &[u8], written: usize) -> String {
    let bytes = &buffer[..written.min(buffer.len())];
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end])
        .trim_end()
        .to_string()
}

/// Compiles a PTX image to the current context's device's machine code
/// (a cubin) with the driver's JIT, through the linker (`cuLinkCreate`,
/// `cuLinkAddData`, `cuLinkComplete`), which, unlike `cuModuleLoadDataEx`,
/// hands the code back: it can be kept and loaded later with
/// [`Module::load_with_logs`] without compiling again. Returns the cubin
/// and the JIT's info log; a failure carries both logs as
/// [`Module::load_with_logs`]'s does.
///
/// # Safety
/// `ptx` must end in a NUL byte (the JIT reads up to it).
pub unsafe fn compile_ptx(ptx: &[u8]) -> Result<(Vec<u8>, String), LoadFailure> {
    let mut error_log = vec![0u8; JIT_LOG_BYTES];
    let mut info_log = vec![0u8; JIT_LOG_BYTES];
    let mut options = [
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        sys::CUjit_option::CU_JIT_INFO_LOG_BUFFER,
        sys::CUjit_option::CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
        sys::CUjit_option::CU_JIT_LOG_VERBOSE,
    ];
    // As in `Module::load_with_logs`: sizes are integers in pointer slots.
    let mut values: [*mut c_void; 5] = [
        error_log.as_mut_ptr().cast(),
        std::ptr::without_provenance_mut(JIT_LOG_BYTES),
        info_log.as_mut_ptr().cast(),
        std::ptr::without_provenance_mut(JIT_LOG_BYTES),
        std::ptr::without_provenance_mut(1),
    ];
    let mut state: sys::CUlinkState = std::ptr::null_mut();
    let fail =
        |error: DriverError, values: &[*mut c_void; 5], error_log: &[u8], info_log: &[u8]| {
            LoadFailure {
                error,
                error_log: log_text(error_log, values[1].addr()),
                info_log: log_text(info_log, values[3].addr()),
            }
        };
    // SAFETY: options and values have the same length, passed as the
    // count; the log buffers hold JIT_LOG_BYTES each and outlive the link
    // state (destroyed below, on every path, before they are dropped).
    let created = check("cuLinkCreate", unsafe {
        sys::cuLinkCreate_v2(
            options.len() as u32,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
            &mut state,
        )
    });
    if let Err(error) = created {
        return Err(fail(error, &values, &error_log, &info_log));
    }
    let name = c"kernel.ptx";
    // SAFETY: `state` was created above; the caller's contract puts a NUL
    // at the end of `ptx`, which outlives the call; no per-input options.
    let added = check("cuLinkAddData", unsafe {
        sys::cuLinkAddData_v2(
            state,
            sys::CUjitInputType::CU_JIT_INPUT_PTX,
            ptx.as_ptr().cast_mut().cast(),
            ptx.len(),
            name.as_ptr(),
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    });
    let mut cubin: *mut c_void = std::ptr::null_mut();
    let mut size: usize = 0;
    let completed = added.and_then(|()| {
        // SAFETY: `state` is live; the outputs are live locals. The cubin
        // the driver returns lives in `state` until it is destroyed, so it
        // is copied out before that.
        let code = unsafe { sys::cuLinkComplete(state, &mut cubin, &mut size) };
        check("cuLinkComplete", code)
    });
    let code = completed.and_then(|()| {
        if cubin.is_null() || size == 0 {
            return Err(DriverError {
                call: "cuLinkComplete",
                name: "an empty image".into(),
            });
        }
        // SAFETY: the driver wrote `size` bytes at `cubin`, owned by
        // `state`, which is still live.
        Ok(unsafe { std::slice::from_raw_parts(cubin.cast::<u8>(), size) }.to_vec())
    });
    // SAFETY: `state` was created above and is destroyed once, here; the
    // cubin it owned has been copied.
    log_release(
        check("cuLinkDestroy", unsafe { sys::cuLinkDestroy(state) }),
        "cannot destroy a JIT link state",
    );
    match code {
        Ok(code) => Ok((code, log_text(&info_log, values[3].addr()))),
        Err(error) => Err(fail(error, &values, &error_log, &info_log)),
    }
}

/// A loaded module; unloaded on drop.
#[derive(Debug)]
pub struct Module {
    raw: sys::CUmodule,
}

// SAFETY: module handles are usable from any thread of their context.
unsafe impl Send for Module {}
// SAFETY: as above; resolving a function only reads the module.
unsafe impl Sync for Module {}

impl Module {
    /// Loads a PTX, cubin or fatbin image into the current context
    /// (`cuModuleLoadData`: no JIT logs).
    ///
    /// # Safety
    /// A PTX `image` must end in a NUL byte; a cubin or fatbin image must be
    /// complete (the driver trusts the sizes written inside an image).
    pub unsafe fn load(image: &[u8]) -> Result<Self, DriverError> {
        // SAFETY: the caller's contract; `image` outlives the call.
        let raw = unsafe { result::module::load_data(image.as_ptr().cast()) }
            .named("cuModuleLoadData")?;
        Ok(Module { raw })
    }

    /// Loads an image as [`Module::load`] does, but with
    /// `cuModuleLoadDataEx`, capturing the JIT's error and info logs; on
    /// success returns the info log too.
    ///
    /// # Safety
    /// As for [`Module::load`].
    pub unsafe fn load_with_logs(image: &[u8]) -> Result<(Self, String), LoadFailure> {
        let mut error_log = vec![0u8; JIT_LOG_BYTES];
        let mut info_log = vec![0u8; JIT_LOG_BYTES];
        let mut options = [
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
            sys::CUjit_option::CU_JIT_INFO_LOG_BUFFER,
            sys::CUjit_option::CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
            sys::CUjit_option::CU_JIT_LOG_VERBOSE,
        ];
        // The driver reads size options as integers stored in the pointer
        // slots and writes back the number of bytes it logged.
        let mut values: [*mut c_void; 5] = [
            error_log.as_mut_ptr().cast(),
            std::ptr::without_provenance_mut(JIT_LOG_BYTES),
            info_log.as_mut_ptr().cast(),
            std::ptr::without_provenance_mut(JIT_LOG_BYTES),
            std::ptr::without_provenance_mut(1),
        ];
        let mut raw: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: the image is the caller's contract; the log buffers hold
        // JIT_LOG_BYTES each and outlive the call; options and values have
        // the same length, passed as the count.
        let code = unsafe {
            sys::cuModuleLoadDataEx(
                &mut raw,
                image.as_ptr().cast(),
                options.len() as u32,
                options.as_mut_ptr(),
                values.as_mut_ptr(),
            )
        };
        let error_written = values[1].addr();
        let info_written = values[3].addr();
        let info = log_text(&info_log, info_written);
        match check("cuModuleLoadDataEx", code) {
            Ok(()) => Ok((Module { raw }, info)),
            Err(error) => Err(LoadFailure {
                error,
                error_log: log_text(&error_log, error_written),
                info_log: info,
            }),
        }
    }

    /// Resolves a kernel by name (`CUDA_ERROR_NOT_FOUND` when there is
    /// none).
    pub fn function(&self, symbol: &CStr) -> Result<Function, DriverError> {
        // SAFETY: the module is loaded and not yet unloaded.
        let raw = unsafe { result::module::get_function(self.raw, symbol.to_owned()) }
            .named("cuModuleGetFunction")?;
        Ok(Function { raw })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: `raw` came from a successful load and is unloaded once.
        let unloaded = unsafe { result::module::unload(self.raw) };
        log_release(unloaded.named("cuModuleUnload"), "unloading a module");
    }
}

/// A kernel inside a loaded [`Module`]. It does not borrow the module (the
/// executor stores both side by side), so its holder keeps the module loaded
/// for as long as it uses the function.
#[derive(Debug, Clone, Copy)]
pub struct Function {
    raw: sys::CUfunction,
}

// SAFETY: a function handle is an immutable reference into its module, usable
// from any thread of the context.
unsafe impl Send for Function {}
// SAFETY: as above; nothing mutates through it.
unsafe impl Sync for Function {}

impl Function {
    /// The byte size of each kernel parameter, in order (cudarc does not
    /// wrap `cuFuncGetParamInfo`).
    pub fn param_sizes(&self) -> Result<Vec<usize>, DriverError> {
        // Kernel parameter space is 32 KiB at most, so this bounds the loop
        // even if the driver never said "no such parameter".
        const MAX_PARAMS: usize = 32 * 1024;
        let mut sizes = Vec::new();
        for index in 0..MAX_PARAMS {
            let (mut offset, mut size) = (0usize, 0usize);
            // SAFETY: `offset` and `size` are valid out-pointers; the
            // function is loaded.
            let code = unsafe { sys::cuFuncGetParamInfo(self.raw, index, &mut offset, &mut size) };
            match check("cuFuncGetParamInfo", code) {
                Ok(()) => sizes.push(size),
                // The driver's answer for an index past the last parameter.
                Err(e) if e.name == "CUDA_ERROR_INVALID_VALUE" => break,
                Err(e) => return Err(e),
            }
        }
        Ok(sizes)
    }

    /// The most threads a block of this kernel may have, as compiled.
    pub fn max_threads_per_block(&self) -> Result<u32, DriverError> {
        let attribute = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK;
        // SAFETY: the function is loaded.
        let value = unsafe { result::function::get_function_attribute(self.raw, attribute) }
            .named("cuFuncGetAttribute")?;
        Ok(value.max(0) as u32)
    }

    /// Enqueues the kernel on `stream` with a 1-D grid and no dynamic shared
    /// memory.
    ///
    /// # Safety
    /// `params` must hold one pointer per kernel parameter, each to a live
    /// value of the size the kernel declares, and every pointer value among
    /// them must address device memory the kernel may access until the
    /// stream is synchronized.
    pub unsafe fn launch(
        &self,
        grid: u32,
        block: u32,
        stream: &Stream,
        params: &mut [*mut c_void],
    ) -> Result<(), DriverError> {
        // SAFETY: the caller's contract; the stream is live; the driver
        // refuses zero or oversized dimensions.
        unsafe {
            result::launch_kernel(self.raw, (grid, 1, 1), (block, 1, 1), 0, stream.raw, params)
        }
        .named("cuLaunchKernel")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_format_like_nvidia_smi() {
        let bytes: [u8; 16] = [
            0x5a, 0x1b, 0x2c, 0x3d, 0x4e, 0x5f, 0x60, 0x71, 0x82, 0x93, 0xa4, 0xb5, 0xc6, 0xd7,
            0xe8, 0xf9,
        ];
        assert_eq!(
            format_uuid(&bytes),
            "GPU-5a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"
        );
        let mut bytes = [0u8; 16];
        bytes[0] = 0xab;
        bytes[15] = 0x01;
        assert_eq!(
            format_uuid(&bytes),
            "GPU-ab000000-0000-0000-0000-000000000001"
        );
    }

    #[test]
    fn jit_logs_stop_at_the_written_length_and_the_first_nul() {
        assert_eq!(log_text(b"ptxas error\0junk", 16), "ptxas error");
        assert_eq!(log_text(b"abcdef", 3), "abc");
        assert_eq!(log_text(b"abc", 99), "abc");
    }

    #[test]
    fn sizes_round_up_to_the_granularity_and_never_to_zero() {
        let mib2 = 2 << 20;
        assert_eq!(round_up(0, mib2), Some(mib2));
        assert_eq!(round_up(1, mib2), Some(mib2));
        assert_eq!(round_up(mib2, mib2), Some(mib2));
        assert_eq!(round_up(mib2 + 1, mib2), Some(2 * mib2));
        assert_eq!(round_up(u64::MAX, mib2), None);
        assert_eq!(round_up(5, 0), Some(5));
    }

    #[test]
    fn sticky_errors_are_told_apart_by_name() {
        let error = |name: &str| DriverError {
            call: "cuStreamSynchronize",
            name: name.into(),
        };
        assert!(error("CUDA_ERROR_ILLEGAL_ADDRESS").is_sticky());
        assert!(error("CUDA_ERROR_CONTAINED").is_sticky());
        assert!(!error("CUDA_ERROR_INVALID_VALUE").is_sticky());
        assert_eq!(
            error("CUDA_ERROR_INVALID_VALUE").to_string(),
            "cuStreamSynchronize failed: CUDA_ERROR_INVALID_VALUE"
        );
    }

    #[test]
    fn batch_operations_fill_the_drivers_union_as_the_single_calls_would() {
        use sys::CUstreamBatchMemOpType as Op;
        let write = mem_op_params(MemOp::Write {
            addr: 0x7f00_0000_1008,
            value: 0x1_0000_0002,
            wide: true,
        });
        let wait = mem_op_params(MemOp::WaitGeq {
            addr: 0x7f00_0000_1000,
            value: 0xdead_beef_0000_0007,
            wide: false,
        });
        // SAFETY: reading the variants `mem_op_params` wrote (every field is
        // a plain integer, and the union was zeroed first).
        unsafe {
            assert_eq!(
                write.writeValue.operation,
                Op::CU_STREAM_MEM_OP_WRITE_VALUE_64
            );
            assert_eq!(write.writeValue.address, 0x7f00_0000_1008);
            assert_eq!(write.writeValue.__bindgen_anon_1.value64, 0x1_0000_0002);
            assert_eq!(write.writeValue.flags, 0);
            assert_eq!(write.writeValue.alias, 0);
            assert_eq!(wait.waitValue.operation, Op::CU_STREAM_MEM_OP_WAIT_VALUE_32);
            assert_eq!(wait.waitValue.address, 0x7f00_0000_1000);
            // A 32-bit wait takes the low word, and leaves the high one zero.
            assert_eq!(wait.waitValue.__bindgen_anon_1.value64, 7);
            assert_eq!(
                wait.waitValue.flags,
                sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32
            );
        }
        // Nothing to enqueue is not a driver call (this machine may have no
        // driver at all).
        // SAFETY: no operation, so neither the stream nor an address is used.
        assert!(unsafe { batch_mem_ops_raw(std::ptr::null_mut(), &[]) }.is_ok());
    }

    /// Every error a faulting kernel or failing hardware reports is sticky;
    /// the errors of a call the client or the front got wrong are not (the
    /// executor answers those and serves on). Each name is also checked to
    /// be a code of the driver's headers, so a misspelt entry cannot hide.
    #[test]
    fn the_classification_covers_every_kernel_fault_and_no_call_error() {
        use sys::CUresult as R;
        let named = |code: R| format!("{code:?}");
        let sticky = [
            R::CUDA_ERROR_ILLEGAL_ADDRESS,
            R::CUDA_ERROR_LAUNCH_FAILED,
            R::CUDA_ERROR_MISALIGNED_ADDRESS,
            R::CUDA_ERROR_HARDWARE_STACK_ERROR,
            R::CUDA_ERROR_ILLEGAL_INSTRUCTION,
            R::CUDA_ERROR_INVALID_PC,
            R::CUDA_ERROR_ASSERT,
            R::CUDA_ERROR_INVALID_ADDRESS_SPACE,
            R::CUDA_ERROR_LAUNCH_TIMEOUT,
            R::CUDA_ERROR_ECC_UNCORRECTABLE,
            R::CUDA_ERROR_NVLINK_UNCORRECTABLE,
            R::CUDA_ERROR_CONTEXT_IS_DESTROYED,
            R::CUDA_ERROR_DEINITIALIZED,
        ];
        for code in sticky {
            assert!(is_sticky_error(&named(code)), "{code:?} is not sticky");
        }
        let recoverable = [
            R::CUDA_SUCCESS,
            R::CUDA_ERROR_INVALID_VALUE,
            R::CUDA_ERROR_OUT_OF_MEMORY,
            R::CUDA_ERROR_NOT_READY,
            R::CUDA_ERROR_NOT_FOUND,
            R::CUDA_ERROR_INVALID_HANDLE,
            R::CUDA_ERROR_INVALID_IMAGE,
            R::CUDA_ERROR_INVALID_PTX,
            R::CUDA_ERROR_NO_BINARY_FOR_GPU,
            R::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
            R::CUDA_ERROR_ALREADY_MAPPED,
            R::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
            R::CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
            R::CUDA_ERROR_NOT_SUPPORTED,
        ];
        for code in recoverable {
            assert!(!is_sticky_error(&named(code)), "{code:?} is sticky");
        }
        // Names from newer headers than cudarc's are matched by name too.
        for name in [
            "CUDA_ERROR_CONTAINED",
            "CUDA_ERROR_TENSOR_MEMORY_LEAK",
            "CUDA_ERROR_EXTERNAL_DEVICE",
        ] {
            assert!(is_sticky_error(name), "{name}");
        }
        // A name the driver could not give is never sticky by accident.
        assert!(!is_sticky_error("CUresult(719)"));
        assert!(!is_sticky_error("cuda_error_illegal_address"));
        assert!(!is_sticky_error(""));
    }
}
