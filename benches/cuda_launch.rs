//! CUDA launch-path benchmark: in-process driver calls against the same work
//! through a ptxd CUDA executor, printed as one table (p50/p99 per row).
//!
//! Not a test: it asserts nothing beyond the results of the work it times.
//! Run on a GPU machine (`bash .gpu/run.sh` runs it after the tests; or
//! `cargo bench --features gpu-tests --bench cuda_launch`).
//!
//! The ptxd rows drive the executor process over the internal protocol, as
//! the daemon's front would, without gRPC in between; rows through the
//! daemon front (unary Launch, LaunchStream, RegisterBuffer, the front's
//! kernel cache) need `ptxd serve` and are printed as not measured until it
//! exists.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../tests/gpu/executor_client.rs"]
mod executor_client;

use std::ffi::c_void;
use std::time::{Duration, Instant};

use executor_client::*;
use ptxd_client::cuda::{CudaDevice, DeviceAllocation};
use ptxd_proto::executor::{request::Op, ArtifactKind, CloseBuffer};

struct Row {
    name: String,
    p50: Duration,
    p99: Duration,
    samples: usize,
    note: String,
}

fn row(name: &str, mut samples: Vec<Duration>, note: String) -> Row {
    samples.sort();
    let pick = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    Row {
        name: name.into(),
        p50: pick(0.5),
        p99: pick(0.99),
        samples: samples.len(),
        note,
    }
}

/// Rows are printed as soon as they are measured, so a stall still leaves
/// the rows before it.
struct Table(Vec<Row>);

impl Table {
    fn push(&mut self, r: Row) {
        if r.samples == 0 {
            println!("| {} | – | – | 0 | {} |", r.name, r.note);
        } else {
            println!(
                "| {} | {} | {} | {} | {} |",
                r.name,
                us(r.p50),
                us(r.p99),
                r.samples,
                r.note
            );
        }
        self.0.push(r);
    }
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

const SMALL_N: usize = 4096;
const BIG_N: usize = 16 << 20; // 64 MiB of f32 per operand

fn in_process_launch(
    f: &ptxd_client::cuda::LocalFunction<'_>,
    stream: &ptxd_client::cuda::ClientStream,
    a: &DeviceAllocation,
    b: &DeviceAllocation,
    out: &DeviceAllocation,
    n: usize,
) {
    let (mut pa, mut pb, mut po, mut nn) =
        (a.device_ptr(), b.device_ptr(), out.device_ptr(), n as i64);
    let mut params: [*mut c_void; 4] = [
        (&mut pa as *mut u64).cast(),
        (&mut pb as *mut u64).cast(),
        (&mut po as *mut u64).cast(),
        (&mut nn as *mut i64).cast(),
    ];
    let grid = n.div_ceil(256) as u32;
    // SAFETY: add_f32_scalar takes (ptr, ptr, ptr, long long); every
    // allocation holds at least n floats and outlives the stream's work.
    unsafe { f.launch(stream, grid, 256, &mut params) }.unwrap();
}

fn main() {
    let dev = CudaDevice::open(0).expect("the benchmark needs a CUDA device");
    let ptx = corpus("add_f32_scalar.ptx");
    println!("device: {} ({})", dev.name(), dev.uuid());
    println!("| what | p50 | p99 | samples | note |");
    println!("| --- | --- | --- | --- | --- |");
    let mut rows = Table(Vec::new());

    // --- in-process ---------------------------------------------------
    let t = Instant::now();
    let module = dev.load_module(&ptx).unwrap();
    let cold = t.elapsed();
    let mut warm = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let again = dev.load_module(&ptx).unwrap();
        warm.push(t.elapsed());
        drop(again);
    }
    rows.push(row(
        "in-process cuModuleLoadData add PTX, first",
        vec![cold],
        "one sample".into(),
    ));
    rows.push(row(
        "in-process cuModuleLoadData same PTX again",
        warm,
        String::new(),
    ));

    let f = module.function("add_f32_scalar").unwrap();
    let stream = dev.stream().unwrap();
    let ones = vec![1.0f32; BIG_N];
    let (a, b, out) = (
        dev.alloc(BIG_N * 4).unwrap(),
        dev.alloc(BIG_N * 4).unwrap(),
        dev.alloc(BIG_N * 4).unwrap(),
    );
    a.upload(0, &ones).unwrap();
    b.upload(0, &ones).unwrap();

