//! GPU tests, stage 2: the real daemon (`ptxd serve --backend cuda`) driven
//! through the SDK, with tensors in this process's IPC-exported memory.

use std::process::{Command, Stdio};
use std::time::Duration;

use half::f16;

use ptxd_client::cuda::{CudaDevice, DeviceAllocation};
use ptxd_client::{
    Client, DeclaredAbi, Error, HostShm, Kernel, Launch, LoadOptions, Session, SessionEvent,
};
use rand::Rng;

use super::daemon_support::Daemon;
use super::executor_client::corpus;
use super::{device, rng};

/// `ptxd serve --backend BACKEND EXTRA` on a fresh socket, answering.
fn start(backend: &str, extra: &[&str]) -> Daemon {
    Daemon::start_backend(backend, extra, |_| {})
}

/// A client of `daemon` and a session opened on it.
async fn open_session(daemon: &Daemon, label: &str) -> (Client, Session) {
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session(label).await.unwrap();
    (client, session)
}

fn text(file: &str) -> String {
    String::from_utf8(corpus(file)).unwrap()
}

async fn gpu_buffer(
    session: &Session,
    dev: &CudaDevice,
    bytes: &[u8],
) -> (DeviceAllocation, ptxd_client::Buffer) {
    let mem = dev.alloc(bytes.len()).unwrap();
    mem.upload(0, bytes).unwrap();
    let buffer = session
        .register_cuda_ipc(mem.ipc_handle().unwrap(), dev.uuid(), mem.size() as u64)
        .await
        .unwrap();
    (mem, buffer)
}

async fn host_buffer(session: &Session, bytes: &[u8]) -> (HostShm, ptxd_client::Buffer) {
    let mut shm = HostShm::create(bytes.len() as u64).unwrap();
    shm.as_mut_slice()[..bytes.len()].copy_from_slice(bytes);
    let buffer = session.register_shm(&shm, None).await.unwrap();
    (shm, buffer)
}

fn bytes_of<T: Copy>(values: &[T]) -> Vec<u8> {
    // SAFETY: test-only view of plain numeric slices (f32/u16) as bytes.
    unsafe {
        std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values))
    }
    .to_vec()
}

