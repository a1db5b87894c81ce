//! The executor's thin layer over the CUDA driver API (`cudarc::driver::sys`).
//!
//! Everything `unsafe` about the driver lives here; the backend above it
//! (`super`) is safe code over these wrappers. Each wrapper turns a
//! `CUresult` into a [`DriverError`] carrying the call and the driver's error
//! name, and each owned driver object is an RAII type released on drop.
//!
//! Invariants:
//! - No function here is called before [`library_present`] returned true and
//!   [`init`] succeeded: cudarc's loader panics when `libcuda` is missing.
//! - Every driver object is created, used and destroyed while the executor's
//!   primary context is current on the calling thread (the backend makes it
//!   current on every thread it starts).
//! - Raw handles are `Send` because the driver API is thread-safe for
//!   distinct calls on the same object; the backend never destroys an object
//!   while another thread may still use it (streams are destroyed by their
//!   own waiter thread, after its last synchronization).

use std::ffi::{c_void, CStr};
use std::mem::MaybeUninit;

use cudarc::driver::result::DriverError as RawError;
use cudarc::driver::sys;

/// A failed driver call.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{call} failed: {name}")]
pub struct DriverError {
    /// The driver entry point that failed.
    pub call: &'static str,
    /// The driver's name for the error, e.g. `CUDA_ERROR_INVALID_VALUE`.
    pub name: String,
}

/// Errors after which the process's every context is unusable (measured on
/// an H200: even `cuCtxCreate` fails afterwards). Matched by name so that
/// codes added in newer headers (e.g. `CUDA_ERROR_CONTAINED`) need no
/// feature gate.
const STICKY_ERRORS: &[&str] = &[
    "CUDA_ERROR_ILLEGAL_ADDRESS",
    "CUDA_ERROR_LAUNCH_TIMEOUT",
    "CUDA_ERROR_ASSERT",
    "CUDA_ERROR_HARDWARE_STACK_ERROR",
    "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    "CUDA_ERROR_MISALIGNED_ADDRESS",
    "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    "CUDA_ERROR_INVALID_PC",
    "CUDA_ERROR_LAUNCH_FAILED",
    "CUDA_ERROR_ECC_UNCORRECTABLE",
    "CUDA_ERROR_CONTAINED",
    "CUDA_ERROR_TENSOR_MEMORY_LEAK",
    "CUDA_ERROR_EXTERNAL_DEVICE",
];

impl DriverError {
    /// Whether this error poisoned the process's contexts for good.
    pub fn is_sticky(&self) -> bool {
        STICKY_ERRORS.contains(&self.name.as_str())
    }
}

fn error_name(code: sys::CUresult) -> String {
    match RawError(code).error_name() {
        Ok(name) => name.to_string_lossy().into_owned(),
        Err(_) => format!("CUresult({})", code as u32),
    }
}

fn check(call: &'static str, code: sys::CUresult) -> Result<(), DriverError> {
    if code == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(DriverError {
            call,
            name: error_name(code),
        })
    }
}

/// Whether `libcuda` can be loaded; must be true before any other call here.
pub fn library_present() -> bool {
    // SAFETY: only tries to dlopen the candidate library names and drops the
    // handles; it calls no driver function.
    unsafe { sys::is_culib_present() }
}

/// Initializes the driver (idempotent).
pub fn init() -> Result<(), DriverError> {
    // SAFETY: cuInit takes no pointers; flags must be 0.
    check("cuInit", unsafe { sys::cuInit(0) })
}

/// Formats a device UUID the way `nvidia-smi -L` prints it.
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
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    pub ordinal: u32,
    pub device: sys::CUdevice,
    pub uuid: String,
    pub name: String,
    pub compute_major: u32,
    pub compute_minor: u32,
    pub total_memory: u64,
}

fn device_attribute(
    device: sys::CUdevice,
    attribute: sys::CUdevice_attribute,
) -> Result<i32, DriverError> {
    let mut value = 0i32;
    // SAFETY: `value` is a valid out-pointer; `device` came from cuDeviceGet.
    check("cuDeviceGetAttribute", unsafe {
        sys::cuDeviceGetAttribute(&mut value, attribute, device)
    })?;
    Ok(value)
}

