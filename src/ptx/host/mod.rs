//! The host (CPU) engine: runs verified scalar kernels with CUDA launch
//! semantics.
//!
//! Geometry: block = `.reqntid` x if present, else `min(256, .maxntid x)`,
//! else 256; grid = ceil(n / block); `%tid.x`, `%ntid.x`, `%ctaid.x`,
//! `%nctaid.x` as on the GPU, the y/z components 0 (`%ntid`/`%nctaid` 1).
//! The grid's threads are cut into batches of [`exec::LANES`] consecutive
//! threads (a batch may span blocks: each lane has its own tid/ctaid), and
//! contiguous runs of batches are spread over `HostLaunch::threads` OS
//! threads.
//!
//! Soundness: before any thread runs, the launch checks that it passes one
//! span per input, the declared number of float params, and that
//! `n × element size <= len` for every operand (and [`super::HostKernel`]
//! that the contract's preconditions hold). With the verifier's proof that
//! every access is element `i` of its operand under `i < n` (a `.v2`/`.v4`
//! element decoded as one scalar access per lane, inside the element), no
//! access leaves its span; checked mode re-checks each access anyway and
//! turns a miss into a [`HostFault`].

pub mod api;
pub mod decode;
pub mod exec;
pub mod float;

use super::{HostFault, HostLaunch, Signature, DEFAULT_BLOCK};
use decode::{Program, Uniform};
use exec::{Bounds, Frame, LANES};

/// The block size the engine launches `sig` with.
pub fn block_size(sig: &Signature) -> u32 {
    match (sig.reqntid, sig.maxntid) {
        (Some(x), _) => x,
        (None, Some(m)) => m.min(DEFAULT_BLOCK),
        (None, None) => DEFAULT_BLOCK,
    }
}

fn launch_fault(message: String) -> HostFault {
    HostFault { line: 0, message }
}

/// Runs `prog` for `launch`.
///
/// # Safety
/// Each span of `launch` must be valid for reads (inputs) or writes
/// (output) of `len` bytes for the duration of the call.
pub unsafe fn run(
    prog: &Program,
    sig: &Signature,
    launch: &HostLaunch<'_>,
) -> Result<(), HostFault> {
    if launch.inputs.len() != sig.inputs as usize {
        return Err(launch_fault(format!(
            "the kernel takes {} inputs, the launch passed {}",
            sig.inputs,
            launch.inputs.len()
        )));
    }
    if launch.params.len() != sig.scalar_params as usize {
        return Err(launch_fault(format!(
            "the kernel takes {} float params, the launch passed {}",
            sig.scalar_params,
            launch.params.len()
        )));
    }
    let spans = launch.inputs.iter().chain(std::iter::once(&launch.output));
    for (k, (span, size)) in spans.zip(&sig.element_sizes).enumerate() {
        let need = launch.n.checked_mul(u64::from(*size));
        if need.is_none_or(|b| b > span.len as u64) {
            return Err(launch_fault(format!(
                "operand {k} holds {} bytes, fewer than n × {size} for n = {}",
                span.len, launch.n
            )));
        }
    }
    if launch.n == 0 {
        return Ok(());
    }
    let block = u64::from(block_size(sig));
    let grid = launch.n.div_ceil(block);
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
            Uniform::InputPtr(k) => launch.inputs.get(k as usize).map_or(0, |s| s.ptr as u64),
            Uniform::OutputPtr => launch.output.ptr as u64,
            Uniform::Count => launch.n,
            Uniform::Scalar(k) => launch
                .params
                .get(k as usize)
                .map_or(0, |p| u64::from(p.to_bits())),
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
mod tests;
