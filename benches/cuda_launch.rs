//! CUDA launch-path benchmark: in-process driver calls against the same work
//! through a ptxd CUDA executor, printed as one table (p50/p99 per row).
//!
//! Not a test: it asserts nothing beyond the results of the work it times.
//! Run on a GPU machine (`bash .gpu/run.sh` runs it after the tests; or
//! `cargo bench --features gpu-tests --bench cuda_launch`).
//!
//! The "executor" rows drive a `ptxd executor` process over the internal
//! protocol, as the daemon's front would, without gRPC in between; the
//! "daemon" rows go through `ptxd serve --backend cuda` with the SDK (gRPC on
//! a Unix socket), on memory this process allocates and shares by CUDA IPC.
//! The ratio column divides a row's p50 by the p50 of the baseline row its
//! note names, measured earlier in the same run.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../tests/support/daemon.rs"]
mod daemon_support;

#[path = "../tests/gpu/executor_client.rs"]
mod executor_client;

use std::ffi::c_void;
use std::time::{Duration, Instant};

use daemon_support::Daemon;
use executor_client::*;
use ptxd_client::cuda::{CudaDevice, DeviceAllocation};
use ptxd_proto::executor::{request::Op, ArtifactKind, CloseBuffer};

struct Row {
    name: String,
    p50: Duration,
    p99: Duration,
    samples: usize,
    /// This row's p50 over its baseline's p50 (measured in the same run).
    ratio: Option<f64>,
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
        ratio: None,
        note,
    }
}

impl Row {
    /// Adds the ratio of this row's p50 to `baseline` (a p50 of this run).
    fn against(self, baseline: Duration) -> Row {
        Row {
            ratio: Some(self.p50.as_secs_f64() / baseline.as_secs_f64()),
            ..self
        }
    }
}

/// Rows are printed as soon as they are measured, so a stall still leaves
/// the rows before it.
struct Table(Vec<Row>);