/// Every device the driver sees, in ordinal order.
pub fn devices() -> Result<Vec<DeviceInfo>, DriverError> {
    let mut count = 0i32;
    // SAFETY: `count` is a valid out-pointer.
    check("cuDeviceGetCount", unsafe {
        sys::cuDeviceGetCount(&mut count)
    })?;
    let mut out = Vec::new();
    for ordinal in 0..count.max(0) {
        let mut device: sys::CUdevice = 0;
        // SAFETY: `device` is a valid out-pointer; ordinal < count.
        check("cuDeviceGet", unsafe {
            sys::cuDeviceGet(&mut device, ordinal)
        })?;
        let mut name = [0 as std::ffi::c_char; 256];
        // SAFETY: the buffer holds `len` bytes; the driver NUL-terminates.
        check("cuDeviceGetName", unsafe {
            sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, device)
        })?;
        // SAFETY: cuDeviceGetName wrote a NUL-terminated string into `name`.
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let mut uuid = MaybeUninit::<sys::CUuuid>::uninit();
        // SAFETY: `uuid` is a valid out-pointer for one CUuuid.
        check("cuDeviceGetUuid", unsafe {
            sys::cuDeviceGetUuid_v2(uuid.as_mut_ptr(), device)
        })?;
        // SAFETY: initialized by the successful call above.
        let uuid = unsafe { uuid.assume_init() };
        let uuid_bytes: [u8; 16] = uuid.bytes.map(|b| b as u8);
        let mut total = 0usize;
        // SAFETY: `total` is a valid out-pointer.
        check("cuDeviceTotalMem", unsafe {
            sys::cuDeviceTotalMem_v2(&mut total, device)
        })?;
        use sys::CUdevice_attribute::*;
        out.push(DeviceInfo {
            ordinal: ordinal as u32,
            device,
            uuid: format_uuid(&uuid_bytes),
            name,
            compute_major: device_attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?
                as u32,
            compute_minor: device_attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?
                as u32,
            total_memory: total as u64,
        });
    }
    Ok(out)
}

/// A retained primary context of one device.
#[derive(Debug)]
pub struct PrimaryContext {
    device: sys::CUdevice,
    context: sys::CUcontext,
}

// SAFETY: a CUcontext may be made current on any thread; the handle itself is
// an opaque pointer the driver synchronizes.
unsafe impl Send for PrimaryContext {}
// SAFETY: as above; `set_current` only reads the handle.
unsafe impl Sync for PrimaryContext {}

impl PrimaryContext {
    /// Retains the device's primary context and makes it current here.
    pub fn retain(device: sys::CUdevice) -> Result<Self, DriverError> {
        let mut context: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: `context` is a valid out-pointer; `device` came from cuDeviceGet.
        check("cuDevicePrimaryCtxRetain", unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut context, device)
        })?;
        let retained = PrimaryContext { device, context };
        retained.set_current()?;
        Ok(retained)
    }

    /// Makes the context current on the calling thread.
    pub fn set_current(&self) -> Result<(), DriverError> {
        // SAFETY: the context is retained for as long as `self` lives.
        check("cuCtxSetCurrent", unsafe {
            sys::cuCtxSetCurrent(self.context)
        })
    }

    /// Waits for all work in the context.
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
        let code = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.device) };
        if let Err(e) = check("cuDevicePrimaryCtxRelease", code) {
            tracing::warn!(error = %e, "releasing the primary context");
        }
    }
}

/// Why a module did not load.
#[derive(Debug)]
pub struct LoadFailure {
    pub error: DriverError,
    pub error_log: String,
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

/// A loaded module; unloaded on drop.
#[derive(Debug)]
pub struct Module {
    raw: sys::CUmodule,
}

// SAFETY: module handles are usable from any thread of the context; the
// backend only touches a module from its request-loop thread.
unsafe impl Send for Module {}

impl Module {
    /// Loads a PTX, cubin or fatbin image with cuModuleLoadDataEx, capturing
    /// the JIT's error and info logs. A PTX `image` must end in a NUL byte;
    /// a cubin or fatbin image must have had its headers checked against its
    /// length (the driver trusts the sizes written inside the image).
    pub fn load(image: &[u8]) -> Result<(Module, String), LoadFailure> {
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
        // SAFETY: `image` is NUL-terminated PTX or a cubin/fatbin whose
        // headers lie within it (caller's contract); the log buffers hold
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

    /// Resolves a kernel by name.
    pub fn function(&self, symbol: &CStr) -> Result<Function, DriverError> {
        let mut raw: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: the module is loaded; `symbol` is NUL-terminated.
        check("cuModuleGetFunction", unsafe {
            sys::cuModuleGetFunction(&mut raw, self.raw, symbol.as_ptr())
        })?;
        Ok(Function { raw })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: `raw` came from a successful load and is unloaded once.
        let code = unsafe { sys::cuModuleUnload(self.raw) };
        if let Err(e) = check("cuModuleUnload", code) {
            tracing::warn!(error = %e, "unloading a module");
        }
    }
}

/// A kernel inside a loaded [`Module`]; valid while the module is.
#[derive(Debug, Clone, Copy)]
pub struct Function {
    raw: sys::CUfunction,
}

// SAFETY: a function handle is an immutable reference into its module; the
// backend keeps the module alive as long as the function.
unsafe impl Send for Function {}

impl Function {
    /// The byte size of each kernel parameter, in order.
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

    /// The most threads a block of this kernel may have.
    pub fn max_threads_per_block(&self) -> Result<u32, DriverError> {
        let mut value = 0i32;
        // SAFETY: `value` is a valid out-pointer; the function is loaded.
        check("cuFuncGetAttribute", unsafe {
            sys::cuFuncGetAttribute(
                &mut value,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                self.raw,
            )
        })?;
        Ok(value.max(0) as u32)
    }