/// Runs one corpus kernel on both daemons with the same inputs; returns
/// (GPU output, host output) as raw bytes.
#[allow(clippy::too_many_arguments)]
async fn run_both(
    gpu: &Session,
    host: &Session,
    dev: &CudaDevice,
    file: &str,
    symbol: &str,
    inputs: &[Vec<u8>],
    out_bytes: usize,
    n: u64,
    params: &[f64],
) -> (Vec<u8>, Vec<u8>) {
    let poison = vec![0xa5u8; out_bytes];
    let gk = gpu
        .load_ptx(0, text(file), symbol, LoadOptions::default())
        .await
        .unwrap();
    let hk = host
        .load_ptx(0, text(file), symbol, LoadOptions::default())
        .await
        .unwrap();
    let mut g_in = Vec::new();
    let mut h_in = Vec::new();
    for bytes in inputs {
        g_in.push(gpu_buffer(gpu, dev, bytes).await);
        h_in.push(host_buffer(host, bytes).await);
    }
    let (g_out, g_out_buf) = gpu_buffer(gpu, dev, &poison).await;
    let (h_out, h_out_buf) = host_buffer(host, &poison).await;
    let launch = |ins: Vec<ptxd_client::Operand>, out: ptxd_client::Operand| {
        Launch::new(ins, out, n)
            .params(params.iter().copied())
            .sync(true)
    };
    gpu.launch(
        &gk,
        &launch(
            g_in.iter().map(|(_, b)| b.operand()).collect(),
            g_out_buf.operand(),
        ),
    )
    .await
    .unwrap();
    host.launch(
        &hk,
        &launch(
            h_in.iter().map(|(_, b)| b.operand()).collect(),
            h_out_buf.operand(),
        ),
    )
    .await
    .unwrap();
    let mut g = vec![0u8; out_bytes];
    g_out.download(0, &mut g).unwrap();
    let h = h_out.as_slice()[..out_bytes].to_vec();
    // A well-behaved client releases a registration before it frees the
    // allocation: the driver may hand the same addresses to the next
    // allocation, whose handle then cannot be opened beside the stale
    // mapping (CUDA_ERROR_ALREADY_MAPPED, seen on an H200).
    for (_, buffer) in g_in.iter().chain([&(g_out, g_out_buf)]) {
        gpu.release_buffer(buffer).await.unwrap();
    }
    (g, h)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_runs_the_corpus_on_ipc_memory_like_the_host_backend() {
    let dev = device();
    let (cuda_daemon, host_daemon) = (start("cuda", &[]), start("host", &[]));
    let (_gc, gpu) = open_session(&cuda_daemon, "gpu").await;
    let (_hc, host) = open_session(&host_daemon, "host").await;
    let mut rng = rng();
    let n = 100_003usize;
    let f32s = |rng: &mut rand::rngs::StdRng| {
        (0..n)
            .map(|_| rng.random_range(-100.0f32..100.0))
            .collect::<Vec<f32>>()
    };
    let (a, b) = (f32s(&mut rng), f32s(&mut rng));

    let (g, h) = run_both(
        &gpu,
        &host,
        &dev,
        "add_f32_scalar.ptx",
        "add_f32_scalar",
        &[bytes_of(&a), bytes_of(&b)],
        n * 4,
        n as u64,
        &[],
    )
    .await;
    assert_eq!(g, h, "add: GPU and host outputs differ");
    assert_eq!(&g[..4], &(a[0] + b[0]).to_bits().to_le_bytes());

    let (p0, p1) = (rng.random_range(-3.0..3.0), rng.random_range(-3.0..3.0));
    let (g, h) = run_both(
        &gpu,
        &host,
        &dev,
        "affine_f32_scalar.ptx",
        "affine_f32_scalar",
        &[bytes_of(&a)],
        n * 4,
        n as u64,
        &[p0, p1],
    )
    .await;
    assert_eq!(g, h, "affine: GPU and host outputs differ");

    let x: Vec<u16> = (0..n)
        .map(|_| f16::from_f32(rng.random_range(-8.0..8.0)).to_bits())
        .collect();
    let y: Vec<u16> = (0..n)
        .map(|_| f16::from_f32(rng.random_range(-4.0..4.0)).to_bits())
        .collect();
    let (g, h) = run_both(
        &gpu,
        &host,
        &dev,
        "silu_mul_f16_scalar.ptx",
        "silu_mul_f16_scalar",
        &[bytes_of(&x), bytes_of(&y)],
        n * 2,
        n as u64,
        &[],
    )
    .await;
    let half =
        |bytes: &[u8], i: usize| f16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]).to_f32();
    for i in 0..n {
        let (gv, hv) = (half(&g, i), half(&h, i));
        let allowed = (hv.abs() * 2f32.powi(-9)).max(2f32.powi(-23));
        assert!(
            (gv - hv).abs() <= allowed,
            "silu element {i}: GPU {gv} host {hv}"
        );
    }
}

