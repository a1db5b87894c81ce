//! A kernel's launch as an instantiated one-node CUDA graph, re-aimed at
//! each launch (`cuGraphExecKernelNodeSetParams`, then `cuGraphLaunch`).
//!
//! Why: on the H200 ptxd is measured on, enqueueing through a graph whose
//! node is updated per launch costs 1.5 µs at p50 (2.5 µs p99), against 3.5
//! µs (7.3 µs p99) for `cuLaunchKernel` of the same kernel, and sustains
//! 566k launches a second on one stream from one thread, against 200k–244k
//! (`docs/experiments/graphexp`, runs AV–AW in docs/benchmarks-history.md).
//! Nearly all of a graph launch is serialized inside the driver, though:
//! several threads launching graphs at once get less done than with
//! `cuLaunchKernel` (the caller decides when to use one). A graph may end
//! with a 64-bit write to a word (a batch memory operation node), so a
//! kernel and the write that marks its end go in one submission.
//!
//! Invariants:
//! - Built and used on one thread at a time with its context current (the
//!   owner, a ring's kernel, is used by the ring's thread only); dropped
//!   with the context current, like every object of this crate. An
//!   executable graph destroyed while a launch of it is in flight is freed
//!   by the driver once that launch completes.
//! - Launches of one executable graph run in the order they were enqueued
//!   (the driver orders each behind the previous launch of the same graph),
//!   and an update reaches only later launches, never one already
//!   enqueued: the driver copies the node's params at each update.
//! - The function of an update belongs to the context the graph was built
//!   in (the caller's: a ring's kernels all live in its device's context).

use std::ffi::c_void;

use cudarc::driver::sys;

use crate::{check, log_release, DriverError, Function, Stream};

/// A word written after a graph's kernel: its device address (8-byte
/// aligned) and the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WordWrite {
    /// The word's device address (device memory, or pinned host memory
    /// mapped for the device).
    pub addr: u64,
    /// The 64-bit value written once the kernel has ended.
    pub value: u64,
}

/// One kernel node, optionally followed by a 64-bit word write, in an
/// instantiated graph (see the module doc).
#[derive(Debug)]
pub struct KernelGraph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    kernel: sys::CUgraphNode,
    /// The write node after the kernel, if the graph has one.
    write: Option<sys::CUgraphNode>,
    /// The context the graph was built in (a write node names it).
    context: sys::CUcontext,
}

// SAFETY: the handles are opaque driver pointers; the type's methods take
// `&mut self`, so one thread at a time uses it (the module's invariant),
// and the driver API is thread-safe for distinct calls.
unsafe impl Send for KernelGraph {}

/// The driver's params of a kernel node: `function` on a 1-D grid.
fn kernel_params(
    function: &Function,
    grid: u32,
    block: u32,
    params: &mut [*mut c_void],
) -> sys::CUDA_KERNEL_NODE_PARAMS {
    sys::CUDA_KERNEL_NODE_PARAMS {
        func: function.raw,
        gridDimX: grid,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        kernelParams: params.as_mut_ptr(),
        extra: std::ptr::null_mut(),
        kern: std::ptr::null_mut(),
        ctx: std::ptr::null_mut(),
    }
}

/// The one operation of a write node.
fn write_op(write: WordWrite) -> sys::CUstreamBatchMemOpParams {
    // SAFETY: the params are a C union of plain integers, for which all-zero
    // bytes are valid (and what the driver expects in unused fields).
    let mut op: sys::CUstreamBatchMemOpParams = unsafe { std::mem::zeroed() };
    op.writeValue.operation = sys::CUstreamBatchMemOpType::CU_STREAM_MEM_OP_WRITE_VALUE_64;
    op.writeValue.address = write.addr;
    op.writeValue.__bindgen_anon_1.value64 = write.value;
    op.writeValue.flags = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
    op
}

