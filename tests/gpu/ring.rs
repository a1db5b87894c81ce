//! GPU tests of the launch ring: the real daemon on the CUDA backend, the
//! SDK's `LaunchRing`, tensors in this process's IPC-exported memory, and
//! ordering between the session's stream and ptxd's through semaphore words
//! in device memory, without waiting for any reply, and the SDK releasing a
//! stream that waits on a signal when the executor dies; the SDK's
//! ordering API (`order_with`, `after`, `stream_wait`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ptxd_client::cuda::{ClientStream, CudaDevice, DeviceAllocation};
use ptxd_client::ring::{SemaphoreOp, SemaphoreWidth};
use ptxd_client::{
    Buffer, Client, Error, FdBufferSpec, LoadOptions, OrphanCause, Session, ORDERING_BYTES,
};
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

/// Each ring kernel launches through a parameter block prepared once per
/// grant and patched per launch: a burst that alternates two kernels, each
/// launch with its own output chunk, input offset and scalars, kept at the
/// ring's depth, computes every chunk exactly as its own launch says (no
/// operand, count or scalar of an earlier launch survives a patch); the
/// answers come back in order, each once.
#[tokio::test(flavor = "multi_thread")]
async fn a_burst_of_two_kernels_patches_each_launchs_own_params() {
    let daemon = Daemon::start_backend("cuda", &[], |_| {});
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("gpu-ring-burst").await.unwrap();
    let dev = device();
    let load = |file: &'static str, symbol: &'static str| {
        let session = &session;
        async move {
            session
                .load_ptx(
                    0,
                    String::from_utf8(corpus(file)).unwrap(),
                    symbol,
                    LoadOptions::default(),
                )
                .await
                .unwrap()
        }
    };
    let add = load("add_f32_scalar.ptx", "add_f32_scalar").await;
    let affine = load("affine_f32_scalar.ptx", "affine_f32_scalar").await;
    let mut rng = rng();
    let (chunk, launches, depth) = (4099usize, 400usize, 32u64);
    let a: Vec<f32> = (0..chunk * launches + 64)
        .map(|_| rng.random_range(-10.0..10.0))
        .collect();
    let b: Vec<f32> = (0..chunk).map(|_| rng.random_range(-10.0..10.0)).collect();
    let (_a_mem, a_buf) = gpu_f32(&session, &dev, &a).await;
    let (_b_mem, b_buf) = gpu_f32(&session, &dev, &b).await;
    let (out_mem, out_buf) = gpu_f32(&session, &dev, &vec![f32::NAN; chunk * launches]).await;
    let mut ring = session.open_ring(depth as u32, dev.uuid()).await.unwrap();
    // Per launch: None for add with an input shift, Some((scale, bias)) for
    // affine.
    let mut shots: Vec<(usize, Option<(f32, f32)>)> = Vec::with_capacity(launches);
    let mut pending = std::collections::VecDeque::new();
    for index in 0..launches {
        while ring.outstanding() >= depth {
            let done = next(&mut ring);
            assert_eq!(Some(done.ticket), pending.pop_front(), "out of order");
            assert_eq!(done.outcome, Ok(()));
        }
        let at = (index * chunk * 4) as u64;
        let shift = rng.random_range(0..64usize);
        let ticket = if rng.random_range(0..3) == 0 {
            let (scale, bias) = (
                rng.random_range(-2.0f32..2.0),
                rng.random_range(-1.0f32..1.0),
            );
            shots.push((shift, Some((scale, bias))));
            ring.launch(
                &affine,
                &[(&a_buf, at + 4 * shift as u64)],
                (&out_buf, at),
                chunk as u64,
                &[scale, bias],
            )
        } else {
            shots.push((shift, None));
            ring.launch(
                &add,
                &[(&a_buf, at + 4 * shift as u64), (&b_buf, 0)],
                (&out_buf, at),
                chunk as u64,
                &[],
            )
        }
        .unwrap();
        pending.push_back(ticket);
    }
    while let Some(ticket) = pending.pop_front() {
        let done = next(&mut ring);
        assert_eq!(done.ticket, ticket, "out of order");
        assert_eq!(done.outcome, Ok(()));
    }
    assert!(ring.wait(Duration::from_millis(200)).unwrap().is_none());
    // A last sync launch drains the stream before the read-back.
    let descriptor = ring
        .descriptor(&add, &[(&b_buf, 0), (&b_buf, 0)], (&b_buf, 0), 0, &[])
        .unwrap()
        .with_sync(true);
    ring.submit(&descriptor).unwrap();
    assert_eq!(next(&mut ring).outcome, Ok(()));
    let mut got = vec![0f32; chunk * launches];
    out_mem.download(0, &mut got).unwrap();
    for (index, (shift, affine)) in shots.iter().enumerate() {
        for i in 0..chunk {
            let x = a[index * chunk + shift + i];
            let got = got[index * chunk + i];
            match affine {
                Some((scale, bias)) => {
                    let (fused, plain) = (x.mul_add(*scale, *bias), x * scale + bias);
                    assert!(
                        got.to_bits() == fused.to_bits() || got.to_bits() == plain.to_bits(),
                        "launch {index} (affine), element {i}: {got}"
                    );
                }
                None => assert_eq!(
                    got.to_bits(),
                    (x + b[i]).to_bits(),
                    "launch {index} (add), element {i}"
                ),
            }
        }
    }
}

