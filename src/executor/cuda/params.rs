//! The scalar ABI's kernel parameters, packed for `cuLaunchKernel`: the one
//! place both launch paths (the protocol's and the ring's) enqueue a kernel.
//!
//! Invariant: a kernel is enqueued only with exactly the parameters it was
//! loaded for, in the scalar ABI's order and sizes (each operand's address
//! as an 8-byte pointer, inputs then output; `n` as an 8-byte `long long`;
//! each scalar as a 4-byte `float`), the sizes the load checked against the
//! kernel's own declaration ([`super::images::expected_param_sizes`]).

use std::ffi::c_void;

use ptxd_cuda::{DriverError, Stream};

use super::LoadedKernel;

impl LoadedKernel {
    /// Enqueues this kernel on `stream`, `grid` blocks of its block size,
    /// over `n` elements of `operands` (device addresses, inputs then
    /// output) with `scalars`. A count that is not the kernel's is refused
    /// before the driver sees it.
    ///
    /// # Safety
    /// Every address in `operands` must lie in device memory with room for
    /// `n` elements of its operand, and stay mapped until the stream has run
    /// the launch.
    pub(super) unsafe fn enqueue(
        &self,
        stream: &Stream,
        grid: u32,
        operands: &[u64],
        n: u64,
        scalars: &[f32],
    ) -> Result<(), DriverError> {
        if operands.len() != self.inputs as usize + 1
            || scalars.len() != self.scalar_params as usize
        {
            return Err(DriverError {
                call: "packing the kernel's parameters",
                name: "CUDA_ERROR_INVALID_VALUE".into(),
            });
        }
        // Each parameter is passed as a pointer to its value; the values
        // live in these locals until cuLaunchKernel returns (the driver
        // copies them during the call).
        let mut addresses = operands.to_vec();
        let mut n = n as i64;
        let mut scalars = scalars.to_vec();
        let mut params: Vec<*mut c_void> = addresses
            .iter_mut()
            .map(|a| (a as *mut u64).cast())
            .collect();
        params.push((&mut n as *mut i64).cast());
        params.extend(scalars.iter_mut().map(|p| (p as *mut f32).cast::<c_void>()));
        // SAFETY: `params` holds one pointer per kernel parameter (the counts
        // were checked above against the kernel's), each to a live local of
        // the size the load checked against the kernel's declaration (this
        // module's invariant); every address among them is device memory
        // with room for the launch until it has run (this function's
        // contract).
        unsafe { self.function.launch(grid, self.block, stream, &mut params) }
    }
}
