//! GPU tests of `LaunchRing::launch_on_raw_stream`, what the Python client's
//! ring path calls: launches ordered on a stream the SDK did not create
//! (given as its raw `CUstream`) by one `cuStreamBatchMemOp` per call, no
//! reply awaited for the order. The session's kernel writes x, ptxd's
//! launches read it, the session's next kernel reads theirs; 16 Mi-float
//! operands, so a kernel started early reads poison.

use std::sync::Arc;

use ptxd_client::cuda::{CudaDevice, DeviceAllocation};
use ptxd_client::ring::OperandRef;
use ptxd_client::{Buffer, Client, LoadOptions, RawStreamLaunch, Session, ORDERING_BYTES};
use rand::Rng;

use super::daemon_support::Daemon;
use super::executor_client::corpus;
use super::ring::{local_add, synchronize_within};
use super::ring_completions::WAIT;
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

fn at(buffer: &Buffer) -> OperandRef {
    OperandRef {
        buffer: buffer.ring_index,
        offset: 0,
    }
}

/// Three rounds of x = a + b (this process) → y = x + b (ptxd, on the raw
/// stream) → z = y + a (this process), async and then sync; then a chain of
/// 40 dependent ptxd launches in one call on a 16-slot ring (the path that
/// waits for slots), then a refused launch whose stream is still released.
#[tokio::test(flavor = "multi_thread")]
async fn launches_on_a_raw_stream_are_ordered_by_one_batch_of_stream_operations() {
    let daemon = Daemon::start_backend("cuda", &[], |_| {});
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("gpu-raw-stream").await.unwrap();
    let dev = device();
    let ptx = corpus("add_f32_scalar.ptx");
    let add = session
        .load_ptx(
            0,
            String::from_utf8(ptx.clone()).unwrap(),
            "add_f32_scalar",
            LoadOptions::default(),
        )
        .await
        .unwrap();
    let module = dev.load_module(&ptx).unwrap();
    let local = module.function("add_f32_scalar").unwrap();
    let n = 1 << 24;
    let mut rng = rng();
    let poison = vec![f32::NAN; n];
    let (x_mem, x_buf) = gpu_f32(&session, &dev, &poison).await;
    let (y_mem, y_buf) = gpu_f32(&session, &dev, &poison).await;
    let (z_mem, _) = gpu_f32(&session, &dev, &poison).await;
    let words = Arc::new(dev.alloc(ORDERING_BYTES).unwrap());
    let words_buf = session
        .register_cuda_ipc(
            words.ipc_handle().unwrap(),
            dev.uuid(),
            ORDERING_BYTES as u64,
        )
        .await
        .unwrap();
    let stream = Arc::new(dev.stream().unwrap());
    let mut ring = session.open_ring(16, dev.uuid()).await.unwrap();
    ring.order_with(&words_buf, words.clone()).unwrap();

    for (round, sync) in [(0, false), (1, false), (2, true)] {
        let a: Vec<f32> = (0..n).map(|_| rng.random_range(-10.0..10.0)).collect();
        let b: Vec<f32> = (0..n).map(|_| rng.random_range(-10.0..10.0)).collect();
        let (a_mem, a_buf) = gpu_f32(&session, &dev, &a).await;
        let (b_mem, b_buf) = gpu_f32(&session, &dev, &b).await;
        for mem in [&x_mem, &y_mem, &z_mem] {
            mem.upload(0, &poison).unwrap();
        }
        local_add(&local, &stream, (&a_mem, &b_mem, &x_mem), n);
        let inputs = [at(&x_buf), at(&b_buf)];
        let launch = RawStreamLaunch {
            kernel: &add,
            inputs: &inputs,
            output: at(&y_buf),
            n: n as u64,
            scalars: &[],
            args: &[],
        };
        // SAFETY: the stream is this device's, alive until the test ends,
        // and only this thread uses the ring.
        let done = unsafe { ring.launch_on_raw_stream(stream.raw_handle(), &[launch], sync, WAIT) }
            .unwrap();
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].outcome, Ok(()), "round {round}");
        local_add(&local, &stream, (&y_mem, &a_mem, &z_mem), n);
        synchronize_within(stream.clone(), "the raw-stream chain");
        let mut y = vec![0f32; n];
        let mut z = vec![0f32; n];
        y_mem.download(0, &mut y).unwrap();
        z_mem.download(0, &mut z).unwrap();
        for i in 0..n {
            let want_y = (a[i] + b[i]) + b[i];
            assert_eq!(y[i].to_bits(), want_y.to_bits(), "round {round}, y[{i}]");
            assert_eq!(
                z[i].to_bits(),
                (want_y + a[i]).to_bits(),
                "round {round}, z[{i}]"
            );
        }
        session.release_buffer(&a_buf).await.unwrap();
        session.release_buffer(&b_buf).await.unwrap();
    }

    // 40 launches in one call on 16 slots: y = x + b, then y = y + b 39
    // times, each reading the one before; x written by this process first.
    let steps = 40;
    let a: Vec<f32> = (0..n).map(|_| rng.random_range(-10.0..10.0)).collect();
    let b: Vec<f32> = (0..n).map(|_| rng.random_range(-10.0..10.0)).collect();
    let (a_mem, a_buf) = gpu_f32(&session, &dev, &a).await;
    let (b_mem, b_buf) = gpu_f32(&session, &dev, &b).await;
    y_mem.upload(0, &poison).unwrap();
    local_add(&local, &stream, (&a_mem, &b_mem, &x_mem), n);
    let first = [at(&x_buf), at(&b_buf)];
    let again = [at(&y_buf), at(&b_buf)];
    let launches: Vec<RawStreamLaunch<'_>> = (0..steps)
        .map(|step| RawStreamLaunch {
            kernel: &add,
            inputs: if step == 0 { &first } else { &again },
            output: at(&y_buf),
            n: n as u64,
            scalars: &[],
            args: &[],
        })
        .collect();
    // SAFETY: as above.
    let done =
        unsafe { ring.launch_on_raw_stream(stream.raw_handle(), &launches, false, WAIT) }.unwrap();
    assert_eq!(done.len(), steps);
    assert!(done.iter().all(|c| c.outcome.is_ok()), "{done:?}");
    local_add(&local, &stream, (&y_mem, &a_mem, &z_mem), n);
    synchronize_within(stream.clone(), "the 40-launch chain");
    let mut z = vec![0f32; n];
    z_mem.download(0, &mut z).unwrap();
    for i in 0..n {
        let mut want = a[i] + b[i];
        for _ in 0..steps {
            want += b[i];
        }
        assert_eq!(z[i].to_bits(), (want + a[i]).to_bits(), "chain, z[{i}]");
    }
    drop((a_buf, b_buf));

    // A refused launch (n past the buffers): its completion says why, and
    // the stream waiting on it is released.
    let inputs = [at(&x_buf), at(&x_buf)];
    let refused = RawStreamLaunch {
        kernel: &add,
        inputs: &inputs,
        output: at(&y_buf),
        n: n as u64 + 1,
        scalars: &[],
        args: &[],
    };
    // SAFETY: as above.
    let done =
        unsafe { ring.launch_on_raw_stream(stream.raw_handle(), &[refused], false, WAIT) }.unwrap();
    let refusal = done[0].outcome.clone().unwrap_err();
    assert_eq!(refusal.reason, "BUFFER_TOO_SMALL");
    assert!(!refusal.failed);
    synchronize_within(stream.clone(), "a refused launch's waiter");
    assert_eq!(ring.outstanding(), 0);
}
