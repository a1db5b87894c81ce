//! GPU tests of the launch ring: the real daemon on the CUDA backend, the
//! SDK's `LaunchRing`, tensors in this process's IPC-exported memory, and
//! ordering between the session's stream and ptxd's through semaphore words
//! in device memory, without waiting for any reply.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ptxd_client::cuda::{CudaDevice, DeviceAllocation};
use ptxd_client::ring::{SemaphoreOp, SemaphoreWidth};
use ptxd_client::{Buffer, Client, LoadOptions, Session};
use rand::Rng;

use super::daemon_support::Daemon;
use super::executor_client::corpus;
use super::ring_completions::{next, refusal as reason, WAIT};
use super::{device, rng};

async fn gpu_f32(
    session: &Session,
    dev: &CudaDevice,
    values: &[f32],
) -> (DeviceAllocation, Buffer) {
    let mem = dev.alloc(values.len() * 4).unwrap();
    mem.upload(0, values).unwrap();
    let buffer = session
        .register_cuda_ipc(mem.ipc_handle().unwrap(), dev.uuid(), mem.size() as u64)
        .await
        .unwrap();
    (mem, buffer)
}

fn word(mem: &DeviceAllocation, index: usize) -> u32 {
    let mut out = [0u32; 1];
    mem.download(index * 4, &mut out).unwrap();
    out[0]
}

