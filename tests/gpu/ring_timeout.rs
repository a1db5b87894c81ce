//! The per-launch budget (`--max-kernel-time`) on ring launches on a GPU: a
//! kernel launched through the launch ring that outlives the budget is
//! caught by the watchdog like a gRPC launch: the executor restarts with a
//! new generation and the culprit's session is charged the timeout.

use std::time::{Duration, Instant};

use ptxd_client::cuda::DeviceAllocation;
use ptxd_client::{Buffer, Client, LoadOptions, Session};

use super::daemon_support::Daemon;
use super::device;

const SPIN_F32: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/corpus/spin_f32.ptx"
));

async fn ipc_buffer(session: &Session, bytes: usize) -> (DeviceAllocation, Buffer) {
    let dev = device();
    let mem = dev.alloc(bytes).unwrap();
    mem.upload(0, &vec![0u8; bytes]).unwrap();
    let buffer = session
        .register_cuda_ipc(mem.ipc_handle().unwrap(), dev.uuid(), bytes as u64)
        .await
        .unwrap();
    (mem, buffer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ring_launch_past_the_budget_restarts_the_executor_and_counts_against_its_session() {
    let dev = device();
    let daemon = Daemon::start_backend(
        "cuda",
        &[
            "--devices",
            dev.uuid(),
            "--max-kernel-time",
            "1s",
            "--max-kernel-timeouts-per-session",
            "1",
        ],
        |_| {},
    );
    let client = Client::connect(&daemon.target()).await.unwrap();
    let culprit = client.open_session("ring spinner").await.unwrap();
    let spin = culprit
        .load_ptx(0, SPIN_F32, "spin_f32", LoadOptions::default())
        .await
        .unwrap();
    let (_x_mem, x) = ipc_buffer(&culprit, 256).await;
    let (_y_mem, y) = ipc_buffer(&culprit, 256).await;
    let before = client.info().await.unwrap().devices[0].generation;
    let mut ring = culprit.open_ring(16, dev.uuid()).await.unwrap();
    let started = Instant::now();
    ring.launch(&spin, &[(&x, 0)], (&y, 0), 64, &[]).unwrap();
    // Without a watch on ring launches the kernel would spin forever and
    // the generation would never change.
    loop {
        let device = client.info().await.unwrap().devices[0].clone();
        if device.available && device.generation != before {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the executor did not restart within 30 s of a ring launch past a 1 s budget"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(1),
        "restarted after only {took:?}"
    );
    // The timeout was charged to the ring's session: it is over its limit.
    let spin = culprit
        .load_ptx(0, SPIN_F32, "spin_f32", LoadOptions::default())
        .await
        .unwrap();
    let launch = ptxd_client::Launch::new([x.operand()], y.operand(), 64).sync(true);
    let error = culprit.launch(&spin, &launch).await.unwrap_err();
    let refusal = error.refusal().expect("a refusal");
    assert_eq!(refusal.wire_name(), "LIMIT_EXCEEDED", "{error}");
    assert_eq!(
        refusal.metadata().get("limit").map(String::as_str),
        Some("max_kernel_timeouts_per_session")
    );
}