/// Ring launches go through graphs re-aimed per launch: a chain in which
/// each launch reads what the one before it wrote (two buffers in turn),
/// over two kernels, random counts (so grids) and scalars, sent back to
/// back with the ring full, the watchdog's markers in the kernels' own
/// submissions. Every element of both buffers is compared with a host
/// simulation of the chain, exact (integers in f32): a launch run out of
/// order, with another launch's params, on a stale grid or not at all
/// changes some element.
#[tokio::test(flavor = "multi_thread")]
async fn a_chain_of_ring_launches_runs_in_order_with_each_launchs_own_params() {
    let daemon = Daemon::start_backend("cuda", &[], |_| {});
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("gpu-ring-chain").await.unwrap();
    let dev = device();
    let load = |file: &'static str, symbol: &'static str| {
        let session = &session;
        async move {
            session
                .load_ptx(
                    0,
                    String::from_utf8(corpus(file)).unwrap(),
                    symbol,
                    LoadOptions::default(),
                )
                .await
                .unwrap()
        }
    };
    let add = load("add_f32_scalar.ptx", "add_f32_scalar").await;
    let affine = load("affine_f32_scalar.ptx", "affine_f32_scalar").await;
    let mut rng = rng();
    let (len, launches, depth) = (70_000usize, 3000usize, 64u64);
    // Integers both (a NaN's payload is not the same on the GPU and here):
    // an element no launch wrote keeps its own start value.
    let mut host: [Vec<f32>; 2] = [
        (0..len)
            .map(|_| rng.random_range(-64i32..64) as f32)
            .collect(),
        (0..len)
            .map(|_| rng.random_range(-64i32..64) as f32)
            .collect(),
    ];
    let addend: Vec<f32> = (0..len)
        .map(|_| rng.random_range(-8i32..=8) as f32)
        .collect();
    let (mem0, buf0) = gpu_f32(&session, &dev, &host[0]).await;
    let (mem1, buf1) = gpu_f32(&session, &dev, &host[1]).await;
    let (_addend_mem, addend_buf) = gpu_f32(&session, &dev, &addend).await;
    let buffers = [&buf0, &buf1];
    let mut ring = session.open_ring(depth as u32, dev.uuid()).await.unwrap();
    let mut pending = std::collections::VecDeque::new();
    for index in 0..launches {
        while ring.outstanding() >= depth {
            let done = next(&mut ring);
            assert_eq!(Some(done.ticket), pending.pop_front(), "out of order");
            assert_eq!(done.outcome, Ok(()), "launch {index}");
        }
        let (src, dst) = (index % 2, (index + 1) % 2);
        // Mostly large counts, some tiny: grids from 1 block to 274.
        let n = if rng.random_range(0..4) == 0 {
            rng.random_range(1..=600usize)
        } else {
            rng.random_range(1..=len)
        };
        let [first, second] = &mut host;
        let (from, to) = if src == 0 {
            (&first[..n], &mut second[..n])
        } else {
            (&second[..n], &mut first[..n])
        };
        let ticket = if rng.random_range(0..2) == 0 {
            let scale = if rng.random_range(0..2) == 0 {
                1.0f32
            } else {
                -1.0
            };
            let bias = rng.random_range(-8i32..=8) as f32;
            for (to, from) in to.iter_mut().zip(from) {
                *to = from * scale + bias;
            }
            ring.launch(
                &affine,
                &[(buffers[src], 0)],
                (buffers[dst], 0),
                n as u64,
                &[scale, bias],
            )
        } else {
            for ((to, from), addend) in to.iter_mut().zip(from).zip(&addend) {
                *to = from + addend;
            }
            ring.launch(
                &add,
                &[(buffers[src], 0), (&addend_buf, 0)],
                (buffers[dst], 0),
                n as u64,
                &[],
            )
        }
        .unwrap();
        pending.push_back(ticket);
    }
    while let Some(ticket) = pending.pop_front() {
        let done = next(&mut ring);
        assert_eq!(done.ticket, ticket, "out of order");
        assert_eq!(done.outcome, Ok(()));
    }
    // A last sync launch (n = 0: no kernel) drains the stream.
    let descriptor = ring
        .descriptor(
            &add,
            &[(&addend_buf, 0), (&addend_buf, 0)],
            (&addend_buf, 0),
            0,
            &[],
        )
        .unwrap()
        .with_sync(true);
    ring.submit(&descriptor).unwrap();
    assert_eq!(next(&mut ring).outcome, Ok(()));
    for (which, mem) in [&mem0, &mem1].into_iter().enumerate() {
        let mut got = vec![0f32; len];
        mem.download(0, &mut got).unwrap();
        for i in 0..len {
            assert_eq!(
                got[i].to_bits(),
                host[which][i].to_bits(),
                "buffer {which}, element {i}: {} against {}",
                got[i],
                host[which][i]
            );
        }
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

/// A kernel of this process on `stream`: `out = a + b` over `n` floats.
pub(super) fn local_add(
    f: &ptxd_client::cuda::LocalFunction<'_>,
    stream: &ClientStream,
    (a, b, out): (&DeviceAllocation, &DeviceAllocation, &DeviceAllocation),
    n: usize,
) {
    let (mut pa, mut pb, mut po, mut nn) =
        (a.device_ptr(), b.device_ptr(), out.device_ptr(), n as i64);
    let mut params: [*mut std::ffi::c_void; 4] = [
        (&mut pa as *mut u64).cast(),
        (&mut pb as *mut u64).cast(),
        (&mut po as *mut u64).cast(),
        (&mut nn as *mut i64).cast(),
    ];
    // SAFETY: add_f32_scalar takes (ptr, ptr, ptr, long long); every
    // allocation holds n floats and outlives the stream's work (the test
    // synchronizes the stream before dropping them).
    unsafe { f.launch(stream, n.div_ceil(256) as u32, 256, &mut params) }.unwrap();
}

/// Synchronizes `stream` on a thread of its own and fails the test if that
/// takes longer than `WAIT` (a stream blocked for good would hang it).
pub(super) fn synchronize_within(stream: Arc<ClientStream>, what: &str) {
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || done.send(stream.synchronize()));
    match finished.recv_timeout(WAIT) {
        Ok(result) => result.unwrap(),
        Err(_) => panic!("{what}: the stream was still blocked after {WAIT:?}"),
    }
}

/// The SDK's ordering API: the session's kernel → `ring.after` → ptxd's
/// kernel → `ring.stream_wait` → the session's kernel, three rounds, no
/// reply awaited anywhere; 64 MiB operands, so a kernel started early would
/// read poison. Then a refused launch's ticket still releases a waiter, and
/// misuse is refused before anything is enqueued.
#[tokio::test(flavor = "multi_thread")]
async fn after_and_stream_wait_order_the_sessions_kernels_around_ptxds() {
    let daemon = Daemon::start_backend("cuda", &[], |_| {});
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("gpu-ordering").await.unwrap();
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

    // Not ordered yet: the ordering calls say so.
    let unordered = ring.stream_wait(1, &stream).unwrap_err();
    assert!(
        matches!(unordered, Error::InvalidInput(ref m) if m.contains("not ordered")),
        "{unordered:?}"
    );
    ring.order_with(&words_buf, words.clone()).unwrap();
    let twice = ring.order_with(&words_buf, words.clone()).unwrap_err();
    assert!(
        matches!(twice, Error::InvalidInput(ref m) if m.contains("already ordered")),
        "{twice:?}"
    );

    let chain = Chain {
        session: &session,
        dev: &dev,
        add: &add,
        local: &local,
        stream: &stream,
        x: (&x_mem, &x_buf),
        y: (&y_mem, &y_buf),
        z: &z_mem,
        n,
    };
    for round in 0..3 {
        let ticket = chain.round(&mut ring, round).await;
        assert_eq!(
            word64(&words, 0),
            ticket,
            "the done word holds the last ticket"
        );
    }

    // A refused launch (n past the buffers) still signals its ticket: the
    // stream waiting on it is released, and the completion says why.
    let refused = ring
        .launch(
            &add,
            &[(&x_buf, 0), (&x_buf, 0)],
            (&y_buf, 0),
            n as u64 + 1,
            &[],
        )
        .unwrap();
    ring.stream_wait(refused, &stream).unwrap();
    synchronize_within(stream.clone(), "a refused launch's waiter");
    assert_eq!(reason(&next(&mut ring)), "BUFFER_TOO_SMALL");
    assert_eq!(word64(&words, 0), refused);

    // A ticket not launched yet, and semaphores of the caller's own on an
    // ordered ring, are refused before anything is enqueued.
    let future = ring.stream_wait(refused + 1, &stream).unwrap_err();
    assert!(
        matches!(future, Error::InvalidInput(ref m) if m.contains("was not launched")),
        "{future:?}"
    );
    let own = ring
        .launch_ordered(
            &add,
            &[(&x_buf, 0), (&x_buf, 0)],
            (&y_buf, 0),
            1,
            &[],
            None,
            Some(SemaphoreOp {
                buffer: words_buf.ring_index,
                offset: 0,
                value: 1,
                width: SemaphoreWidth::Bits64,
            }),
        )
        .unwrap_err();
    assert!(
        matches!(own, Error::InvalidInput(ref m) if m.contains("no semaphores of their own")),
        "{own:?}"
    );
    assert_eq!(ring.outstanding(), 0);

    // The same chain on words passed by descriptor (`cuMemCreate` memory,
    // as a client without CUDA IPC has), on a new ring.
    drop(ring);
    let fd_words = Arc::new(dev.alloc_exportable(ORDERING_BYTES).unwrap());
    let fd = fd_words.export_fd().unwrap();
    let fd_words_buf = session
        .register_fd_buffer(
            std::os::fd::AsFd::as_fd(&fd),
            ORDERING_BYTES as u64,
            FdBufferSpec {
                device_uuid: Some(dev.uuid().to_owned()),
                allocation_size: Some(fd_words.allocation_size()),
                ..FdBufferSpec::default()
            },
        )
        .await
        .unwrap();
    drop(fd);
    let mut ring = session.open_ring(16, dev.uuid()).await.unwrap();
    ring.order_with(&fd_words_buf, fd_words.clone()).unwrap();
    for round in 3..5 {
        let ticket = chain.round(&mut ring, round).await;
        let mut done = [0u64; 1];
        fd_words.download(0, &mut done).unwrap();
        assert_eq!(done[0], ticket, "the fd words' done word holds the ticket");
    }
}

/// What a round of the ordered chain needs: the session, its kernel in
/// ptxd and in this process, the session's stream, and x, y, z of `n`
/// floats.
struct Chain<'t> {
    session: &'t Session,
    dev: &'t CudaDevice,
    add: &'t ptxd_client::Kernel,
    local: &'t ptxd_client::cuda::LocalFunction<'t>,
    stream: &'t Arc<ClientStream>,
    x: (&'t DeviceAllocation, &'t Buffer),
    y: (&'t DeviceAllocation, &'t Buffer),
    z: &'t DeviceAllocation,
    n: usize,
}