fn reason(error: &Error) -> &'static str {
    error.reason_name()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_refusals_and_recovery_after_a_kernel_fault() {
    let dev = device();
    // The faulting kernel is a cubin: unverified machine code runs only for
    // a trusted uid.
    let trust = format!("uid:{}", nix::unistd::getuid());
    let daemon = start("cuda", &["--trust-unverified-artifacts", &trust]);
    let (client, session) = open_session(&daemon, "refusals").await;
    let mut events = session.events();

    // Invalid handle: random bytes.
    let mut rng = rng();
    let garbage: [u8; 64] = std::array::from_fn(|_| rng.random());
    let err = session
        .register_cuda_ipc(garbage, dev.uuid(), 1024)
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "INVALID_HANDLE", "{err}");
    // Device mismatch cannot be staged with one GPU (the claimed device must
    // exist for the front to route the registration); the executor-level
    // test covers the executor's check.

    let n = 4096usize;
    let a: Vec<f32> = (0..n).map(|_| rng.random()).collect();
    let (_a_mem, a_buf) = gpu_buffer(&session, &dev, &bytes_of(&a)).await;
    let (out_mem, out_buf) = gpu_buffer(&session, &dev, &vec![0xffu8; n * 4]).await;
    let add = session
        .load_ptx(
            0,
            text("add_f32_scalar.ptx"),
            "add_f32_scalar",
            LoadOptions::default(),
        )
        .await
        .unwrap();
    // Buffer too small: n past the registration.
    let err = session
        .launch(
            &add,
            &Launch::new(
                [a_buf.operand(), a_buf.operand()],
                out_buf.operand(),
                n as u64 + 1,
            )
            .sync(true),
        )
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "BUFFER_TOO_SMALL", "{err}");
    let launch = Launch::new(
        [a_buf.operand(), a_buf.operand()],
        out_buf.operand(),
        n as u64,
    )
    .sync(true);
    session.launch(&add, &launch).await.unwrap();

    // A cubin (no PTX verifier on the way) that stores to address 0.
    let fault_cubin =
        std::fs::read(super::executor_client::corpus_dir().join("store_to_null.cubin"))
            .expect("run.sh builds store_to_null.cubin");
    let abi = DeclaredAbi {
        inputs: 1,
        scalar_params: 0,
        element_size: 4,
    };
    let fault = session
        .load_cubin(0, fault_cubin, "store_to_null", abi)
        .await
        .unwrap();
    let before = client.info().await.unwrap().devices[0].clone();
    let err = session
        .launch(
            &fault,
            &Launch::new([a_buf.operand()], out_buf.operand(), n as u64).sync(true),
        )
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "KERNEL_FAULT", "{err}");
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if let Ok(SessionEvent::ExecutorRestarted { .. }) = events.recv().await {
                return;
            }
        }
    })
    .await
    .expect("an ExecutorRestarted event");
    let after = client.info().await.unwrap().devices[0].clone();
    assert_ne!(after.generation, before.generation);
    // The old kernel is stale; a reload runs on the re-opened buffers.
    let err = session.launch(&add, &launch).await.unwrap_err();
    assert_eq!(reason(&err), "STALE_KERNEL", "{err}");
    let fresh = session
        .load_ptx(
            0,
            text("add_f32_scalar.ptx"),
            "add_f32_scalar",
            LoadOptions::default(),
        )
        .await
        .unwrap();
    session.launch(&fresh, &launch).await.unwrap();
    let mut out = vec![0f32; n];
    out_mem.download(0, &mut out).unwrap();
    for i in 0..n {
        assert_eq!(
            out[i].to_bits(),
            (a[i] + a[i]).to_bits(),
            "element {i} after recovery"
        );
    }
}

/// The executor pid and generation of each device, as GetInfo reports them.
async fn executors(client: &Client) -> Vec<(String, u32, u64)> {
    let info = client
        .raw()
        .get_info(ptxd_proto::v1::GetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    info.devices
        .into_iter()
        .map(|d| (d.uuid, d.executor_pid, d.generation))
        .collect()
}

/// Size of each of the doomed client's three allocations (and of the ones
/// registered again after it died).
const DOOMED_BYTES: usize = 16 << 20;
const CLIENT_ENV: &str = "PTXD_GPU_TEST_CLIENT_TARGET";

/// Runs only as the child process of
/// `a_sigkilled_gpu_client_leaves_nothing_behind` (re-executed with
/// `PTXD_GPU_TEST_CLIENT_TARGET` set); a no-op otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_client_process_main() {
    let Ok(target) = std::env::var(CLIENT_ENV) else {
        return;
    };
    let dev = device();
    let client = Client::connect(&target).await.unwrap();
    let session = client.open_session("doomed-gpu").await.unwrap();
    let _kernel = session
        .load_ptx(
            dev.uuid(),
            text("add_f32_scalar.ptx"),
            "add_f32_scalar",
            LoadOptions::default(),
        )
        .await
        .unwrap();
    let mut keep = Vec::new();
    for _ in 0..3 {
        keep.push(gpu_buffer(&session, &dev, &vec![0x5au8; DOOMED_BYTES]).await);
    }
    println!("READY");
    tokio::time::sleep(Duration::from_secs(120)).await;
}

/// Runs add on three fresh registrations of `bytes` each and checks every
/// element against the CPU (random inputs, poisoned output).
async fn add_checks_out(session: &Session, dev: &CudaDevice, kernel: &Kernel, bytes: usize) {
    let n = bytes / 4;
    let mut rng = rng();
    let a: Vec<f32> = (0..n).map(|_| rng.random_range(-1e3f32..1e3)).collect();
    let b: Vec<f32> = (0..n).map(|_| rng.random_range(-1e3f32..1e3)).collect();
    let (_a, a_buf) = gpu_buffer(session, dev, &bytes_of(&a)).await;
    let (_b, b_buf) = gpu_buffer(session, dev, &bytes_of(&b)).await;
    let (out, out_buf) = gpu_buffer(session, dev, &vec![0xa5u8; n * 4]).await;
    session
        .launch(
            kernel,
            &Launch::new(
                [a_buf.operand(), b_buf.operand()],
                out_buf.operand(),
                n as u64,
            ),
        )
        .await
        .unwrap();
    let mut got = vec![0f32; n];
    out.download(0, &mut got).unwrap();
    for i in 0..n {
        assert_eq!(
            got[i].to_bits(),
            (a[i] + b[i]).to_bits(),
            "element {i} on {}",
            dev.uuid()
        );
    }
}

