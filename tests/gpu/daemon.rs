//! GPU tests, stage 2: the real daemon (`ptxd serve --backend cuda`) driven
//! through the SDK, with tensors in this process's IPC-exported memory.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ptxd_client::cuda::{CudaDevice, DeviceAllocation};
use ptxd_client::{
    Client, DeclaredAbi, Error, HostShm, Launch, LoadOptions, Session, SessionEvent,
};
use rand::Rng;

use super::executor_client::{corpus, ptxd_bin};
use super::{device, f16_to_f32, f32_to_f16, rng};

struct Daemon {
    child: Child,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Daemon {
    fn start(backend: &str) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("ptxd.sock");
        let child = Command::new(ptxd_bin())
            .args(["serve", "--backend", backend, "--socket"])
            .arg(&socket)
            .env(
                "RUST_LOG",
                std::env::var("PTXD_TEST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "ptxd serve --backend {backend} did not come up"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Daemon {
            child,
            socket,
            _dir: dir,
        }
    }

    async fn session(&self, label: &str) -> (Client, Session) {
        let client = Client::connect(&format!("unix:{}", self.socket.display()))
            .await
            .unwrap();
        let session = client.open_session(label).await.unwrap();
        (client, session)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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
    (g, h)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_runs_the_corpus_on_ipc_memory_like_the_host_backend() {
    let dev = device();
    let (cuda_daemon, host_daemon) = (Daemon::start("cuda"), Daemon::start("host"));
    let (_gc, gpu) = cuda_daemon.session("gpu").await;
    let (_hc, host) = host_daemon.session("host").await;
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
        .map(|_| f32_to_f16(rng.random_range(-8.0..8.0)))
        .collect();
    let y: Vec<u16> = (0..n)
        .map(|_| f32_to_f16(rng.random_range(-4.0..4.0)))
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
        |bytes: &[u8], i: usize| f16_to_f32(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]));
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
    let daemon = Daemon::start("cuda");
    let (client, session) = daemon.session("refusals").await;
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