impl KernelGraph {
    /// Builds and instantiates the graph: `function` on `grid` × `block`
    /// with `params`, then, with `write`, a 64-bit word write after it.
    /// Nothing is enqueued.
    ///
    /// # Safety
    /// `params` holds one pointer per kernel parameter, each to a live
    /// value of the size the kernel declares (the driver copies them during
    /// the call). The graph is never launched as built: every launch sets
    /// its own params first ([`KernelGraph::launch`]).
    pub unsafe fn new(
        function: &Function,
        grid: u32,
        block: u32,
        params: &mut [*mut c_void],
        write: Option<WordWrite>,
    ) -> Result<Self, DriverError> {
        let mut context: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: `context` is a valid out-pointer.
        check("cuCtxGetCurrent", unsafe {
            sys::cuCtxGetCurrent(&mut context)
        })?;
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: `graph` is a valid out-pointer; flags must be 0.
        check("cuGraphCreate", unsafe {
            sys::cuGraphCreate(&mut graph, 0)
        })?;
        // From here on, a failure destroys what was made (Drop).
        let mut built = KernelGraph {
            graph,
            exec: std::ptr::null_mut(),
            kernel: std::ptr::null_mut(),
            write: None,
            context,
        };
        let node = kernel_params(function, grid, block, params);
        // SAFETY: the graph is live; `node` names a loaded function and
        // the caller's params, which the driver copies; no dependencies.
        check("cuGraphAddKernelNode", unsafe {
            sys::cuGraphAddKernelNode_v2(&mut built.kernel, graph, std::ptr::null(), 0, &node)
        })?;
        if let Some(write) = write {
            let mut op = [write_op(write)];
            let node = sys::CUDA_BATCH_MEM_OP_NODE_PARAMS {
                ctx: context,
                count: 1,
                paramArray: op.as_mut_ptr(),
                flags: 0,
            };
            let mut write_node: sys::CUgraphNode = std::ptr::null_mut();
            let after = [built.kernel];
            // SAFETY: the graph and the kernel node are live; `op` lives
            // across the call (the driver copies it).
            check("cuGraphAddBatchMemOpNode", unsafe {
                sys::cuGraphAddBatchMemOpNode(&mut write_node, graph, after.as_ptr(), 1, &node)
            })?;
            built.write = Some(write_node);
        }
        // SAFETY: the graph is live and complete; `exec` is an out-pointer.
        check("cuGraphInstantiateWithFlags", unsafe {
            sys::cuGraphInstantiateWithFlags(&mut built.exec, graph, 0)
        })?;
        Ok(built)
    }

    /// Whether the graph ends with a word write.
    pub fn writes(&self) -> bool {
        self.write.is_some()
    }

    /// Enqueues the graph on `stream`, its kernel node set to `function` on
    /// `grid` × `block` with `params`, and its write (if it has one) to
    /// `write`. A graph with a write node needs `write`, and one without
    /// refuses it (`CUDA_ERROR_INVALID_VALUE`, nothing enqueued).
    ///
    /// # Safety
    /// As [`Function::launch`] for `params` and the memory they address;
    /// `write`'s word stays valid until the stream has run the launch.
    /// `function` belongs to the graph's context.
    pub unsafe fn launch(
        &mut self,
        stream: &Stream,
        function: &Function,
        grid: u32,
        block: u32,
        params: &mut [*mut c_void],
        write: Option<WordWrite>,
    ) -> Result<(), DriverError> {
        let invalid =
            || DriverError::from_code("cuGraphLaunch", sys::CUresult::CUDA_ERROR_INVALID_VALUE);
        let node = kernel_params(function, grid, block, params);
        // SAFETY: the executable graph and its node are live; the driver
        // copies `node`'s params during the call (the caller's contract).
        check("cuGraphExecKernelNodeSetParams", unsafe {
            sys::cuGraphExecKernelNodeSetParams_v2(self.exec, self.kernel, &node)
        })?;
        match (self.write, write) {
            (Some(write_node), Some(write)) => {
                let mut op = [write_op(write)];
                let node = sys::CUDA_BATCH_MEM_OP_NODE_PARAMS {
                    ctx: self.context,
                    count: 1,
                    paramArray: op.as_mut_ptr(),
                    flags: 0,
                };
                // SAFETY: as above; only the address and value change.
                check("cuGraphExecBatchMemOpNodeSetParams", unsafe {
                    sys::cuGraphExecBatchMemOpNodeSetParams(self.exec, write_node, &node)
                })?;
            }
            (None, None) => {}
            _ => return Err(invalid()),
        }
        // SAFETY: the executable graph and the stream are live.
        check("cuGraphLaunch", unsafe {
            sys::cuGraphLaunch(self.exec, stream.raw)
        })
    }
}

impl Drop for KernelGraph {
    fn drop(&mut self) {
        if !self.exec.is_null() {
            // SAFETY: `exec` came from cuGraphInstantiate and is destroyed
            // once; one in flight is freed by the driver when it completes.
            let destroyed = unsafe { sys::cuGraphExecDestroy(self.exec) };
            log_release(
                check("cuGraphExecDestroy", destroyed),
                "destroying a kernel graph",
            );
        }
        // SAFETY: `graph` came from cuGraphCreate and is destroyed once
        // (its nodes with it).
        let destroyed = unsafe { sys::cuGraphDestroy(self.graph) };
        log_release(
            check("cuGraphDestroy", destroyed),
            "destroying a kernel graph",
        );
    }
}