#[tokio::test(flavor = "multi_thread")]
async fn ring_launches_on_ipc_memory_match_the_reference() {
    let daemon = Daemon::start_backend("cuda", &[], |_| {});
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("gpu-ring").await.unwrap();
    let dev = device();
    let add = session
        .load_ptx(
            0,
            String::from_utf8(corpus("add_f32_scalar.ptx")).unwrap(),
            "add_f32_scalar",
            LoadOptions::default(),
        )
        .await
        .unwrap();
    let mut rng = rng();
    let n = 1 << 16;
    let a: Vec<f32> = (0..n).map(|_| rng.random_range(-10.0..10.0)).collect();
    let b: Vec<f32> = (0..n).map(|_| rng.random_range(-10.0..10.0)).collect();
    let (_a_mem, a_buf) = gpu_f32(&session, &dev, &a).await;
    let (_b_mem, b_buf) = gpu_f32(&session, &dev, &b).await;
    let (out_mem, out_buf) = gpu_f32(&session, &dev, &vec![f32::NAN; n]).await;
    let mut ring = session.open_ring(64, dev.uuid()).await.unwrap();
    assert_eq!(ring.device_uuid(), dev.uuid());
    for round in 0..20 {
        let len = rng.random_range(1..=n);
        out_mem.upload(0, &vec![f32::NAN; n]).unwrap();
        let descriptor = ring
            .descriptor(
                &add,
                &[(&a_buf, 0), (&b_buf, 0)],
                (&out_buf, 0),
                len as u64,
                &[],
            )
            .unwrap()
            .with_sync(true);
        ring.submit(&descriptor).unwrap();
        let done = next(&mut ring);
        assert_eq!((done.ticket, done.outcome), (descriptor.ticket, Ok(())));
        let mut got = vec![0f32; n];
        out_mem.download(0, &mut got).unwrap();
        for i in 0..n {
            if i < len {
                assert_eq!(
                    got[i].to_bits(),
                    (a[i] + b[i]).to_bits(),
                    "round {round} element {i}"
                );
            } else {
                assert!(
                    got[i].is_nan(),
                    "round {round}: element {i} past n was written"
                );
            }
        }
    }
    // The same refusals as on the host backend.
    ring.launch(
        &add,
        &[(&a_buf, 0), (&b_buf, 0)],
        (&out_buf, 4),
        n as u64,
        &[],
    )
    .unwrap();
    assert_eq!(reason(&next(&mut ring)), "BUFFER_TOO_SMALL");
    ring.launch(&add, &[(&a_buf, 0)], (&out_buf, 0), 8, &[])
        .unwrap();
    assert_eq!(reason(&next(&mut ring)), "ABI_MISMATCH");
    // Many async launches in flight, then one sync: all ran, in order.
    out_mem.upload(0, &vec![f32::NAN; n]).unwrap();
    for _ in 0..500 {
        ring.launch(
            &add,
            &[(&a_buf, 0), (&b_buf, 0)],
            (&out_buf, 0),
            n as u64,
            &[],
        )
        .unwrap();
        assert_eq!(next(&mut ring).outcome, Ok(()));
    }
    let descriptor = ring
        .descriptor(
            &add,
            &[(&out_buf, 0), (&b_buf, 0)],
            (&out_buf, 0),
            n as u64,
            &[],
        )
        .unwrap()
        .with_sync(true);
    ring.submit(&descriptor).unwrap();
    assert_eq!(next(&mut ring).outcome, Ok(()));
    let mut got = vec![0f32; n];
    out_mem.download(0, &mut got).unwrap();
    for i in 0..n {
        assert_eq!(
            got[i].to_bits(),
            ((a[i] + b[i]) + b[i]).to_bits(),
            "element {i}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sessions_stream_and_ptxd_order_through_semaphores_without_replies() {
    let daemon = Daemon::start_backend("cuda", &[], |_| {});
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("gpu-sem").await.unwrap();
    let dev = device();
    let add = session
        .load_ptx(
            0,
            String::from_utf8(corpus("add_f32_scalar.ptx")).unwrap(),
            "add_f32_scalar",
            LoadOptions::default(),
        )
        .await
        .unwrap();
    let mut rng = rng();
    let n = 1 << 20;
    let a: Vec<f32> = (0..n).map(|_| rng.random_range(-10.0..10.0)).collect();
    let b: Vec<f32> = (0..n).map(|_| rng.random_range(-10.0..10.0)).collect();
    let (_a_mem, a_buf) = gpu_f32(&session, &dev, &a).await;
    let (_b_mem, b_buf) = gpu_f32(&session, &dev, &b).await;
    let (out_mem, out_buf) = gpu_f32(&session, &dev, &vec![f32::NAN; n]).await;
    // Word 0: the session's stream → ptxd ("after"); word 1: ptxd → the
    // session's stream (a ticket's completion on the GPU).
    let sem_mem = Arc::new(dev.alloc(256).unwrap());
    sem_mem.upload(0, &[0u32; 64]).unwrap();
    let sem = session
        .register_cuda_ipc(sem_mem.ipc_handle().unwrap(), dev.uuid(), 256)
        .await
        .unwrap();
    let op = |offset: u64, value: u64| SemaphoreOp {
        buffer: sem.ring_index,
        offset,
        value,
        width: SemaphoreWidth::Bits32,
    };
    let mut ring = session.open_ring(16, dev.uuid()).await.unwrap();
    ring.bind_semaphores(&sem, sem_mem.clone()).unwrap();
    let stream = dev.stream().unwrap();

    // ptxd's kernel waits for word 0 >= 1 and then signals word 1 = 1.
    let ticket = ring
        .launch_ordered(
            &add,
            &[(&a_buf, 0), (&b_buf, 0)],
            (&out_buf, 0),
            n as u64,
            &[],
            Some(op(0, 1)),
            Some(op(4, 1)),
        )
        .unwrap();
    // The completion says "enqueued" at once; the kernel is held on the GPU.
    let done = next(&mut ring);
    assert_eq!((done.ticket, done.outcome), (ticket, Ok(())));
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        word(&sem_mem, 1),
        0,
        "ptxd's kernel ran before its semaphore"
    );
    let mut first = [0f32; 1];
    out_mem.download(0, &mut first).unwrap();
    assert!(first[0].is_nan());
    // The session's stream releases it, then waits for ptxd's signal: no
    // reply from ptxd is involved.
    stream.write_word(&sem_mem, 0, 1).unwrap();
    stream.wait_word(&sem_mem, 4, 1).unwrap();
    stream.synchronize().unwrap();
    let mut got = vec![0f32; n];
    out_mem.download(0, &mut got).unwrap();
    for i in 0..n {
        assert_eq!(got[i].to_bits(), (a[i] + b[i]).to_bits(), "element {i}");
    }
    assert_eq!(word(&sem_mem, 1), 1);

    // A refused launch still writes its signal: a stream waiting on it is
    // released, and the completion says why.
    ring.launch_ordered(
        &add,
        &[(&a_buf, 0), (&b_buf, 0)],
        (&out_buf, 0),
        n as u64 + 1,
        &[],
        None,
        Some(op(4, 2)),
    )
    .unwrap();
    assert_eq!(reason(&next(&mut ring)), "BUFFER_TOO_SMALL");
    let deadline = Instant::now() + WAIT;
    while word(&sem_mem, 1) < 2 {
        assert!(
            Instant::now() < deadline,
            "the refused launch's signal never came"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    stream.wait_word(&sem_mem, 4, 2).unwrap();
    stream.synchronize().unwrap();
}