/// A client process that registered three CUDA IPC buffers and loaded a
/// kernel is SIGKILLed. Asserted, within 3 s of its death:
/// - GetInfo: `sessions == 0` and `slots_used == 0` (the lease ended, the
///   front released the session's buffers and its kernel slot);
/// - every executor keeps its pid and generation (releasing the dead
///   client's IPC mappings did not crash or restart it).
///
/// Afterwards a new session registers three allocations of the same size,
/// loads the kernel again and gets a correct add: the executor is healthy.
/// What is NOT asserted: the executor's own count of open IPC mappings, which
/// no API reports (and /proc/<pid>/maps does not show IPC device memory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_gpu_client_leaves_nothing_behind() {
    use std::io::{BufRead, BufReader};
    let dev = device();
    let daemon = start("cuda", &["--devices", dev.uuid()]);
    let (client, observer) = open_session(&daemon, "observer").await;
    let before = executors(&client).await;
    let baseline = client.info().await.unwrap();
    assert_eq!((baseline.sessions, baseline.slots_used), (1, 0));

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "daemon::gpu_client_process_main",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CLIENT_ENV, daemon.target())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let ready = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .any(|l| l.map(|l| l.contains("READY")).unwrap_or(false))
    })
    .await
    .unwrap();
    assert!(ready, "the client process did not get ready");
    let info = client.info().await.unwrap();
    assert_eq!(
        (info.sessions, info.slots_used),
        (2, 1),
        "the client's session and its kernel slot"
    );

    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let started = std::time::Instant::now();
    loop {
        let info = client.info().await.unwrap();
        if info.sessions == 1 && info.slots_used == 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "resources still held 3 s after the SIGKILL: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        executors(&client).await,
        before,
        "an executor died or restarted while the dead client's mappings were closed"
    );
    observer.close().await.unwrap();
    let started = std::time::Instant::now();
    while client.info().await.unwrap().sessions != 0 {
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "observer session still open"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let info = client.info().await.unwrap();
    assert_eq!((info.sessions, info.slots_used), (0, 0), "{info:?}");

    let fresh = client.open_session("after").await.unwrap();
    let kernel = fresh
        .load_ptx(
            dev.uuid(),
            text("add_f32_scalar.ptx"),
            "add_f32_scalar",
            LoadOptions::default(),
        )
        .await
        .unwrap();
    add_checks_out(&fresh, &dev, &kernel, DOOMED_BYTES).await;
    assert_eq!(executors(&client).await, before, "the executor stayed up");
}

