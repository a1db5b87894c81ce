//! Experiment: can a chain of kernel nodes in an instantiated CUDA graph,
//! re-parameterised per batch, enqueue launches faster than cuLaunchKernel
//! on one stream from one thread?
use cudarc::driver::sys::*;
use std::ffi::c_void;
use std::time::Instant;

const PTX: &str = r#"
.version 8.0
.target sm_90
.address_size 64
.visible .entry step(.param .u64 out, .param .u32 v, .param .u64 n)
{
  .reg .pred %p; .reg .b32 %r<8>; .reg .b64 %rd<8>;
  ld.param.u64 %rd1, [out];
  ld.param.u32 %r1, [v];
  ld.param.u64 %rd2, [n];
  mov.u32 %r2, %ctaid.x; mov.u32 %r3, %ntid.x; mov.u32 %r4, %tid.x;
  mad.lo.s32 %r5, %r2, %r3, %r4;
  cvt.u64.u32 %rd3, %r5;
  setp.ge.u64 %p, %rd3, %rd2;
  @%p bra DONE;
  shl.b64 %rd4, %rd3, 2;
  add.s64 %rd5, %rd1, %rd4;
  ld.global.u32 %r6, [%rd5];
  mad.lo.s32 %r7, %r6, 3, %r1;
  st.global.u32 [%rd5], %r7;
DONE:
  ret;
}
"#;