impl Table {
    fn push(&mut self, r: Row) {
        let ratio = r
            .ratio
            .map_or_else(|| "–".to_string(), |x| format!("{x:.2}×"));
        if r.samples == 0 {
            println!("| {} | – | – | 0 | – | {} |", r.name, r.note);
        } else {
            println!(
                "| {} | {} | {} | {} | {} | {} |",
                r.name,
                us(r.p50),
                us(r.p99),
                r.samples,
                ratio,
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

/// The in-process floors a ring launch is measured against, besides the
/// bare `cuLaunchKernel` of a burst (the goal's baseline).
#[derive(Clone, Copy)]
struct Floors {
    /// One launch every [`PACE`]: the GPU idle at each, as in a round trip.
    paced: Duration,
    /// The mean launch of 200,000 back to back on one stream, no sync:
    /// what one stream takes at most from one thread.
    sustained: Duration,
    /// A launch handed from one thread to another in this process over a
    /// shared cache line and answered the same way: the floor of any
    /// cross-core ring, with no process boundary and no checks.
    handoff: Duration,
    /// [`Floors::paced`] through a one-node graph re-aimed per launch, as
    /// the ring launches (`cuGraphExecKernelNodeSetParams` +
    /// `cuGraphLaunch`).
    graph_paced: Duration,
    /// [`Floors::sustained`] through that graph.
    graph_sustained: Duration,
}

/// The pace of [`Floors::paced`]: about a ring round trip.
const PACE: Duration = Duration::from_micros(8);

fn in_process_floors(
    f: &ptxd_client::cuda::LocalFunction<'_>,
    stream: &ptxd_client::cuda::ClientStream,
    [a, b, out]: [&DeviceAllocation; 3],
    rows: &mut Table,
) -> Floors {
    let mut paced = Vec::new();
    for _ in 0..5000 {
        let t = Instant::now();
        in_process_launch(f, stream, a, b, out, SMALL_N);
        paced.push(t.elapsed());
        while t.elapsed() < PACE {
            std::hint::spin_loop();
        }
    }
    stream.synchronize().unwrap();
    let paced = row(
        "in-process cuLaunchKernel paced, one every 8 µs (n=4096)",
        paced,
        "the GPU idle at each launch, as in a ring round trip".into(),
    );
    let paced_p50 = paced.p50;
    rows.push(paced);

    let total = 200_000u32;
    let t = Instant::now();
    for _ in 0..total {
        in_process_launch(f, stream, a, b, out, SMALL_N);
    }
    stream.synchronize().unwrap();
    let took = t.elapsed();
    let sustained = took / total;
    rows.push(Row {
        name: "in-process cuLaunchKernel sustained, one stream (n=4096)".into(),
        p50: sustained,
        p99: sustained,
        samples: total as usize,
        ratio: None,
        note: format!(
            "{:.0} launches/s (mean of 200,000 back to back, one sync at the end; not p50): \
             the one-client throughput's baseline",
            f64::from(total) / took.as_secs_f64()
        ),
    });

    // The same, with the watchdog's marker after every RING_GROUP launches
    // (a 64-bit write to a word of pinned host memory, as a ring's group
    // closes): what the markers cost the stream itself.
    let word = ptxd_cuda::HostWord::new().unwrap();
    let group = 16u32; // the watchdog's RING_GROUP (src/executor/cuda/watchdog.rs)
    let t = Instant::now();
    for i in 1..=total {
        in_process_launch(f, stream, a, b, out, SMALL_N);
        if i % group == 0 {
            let marker = ptxd_cuda::MemOp::Write {
                addr: word.device_ptr(),
                value: u64::from(i / group),
                wide: true,
            };
            // SAFETY: the word is pinned host memory mapped for the device,
            // alive until after the synchronize below.
            unsafe { ptxd_cuda::batch_mem_ops_raw(stream.raw_handle() as _, &[marker]) }.unwrap();
        }
    }
    stream.synchronize().unwrap();
    let took = t.elapsed();
    let marked = took / total;
    rows.push(Row {
        name: "in-process cuLaunchKernel sustained, a marker every 16 (n=4096)".into(),
        p50: marked,
        p99: marked,
        samples: total as usize,
        ratio: Some(marked.as_secs_f64() / sustained.as_secs_f64()),
        note: format!(
            "{:.0} launches/s; a cuStreamWriteValue64 to pinned host memory after every {group} \
             launches, as the watchdog's markers on a ring (ratio: against the row above)",
            f64::from(total) / took.as_secs_f64()
        ),
    });
    assert_eq!(
        word.load(),
        u64::from(total / group),
        "the markers reached the word"
    );

    let handoff = |answer_first: bool| {
        let samples = hand_off_round_trips(answer_first, || {
            in_process_launch(f, stream, a, b, out, SMALL_N)
        });
        stream.synchronize().unwrap();
        samples
    };
    let after = row(
        "in-process hand-off round trip, launch then answer (n=4096)",
        handoff(false),
        "two threads of one process, one cache line each way: the floor of a ring round trip"
            .into(),
    );
    let handoff_p50 = after.p50;
    rows.push(after);
    rows.push(row(
        "in-process hand-off round trip, answer then launch (n=4096)",
        handoff(true),
        "as above, answered before the launch: the floor of an answer on acceptance".into(),
    ));
    let (graph_paced, graph_sustained) = in_process_graph_floors([a, b, out], rows);
    Floors {
        paced: paced_p50,
        sustained,
        handoff: handoff_p50,
        graph_paced,
        graph_sustained,
    }
}

/// Round trips between two threads of this process, the ring's shape with
/// no process boundary and no checks: a client thread stores a request
/// number in one cache line and spins on another for the answer; this
/// thread (the context current) spins on the request, calls `launch` and
/// answers, after the launch or (`answer_first`, as a ring answers on
/// acceptance) before it. Returns the client's round trips; the caller
/// synchronizes the stream.
fn hand_off_round_trips(answer_first: bool, mut launch: impl FnMut()) -> Vec<Duration> {
    use std::sync::atomic::{AtomicU64, Ordering};
    let request = AtomicU64::new(0);
    let answer = AtomicU64::new(0);
    let rounds = 20_000u64;
    std::thread::scope(|scope| {
        let client = scope.spawn(|| {
            let mut samples = Vec::with_capacity(rounds as usize);
            for i in 1..=rounds {
                let t = Instant::now();
                request.store(i, Ordering::Release);
                while answer.load(Ordering::Acquire) != i {
                    std::hint::spin_loop();
                }
                samples.push(t.elapsed());
            }
            samples
        });
        for i in 1..=rounds {
            while request.load(Ordering::Acquire) != i {
                std::hint::spin_loop();
            }
            if answer_first {
                answer.store(i, Ordering::Release);
            }
            launch();
            if !answer_first {
                answer.store(i, Ordering::Release);
            }
        }
        client.join().unwrap()
    })
}

/// The paced and sustained floors again, each launch through a one-node
/// graph whose node is re-aimed per launch (what the ring does since run
/// AW): the in-process equivalent of ptxd's own launch, so that a ring row
/// can be read against both `cuLaunchKernel` and the same technique in
/// process. Returns (paced p50, sustained mean).
fn in_process_graph_floors(
    [a, b, out]: [&DeviceAllocation; 3],
    rows: &mut Table,
) -> (Duration, Duration) {
    // The SDK's calls above left the device's context current on this
    // thread: ptxd-cuda's objects are made and dropped in it.
    let ptx = corpus("add_f32_scalar.ptx");
    // SAFETY: a PTX image of the corpus, NUL-free text.
    let module = unsafe { ptxd_cuda::Module::load(&ptx) }.unwrap();
    let function = module.function(c"add_f32_scalar").unwrap();
    let stream = ptxd_cuda::Stream::new().unwrap();
    let (mut pa, mut pb, mut po, mut nn) = (
        a.device_ptr(),
        b.device_ptr(),
        out.device_ptr(),
        SMALL_N as i64,
    );
    let mut params: [*mut c_void; 4] = [
        (&mut pa as *mut u64).cast(),
        (&mut pb as *mut u64).cast(),
        (&mut po as *mut u64).cast(),
        (&mut nn as *mut i64).cast(),
    ];
    let grid = SMALL_N.div_ceil(256) as u32;
    // SAFETY: add_f32_scalar takes (ptr, ptr, ptr, long long); the values
    // live across the calls; nothing is enqueued by `new`.
    let mut graph =
        unsafe { ptxd_cuda::KernelGraph::new(&function, grid, 256, &mut params, None) }.unwrap();
    let mut launch = |graph: &mut ptxd_cuda::KernelGraph| {
        // SAFETY: as above; every allocation holds at least n floats and
        // outlives the stream's work.
        unsafe { graph.launch(&stream, &function, grid, 256, &mut params, None) }.unwrap();
    };
    let mut paced = Vec::new();
    for _ in 0..5000 {
        let t = Instant::now();
        launch(&mut graph);
        paced.push(t.elapsed());
        while t.elapsed() < PACE {
            std::hint::spin_loop();
        }
    }
    stream.synchronize().unwrap();
    let paced = row(
        "in-process graph launch paced, one every 8 µs (n=4096)",
        paced,
        "a one-node graph re-aimed per launch (cuGraphExecKernelNodeSetParams + cuGraphLaunch), \
         as the ring launches"
            .into(),
    );
    let paced_p50 = paced.p50;
    rows.push(paced);
    // Back to back, each launch timed: the driver's own tail when the GPU
    // is kept busy, as a ring round trip keeps it (the paced row leaves the
    // GPU idle at each launch).
    let mut back_to_back = Vec::with_capacity(20_000);
    for _ in 0..20_000 {
        let t = Instant::now();
        launch(&mut graph);
        back_to_back.push(t.elapsed());
    }
    stream.synchronize().unwrap();
    rows.push(row(
        "in-process graph launch back to back, each timed (n=4096)",
        back_to_back,
        "the graph launch's p99 with the GPU kept busy, as in a ring round trip".into(),
    ));
    // The ring's shape with no process boundary and no checks, the launch
    // through the graph: the floor of the ring round trip's p50 and p99 on
    // this machine.
    let handoff = hand_off_round_trips(true, || launch(&mut graph));
    stream.synchronize().unwrap();
    rows.push(row(
        "in-process graph hand-off round trip, answer then launch (n=4096)",
        handoff,
        "two threads, one cache line each way, the launch through the re-aimed graph: the \
         floor of the ring round trip (p50 and p99)"
            .into(),
    ));
    let total = 200_000u32;
    let t = Instant::now();
    for _ in 0..total {
        launch(&mut graph);
    }
    stream.synchronize().unwrap();
    let took = t.elapsed();
    let sustained = took / total;
    rows.push(Row {
        name: "in-process graph launch sustained, one stream (n=4096)".into(),
        p50: sustained,
        p99: sustained,
        samples: total as usize,
        ratio: None,
        note: format!(
            "{:.0} launches/s (mean of 200,000 back to back, one sync at the end; not p50)",
            f64::from(total) / took.as_secs_f64()
        ),
    });
    drop(graph);
    (paced_p50, sustained)
}

fn main() {
    let dev = CudaDevice::open(0).expect("the benchmark needs a CUDA device");
    let ptx = corpus("add_f32_scalar.ptx");
    println!("device: {} ({})", dev.name(), dev.uuid());
    println!("| what | p50 | p99 | samples | p50 / baseline p50 | note |");
    println!("| --- | --- | --- | --- | --- | --- |");
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
    let in_async = row(
        "in-process cuLaunchKernel async (n=4096)",
        enqueue,
        String::new(),
    );
    let base_async = in_async.p50;
    rows.push(in_async);
    let floors = in_process_floors(&f, &stream, [&a, &b, &out], &mut rows);
    let mut synced = Vec::new();
    for _ in 0..5000 {
        let t = Instant::now();
        in_process_launch(&f, &stream, &a, &b, &out, SMALL_N);
        stream.synchronize().unwrap();
        synced.push(t.elapsed());
    }
    let in_sync = row(
        "in-process launch + cuStreamSynchronize (n=4096)",
        synced,
        String::new(),
    );
    let base_sync = in_sync.p50;
    rows.push(in_sync);
    let mut big = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        in_process_launch(&f, &stream, &a, &b, &out, BIG_N);
        stream.synchronize().unwrap();
        big.push(t.elapsed());
    }
    let bytes = 3.0 * (BIG_N * 4) as f64;
    let big_row = row("in-process add 3×64 MiB, launch + sync", big, String::new());
    let base_big = big_row.p50;
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
    let open_row = row(
        "executor OpenBuffer (cuIpcOpenMemHandle), 1 MiB",
        register,
        String::new(),
    );
    let base_open = open_row.p50;
    rows.push(open_row);
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
        ratio: None,
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

    let baselines = Baselines {
        first_load: cold,
        launch_async: base_async,
        launch_sync: base_sync,
        big: base_big,
        open_buffer: base_open,
        floors,
    };
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(daemon_rows(
            &mut rows,
            &dev,
            &ptx,
            &scratch,
            [&a, &b, &out],
            &baselines,
        ));
    out.download(0, &mut check).unwrap();
    assert!(check.iter().all(|&x| x == 2.0), "daemon add is wrong");

    println!("({} rows)", rows.0.len());
}

/// p50s of this run that the daemon rows are compared with.
struct Baselines {
    first_load: Duration,
    launch_async: Duration,
    launch_sync: Duration,
    big: Duration,
    open_buffer: Duration,
    floors: Floors,
}

/// The rows through `ptxd serve`: the SDK over gRPC on a Unix socket, the
/// tensors in this process's memory (CUDA IPC), the kernel run by the
/// daemon's executor process.
async fn daemon_rows(
    rows: &mut Table,
    dev: &CudaDevice,
    ptx: &[u8],
    scratch: &[DeviceAllocation],
    [a, b, out]: [&DeviceAllocation; 3],
    base: &Baselines,
) {
    use ptxd_client::{Client, Launch, LoadOptions};

    let spawn = Instant::now();
    // The helper returns once the socket answers; the row goes on to the
    // device being available, SIGTERM on drop (the drain timeout is short).
    let daemon = Daemon::start_backend("cuda", &["--devices", dev.uuid()], |_| {});
    let target = daemon.target();
    let client = loop {
        if let Ok(client) = Client::connect(&target).await {
            if let Ok(info) = client.info().await {
                if info.devices.first().is_some_and(|d| d.available) {
                    break client;
                }
            }
        }
        assert!(
            spawn.elapsed() < Duration::from_secs(30),
            "ptxd serve did not come up with its device available"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    rows.push(row(
        "daemon start to device available (GetInfo)",
        vec![spawn.elapsed()],
        "one sample; polled every 5 ms".into(),
    ));
    let session = client.open_session("bench").await.unwrap();
    let text = String::from_utf8(ptx.to_vec()).unwrap();

    // LoadKernel: each cold load gets a PTX the daemon has never seen (a
    // unique dead write before the return changes the canonical text, which
    // is what the content hash covers; a comment would not). Whether the
    // driver's on-disk JIT cache still serves it is the driver's business, so
    // this row bounds ptxd's cold path from below, not a true cold JIT.
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let variants: Vec<String> = (0..10u64)
        .map(|k| {
            let unique = (stamp as u64 ^ u64::from(std::process::id()) << 40) + k;
            text.replacen(
                "\tmov.u32 \t%r1, %ctaid.x;",
                &format!("\tmov.b64 \t%rd1, {unique};\n\tmov.u32 \t%r1, %ctaid.x;"),
                1,
            )
        })
        .collect();
    let mut cold = Vec::new();
    let mut cold_hits = 0;
    for variant in &variants {
        let t = Instant::now();
        let kernel = session
            .load_ptx(
                dev.uuid(),
                variant.clone(),
                "add_f32_scalar",
                LoadOptions::default(),
            )
            .await
            .unwrap();
        cold.push(t.elapsed());
        cold_hits += usize::from(kernel.state().cache_hit);
    }
    rows.push(
        row(
            "daemon LoadKernel, new PTX (cold in ptxd)",
            cold,
            format!(
                "{cold_hits}/10 reported cache_hit; baseline: in-process first cuModuleLoadData"
            ),
        )
        .against(base.first_load),
    );
    let mut hits = Vec::new();
    let mut hit_count = 0;
    for label in ["bench-2", "bench-3"] {
        let other = client.open_session(label).await.unwrap();
        for variant in &variants {
            let t = Instant::now();
            let kernel = other
                .load_ptx(
                    dev.uuid(),
                    variant.clone(),
                    "add_f32_scalar",
                    LoadOptions::default(),
                )
                .await
                .unwrap();
            hits.push(t.elapsed());
            hit_count += usize::from(kernel.state().cache_hit);
        }
        other.close().await.unwrap();
    }
    rows.push(
        row(
            "daemon LoadKernel, same PTX from another session",
            hits,
            format!(
                "{hit_count}/20 reported cache_hit; baseline: in-process first cuModuleLoadData"
            ),
        )
        .against(base.first_load),
    );

    // RegisterBuffer / ReleaseBuffer pairs on 1 MiB allocations.
    let mut register = Vec::new();
    let mut release = Vec::new();
    for mem in scratch {
        let handle = mem.ipc_handle().unwrap();
        let t = Instant::now();
        let buffer = session
            .register_cuda_ipc(handle, dev.uuid(), mem.size() as u64)
            .await
            .unwrap();
        register.push(t.elapsed());
        let t = Instant::now();
        session.release_buffer(&buffer).await.unwrap();
        release.push(t.elapsed());
    }
    rows.push(
        row(
            "daemon RegisterBuffer (cuda_ipc), 1 MiB",
            register,
            "baseline: executor OpenBuffer".into(),
        )
        .against(base.open_buffer),
    );
    rows.push(row("daemon ReleaseBuffer, 1 MiB", release, String::new()));

    // The same registration by file descriptor: cuMemCreate memory exported
    // as a POSIX fd, RegisterBuffer (posix_fd) then the fd socket's round
    // trip, import and map in the executor.
    let mut register_fd = Vec::new();
    for _ in 0..200 {
        let mem = dev.alloc_exportable(1 << 20).unwrap();
        let fd = mem.export_fd().unwrap();
        let spec = ptxd_client::FdBufferSpec {
            device_uuid: Some(dev.uuid().to_owned()),
            allocation_size: Some(mem.allocation_size()),
            ..ptxd_client::FdBufferSpec::default()
        };
        let t = Instant::now();
        let buffer = session
            .register_fd_buffer(std::os::fd::AsFd::as_fd(&fd), 1 << 20, spec)
            .await
            .unwrap();
        register_fd.push(t.elapsed());
        session.release_buffer(&buffer).await.unwrap();
    }
    rows.push(
        row(
            "daemon RegisterBuffer (posix_fd), 1 MiB",
            register_fd,
            "cuMemCreate memory by fd; baseline: executor OpenBuffer (cuda_ipc)".into(),
        )
        .against(base.open_buffer),
    );

    let kernel = session
        .load_ptx(dev.uuid(), text, "add_f32_scalar", LoadOptions::default())
        .await
        .unwrap();
    let mut buffers = Vec::new();
    for mem in [a, b, out] {
        buffers.push(
            session
                .register_cuda_ipc(mem.ipc_handle().unwrap(), dev.uuid(), mem.size() as u64)
                .await
                .unwrap(),
        );
    }
    let launch = |n: usize, sync: bool| {
        Launch::new(
            [buffers[0].operand(), buffers[1].operand()],
            buffers[2].operand(),
            n as u64,
        )
        .sync(sync)
    };
    let small_async = launch(SMALL_N, false);
    let mut async_rt = Vec::new();
    for _ in 0..5000 {
        let t = Instant::now();
        session.launch(&kernel, &small_async).await.unwrap();
        async_rt.push(t.elapsed());
    }
    rows.push(
        row(
            "daemon unary Launch async (n=4096)",
            async_rt,
            "baseline: in-process cuLaunchKernel async".into(),
        )
        .against(base.launch_async),
    );
    let small_sync = launch(SMALL_N, true);
    let mut sync_rt = Vec::new();
    for _ in 0..5000 {
        let t = Instant::now();
        session.launch(&kernel, &small_sync).await.unwrap();
        sync_rt.push(t.elapsed());
    }
    rows.push(
        row(
            "daemon unary Launch sync (n=4096)",
            sync_rt,
            "baseline: in-process launch + cuStreamSynchronize".into(),
        )
        .against(base.launch_sync),
    );

    // LaunchStream with a bounded window, as the executor row: an unbounded
    // burst would fill every queue between here and the executor.
    let total_launches = 20_000u32;
    let window = 256;
    let mut stream = session.launch_stream().await.unwrap();
    let mut in_flight = 0usize;
    let mut answered = 0u32;
    let t = Instant::now();
    for _ in 0..total_launches {
        if in_flight == window {
            let reply = stream.next().await.unwrap().expect("a reply per launch");
            reply.outcome.unwrap();
            in_flight -= 1;
            answered += 1;
        }
        stream.send(&kernel, &small_async).await.unwrap();
        in_flight += 1;
    }
    while in_flight > 0 {
        let reply = stream.next().await.unwrap().expect("a reply per launch");
        reply.outcome.unwrap();
        in_flight -= 1;
        answered += 1;
    }
    let total = t.elapsed();
    assert_eq!(answered, total_launches);
    drop(stream);
    let per_launch = total / total_launches;
    rows.push(Row {
        name: "daemon LaunchStream async Launch (n=4096)".into(),
        p50: per_launch,
        p99: per_launch,
        samples: total_launches as usize,
        ratio: Some(per_launch.as_secs_f64() / base.launch_async.as_secs_f64()),
        note: format!(
            "{:.0} launches/s (mean of 20,000, window 256; not p50); baseline: in-process cuLaunchKernel async",
            f64::from(total_launches) / total.as_secs_f64()
        ),
    });

    ring_rows(
        rows,
        &client,
        daemon.pid() as u32,
        dev,
        ptx,
        [a, b, out],
        base,
    )
    .await;

    // Poisoned, so the caller's check sees what the daemon's launches wrote.
    out.upload(0, &vec![f32::NAN; 1024]).unwrap();
    let big = launch(BIG_N, true);
    let mut samples = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        session.launch(&kernel, &big).await.unwrap();
        samples.push(t.elapsed());
    }
    let big_row = row(
        "daemon add 3×64 MiB, sync unary Launch",
        samples,
        String::new(),
    )
    .against(base.big);
    let bytes = 3.0 * (BIG_N * 4) as f64;
    let note = format!(
        "{:.2} TB/s at p50; baseline: in-process add 3×64 MiB",
        bytes / big_row.p50.as_secs_f64() / 1e12
    );
    rows.push(Row { note, ..big_row });
    session.close().await.unwrap();
    drop(daemon);
}

/// Reads a process's CPU time (user + system) from /proc.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start after ')'.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are fields 14 and 15 of the line (11 and 12 here).
    let hz = 100; // USER_HZ on Linux
    Duration::from_millis((ticks(11) + ticks(12)) * 1000 / hz)
}

/// The launch-ring rows: round trip, throughput from one and 16 clients,
/// the ordered pipeline three ways, and the idle daemon's CPU.
#[allow(clippy::too_many_arguments)]
async fn ring_rows(
    rows: &mut Table,
    client: &ptxd_client::Client,
    daemon_pid: u32,
    dev: &CudaDevice,
    ptx: &[u8],
    [a, b, out]: [&DeviceAllocation; 3],
    base: &Baselines,
) {
    use ptxd_client::ring::{SemaphoreOp, SemaphoreWidth};
    use ptxd_client::{Launch, LoadOptions};

    let text = String::from_utf8(ptx.to_vec()).unwrap();
    let open = |label: &'static str| {
        let text = text.clone();
        async move {
            let session = client.open_session(label).await.unwrap();
            let kernel = session
                .load_ptx(dev.uuid(), text, "add_f32_scalar", LoadOptions::default())
                .await
                .unwrap();
            let mut buffers = Vec::new();
            for mem in [a, b, out] {
                buffers.push(
                    session
                        .register_cuda_ipc(mem.ipc_handle().unwrap(), dev.uuid(), mem.size() as u64)
                        .await
                        .unwrap(),
                );
            }
            let ring = session.open_ring(256, dev.uuid()).await.unwrap();
            (session, kernel, buffers, ring)
        }
    };
    let (session, kernel, buffers, mut ring) = open("bench-ring").await;

    // Round trip: submit, then wait for the completion (async: enqueued);
    // `count` of them, back to back or one every `pace`.
    let mut round_trips = |count: usize, pace: Duration| {
        let mut samples = Vec::with_capacity(count);
        for _ in 0..count {
            let t = Instant::now();
            ring.launch(
                &kernel,
                &[(&buffers[0], 0), (&buffers[1], 0)],
                (&buffers[2], 0),
                SMALL_N as u64,
                &[],
            )
            .unwrap();
            let done = ring
                .wait(Duration::from_secs(5))
                .unwrap()
                .expect("a completion");
            samples.push(t.elapsed());
            done.outcome.unwrap();
            while t.elapsed() < pace {
                std::hint::spin_loop();
            }
        }
        samples
    };
    let samples = round_trips(20_000, Duration::ZERO);
    let round_trip = row(
        "daemon ring round trip async (n=4096)",
        samples,
        String::new(),
    );
    let note = format!(
        "submit → completion; baseline: in-process cuLaunchKernel async; {:.2}× the paced \
         launch, {:.2}× the in-process hand-off, {:.2}× the paced in-process graph launch",
        round_trip.p50.as_secs_f64() / base.floors.paced.as_secs_f64(),
        round_trip.p50.as_secs_f64() / base.floors.handoff.as_secs_f64(),
        round_trip.p50.as_secs_f64() / base.floors.graph_paced.as_secs_f64(),
    );
    rows.push(Row { note, ..round_trip }.against(base.launch_async));

    // The same round trip paced like the in-process paced floors (one
    // every PACE, the GPU idle at each): whether the tail above comes from
    // the GPU kept busy back to back or from the ring itself.
    let samples = round_trips(5000, PACE);
    let paced = row(
        "daemon ring round trip async, paced one every 8 µs (n=4096)",
        samples,
        "as above, paced like the in-process paced floors".into(),
    );
    rows.push(paced.against(base.launch_async));

    // Throughput, one client: keep the ring full.
    let pipelined = |ring: &mut ptxd_client::LaunchRing,
                     kernel: &ptxd_client::Kernel,
                     buffers: &[ptxd_client::Buffer],
                     total: u32| {
        let mut answered = 0u32;
        let mut sent = 0u32;
        while answered < total {
            while sent < total
                && ring
                    .launch(
                        kernel,
                        &[(&buffers[0], 0), (&buffers[1], 0)],
                        (&buffers[2], 0),
                        SMALL_N as u64,
                        &[],
                    )
                    .is_ok()
            {
                sent += 1;
            }
            let done = ring
                .wait(Duration::from_secs(5))
                .unwrap()
                .expect("a completion");
            done.outcome.unwrap();
            answered += 1;
            while let Some(done) = ring.poll().unwrap() {
                done.outcome.unwrap();
                answered += 1;
            }
        }
    };
    let total = 200_000u32;
    let t = Instant::now();
    pipelined(&mut ring, &kernel, &buffers, total);
    let took = t.elapsed();
    let per = took / total;
    rows.push(Row {
        name: "daemon ring throughput, 1 client (n=4096)".into(),
        p50: per,
        p99: per,
        samples: total as usize,
        ratio: Some(per.as_secs_f64() / base.launch_async.as_secs_f64()),
        note: format!(
            "{:.0} launches/s (mean of 200,000, 256 in flight; not p50); {:.2}× the in-process \
             sustained launch, {:.2}× the in-process sustained graph launch",
            f64::from(total) / took.as_secs_f64(),
            per.as_secs_f64() / base.floors.sustained.as_secs_f64(),
            per.as_secs_f64() / base.floors.graph_sustained.as_secs_f64(),
        ),
    });

    // Throughput, 16 clients: 16 sessions, each with its own ring, on 16
    // threads, all on this device.
    let mut clients = Vec::new();
    for _ in 0..16 {
        clients.push(open("bench-ring-16").await);
    }
    let per_client = 20_000u32;
    let t = Instant::now();
    // Each client's own time: rings are served by one thread each, so a
    // busy ring must not starve the others (the slowest client's rate
    // against the fastest's says whether one did).
    let mut each: Vec<Duration> = std::thread::scope(|scope| {
        let threads: Vec<_> = clients
            .iter_mut()
            .map(|(_, kernel, buffers, ring)| {
                let pipelined = &pipelined;
                scope.spawn(move || {
                    let start = Instant::now();
                    pipelined(ring, kernel, buffers, per_client);
                    start.elapsed()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let took = t.elapsed();
    each.sort();
    let rate = |d: Duration| f64::from(per_client) / d.as_secs_f64();
    let all = per_client * 16;
    let per = took / all;
    rows.push(Row {
        name: "daemon ring throughput, 16 clients (n=4096)".into(),
        p50: per,
        p99: per,
        samples: all as usize,
        ratio: None,
        note: format!(
            "{:.0} launches/s on the device (16 × 20,000, 256 in flight each; not p50); per client {:.0} (slowest) to {:.0} (fastest) launches/s",
            f64::from(all) / took.as_secs_f64(),
            rate(each[each.len() - 1]),
            rate(each[0]),
        ),
    });
    for (session, _, _, ring) in clients {
        drop(ring);
        session.close().await.unwrap();
    }

    // The ordered pipeline: [client kernel → ptxd kernel → client kernel]
    // × 10,000, all on the GPU in the end; three ways of handing over.
    let module = dev.load_module(ptx).unwrap();
    let f = module.function("add_f32_scalar").unwrap();
    let stream = dev.stream().unwrap();
    let sem_mem = std::sync::Arc::new(dev.alloc(256).unwrap());
    let sem = session
        .register_cuda_ipc(sem_mem.ipc_handle().unwrap(), dev.uuid(), 256)
        .await
        .unwrap();
    // The SDK releases the words itself if the executor is lost.
    ring.bind_semaphores(&sem, sem_mem.clone()).unwrap();
    let event_a = dev.ipc_event().unwrap();
    let event_b = dev.ipc_event().unwrap();
    let reg_a = session
        .register_event(event_a.ipc_handle().unwrap(), dev.uuid(), "a")
        .await
        .unwrap();
    let reg_b = session
        .register_event(event_b.ipc_handle().unwrap(), dev.uuid(), "b")
        .await
        .unwrap();
    let iterations = 10_000u32;
    for n in [BIG_N, SMALL_N] {
        let label = if n == BIG_N {
            "3×64 MiB adds"
        } else {
            "n=4096"
        };
        // All in-process.
        stream.synchronize().unwrap();
        let t = Instant::now();
        for _ in 0..iterations {
            in_process_launch(&f, &stream, a, b, out, n);
            in_process_launch(&f, &stream, a, b, out, n);
            in_process_launch(&f, &stream, a, b, out, n);
        }
        stream.synchronize().unwrap();
        let in_process = t.elapsed() / iterations;
        rows.push(row(
            &format!("ordered pipeline, all in-process ({label})"),
            vec![in_process],
            "per iteration of 3 kernels (mean of 10,000)".into(),
        ));
        // Through ptxd, ordered by IPC events and a unary Launch each.
        let through = Launch::new(
            [buffers[0].operand(), buffers[1].operand()],
            buffers[2].operand(),
            n as u64,
        )
        .wait_event(&reg_a)
        .signal_event(&reg_b);
        let t = Instant::now();
        for _ in 0..iterations {
            in_process_launch(&f, &stream, a, b, out, n);
            stream.record(&event_a).unwrap();
            session.launch(&kernel, &through).await.unwrap();
            stream.wait(&event_b).unwrap();
            in_process_launch(&f, &stream, a, b, out, n);
        }
        stream.synchronize().unwrap();
        let events = t.elapsed() / iterations;
        rows.push(Row {
            ratio: Some(events.as_secs_f64() / in_process.as_secs_f64()),
            ..row(
                &format!("ordered pipeline, ptxd via events + unary Launch ({label})"),
                vec![events],
                "per iteration (mean of 10,000); baseline: all in-process".into(),
            )
        });
        // Through the ring, ordered by semaphore words on the GPU.
        sem_mem.upload(0, &[0u32; 64]).unwrap();
        let op = |offset: u64, value: u32| SemaphoreOp {
            buffer: sem.ring_index,
            offset,
            value: u64::from(value),
            width: SemaphoreWidth::Bits32,
        };
        let t = Instant::now();
        for i in 1..=iterations {
            in_process_launch(&f, &stream, a, b, out, n);
            stream.write_word(&sem_mem, 0, i).unwrap();
            loop {
                match ring.launch_ordered(
                    &kernel,
                    &[(&buffers[0], 0), (&buffers[1], 0)],
                    (&buffers[2], 0),
                    n as u64,
                    &[],
                    Some(op(0, i)),
                    Some(op(4, i)),
                ) {
                    Ok(_) => break,
                    Err(_) => {
                        let done = ring
                            .wait(Duration::from_secs(5))
                            .unwrap()
                            .expect("a completion");
                        done.outcome.unwrap();
                    }
                }
            }
            stream.wait_word(&sem_mem, 4, i).unwrap();
            in_process_launch(&f, &stream, a, b, out, n);
            while let Some(done) = ring.poll().unwrap() {
                done.outcome.unwrap();
            }
        }
        stream.synchronize().unwrap();
        let semaphores = t.elapsed() / iterations;
        while ring.outstanding() > 0 {
            ring.wait(Duration::from_secs(5))
                .unwrap()
                .expect("a completion")
                .outcome
                .unwrap();
        }
        rows.push(Row {
            ratio: Some(semaphores.as_secs_f64() / in_process.as_secs_f64()),
            ..row(
                &format!("ordered pipeline, ptxd via ring + GPU semaphores ({label})"),
                vec![semaphores],
                "per iteration (mean of 10,000); baseline: all in-process".into(),
            )
        });
        sem_mem.upload(0, &[0u32; 64]).unwrap();
    }

    // The idle daemon (front and executor), with this session's ring open.
    let info = client
        .raw()
        .get_info(ptxd_proto::v1::GetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    let executor = info.devices.first().map(|d| d.executor_pid).unwrap_or(0);
    let before = cpu_time(daemon_pid) + cpu_time(executor);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let used = cpu_time(daemon_pid) + cpu_time(executor) - before;
    rows.push(row(
        "daemon idle CPU over 10 s (front + executor, one ring open)",
        vec![used],
        format!("{:.2}% of a core", used.as_secs_f64() / 10.0 * 100.0),
    ));
    drop(ring);
    session.close().await.unwrap();
}