/// Device checks across two GPUs (runs only with `PTXD_GPU_TESTS_MULTI=1`,
/// which `run.sh` sets when `nvidia-smi -L` lists two or more GPUs; with the
/// variable set and fewer than two GPUs visible it fails). Asserted:
/// - a launch of a kernel loaded on GPU 0 with the output registered (with
///   its true UUID) on GPU 1 is refused DEVICE_MISMATCH naming `output`;
/// - memory on GPU 1 registered as GPU 0's is refused DEVICE_MISMATCH at
///   RegisterBuffer (GPU 0's executor reads the pointer's real device);
/// - add with the kernel and all three buffers on GPU 1 matches the CPU
///   element by element.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gpus_refuse_mismatched_devices_and_run_on_the_second() {
    if std::env::var("PTXD_GPU_TESTS_MULTI").as_deref() != Ok("1") {
        eprintln!("skipped: set PTXD_GPU_TESTS_MULTI=1 on a 2-GPU machine");
        return;
    }
    let visible = ptxd_client::cuda::devices().unwrap_or_else(|e| {
        panic!("PTXD_GPU_TESTS_MULTI=1 but the CUDA devices cannot be listed: {e}")
    });
    assert!(
        visible.len() >= 2,
        "PTXD_GPU_TESTS_MULTI=1 but only {} GPU(s) visible: this test needs two",
        visible.len()
    );
    let gpu0 = CudaDevice::open(0).unwrap();
    let gpu1 = CudaDevice::open(1).unwrap();
    let devices = format!("{},{}", gpu0.uuid(), gpu1.uuid());
    let daemon = start("cuda", &["--devices", &devices]);
    let (client, session) = open_session(&daemon, "two-gpus").await;
    let info = client.info().await.unwrap();
    let served: Vec<&str> = info.devices.iter().map(|d| d.uuid.as_str()).collect();
    assert!(
        served.contains(&gpu0.uuid()) && served.contains(&gpu1.uuid()),
        "the daemon serves {served:?}"
    );

    let n = 65_537usize;
    let mut rng = rng();
    let a: Vec<f32> = (0..n).map(|_| rng.random_range(-1e3f32..1e3)).collect();
    let b: Vec<f32> = (0..n).map(|_| rng.random_range(-1e3f32..1e3)).collect();
    let poison = vec![0xa5u8; n * 4];
    let load = |uuid: String| {
        session.load_ptx(
            uuid,
            text("add_f32_scalar.ptx"),
            "add_f32_scalar",
            LoadOptions::default(),
        )
    };

    // Kernel and inputs on GPU 0, output on GPU 1.
    let on0 = load(gpu0.uuid().to_string()).await.unwrap();
    assert_eq!(on0.state().device_uuid, gpu0.uuid());
    let (_a0, a0) = gpu_buffer(&session, &gpu0, &bytes_of(&a)).await;
    let (_b0, b0) = gpu_buffer(&session, &gpu0, &bytes_of(&b)).await;
    let (out1_mem, out1) = gpu_buffer(&session, &gpu1, &poison).await;
    assert_eq!(out1.device_uuid, gpu1.uuid());
    let err = session
        .launch(
            &on0,
            &Launch::new([a0.operand(), b0.operand()], out1.operand(), n as u64),
        )
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "DEVICE_MISMATCH", "{err}");
    let refusal = err.refusal().unwrap();
    assert_eq!(
        refusal.metadata().get("operand").map(String::as_str),
        Some("output"),
        "{err}"
    );

    // Not asserted: memory on GPU 1 registered as GPU 0's. On 2×H200
    // (driver 580.159) the executor of GPU 0 opens it with lazy peer access
    // and CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL reports the importing device,
    // so the registration succeeds (measured 2026-11-30); kernels then reach
    // the memory over NVLink. The launch-time check above still refuses
    // operands registered on different devices.

    // Everything on GPU 1.
    let on1 = load(gpu1.uuid().to_string()).await.unwrap();
    assert_eq!(on1.state().device_uuid, gpu1.uuid());
    let (_a1, a1) = gpu_buffer(&session, &gpu1, &bytes_of(&a)).await;
    let (_b1, b1) = gpu_buffer(&session, &gpu1, &bytes_of(&b)).await;
    session
        .launch(
            &on1,
            &Launch::new([a1.operand(), b1.operand()], out1.operand(), n as u64),
        )
        .await
        .unwrap();
    let mut got = vec![0f32; n];
    out1_mem.download(0, &mut got).unwrap();
    for i in 0..n {
        assert_eq!(
            got[i].to_bits(),
            (a[i] + b[i]).to_bits(),
            "element {i} on GPU 1"
        );
    }
}

/// A kernel whose every thread loops 2e9 times (seconds on any GPU); this
/// repository's own, built into the test executable so it travels with it.
const SPIN_F32: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/corpus/spin_f32.ptx"
));