    /// Enqueues the kernel on `stream` with a 1-D grid.
    ///
    /// # Safety
    /// `params` must point at one live value per kernel parameter, of the
    /// size the kernel declares, and every pointer value among them must
    /// address device memory the kernel may access for the whole launch.
    pub unsafe fn launch(
        &self,
        grid: u32,
        block: u32,
        stream: &Stream,
        params: &mut [*mut c_void],
    ) -> Result<(), DriverError> {
        // SAFETY: the caller guarantees `params`; grid and block are nonzero
        // dimensions checked by the backend; the stream is live.
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

/// A non-blocking stream; destroyed on drop.
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
    /// Creates a stream that does not synchronize with the legacy default
    /// stream, so one session's work never waits on another's by accident.
    pub fn new() -> Result<Self, DriverError> {
        let mut raw: sys::CUstream = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer.
        check("cuStreamCreate", unsafe {
            sys::cuStreamCreate(&mut raw, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        })?;
        Ok(Stream { raw })
    }

    /// Waits for everything enqueued so far; reports the first error of a
    /// kernel on it (or a sticky error of the context).
    pub fn synchronize(&self) -> Result<(), DriverError> {
        // SAFETY: the stream is live.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(self.raw)
        })
    }

    /// Makes later work on this stream wait for `event`'s last record.
    pub fn wait(&self, event: &Event) -> Result<(), DriverError> {
        // SAFETY: stream and event are live; flags must be 0.
        check("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(self.raw, event.raw, 0)
        })
    }

    /// Records `event` after the work enqueued so far.
    pub fn record(&self, event: &Event) -> Result<(), DriverError> {
        // SAFETY: stream and event are live.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(event.raw, self.raw)
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: `raw` came from cuStreamCreate and is destroyed once.
        let code = unsafe { sys::cuStreamDestroy_v2(self.raw) };
        if let Err(e) = check("cuStreamDestroy", code) {
            tracing::warn!(error = %e, "destroying a stream");
        }
    }
}

/// An event opened from another process's IPC handle; destroyed on drop.
#[derive(Debug)]
pub struct Event {
    raw: sys::CUevent,
}

// SAFETY: events may be used from any thread of their context.
unsafe impl Send for Event {}

impl Event {
    /// Creates an event without timing, to mark a point in a stream.
    pub fn marker() -> Result<Self, DriverError> {
        let mut raw: sys::CUevent = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the flag is a valid
        // CUevent_flags value.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(
                &mut raw,
                sys::CUevent_flags_enum::CU_EVENT_DISABLE_TIMING as u32,
            )
        })?;
        Ok(Event { raw })
    }

    /// Whether the work before the event's last record has completed
    /// (an event never recorded counts as complete).
    pub fn query(&self) -> Result<bool, DriverError> {
        // SAFETY: the event is live; the call does not block.
        let code = unsafe { sys::cuEventQuery(self.raw) };
        if code == sys::CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        check("cuEventQuery", code).map(|()| true)
    }

    /// Opens a 64-byte CUipcEventHandle.
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
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: `raw` came from cuIpcOpenEventHandle or cuEventCreate and
        // is destroyed once.
        let code = unsafe { sys::cuEventDestroy_v2(self.raw) };
        if let Err(e) = check("cuEventDestroy", code) {
            tracing::warn!(error = %e, "destroying an event");
        }
    }
}

/// A mapping of another process's device allocation; closed on drop.
#[derive(Debug)]
pub struct IpcMapping {
    ptr: sys::CUdeviceptr,
}

// SAFETY: a device address is a plain integer usable from any thread.
unsafe impl Send for IpcMapping {}

impl IpcMapping {
    /// Opens a 64-byte CUipcMemHandle, with peer access enabled lazily so a
    /// handle from a peer device maps too (and is then caught as a device
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
        let mut ordinal = 0i32;
        // SAFETY: DEVICE_ORDINAL writes one int to `ordinal`; the mapping is live.
        check("cuPointerGetAttribute", unsafe {
            sys::cuPointerGetAttribute(
                (&mut ordinal as *mut i32).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                self.ptr,
            )
        })?;
        Ok(ordinal.max(0) as u32)
    }

    /// The size of the whole allocation behind the handle.
    pub fn allocation_size(&self) -> Result<u64, DriverError> {
        let (mut base, mut size) = (0u64, 0usize);
        // SAFETY: valid out-pointers; the mapping is live.
        check("cuMemGetAddressRange", unsafe {
            sys::cuMemGetAddressRange_v2(&mut base, &mut size, self.ptr)
        })?;
        // An IPC handle names a whole allocation and maps at its base, so
        // the range starts at `ptr`; if it ever did not, count from `ptr`.
        Ok((base + size as u64).saturating_sub(self.ptr))
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from cuIpcOpenMemHandle and is closed once.
        let code = unsafe { sys::cuIpcCloseMemHandle(self.ptr) };
        if let Err(e) = check("cuIpcCloseMemHandle", code) {
            tracing::warn!(error = %e, "closing an IPC mapping");
        }
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
    }

    #[test]
    fn jit_logs_stop_at_the_written_length_and_the_first_nul() {
        assert_eq!(log_text(b"ptxas error\0junk", 16), "ptxas error");
        assert_eq!(log_text(b"abcdef", 3), "abc");
        assert_eq!(log_text(b"abc", 99), "abc");
    }
}