fn ck(what: &str, r: CUresult) {
    if r != CUresult::CUDA_SUCCESS {
        panic!("{what}: {r:?}");
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let total: u32 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(200_000);
    unsafe {
        ck("init", cuInit(0));
        let mut dev = 0;
        ck("dev", cuDeviceGet(&mut dev, 0));
        let mut ctx = std::ptr::null_mut();
        ck("retain", cuDevicePrimaryCtxRetain(&mut ctx, dev));
        ck("current", cuCtxSetCurrent(ctx));
        let mut module = std::ptr::null_mut();
        let ptx = std::ffi::CString::new(PTX).unwrap();
        ck("module", cuModuleLoadData(&mut module, ptx.as_ptr().cast()));
        let mut func = std::ptr::null_mut();
        ck("func", cuModuleGetFunction(&mut func, module, c"step".as_ptr()));
        let n: u64 = 4096;
        let mut buf = 0u64;
        ck("alloc", cuMemAlloc_v2(&mut buf, (n * 4) as usize));
        ck("memset", cuMemsetD32_v2(buf, 0, n as usize));
        let mut stream = std::ptr::null_mut();
        ck("stream", cuStreamCreate(&mut stream, CUstream_flags::CU_STREAM_NON_BLOCKING as u32));
        let grid = (n as u32).div_ceil(256);
        let mut reference = 0u32;
        let check = |label: &str, reference: u32| {
            ck("sync", cuStreamSynchronize(stream));
            let mut host = vec![0u32; n as usize];
            ck("dtoh", cuMemcpyDtoH_v2(host.as_mut_ptr().cast(), buf, (n * 4) as usize));
            let bad = host.iter().filter(|&&x| x != reference).count();
            println!("  check {label}: {} of {n} elements differ from the reference", bad);
            assert_eq!(bad, 0);
        };
        // Warm-up + baseline: cuLaunchKernel back to back.
        for round in 0..2 {
            let t = Instant::now();
            for i in 0..total {
                let (mut o, mut v, mut nn) = (buf, i, n);
                let mut p: [*mut c_void; 3] = [
                    (&mut o as *mut u64).cast(),
                    (&mut v as *mut u32).cast(),
                    (&mut nn as *mut u64).cast(),
                ];
                ck("launch", cuLaunchKernel(func, grid, 1, 1, 256, 1, 1, 0, stream, p.as_mut_ptr(), std::ptr::null_mut()));
                reference = reference.wrapping_mul(3).wrapping_add(i);
            }
            ck("sync", cuStreamSynchronize(stream));
            let took = t.elapsed();
            println!(
                "cuLaunchKernel x{total} (round {round}): {:.2} us/launch, {:.0} launches/s",
                took.as_secs_f64() * 1e6 / total as f64,
                total as f64 / took.as_secs_f64()
            );
        }
        check("cuLaunchKernel", reference);
        for &g in &[4usize, 8, 16, 32, 64] {
            for &copies in &[1usize, 2] {
                // A chain of g kernel nodes.
                let mut execs = Vec::new();
                let mut nodes_per = Vec::new();
                let t_build = Instant::now();
                for _ in 0..copies {
                    let mut graph = std::ptr::null_mut();
                    ck("graph", cuGraphCreate(&mut graph, 0));
                    let mut nodes: Vec<CUgraphNode> = Vec::new();
                    for k in 0..g {
                        let (mut o, mut v, mut nn) = (buf, 0u32, n);
                        let mut p: [*mut c_void; 3] = [
                            (&mut o as *mut u64).cast(),
                            (&mut v as *mut u32).cast(),
                            (&mut nn as *mut u64).cast(),
                        ];
                        let params = CUDA_KERNEL_NODE_PARAMS {
                            func,
                            gridDimX: grid, gridDimY: 1, gridDimZ: 1,
                            blockDimX: 256, blockDimY: 1, blockDimZ: 1,
                            sharedMemBytes: 0,
                            kernelParams: p.as_mut_ptr(),
                            extra: std::ptr::null_mut(),
                            kern: std::ptr::null_mut(),
                            ctx: std::ptr::null_mut(),
                        };
                        let mut node = std::ptr::null_mut();
                        let deps: Vec<CUgraphNode> = if k == 0 { vec![] } else { vec![nodes[k - 1]] };
                        ck("add", cuGraphAddKernelNode_v2(&mut node, graph, deps.as_ptr(), deps.len(), &params));
                        nodes.push(node);
                    }
                    let mut exec = std::ptr::null_mut();
                    ck("inst", cuGraphInstantiateWithFlags(&mut exec, graph, 0));
                    ck("upload", cuGraphUpload(exec, stream));
                    execs.push(exec);
                    nodes_per.push(nodes);
                }
                let build = t_build.elapsed();
                ck("sync", cuStreamSynchronize(stream));
                let batches = (total as usize) / g;
                let t = Instant::now();
                let mut set_time = std::time::Duration::ZERO;
                let mut i = 0u32;
                for b in 0..batches {
                    let which = b % copies;
                    let ts = Instant::now();
                    for k in 0..g {
                        let (mut o, mut v, mut nn) = (buf, i, n);
                        let mut p: [*mut c_void; 3] = [
                            (&mut o as *mut u64).cast(),
                            (&mut v as *mut u32).cast(),
                            (&mut nn as *mut u64).cast(),
                        ];
                        let params = CUDA_KERNEL_NODE_PARAMS {
                            func,
                            gridDimX: grid, gridDimY: 1, gridDimZ: 1,
                            blockDimX: 256, blockDimY: 1, blockDimZ: 1,
                            sharedMemBytes: 0,
                            kernelParams: p.as_mut_ptr(),
                            extra: std::ptr::null_mut(),
                            kern: std::ptr::null_mut(),
                            ctx: std::ptr::null_mut(),
                        };
                        ck("set", cuGraphExecKernelNodeSetParams_v2(execs[which], nodes_per[which][k], &params));
                        reference = reference.wrapping_mul(3).wrapping_add(i);
                        i += 1;
                    }
                    set_time += ts.elapsed();
                    ck("glaunch", cuGraphLaunch(execs[which], stream));
                }
                ck("sync", cuStreamSynchronize(stream));
                let took = t.elapsed();
                let launches = (batches * g) as f64;
                println!(
                    "graph chain g={g} copies={copies}: {:.2} us/launch, {:.0} launches/s (set params {:.2} us/launch; build+instantiate {:.0} us)",
                    took.as_secs_f64() * 1e6 / launches,
                    launches / took.as_secs_f64(),
                    set_time.as_secs_f64() * 1e6 / launches,
                    build.as_secs_f64() * 1e6,
                );
                check(&format!("graph g={g} copies={copies}"), reference);
            }
        }

        // Pinned host word for markers.
        let mut host_word: *mut c_void = std::ptr::null_mut();
        ck("hostalloc", cuMemHostAlloc(&mut host_word, 8, 0x02 /* DEVICEMAP */));
        let mut word_dev = 0u64;
        ck("hostdev", cuMemHostGetDevicePointer_v2(&mut word_dev, host_word, 0));
        let word = host_word as *mut u64;
        let write_op = |value: u64| -> CUstreamBatchMemOpParams {
            let mut p: CUstreamBatchMemOpParams = std::mem::zeroed();
            p.writeValue.operation = CUstreamBatchMemOpType::CU_STREAM_MEM_OP_WRITE_VALUE_64;
            p.writeValue.address = word_dev;
            p.writeValue.__bindgen_anon_1.value64 = value;
            p.writeValue.flags = 0;
            p
        };
        let kparams = |p: &mut [*mut c_void; 3]| CUDA_KERNEL_NODE_PARAMS {
            func,
            gridDimX: grid, gridDimY: 1, gridDimZ: 1,
            blockDimX: 256, blockDimY: 1, blockDimZ: 1,
            sharedMemBytes: 0,
            kernelParams: p.as_mut_ptr(),
            extra: std::ptr::null_mut(),
            kern: std::ptr::null_mut(),
            ctx: std::ptr::null_mut(),
        };
        // Build a chain of g kernels, optionally followed by a memop marker node.
        let build_chain = |g: usize, marker: bool| -> (CUgraphExec, Vec<CUgraphNode>, Option<CUgraphNode>) {
            let mut graph = std::ptr::null_mut();
            ck("graph", cuGraphCreate(&mut graph, 0));
            let mut nodes: Vec<CUgraphNode> = Vec::new();
            for k in 0..g {
                let (mut o, mut v, mut nn) = (buf, 0u32, n);
                let mut p: [*mut c_void; 3] = [(&mut o as *mut u64).cast(), (&mut v as *mut u32).cast(), (&mut nn as *mut u64).cast()];
                let params = kparams(&mut p);
                let mut node = std::ptr::null_mut();
                let deps: Vec<CUgraphNode> = if k == 0 { vec![] } else { vec![nodes[k - 1]] };
                ck("add", cuGraphAddKernelNode_v2(&mut node, graph, deps.as_ptr(), deps.len(), &params));
                nodes.push(node);
            }
            let mut mnode = None;
            if marker {
                let mut op = [write_op(0)];
                let mp = CUDA_BATCH_MEM_OP_NODE_PARAMS { ctx, count: 1, paramArray: op.as_mut_ptr(), flags: 0 };
                let mut node = std::ptr::null_mut();
                let deps = [nodes[g - 1]];
                ck("addmemop", cuGraphAddBatchMemOpNode(&mut node, graph, deps.as_ptr(), 1, &mp));
                mnode = Some(node);
            }
            let mut exec = std::ptr::null_mut();
            ck("inst", cuGraphInstantiateWithFlags(&mut exec, graph, 0));
            ck("upload", cuGraphUpload(exec, stream));
            (exec, nodes, mnode)
        };
        let pct = |mut v: Vec<f64>| -> (f64, f64) {
            v.sort_by(|a, b| a.partial_cmp(b).unwrap());
            (v[v.len() / 2], v[v.len() * 99 / 100])
        };
        // Paced latency: 5000 enqueues, one every 8 us.
        let pace = std::time::Duration::from_micros(8);
        let (e1, nodes1, _) = build_chain(1, false);
        let (e1m, nodes1m, m1) = build_chain(1, true);
        let mut seq = 0u64;
        for variant in 0..4 {
            let mut samples = Vec::new();
            for i in 0..5000u32 {
                let t = Instant::now();
                let (mut o, mut v, mut nn) = (buf, i, n);
                let mut p: [*mut c_void; 3] = [(&mut o as *mut u64).cast(), (&mut v as *mut u32).cast(), (&mut nn as *mut u64).cast()];
                match variant {
                    0 => ck("launch", cuLaunchKernel(func, grid, 1, 1, 256, 1, 1, 0, stream, p.as_mut_ptr(), std::ptr::null_mut())),
                    1 => {
                        ck("set", cuGraphExecKernelNodeSetParams_v2(e1, nodes1[0], &kparams(&mut p)));
                        ck("gl", cuGraphLaunch(e1, stream));
                    }
                    2 => {
                        ck("launch", cuLaunchKernel(func, grid, 1, 1, 256, 1, 1, 0, stream, p.as_mut_ptr(), std::ptr::null_mut()));
                        seq += 1;
                        let mut op = [write_op(seq)];
                        ck("batch", cuStreamBatchMemOp_v2(stream, 1, op.as_mut_ptr(), 0));
                    }
                    _ => {
                        ck("set", cuGraphExecKernelNodeSetParams_v2(e1m, nodes1m[0], &kparams(&mut p)));
                        seq += 1;
                        let mut op = [write_op(seq)];
                        let mp = CUDA_BATCH_MEM_OP_NODE_PARAMS { ctx, count: 1, paramArray: op.as_mut_ptr(), flags: 0 };
                        ck("setm", cuGraphExecBatchMemOpNodeSetParams(e1m, m1.unwrap(), &mp));
                        ck("gl", cuGraphLaunch(e1m, stream));
                    }
                }
                reference = reference.wrapping_mul(3).wrapping_add(i);
                samples.push(t.elapsed().as_secs_f64() * 1e6);
                while t.elapsed() < pace { std::hint::spin_loop(); }
            }
            let (p50, p99) = pct(samples);
            let name = ["cuLaunchKernel", "1-node graph (set+launch)", "cuLaunchKernel + marker memop", "graph [kernel, marker node] (set both+launch)"][variant];
            println!("paced {name}: p50 {p50:.2} us, p99 {p99:.2} us");
            check(name, reference);
            if variant >= 2 {
                println!("  marker word {} (expected {seq})", std::ptr::read_volatile(word));
                assert_eq!(std::ptr::read_volatile(word), seq);
            }
        }
        // Throughput: chains of g=1,2 and g=16 with a marker node.
        for &(g, marker) in &[(1usize, false), (2, false), (16, true), (8, true)] {
            let (exec, nodes, mnode) = build_chain(g, marker);
            let batches = (total as usize) / g;
            let mut i = 0u32;
            let t = Instant::now();
            for _ in 0..batches {
                for k in 0..g {
                    let (mut o, mut v, mut nn) = (buf, i, n);
                    let mut p: [*mut c_void; 3] = [(&mut o as *mut u64).cast(), (&mut v as *mut u32).cast(), (&mut nn as *mut u64).cast()];
                    ck("set", cuGraphExecKernelNodeSetParams_v2(exec, nodes[k], &kparams(&mut p)));
                    reference = reference.wrapping_mul(3).wrapping_add(i);
                    i += 1;
                }
                if let Some(m) = mnode {
                    seq += 1;
                    let mut op = [write_op(seq)];
                    let mp = CUDA_BATCH_MEM_OP_NODE_PARAMS { ctx, count: 1, paramArray: op.as_mut_ptr(), flags: 0 };
                    ck("setm", cuGraphExecBatchMemOpNodeSetParams(exec, m, &mp));
                }
                ck("gl", cuGraphLaunch(exec, stream));
            }
            ck("sync", cuStreamSynchronize(stream));
            let took = t.elapsed();
            let launches = (batches * g) as f64;
            println!("throughput chain g={g} marker={marker}: {:.2} us/launch, {:.0} launches/s", took.as_secs_f64() * 1e6 / launches, launches / took.as_secs_f64());
            check(&format!("chain g={g} marker={marker}"), reference);
            if marker {
                println!("  marker word {} (expected {seq})", std::ptr::read_volatile(word));
                assert_eq!(std::ptr::read_volatile(word), seq);
            }
        }
        // Mixed functions in one exec: update node 0 to a different function (same kernel here but from a second module).
        let mut module2 = std::ptr::null_mut();
        ck("module2", cuModuleLoadData(&mut module2, ptx.as_ptr().cast()));
        let mut func2 = std::ptr::null_mut();
        ck("func2", cuModuleGetFunction(&mut func2, module2, c"step".as_ptr()));
        {
            let (exec, nodes, _) = build_chain(4, false);
            for k in 0..4 {
                let (mut o, mut v, mut nn) = (buf, 7u32 + k as u32, n);
                let mut p: [*mut c_void; 3] = [(&mut o as *mut u64).cast(), (&mut v as *mut u32).cast(), (&mut nn as *mut u64).cast()];
                let mut kp = kparams(&mut p);
                if k % 2 == 1 { kp.func = func2; }
                // A different grid too: half the elements.
                let r = cuGraphExecKernelNodeSetParams_v2(exec, nodes[k], &kp);
                println!("  set node {k} to a function of another module: {r:?}");
                reference = reference.wrapping_mul(3).wrapping_add(7 + k as u32);
            }
            ck("gl", cuGraphLaunch(exec, stream));
            check("mixed modules", reference);
        }
        println!("done");
    }
}
