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

const AFFINE_F32: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/corpus/affine_f32_scalar.ptx"
));
const ADD_F32: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/corpus/add_f32_scalar.ptx"
));

/// A bystander's affine launch over fresh random data on the GPU, every
/// element compared with the reference (fused or not).
async fn bystander_affine(session: &Session, affine: &ptxd_client::Kernel) {
    let dev = device();
    let n = 4099;
    let x: Vec<f32> = (0..n).map(|_| rand::random::<f32>() * 8.0 - 4.0).collect();
    let x_mem = dev.alloc(n * 4).unwrap();
    x_mem.upload(0, &x).unwrap();
    let y_mem = dev.alloc(n * 4).unwrap();
    y_mem.upload(0, &vec![f32::NAN; n]).unwrap();
    let register = |mem: &DeviceAllocation| {
        session.register_cuda_ipc(mem.ipc_handle().unwrap(), dev.uuid(), (n * 4) as u64)
    };
    let x_buf = register(&x_mem).await.unwrap();
    let y_buf = register(&y_mem).await.unwrap();
    let (a, b) = (rand::random::<f32>() * 4.0 - 2.0, rand::random::<f32>());
    session
        .launch(
            affine,
            &ptxd_client::Launch::new([x_buf.operand()], y_buf.operand(), n as u64)
                .params([f64::from(a), f64::from(b)])
                .sync(true),
        )
        .await
        .unwrap();
    let mut y = vec![0f32; n];
    y_mem.download(0, &mut y).unwrap();
    for i in 0..n {
        let (fused, plain) = (x[i].mul_add(a, b), x[i] * a + b);
        assert!(
            y[i].to_bits() == fused.to_bits() || y[i].to_bits() == plain.to_bits(),
            "bystander element {i}: {} * {a} + {b} gave {}",
            x[i],
            y[i]
        );
    }
    session.release_buffer(&x_buf).await.unwrap();
    session.release_buffer(&y_buf).await.unwrap();
}

