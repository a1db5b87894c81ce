//! The host (CPU) engine: runs verified kernels with CUDA launch semantics,
//! every launch value taken from the kernel's [`LaunchContract`].
//!
//! Params: each param is what the contract names it: a pointer to launch
//! operand k (the inputs in order, then the output), a null pointer (a
//! Triton scratch pointer the kernel never dereferences), the count `n` in
//! its declared type, or the next by-value scalar (`HostLaunch::args`, or
//! for the scalar ABI's f32 scalars `HostLaunch::params`).
//!
//! Geometry: block = the contract's block rule (`.reqntid` x if present,
//! else `min(256, .maxntid x)`, else 256); grid = ceil(n / (block ×
//! elements per thread)); `%tid.x`, `%ntid.x`, `%ctaid.x`, `%nctaid.x` as on
//! the GPU, the y/z components 0 (`%ntid`/`%nctaid` 1). The grid's threads
//! are cut into batches of [`exec::LANES`] consecutive threads (a batch may
//! span blocks: each lane has its own tid/ctaid), and contiguous runs of
//! batches are spread over `HostLaunch::threads` OS threads.
//!
//! Soundness: before any thread runs, the launch checks that it passes one
//! span per input, one value per scalar, a count that fits the count's
//! type, that every operand's span holds the contract's footprint at this
//! launch's values (for the scalar ABI `n × element size`), and
//! ([`super::HostKernel`]) that the contract's preconditions hold. With the
//! verifier's proof that every access lies inside its operand's footprint,
//! no access leaves its span; checked mode re-checks each access anyway
//! (loads against the input spans, stores against the output span; a null
//! pointer is in neither) and turns a miss into a [`HostFault`].
//!
//! Numerics: integer and bit operations are exact; f32/f64/f16/bf16
//! arithmetic, `fma`, `sqrt`, `div`/`rcp` and conversions are correctly
//! rounded in the instruction's rounding mode, `.ftz` flushing subnormal
//! f32 inputs and results to signed zero. PTX's `.approx`/`.full` forms
//! (`ex2.approx`, `rcp.approx`, `div.full`, `lg2.approx`, ...) are computed
//! in f64 and rounded to nearest: within 1 ulp of the exact value, where
//! the GPU's are within the ISA's stated bound for each (2 ulp for
//! `ex2.approx.f32` and `div.full.f32`, 1 ulp for `rcp.approx.f32`,
//! `2^-10.987` relative for `tanh.approx.f32`): the host and the GPU can
//! differ in such an op's last bits, never by more than the two bounds
//! added.

pub mod api;
pub mod decode;
pub mod exec;
pub mod float;

use super::contract::{LaunchContract, ParamKind, ScalarType};
use super::{HostFault, HostLaunch};
use decode::{Program, Uniform};
use exec::{Bounds, Frame, LANES};

fn launch_fault(message: String) -> HostFault {
    HostFault { line: 0, message }
}

/// The largest value a param of type `t` holds (as the count or a scalar's
/// bits, both zero-extended).
fn type_max(t: ScalarType) -> u64 {
    match t {
        ScalarType::S32 => i32::MAX as u64,
        ScalarType::U32 | ScalarType::F32 => u64::from(u32::MAX),
        ScalarType::S64 => i64::MAX as u64,
        ScalarType::U64 | ScalarType::F64 => u64::MAX,
    }
}

/// The launch's by-value scalars, in the contract's order, as bits: the
/// typed `args`, or (the scalar ABI) the f32 `params`.
fn scalar_values(
    contract: &LaunchContract,
    launch: &HostLaunch<'_>,
) -> Result<Vec<u64>, HostFault> {
    let types = contract.scalar_types();
    if launch.args.is_empty() && types.iter().all(|t| *t == ScalarType::F32) {
        if launch.params.len() != types.len() {
            return Err(launch_fault(format!(
                "the kernel takes {} float params, the launch passed {}",
                types.len(),
                launch.params.len()
            )));
        }
        return Ok(launch
            .params
            .iter()
            .map(|p| u64::from(p.to_bits()))
            .collect());
    }
    if launch.args.len() != types.len() || !launch.params.is_empty() {
        return Err(launch_fault(format!(
            "the kernel takes {} scalar arguments, the launch passed {} (and {} float params)",
            types.len(),
            launch.args.len(),
            launch.params.len()
        )));
    }
    // A sign-extended or wider value in a narrow slot is a caller's bug,
    // not something to truncate quietly.
    let bits = |t: ScalarType| {
        if type_max(t) <= u64::from(u32::MAX) {
            32
        } else {
            64
        }
    };
    for (k, (t, v)) in types.iter().zip(launch.args).enumerate() {
        if bits(*t) == 32 && *v > u64::from(u32::MAX) {
            return Err(launch_fault(format!(
                "scalar argument {k} (.{}) has bits above its 32: {v:#x}",
                t.as_str()
            )));
        }
    }
    Ok(launch.args.to_vec())
}