impl Chain<'_> {
    /// x = a + b (this process), then `ring.after`, y = x + b (ptxd, on the
    /// ring), `ring.stream_wait`, z = y + a (this process), over fresh
    /// random a and b and poisoned x, y, z; every element of y and z
    /// checked. Returns ptxd's launch's ticket.
    async fn round(&self, ring: &mut ptxd_client::LaunchRing, round: usize) -> u64 {
        let n = self.n;
        let mut rng = rng();
        let a: Vec<f32> = (0..n).map(|_| rng.random_range(-10.0..10.0)).collect();
        let b: Vec<f32> = (0..n).map(|_| rng.random_range(-10.0..10.0)).collect();
        let (a_mem, a_buf) = gpu_f32(self.session, self.dev, &a).await;
        let (b_mem, b_buf) = gpu_f32(self.session, self.dev, &b).await;
        let poison = vec![f32::NAN; n];
        for mem in [self.x.0, self.y.0, self.z] {
            mem.upload(0, &poison).unwrap();
        }
        local_add(self.local, self.stream, (&a_mem, &b_mem, self.x.0), n);
        ring.after(self.stream).unwrap();
        let ticket = ring
            .launch(
                self.add,
                &[(self.x.1, 0), (&b_buf, 0)],
                (self.y.1, 0),
                n as u64,
                &[],
            )
            .unwrap();
        ring.stream_wait(ticket, self.stream).unwrap();
        local_add(self.local, self.stream, (self.y.0, &a_mem, self.z), n);
        synchronize_within(self.stream.clone(), "the ordered chain");
        let done = next(ring);
        assert_eq!((done.ticket, done.outcome), (ticket, Ok(())));
        let mut y = vec![0f32; n];
        let mut z = vec![0f32; n];
        self.y.0.download(0, &mut y).unwrap();
        self.z.download(0, &mut z).unwrap();
        for i in 0..n {
            let want_y = (a[i] + b[i]) + b[i];
            assert_eq!(y[i].to_bits(), want_y.to_bits(), "round {round}, y[{i}]");
            assert_eq!(
                z[i].to_bits(),
                (want_y + a[i]).to_bits(),
                "round {round}, z[{i}]"
            );
        }
        self.session.release_buffer(&a_buf).await.unwrap();
        self.session.release_buffer(&b_buf).await.unwrap();
        ticket
    }
}