/// Waits until device 0 is available at a generation other than `before`.
async fn restarted(client: &Client, before: u64, started: Instant) -> u64 {
    loop {
        let device = client.info().await.unwrap().devices[0].clone();
        if device.available && device.generation != before {
            return device.generation;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the executor did not restart within 30 s of a semaphore wait past a 1 s budget"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The CUDA answer to issue 24's question: a ring launch whose semaphore
/// never fires holds its stream (and every drain of the device) forever,
/// so the watchdog treats a wait pending past the budget as a kernel
/// timeout: the executor restarts, the session is charged, and once over
/// its limit its ring refuses launches itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ring_semaphore_that_never_fires_is_a_counted_kernel_timeout() {
    let dev = device();
    let daemon = Daemon::start_backend(
        "cuda",
        &[
            "--devices",
            dev.uuid(),
            "--max-kernel-time",
            "1s",
            "--max-kernel-timeouts-per-session",
            "2",
        ],
        |_| {},
    );
    let client = Client::connect(&daemon.target()).await.unwrap();
    let bystander = client.open_session("bystander").await.unwrap();
    let affine = bystander
        .load_ptx(0, AFFINE_F32, "affine_f32_scalar", LoadOptions::default())
        .await
        .unwrap();
    bystander_affine(&bystander, &affine).await;

    let culprit = client.open_session("never signals").await.unwrap();
    let (_x_mem, x) = ipc_buffer(&culprit, 1024).await;
    let (_y_mem, y) = ipc_buffer(&culprit, 1024).await;
    let sem_mem = std::sync::Arc::new(dev.alloc(256).unwrap());
    sem_mem.upload(0, &[0u32; 64]).unwrap();
    let sem = culprit
        .register_cuda_ipc(sem_mem.ipc_handle().unwrap(), dev.uuid(), 256)
        .await
        .unwrap();
    let never = ptxd_client::ring::SemaphoreOp {
        buffer: sem.ring_index,
        offset: 0,
        value: 1,
        width: ptxd_client::ring::SemaphoreWidth::Bits32,
    };
    for round in 0..2 {
        let add = culprit
            .load_ptx(0, ADD_F32, "add_f32_scalar", LoadOptions::default())
            .await
            .unwrap();
        let before = client.info().await.unwrap().devices[0].generation;
        let mut ring = culprit.open_ring(16, dev.uuid()).await.unwrap();
        let started = Instant::now();
        ring.launch_ordered(
            &add,
            &[(&x, 0), (&x, 0)],
            (&y, 0),
            64,
            &[],
            Some(never),
            None,
        )
        .unwrap();
        restarted(&client, before, started).await;
        let took = started.elapsed();
        assert!(
            took >= Duration::from_secs(1),
            "round {round}: restarted after only {took:?}"
        );
        // The bystander's kernels went stale with the generation; reloaded,
        // they compute exactly.
        bystander.reload(&affine).await.unwrap();
        bystander_affine(&bystander, &affine).await;
    }
    // Two timeouts: the session's next ring refuses every launch itself,
    // and its gRPC launches are refused too.
    let add = culprit
        .load_ptx(0, ADD_F32, "add_f32_scalar", LoadOptions::default())
        .await
        .unwrap();
    let mut ring = culprit.open_ring(16, dev.uuid()).await.unwrap();
    ring.launch(&add, &[(&x, 0), (&x, 0)], (&y, 0), 64, &[])
        .unwrap();
    let done = super::ring_completions::next(&mut ring);
    assert_eq!(
        super::ring_completions::refusal(&done),
        "LIMIT_EXCEEDED",
        "{done:?}"
    );
    let launch = ptxd_client::Launch::new([x.operand(), x.operand()], y.operand(), 64);
    let error = culprit.launch(&add, &launch).await.unwrap_err();
    assert_eq!(
        error.refusal().unwrap().wire_name(),
        "LIMIT_EXCEEDED",
        "{error}"
    );
    bystander_affine(&bystander, &affine).await;
}

/// A kernel that never ends in the middle of a burst of ring launches is
/// caught too: the ring groups up to 16 launches under one sequence
/// marker (a stream write into a pinned word, not an event), so the
/// spinner shares its group with launches before and after it; the group
/// is closed after its last launch and the watchdog blames it within the
/// group's allowance (at most 16 budgets), after the launches before the
/// spinner completed with their answers, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ring_launch_that_never_ends_mid_burst_is_caught() {
    let dev = device();
    let daemon = Daemon::start_backend(
        "cuda",
        &["--devices", dev.uuid(), "--max-kernel-time", "1s"],
        |_| {},
    );
    let client = Client::connect(&daemon.target()).await.unwrap();
    let culprit = client.open_session("mid-burst spinner").await.unwrap();
    let spin = culprit
        .load_ptx(0, SPIN_F32, "spin_f32", LoadOptions::default())
        .await
        .unwrap();
    let add = culprit
        .load_ptx(0, ADD_F32, "add_f32_scalar", LoadOptions::default())
        .await
        .unwrap();
    let (_x_mem, x) = ipc_buffer(&culprit, 4096).await;
    let (_y_mem, y) = ipc_buffer(&culprit, 4096).await;
    let before = client.info().await.unwrap().devices[0].generation;
    let mut ring = culprit.open_ring(64, dev.uuid()).await.unwrap();
    let started = Instant::now();
    let mut tickets = Vec::new();
    for _ in 0..21 {
        tickets.push(
            ring.launch(&add, &[(&x, 0), (&x, 0)], (&y, 0), 1024, &[])
                .unwrap(),
        );
    }
    ring.launch(&spin, &[(&x, 0)], (&y, 0), 64, &[]).unwrap();
    for _ in 0..9 {
        ring.launch(&add, &[(&x, 0), (&x, 0)], (&y, 0), 1024, &[])
            .unwrap();
    }
    // Async launches are answered once enqueued, in order, each once.
    for ticket in &tickets {
        let done = super::ring_completions::next(&mut ring);
        assert_eq!(done.ticket, *ticket);
        assert_eq!(done.outcome, Ok(()), "{done:?}");
    }
    loop {
        let device = client.info().await.unwrap().devices[0].clone();
        if device.available && device.generation != before {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(40),
            "the executor did not restart within 40 s of a spinner in a ring burst (1 s budget, groups of at most 16)"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(1),
        "restarted after only {took:?}"
    );
}