/// Runs `prog` for `launch`, every launch value from `contract`, each
/// worker's register file starting with every row at `fill` (what a
/// register never written holds until its first write).
///
/// # Safety
/// Each span of `launch` must be valid for reads (inputs) or writes
/// (output) of `len` bytes for the duration of the call.
pub unsafe fn run(
    prog: &Program,
    contract: &LaunchContract,
    launch: &HostLaunch<'_>,
    fill: u64,
) -> Result<(), HostFault> {
    if launch.inputs.len() != contract.inputs() {
        return Err(launch_fault(format!(
            "the kernel takes {} inputs, the launch passed {}",
            contract.inputs(),
            launch.inputs.len()
        )));
    }
    let scalars = scalar_values(contract, launch)?;
    if let Some(t) = contract.params.iter().find_map(|p| match p.kind {
        ParamKind::Count(t) => Some(t),
        _ => None,
    }) {
        if launch.n > type_max(t) {
            return Err(launch_fault(format!(
                "n = {} does not fit the kernel's .{} count",
                launch.n,
                t.as_str()
            )));
        }
    }
    let block_threads = contract.geometry.block.host_block();
    let values = contract.values(launch.n, block_threads);
    let spans = launch.inputs.iter().chain(std::iter::once(&launch.output));
    for (k, (span, footprint)) in spans.zip(&contract.footprints).enumerate() {
        let bytes = footprint.bytes.eval_with(&values, launch.args);
        if bytes.is_none_or(|b| b > span.len as u128) {
            return Err(launch_fault(format!(
                "operand {k} holds {} bytes, fewer than its footprint {} at n = {}",
                span.len, footprint.bytes, launch.n
            )));
        }
    }
    if launch.n == 0 {
        return Ok(());
    }
    let block = u64::from(block_threads);
    let grid = values.grid;
    if grid > u64::from(i32::MAX as u32) {
        return Err(launch_fault(format!(
            "n = {} needs more than 2^31-1 blocks",
            launch.n
        )));
    }
    let total = grid * block;
    let batches = total.div_ceil(LANES as u64);
    let bounds = Bounds {
        loads: launch
            .inputs
            .iter()
            .map(|s| (s.ptr as usize, s.len))
            .collect(),
        stores: vec![(launch.output.ptr as usize, launch.output.len)],
        checked: launch.checked,
        control: launch.control,
    };
    let uniform = |u: Uniform| -> u64 {
        match u {
            Uniform::Const(v) => v,
            // Operand k is input k, or the output just past the inputs
            // (decode admits only operands the contract has, and the
            // launch passed one span per input).
            Uniform::Operand(k) => launch
                .inputs
                .get(k as usize)
                .map_or(launch.output.ptr as u64, |s| s.ptr as u64),
            Uniform::Null => 0,
            Uniform::Count => launch.n,
            Uniform::Scalar(k) => scalars.get(k as usize).copied().unwrap_or(0),
            Uniform::Ntid => block,
            Uniform::Nctaid => grid,
        }
    };
    let values: Vec<(u32, u64)> = prog
        .uniforms
        .iter()
        .map(|(r, u)| (*r, uniform(*u)))
        .collect();
    let workers = (launch.threads.max(1) as u64).min(batches);
    let per = batches.div_ceil(workers);
    let work = |first: u64, last: u64| -> Result<(), HostFault> {
        let mut f = Frame::new(prog.rows);
        f.fill_all(fill);
        for (r, v) in &values {
            f.fill(*r, *v);
        }
        for b in first..last {
            let g0 = b * LANES as u64;
            let active = (total - g0).min(LANES as u64) as usize;
            {
                let tid = f.row_mut(prog.tid_row);
                for (l, t) in tid.iter_mut().enumerate() {
                    *t = (g0 + l as u64) % block;
                }
            }
            let ctaid = f.row_mut(prog.ctaid_row);
            for (l, c) in ctaid.iter_mut().enumerate() {
                *c = (g0 + l as u64) / block;
            }
            exec::run_batch(&mut f, &prog.code, active, &bounds)?;
        }
        Ok(())
    };
    if workers <= 1 {
        return work(0, batches);
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let (first, last) = (w * per, ((w + 1) * per).min(batches));
                let work = &work;
                s.spawn(move || work(first, last))
            })
            .collect();
        let mut result = Ok(());
        for h in handles {
            let r = h
                .join()
                .unwrap_or_else(|_| Err(launch_fault("a host worker panicked".into())));
            if result.is_ok() {
                result = r;
            }
        }
        result
    })
}

#[cfg(test)]
mod jit_tests;
#[cfg(test)]
mod tests;