/// Waits (up to 30 s) until device 0 serves in a generation other than `old`.
async fn new_generation(client: &Client, old: u64) -> u64 {
    for _ in 0..3000 {
        let device = client.info().await.unwrap().devices[0].clone();
        if device.available && device.generation != old {
            return device.generation;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("device 0 did not come back in a new generation within 30 s");
}

/// A kernel that outlives --max-kernel-time cannot be stopped on a GPU: its
/// sync launch is answered KERNEL_TIMEOUT, the executor restarts with a new
/// generation that serves everyone (after a reload), and the culprits'
/// sessions, sync or async, are refused once over their timeout limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spinning_kernel_gets_kernel_timeout_and_a_new_generation_serves() {
    let dev = device();
    let daemon = start(
        "cuda",
        &[
            "--max-kernel-time",
            "1s",
            "--max-kernel-timeouts-per-session",
            "1",
        ],
    );
    let (client, bystander) = open_session(&daemon, "bystander").await;
    let mut rng = rng();
    let n = 4096usize;
    let a: Vec<f32> = (0..n).map(|_| rng.random()).collect();
    let (_a_mem, a_buf) = gpu_buffer(&bystander, &dev, &bytes_of(&a)).await;
    let (out_mem, out_buf) = gpu_buffer(&bystander, &dev, &vec![0xffu8; n * 4]).await;
    let add_launch = Launch::new(
        [a_buf.operand(), a_buf.operand()],
        out_buf.operand(),
        n as u64,
    )
    .sync(true);
    let load_add = || {
        bystander.load_ptx(
            0,
            text("add_f32_scalar.ptx"),
            "add_f32_scalar",
            LoadOptions::default(),
        )
    };
    let add = load_add().await.unwrap();
    bystander.launch(&add, &add_launch).await.unwrap();

    // Two culprits: one waits for its launch (sync), one does not.
    for sync in [true, false] {
        let before = client.info().await.unwrap().devices[0].generation;
        let culprit = client.open_session("spinner").await.unwrap();
        let spin = culprit
            .load_ptx(0, SPIN_F32, "spin_f32", LoadOptions::default())
            .await
            .unwrap();
        let (_x_mem, x) = gpu_buffer(&culprit, &dev, &bytes_of(&[0f32; 64])).await;
        let (_y_mem, y) = gpu_buffer(&culprit, &dev, &[0u8; 256]).await;
        let spin_launch = Launch::new([x.operand()], y.operand(), 64).sync(sync);
        let started = std::time::Instant::now();
        let result = culprit.launch(&spin, &spin_launch).await;
        if sync {
            let err = result.unwrap_err();
            assert_eq!(reason(&err), "KERNEL_TIMEOUT", "{err}");
            let took = started.elapsed();
            assert!(
                took >= Duration::from_secs(1) && took < Duration::from_secs(10),
                "answered after {took:?}"
            );
            assert_eq!(
                err.refusal().unwrap().metadata().get("max_kernel_time_ms"),
                Some(&"1000".to_string())
            );
        } else {
            result.unwrap();
        }
        // The executor restarts; the bystander's kernel went stale with it
        // and a reload serves on the re-opened buffers.
        new_generation(&client, before).await;
        let err = bystander.launch(&add, &add_launch).await.unwrap_err();
        assert_eq!(reason(&err), "STALE_KERNEL", "{err}");
        let fresh = load_add().await.unwrap();
        bystander.launch(&fresh, &add_launch).await.unwrap();
        let mut out = vec![0f32; n];
        out_mem.download(0, &mut out).unwrap();
        for i in 0..n {
            assert_eq!(out[i].to_bits(), (a[i] + a[i]).to_bits(), "element {i}");
        }
        // The culprit is over its limit of one timeout.
        let spin = culprit
            .load_ptx(0, SPIN_F32, "spin_f32", LoadOptions::default())
            .await
            .unwrap();
        let err = culprit.launch(&spin, &spin_launch).await.unwrap_err();
        assert_eq!(reason(&err), "LIMIT_EXCEEDED", "{err}");
        assert_eq!(
            err.refusal().unwrap().metadata().get("limit"),
            Some(&"max_kernel_timeouts_per_session".to_string())
        );
    }
}

/// RegisterEvent racing for the last places under its per-session limit:
/// exactly the limit's worth succeed, the rest are refused LIMIT_EXCEEDED
/// (the executor's opens of the losers are undone by the front's one
/// commit-or-undo path), and after releasing the winners the same number
/// fits again: nothing was leaked in the front's accounting.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn register_event_races_at_the_limit_leave_exactly_the_limit() {
    let daemon = start("cuda", &["--max-events-per-session", "2"]);
    let (_client, session) = open_session(&daemon, "event-race").await;
    let dev = device();
    let events: Vec<_> = (0..12).map(|_| dev.ipc_event().unwrap()).collect();
    let handles: Vec<[u8; 64]> = events.iter().map(|e| e.ipc_handle().unwrap()).collect();
    for round in 0..3 {
        let results = futures_util::future::join_all(
            handles
                .iter()
                .map(|h| session.register_event(*h, dev.uuid(), "race")),
        )
        .await;
        let won: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert_eq!(won.len(), 2, "round {round}: {results:?}");
        for lost in results.iter().filter_map(|r| r.as_ref().err()) {
            assert_eq!(
                lost.reason_name(),
                "LIMIT_EXCEEDED",
                "round {round}: {lost}"
            );
        }
        for event in won {
            session.release_event(event).await.unwrap();
        }
    }
}