/// How long after the executor's death the SDK has to release the session's
/// stream: a CUDA executor restarts in about a second (context creation and
/// the re-opening of the session's IPC buffers).
const RELEASE_BOUND: Duration = Duration::from_secs(15);

/// The 64-bit word at byte `offset` of `mem`.
fn word64(mem: &DeviceAllocation, offset: usize) -> u64 {
    let mut out = [0u64; 1];
    mem.download(offset, &mut out).unwrap();
    out[0]
}

/// Set in the child process that runs the release scenario.
const RELEASE_CHILD_ENV: &str = "PTXD_GPU_RING_RELEASE_CHILD";

/// The scenario blocks a stream of this process's context in
/// `cuStreamWaitValue32` until the SDK releases it, and a context-wide call
/// of another test (`cuMemFree`, `cuCtxSynchronize`) in the same process
/// would wait on that stream while holding the driver's locks: so it runs
/// in a child process of its own (this test, re-executed).
#[test]
fn when_the_executor_dies_the_sdk_releases_a_stream_waiting_on_a_ring_signal() {
    if std::env::var_os(RELEASE_CHILD_ENV).is_some() {
        return tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(release_scenario());
    }
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "ring::when_the_executor_dies_the_sdk_releases_a_stream_waiting_on_a_ring_signal",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(RELEASE_CHILD_ENV, "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if started.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the release scenario did not finish within 120 s (a stream stayed blocked)");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "the release scenario failed: {}\nstdout:\n{stdout}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}

async fn release_scenario() {
    let daemon = Daemon::start_backend("cuda", &[], |_| {});
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("gpu-release").await.unwrap();
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
    let n = 1 << 16;
    let (_a_mem, a_buf) = gpu_f32(&session, &dev, &vec![1.0; n]).await;
    let (_b_mem, b_buf) = gpu_f32(&session, &dev, &vec![2.0; n]).await;
    let (_out_mem, out_buf) = gpu_f32(&session, &dev, &vec![f32::NAN; n]).await;
    // Word 0 (u32): never written, ptxd's launch waits on it. Word 1 (u32)
    // and the u64 at byte 8: signalled by launches that cannot run. Word 4
    // (u32, byte 16): signalled by a sync launch that finished.
    let sem_mem = Arc::new(dev.alloc(256).unwrap());
    sem_mem.upload(0, &[0u32; 64]).unwrap();
    let sem = session
        .register_cuda_ipc(sem_mem.ipc_handle().unwrap(), dev.uuid(), 256)
        .await
        .unwrap();
    let op = |offset: u64, value: u64, width: SemaphoreWidth| SemaphoreOp {
        buffer: sem.ring_index,
        offset,
        value,
        width,
    };
    let mut ring = session.open_ring(16, dev.uuid()).await.unwrap();
    ring.bind_semaphores(&sem, sem_mem.clone()).unwrap();
    let inputs = [(&a_buf, 0), (&b_buf, 0)];

    // A sync launch's Ok proves its signal written: the SDK leaves that word
    // alone afterwards (the client resets it here, as one reusing it does).
    let descriptor = ring
        .descriptor(&add, &inputs, (&out_buf, 0), n as u64, &[])
        .unwrap()
        .with_sync(true)
        .with_signal(op(16, 3, SemaphoreWidth::Bits32))
        .unwrap();
    ring.submit(&descriptor).unwrap();
    assert_eq!(next(&mut ring).outcome, Ok(()));
    assert_eq!(word(&sem_mem, 4), 3);
    sem_mem.upload(16, &[0u32]).unwrap();

    // Three async launches held on the GPU behind word 0: each completes Ok
    // at once (enqueued), yet none of their signals is written, and they die
    // with the executor.
    let last64 = (1u64 << 40) | 5;
    let blocked = [
        (
            Some(op(0, 1, SemaphoreWidth::Bits32)),
            op(4, 5, SemaphoreWidth::Bits32),
        ),
        (None, op(4, 6, SemaphoreWidth::Bits32)),
        (None, op(8, last64, SemaphoreWidth::Bits64)),
    ];
    for (wait, signal) in blocked {
        ring.launch_ordered(
            &add,
            &inputs,
            (&out_buf, 0),
            n as u64,
            &[],
            wait,
            Some(signal),
        )
        .unwrap();
        assert_eq!(next(&mut ring).outcome, Ok(()), "enqueued");
    }

    // The session's own stream waits for the last value of word 1, with
    // cuStreamWaitValue32, and a thread blocks on it.
    let stream = dev.stream().unwrap();
    stream.wait_word(&sem_mem, 4, 6).unwrap();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let syncer = std::thread::spawn(move || {
        let synced = stream.synchronize();
        let _ = done_tx.send((synced.map_err(|e| e.to_string()), Instant::now()));
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        done_rx.try_recv().is_err(),
        "the stream did not wait for the signal"
    );
    assert_eq!((word(&sem_mem, 1), word64(&sem_mem, 8)), (0, 0));

    let generation = ring.generation();
    let pid = client
        .raw()
        .get_info(ptxd_proto::v1::GetInfoRequest {})
        .await
        .unwrap()
        .into_inner()
        .devices[0]
        .executor_pid;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let killed = Instant::now();
    let (synced, at) = done_rx
        .recv_timeout(RELEASE_BOUND)
        .expect("the session's stream was released");
    syncer.join().unwrap();
    assert_eq!(synced, Ok(()));
    assert!(at.duration_since(killed) < RELEASE_BOUND);
    // Exactly the values the lost launches would have left. The SDK writes
    // them in submission order, so the stream (waiting on word 1) may be
    // released a moment before the last word is written: wait for it.
    assert_eq!(word(&sem_mem, 1), 6);
    let written = Instant::now();
    while word64(&sem_mem, 8) != last64 && written.elapsed() < RELEASE_BOUND {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(word64(&sem_mem, 8), last64);
    assert_eq!(word(&sem_mem, 4), 0, "the settled word was written again");
    let orphaned = ring.orphaned().expect("the ring is orphaned");
    assert!(
        matches!(
            &orphaned.cause,
            OrphanCause::ExecutorRestarted { device_uuid, old_generation, .. }
                if device_uuid == dev.uuid() && *old_generation == generation
        ),
        "{:?}",
        orphaned.cause
    );
    let released: Vec<_> = orphaned
        .released
        .iter()
        .map(|w| (w.buffer, w.offset, w.width, w.value, w.written.clone()))
        .collect();
    assert_eq!(
        released,
        [
            (sem.ring_index, 4, SemaphoreWidth::Bits32, 6, Ok(())),
            (sem.ring_index, 8, SemaphoreWidth::Bits64, last64, Ok(())),
        ]
    );
    let refused = ring.launch(&add, &inputs, (&out_buf, 0), 8, &[]);
    assert!(
        matches!(refused, Err(Error::RingOrphaned(_))),
        "{refused:?}"
    );
}

/// An async ring launch is answered once it passed its checks, before the
/// ring's thread enqueues it; a unary launch the client sends after that
/// answer, on the same session, still runs after it (the executor's
/// request loop takes the ring's table lock, which the ring's thread holds
/// from before the answer until its enqueue): no semaphore, no sync launch
/// on the ring, every element of the unary launch's output checked, many
/// rounds.
#[tokio::test(flavor = "multi_thread")]
async fn a_unary_launch_sent_after_a_ring_answer_runs_after_that_launch() {
    let daemon = Daemon::start_backend("cuda", &[], |_| {});
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("gpu-ring-then-unary").await.unwrap();
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
    let nan = vec![f32::NAN; n];
    let (a_mem, a_buf) = gpu_f32(&session, &dev, &nan).await;
    let (b_mem, b_buf) = gpu_f32(&session, &dev, &nan).await;
    let (mid_mem, mid_buf) = gpu_f32(&session, &dev, &nan).await;
    let (out_mem, out_buf) = gpu_f32(&session, &dev, &nan).await;
    let mut ring = session.open_ring(64, dev.uuid()).await.unwrap();
    for round in 0..40 {
        let a: Vec<f32> = (0..n).map(|_| rng.random_range(-10.0..10.0)).collect();
        let b: Vec<f32> = (0..n).map(|_| rng.random_range(-10.0..10.0)).collect();
        a_mem.upload(0, &a).unwrap();
        b_mem.upload(0, &b).unwrap();
        mid_mem.upload(0, &nan).unwrap();
        out_mem.upload(0, &nan).unwrap();
        ring.launch(
            &add,
            &[(&a_buf, 0), (&b_buf, 0)],
            (&mid_buf, 0),
            n as u64,
            &[],
        )
        .unwrap();
        assert_eq!(next(&mut ring).outcome, Ok(()), "round {round}");
        session
            .launch(
                &add,
                &ptxd_client::Launch::new(
                    [mid_buf.operand(), b_buf.operand()],
                    out_buf.operand(),
                    n as u64,
                )
                .sync(true),
            )
            .await
            .unwrap();
        let mut got = vec![0f32; n];
        out_mem.download(0, &mut got).unwrap();
        for i in 0..n {
            assert_eq!(
                got[i].to_bits(),
                ((a[i] + b[i]) + b[i]).to_bits(),
                "round {round} element {i}: the unary launch ran before the ring's"
            );
        }
    }
}