    let mut enqueue = Vec::new();
    for _ in 0..40 {
        for _ in 0..500 {
            let t = Instant::now();
            in_process_launch(&f, &stream, &a, &b, &out, SMALL_N);
            enqueue.push(t.elapsed());
        }
        stream.synchronize().unwrap();
    }
    rows.push(row(
        "in-process cuLaunchKernel async (n=4096)",
        enqueue,
        String::new(),
    ));
    let mut synced = Vec::new();
    for _ in 0..5000 {
        let t = Instant::now();
        in_process_launch(&f, &stream, &a, &b, &out, SMALL_N);
        stream.synchronize().unwrap();
        synced.push(t.elapsed());
    }
    rows.push(row(
        "in-process launch + cuStreamSynchronize (n=4096)",
        synced,
        String::new(),
    ));
    let mut big = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        in_process_launch(&f, &stream, &a, &b, &out, BIG_N);
        stream.synchronize().unwrap();
        big.push(t.elapsed());
    }
    let bytes = 3.0 * (BIG_N * 4) as f64;
    let big_row = row("in-process add 3×64 MiB, launch + sync", big, String::new());
    let note = format!(
        "{:.2} TB/s at p50",
        bytes / big_row.p50.as_secs_f64() / 1e12
    );
    rows.push(Row { note, ..big_row });
    let mut check = vec![0f32; 1024];
    out.download(0, &mut check).unwrap();
    assert!(check.iter().all(|&x| x == 2.0), "in-process add is wrong");

    // --- through a ptxd CUDA executor (no front) -------------------------
    let spawn = Instant::now();
    let mut exec = Executor::spawn_cuda(dev.uuid());
    let startup = spawn.elapsed();
    rows.push(row(
        "executor process start to Hello",
        vec![startup],
        "one sample".into(),
    ));
    let t = Instant::now();
    load(
        &mut exec,
        load_op(1, ArtifactKind::Ptx, ptx.clone(), "add_f32_scalar", 2, 0, 4),
    );
    let first_load = t.elapsed();
    rows.push(row(
        "executor LoadModule add PTX, first",
        vec![first_load],
        "one sample".into(),
    ));
    let mut reload = Vec::new();
    for id in 2..22u64 {
        let t = Instant::now();
        load(
            &mut exec,
            load_op(
                id,
                ArtifactKind::Ptx,
                ptx.clone(),
                "add_f32_scalar",
                2,
                0,
                4,
            ),
        );
        reload.push(t.elapsed());
    }
    rows.push(row(
        "executor LoadModule same PTX, new module id",
        reload,
        "driver's in-process cache".into(),
    ));

    let scratch: Vec<DeviceAllocation> = (0..200).map(|_| dev.alloc(1 << 20).unwrap()).collect();
    let mut register = Vec::new();
    for (k, mem) in scratch.iter().enumerate() {
        let handle = mem.ipc_handle().unwrap();
        let t = Instant::now();
        open_buffer(
            &mut exec,
            1000 + k as u64,
            handle,
            mem.size() as u64,
            dev.uuid(),
        );
        register.push(t.elapsed());
    }
    rows.push(row(
        "executor OpenBuffer (cuIpcOpenMemHandle), 1 MiB",
        register,
        String::new(),
    ));
    let mut close = Vec::new();
    for k in 0..scratch.len() {
        let t = Instant::now();
        expect_ok(exec.call(Op::CloseBuffer(CloseBuffer {
            buffer_id: 1000 + k as u64,
        })));
        close.push(t.elapsed());
    }
    rows.push(row(
        "executor CloseBuffer (drain + cuIpcCloseMemHandle)",
        close,
        String::new(),
    ));

    for (id, mem) in [(1u64, &a), (2, &b), (3, &out)] {
        open_buffer(
            &mut exec,
            id,
            mem.ipc_handle().unwrap(),
            mem.size() as u64,
            dev.uuid(),
        );
    }
    let small = |sync: bool| {
        launch_op(
            1,
            vec![operand(1, 0), operand(2, 0)],
            operand(3, 0),
            SMALL_N as u64,
            vec![],
            1,
            sync,
        )
    };
    let mut async_rt = Vec::new();
    for _ in 0..20_000 {
        let t = Instant::now();
        expect_ok(exec.call(small(false)));
        async_rt.push(t.elapsed());
    }
    rows.push(row(
        "executor Launch async, round trip (n=4096)",
        async_rt,
        String::new(),
    ));
    let mut sync_rt = Vec::new();
    for _ in 0..5000 {
        let t = Instant::now();
        expect_ok(exec.call(small(true)));
        sync_rt.push(t.elapsed());
    }
    rows.push(row(
        "executor Launch sync, round trip (n=4096)",
        sync_rt,
        String::new(),
    ));
    // A bounded window of requests in flight: the executor's reply pipe
    // holds a few thousand replies, and an unbounded burst would block both
    // sides on full pipes.
    let pipelined = 20_000u32;
    let window = 256;
    let t = Instant::now();
    let mut in_flight = std::collections::VecDeque::new();
    for _ in 0..pipelined {
        if in_flight.len() == window {
            expect_ok(exec.reply(in_flight.pop_front().unwrap()).unwrap());
        }
        in_flight.push_back(exec.send(small(false)));
    }
    for id in in_flight {
        expect_ok(exec.reply(id).unwrap());
    }
    let total = t.elapsed();
    rows.push(Row {
        name: "executor pipelined async Launch (n=4096)".into(),
        p50: total / pipelined,
        p99: total / pipelined,
        samples: pipelined as usize,
        note: format!(
            "{:.0} launches/s (mean of 20,000, window 256; not p50)",
            f64::from(pipelined) / total.as_secs_f64()
        ),
    });
    let mut big = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        expect_ok(exec.call(launch_op(
            1,
            vec![operand(1, 0), operand(2, 0)],
            operand(3, 0),
            BIG_N as u64,
            vec![],
            1,
            true,
        )));
        big.push(t.elapsed());
    }
    let big_row = row(
        "executor add 3×64 MiB, sync Launch round trip",
        big,
        String::new(),
    );
    let note = format!(
        "{:.2} TB/s at p50",
        bytes / big_row.p50.as_secs_f64() / 1e12
    );
    rows.push(Row { note, ..big_row });
    out.download(0, &mut check).unwrap();
    assert!(check.iter().all(|&x| x == 2.0), "executor add is wrong");
    exec.shutdown();

    for name in [
        "daemon unary Launch async / sync",
        "daemon LaunchStream throughput",
        "daemon LoadKernel cold vs cache hit",
        "daemon RegisterBuffer",
        "daemon add 3×64 MiB",
    ] {
        rows.push(Row {
            name: name.into(),
            p50: Duration::ZERO,
            p99: Duration::ZERO,
            samples: 0,
            note: "not measured: needs the daemon front (`ptxd serve`)".into(),
        });
    }

    println!("({} rows)", rows.0.len());
}
