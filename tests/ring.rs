//! The launch ring end to end on the host backend: the real daemon, the
//! SDK's `LaunchRing`, shared memory in between. Every ring launch is
//! compared element by element with a reference; every refusal is checked
//! for the exact reason a unary Launch gives; a client that scribbles over
//! its ring loses its ring and nothing else; when the executor or the
//! daemon dies, the SDK releases the ring's semaphore waiters itself, with
//! the exact values the lost launches would have written.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
#[path = "support/ring_completions.rs"]
mod ring_completions;

use std::io::{Seek, SeekFrom, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{corpus, executor_pid, random_f32, Daemon};
use ptxd_client::ring::{SemaphoreOp, SemaphoreWidth};
use ptxd_client::{
    Buffer, Client, Error, HostShm, Kernel, Launch, LaunchRing, LoadOptions, OrphanCause,
    ReleasedWord, Session, SessionEvent,
};
use rand::Rng;
use ring_completions::{next, refusal};

async fn load(session: &Session, file: &str, symbol: &str) -> Kernel {
    session
        .load_ptx(0, corpus(file), symbol, LoadOptions::default())
        .await
        .unwrap()
}

async fn f32_buffer(session: &Session, values: Option<&[f32]>, n: usize) -> (HostShm, Buffer) {
    let mut shm = HostShm::create((n * 4) as u64).unwrap();
    match values {
        Some(v) => shm.write_f32(0, v).unwrap(),
        None => shm.write_f32(0, &vec![f32::NAN; n]).unwrap(),
    }
    let buffer = session.register_shm(&shm, None).await.unwrap();
    (shm, buffer)
}

#[tokio::test(flavor = "multi_thread")]
async fn ring_launches_match_the_reference_and_refusals_match_unary_launch() {
    let daemon = Daemon::start(&[]);
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("ring").await.unwrap();
    let add = load(&session, "add_f32_scalar.ptx", "add_f32_scalar").await;
    let affine = load(&session, "affine_f32_scalar.ptx", "affine_f32_scalar").await;
    let n = 5003;
    let (a, b) = (random_f32(n), random_f32(n));
    let (_a_shm, a_buf) = f32_buffer(&session, Some(&a), n).await;
    let (_b_shm, b_buf) = f32_buffer(&session, Some(&b), n).await;
    let (mut out_shm, out_buf) = f32_buffer(&session, None, n).await;
    let mut ring = session.open_ring(64, 0).await.unwrap();
    assert_eq!(ring.device_uuid(), "HOST-0");

    // Random lengths and element offsets; poison before each launch.
    let mut rng = rand::rng();
    for _ in 0..50 {
        let offset = rng.random_range(0..64usize);
        let len = rng.random_range(0..=n - offset);
        out_shm.write_f32(0, &vec![f32::NAN; n]).unwrap();
        let ticket = ring
            .launch(
                &add,
                &[(&a_buf, (offset * 4) as u64), (&b_buf, 0)],
                (&out_buf, 0),
                len as u64,
                &[],
            )
            .unwrap();
        let done = next(&mut ring);
        assert_eq!(done.ticket, ticket);
        assert_eq!(done.outcome, Ok(()));
        let out = out_shm.read_f32(0, n).unwrap();
        for i in 0..n {
            if i < len {
                assert_eq!(
                    out[i].to_bits(),
                    (a[i + offset] + b[i]).to_bits(),
                    "element {i}"
                );
            } else {
                assert!(out[i].is_nan(), "element {i} past n was written");
            }
        }
    }

    // Scalars reach the kernel as f32.
    let (p0, p1) = (
        rng.random_range(-2.0f32..2.0),
        rng.random_range(-0.5f32..0.5),
    );
    out_shm.write_f32(0, &vec![f32::NAN; n]).unwrap();
    ring.launch(&affine, &[(&a_buf, 0)], (&out_buf, 0), n as u64, &[p0, p1])
        .unwrap();
    assert_eq!(next(&mut ring).outcome, Ok(()));
    let out = out_shm.read_f32(0, n).unwrap();
    for i in 0..n {
        assert_eq!(
            out[i].to_bits(),
            a[i].mul_add(p0, p1).to_bits(),
            "affine element {i}"
        );
    }

    // Each mistake, on the ring and through unary Launch: the same reason.
    let unary = |launch: Launch, kernel: &Kernel| {
        let (session, kernel) = (&session, kernel.clone());
        async move {
            session
                .launch(&kernel, &launch.sync(true))
                .await
                .unwrap_err()
                .reason_name()
                .to_string()
        }
    };
    ring.launch(
        &add,
        &[(&a_buf, 0), (&b_buf, 0)],
        (&out_buf, 4),
        n as u64,
        &[],
    )
    .unwrap();
    assert_eq!(refusal(&next(&mut ring)), "BUFFER_TOO_SMALL");
    assert_eq!(
        unary(
            Launch::new([a_buf.at(0), b_buf.at(0)], out_buf.at(4), n as u64),
            &add
        )
        .await,
        "BUFFER_TOO_SMALL"
    );
    ring.launch(&add, &[(&a_buf, 2), (&b_buf, 0)], (&out_buf, 0), 8, &[])
        .unwrap();
    assert_eq!(refusal(&next(&mut ring)), "INVALID_ARGUMENT");
    ring.launch(&add, &[(&a_buf, 0)], (&out_buf, 0), 8, &[])
        .unwrap();
    assert_eq!(refusal(&next(&mut ring)), "ABI_MISMATCH");
    assert_eq!(
        unary(Launch::new([a_buf.at(0)], out_buf.at(0), 8), &add).await,
        "ABI_MISMATCH"
    );
    ring.launch(&affine, &[(&a_buf, 0)], (&out_buf, 0), 8, &[1.0])
        .unwrap();
    assert_eq!(refusal(&next(&mut ring)), "ABI_MISMATCH");

    // Another session's buffer: its ring index means nothing here.
    let other = client.open_session("other").await.unwrap();
    let (_o_shm, o_buf) = f32_buffer(&other, None, n).await;
    let mut foreign = o_buf.clone();
    foreign.ring_index = o_buf.ring_index + 1000;
    ring.launch(&add, &[(&a_buf, 0), (&foreign, 0)], (&out_buf, 0), 8, &[])
        .unwrap();
    assert_eq!(refusal(&next(&mut ring)), "STALE_BUFFER");

    // A released buffer and an unloaded kernel are revoked from the ring.
    let (_c_shm, c_buf) = f32_buffer(&session, Some(&b), n).await;
    ring.launch(&add, &[(&a_buf, 0), (&c_buf, 0)], (&out_buf, 0), 8, &[])
        .unwrap();
    assert_eq!(
        next(&mut ring).outcome,
        Ok(()),
        "a buffer registered after the ring opened"
    );
    session.release_buffer(&c_buf).await.unwrap();
    ring.launch(&add, &[(&a_buf, 0), (&c_buf, 0)], (&out_buf, 0), 8, &[])
        .unwrap();
    assert_eq!(refusal(&next(&mut ring)), "STALE_BUFFER");
    session.unload(&affine).await.unwrap();
    ring.launch(&affine, &[(&a_buf, 0)], (&out_buf, 0), 8, &[1.0, 2.0])
        .unwrap();
    assert_eq!(refusal(&next(&mut ring)), "STALE_KERNEL");

    // After all that, the ring still launches.
    out_shm.write_f32(0, &vec![f32::NAN; n]).unwrap();
    ring.launch(&add, &[(&a_buf, 0), (&b_buf, 0)], (&out_buf, 0), 16, &[])
        .unwrap();
    assert_eq!(next(&mut ring).outcome, Ok(()));
    let out = out_shm.read_f32(0, 16).unwrap();
    for i in 0..16 {
        assert_eq!(out[i].to_bits(), (a[i] + b[i]).to_bits());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn semaphores_order_ring_launches_and_a_refusal_still_signals() {
    let daemon = Daemon::start(&[]);
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("sem").await.unwrap();
    let add = load(&session, "add_f32_scalar.ptx", "add_f32_scalar").await;
    let n = 1024;
    let (a, b) = (random_f32(n), random_f32(n));
    let (_a_shm, a_buf) = f32_buffer(&session, Some(&a), n).await;
    let (_b_shm, b_buf) = f32_buffer(&session, Some(&b), n).await;
    let (out_shm, out_buf) = f32_buffer(&session, None, n).await;
    // Two 32-bit semaphore words, both 0, bound to the ring so that the SDK
    // can release them itself.
    let sem_shm = Arc::new(HostShm::create(64).unwrap());
    let sem = session.register_shm(&sem_shm, None).await.unwrap();
    let mut ring = session.open_ring(16, 0).await.unwrap();
    let unbound = ring.launch_ordered(
        &add,
        &[(&a_buf, 0), (&b_buf, 0)],
        (&out_buf, 0),
        8,
        &[],
        None,
        Some(SemaphoreOp {
            buffer: sem.ring_index,
            offset: 4,
            value: 1,
            width: SemaphoreWidth::Bits32,
        }),
    );
    assert!(
        matches!(unbound, Err(Error::InvalidInput(_))),
        "a signal on memory the ring cannot release: {unbound:?}"
    );
    assert_eq!(ring.outstanding(), 0, "nothing was submitted");
    ring.bind_semaphores(&sem, sem_shm.clone()).unwrap();

    let word = |offset: u64, value: u64| SemaphoreOp {
        buffer: sem.ring_index,
        offset,
        value,
        width: SemaphoreWidth::Bits32,
    };
    // Waits until word 0 >= 1, then signals word 1 = 7.
    let ticket = ring
        .launch_ordered(
            &add,
            &[(&a_buf, 0), (&b_buf, 0)],
            (&out_buf, 0),
            n as u64,
            &[],
            Some(word(0, 1)),
            Some(word(4, 7)),
        )
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        ring.poll().unwrap().is_none(),
        "the launch ran before its semaphore"
    );
    assert!(out_shm.read_f32(0, 1).unwrap()[0].is_nan());
    sem_shm.store_word(0, SemaphoreWidth::Bits32, 1).unwrap();
    let done = next(&mut ring);
    assert_eq!((done.ticket, done.outcome), (ticket, Ok(())));
    assert_eq!(sem_shm.load_word(4, SemaphoreWidth::Bits32).unwrap(), 7);
    let out = out_shm.read_f32(0, n).unwrap();
    for i in 0..n {
        assert_eq!(out[i].to_bits(), (a[i] + b[i]).to_bits(), "element {i}");
    }
    // A refused launch (too long) still writes its signal, so nothing that
    // waits on it blocks forever.
    ring.launch_ordered(
        &add,
        &[(&a_buf, 0), (&b_buf, 0)],
        (&out_buf, 0),
        n as u64 + 1,
        &[],
        None,
        Some(word(4, 9)),
    )
    .unwrap();
    assert_eq!(refusal(&next(&mut ring)), "BUFFER_TOO_SMALL");
    assert_eq!(sem_shm.load_word(4, SemaphoreWidth::Bits32).unwrap(), 9);
    // A semaphore word outside its buffer is refused.
    ring.launch_ordered(
        &add,
        &[(&a_buf, 0), (&b_buf, 0)],
        (&out_buf, 0),
        8,
        &[],
        Some(word(64, 1)),
        None,
    )
    .unwrap();
    assert_eq!(refusal(&next(&mut ring)), "BUFFER_TOO_SMALL");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_shrinks_its_ring_loses_only_its_ring() {
    let daemon = Daemon::start(&[]);
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("shrinker").await.unwrap();
    let add = load(&session, "add_f32_scalar.ptx", "add_f32_scalar").await;
    let n = 64;
    let (a, b) = (random_f32(n), random_f32(n));
    let (_a_shm, a_buf) = f32_buffer(&session, Some(&a), n).await;
    let (_b_shm, b_buf) = f32_buffer(&session, Some(&b), n).await;
    let (mut out_shm, out_buf) = f32_buffer(&session, None, n).await;
    let before = executor_pid(&client, 0).await;
    let mut ring = session.open_ring(8, 0).await.unwrap();
    ring.launch(
        &add,
        &[(&a_buf, 0), (&b_buf, 0)],
        (&out_buf, 0),
        n as u64,
        &[],
    )
    .unwrap();
    assert_eq!(next(&mut ring).outcome, Ok(()));
    ring.launch(
        &add,
        &[(&a_buf, 0), (&b_buf, 0)],
        (&out_buf, 0),
        n as u64,
        &[],
    )
    .unwrap();
    assert_eq!(next(&mut ring).outcome, Ok(()));
    // Two submissions went through: the next one's slot (index 2 of 8, at
    // 0x200 + 2 * 2048) lies past the first page. Cut the object to its
    // first page under the executor's mapping, then publish a third
    // submission by writing the head counter (0x40) through the file: the
    // executor's copy of that slot touches a page that no longer exists.
    let path = format!("/dev/shm{}", ring.shm_name());
    let mut file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(4096).unwrap();
    file.seek(SeekFrom::Start(0x40)).unwrap();
    file.write_all(&3u64.to_le_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // The executor is the same process, and serves this session over gRPC
    // and a new ring.
    assert_eq!(executor_pid(&client, 0).await, before);
    out_shm.write_f32(0, &vec![f32::NAN; n]).unwrap();
    let mut ring = session.open_ring(8, 0).await.unwrap();
    ring.launch(
        &add,
        &[(&a_buf, 0), (&b_buf, 0)],
        (&out_buf, 0),
        n as u64,
        &[],
    )
    .unwrap();
    assert_eq!(next(&mut ring).outcome, Ok(()));
    let got = out_shm.read_f32(0, n).unwrap();
    for i in 0..n {
        assert_eq!(got[i].to_bits(), (a[i] + b[i]).to_bits(), "element {i}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_scribbles_over_its_ring_loses_only_its_ring() {
    let daemon = Daemon::start(&[]);
    let client = Client::connect(&daemon.target()).await.unwrap();
    let (hostile, honest) = (
        client.open_session("hostile").await.unwrap(),
        client.open_session("honest").await.unwrap(),
    );
    let n = 256;
    let mut rings = Vec::new();
    for session in [&hostile, &honest] {
        let add = load(session, "add_f32_scalar.ptx", "add_f32_scalar").await;
        let (a, b) = (random_f32(n), random_f32(n));
        let a_buf = f32_buffer(session, Some(&a), n).await;
        let b_buf = f32_buffer(session, Some(&b), n).await;
        let out = f32_buffer(session, None, n).await;
        let ring = session.open_ring(8, 0).await.unwrap();
        rings.push((add, a, b, a_buf, b_buf, out, ring));
    }
    // The hostile client writes garbage over its ring's control words and
    // slots, then submits.
    {
        let (add, _, _, a_buf, b_buf, out, ring) = &mut rings[0];
        let path = format!("/dev/shm{}", ring.shm_name());
        let mut file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let mut garbage = vec![0u8; 4096];
        rand::rng().fill(&mut garbage[..]);
        file.seek(SeekFrom::Start(64)).unwrap();
        file.write_all(&garbage).unwrap();
        // The submission may or may not be published over the garbage; the
        // daemon must not care either way.
        let _ = ring.launch(add, &[(&a_buf.1, 0), (&b_buf.1, 0)], (&out.1, 0), 8, &[]);
        std::thread::sleep(Duration::from_millis(200));
    }
    // The daemon and the other session's ring are untouched.
    let (add, a, b, a_buf, b_buf, out, ring) = &mut rings[1];
    out.0.write_f32(0, &vec![f32::NAN; n]).unwrap();
    ring.launch(
        add,
        &[(&a_buf.1, 0), (&b_buf.1, 0)],
        (&out.1, 0),
        n as u64,
        &[],
    )
    .unwrap();
    assert_eq!(next(ring).outcome, Ok(()));
    let got = out.0.read_f32(0, n).unwrap();
    for i in 0..n {
        assert_eq!(got[i].to_bits(), (a[i] + b[i]).to_bits(), "element {i}");
    }
    // The hostile session still has gRPC.
    let (add, _, _, a_buf, b_buf, out, _) = &rings[0];
    hostile
        .launch(
            add,
            &Launch::new([a_buf.1.operand(), b_buf.1.operand()], out.1.operand(), 8).sync(true),
        )
        .await
        .unwrap();
    assert!(client.info().await.unwrap().devices[0].available);
}

/// How long after the executor's or the daemon's death the SDK has to
/// release a waiter: less than the host executor's own 10 s bound on a
/// semaphore wait, after which a live executor would signal by itself.
const RELEASE_BOUND: Duration = Duration::from_secs(8);

/// A thread waiting on a semaphore word: what it saw, and when.
type Waiter = std::thread::JoinHandle<Option<(u64, Instant)>>;

/// A waiter on the semaphore word at `offset`, as a host client waits for a
/// ring launch: polls it until it is not zero (at most 20 s) and reports
/// what it saw and when.
fn waiter(sem: Arc<HostShm>, offset: usize, width: SemaphoreWidth) -> Waiter {
    std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let value = sem.load_word(offset, width).unwrap();
            if value != 0 {
                return Some((value, Instant::now()));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        None
    })
}

/// A ring whose launches cannot complete: what the release tests share.
struct BlockedRing {
    ring: LaunchRing,
    add: Kernel,
    sem_shm: Arc<HostShm>,
    sem: Buffer,
    _buffers: Vec<(HostShm, Buffer)>,
}

/// The word a launch waits on and nobody writes (offset 0).
const NEVER: u64 = 0;
/// Words the blocked launches signal: 32-bit at 4, 64-bit at 8.
const WORD32: u64 = 4;
const WORD64: u64 = 8;
/// A word a finished sync launch signalled, then the client reset.
const SETTLED: u64 = 16;
/// What the blocked launches signal last: the values the SDK must write.
const LAST32: u64 = 8;
const LAST64: u64 = (1 << 40) | 5;

/// Opens a ring with its semaphore memory bound; runs one sync launch that
/// signals `SETTLED` (then resets it, as a client reusing the word does);
/// then submits launches that cannot run: the first waits on `NEVER` and
/// signals `WORD32 = 7`, the ones behind it signal `WORD32 = LAST32` and
/// `WORD64 = LAST64`.
async fn blocked_ring(session: &Session) -> BlockedRing {
    let add = load(session, "add_f32_scalar.ptx", "add_f32_scalar").await;
    let n = 64;
    let a = f32_buffer(session, Some(&random_f32(n)), n).await;
    let b = f32_buffer(session, Some(&random_f32(n)), n).await;
    let out = f32_buffer(session, None, n).await;
    let sem_shm = Arc::new(HostShm::create(64).unwrap());
    let sem = session.register_shm(&sem_shm, None).await.unwrap();
    let mut ring = session.open_ring(16, 0).await.unwrap();
    ring.bind_semaphores(&sem, sem_shm.clone()).unwrap();
    let op = |offset: u64, value: u64, width: SemaphoreWidth| SemaphoreOp {
        buffer: sem.ring_index,
        offset,
        value,
        width,
    };
    let inputs = [(&a.1, 0), (&b.1, 0)];
    let descriptor = ring
        .descriptor(&add, &inputs, (&out.1, 0), n as u64, &[])
        .unwrap()
        .with_sync(true)
        .with_signal(op(SETTLED, 3, SemaphoreWidth::Bits32))
        .unwrap();
    ring.submit(&descriptor).unwrap();
    assert_eq!(next(&mut ring).outcome, Ok(()));
    let settled = SETTLED as usize;
    assert_eq!(
        sem_shm.load_word(settled, SemaphoreWidth::Bits32).unwrap(),
        3
    );
    sem_shm
        .store_word(settled, SemaphoreWidth::Bits32, 0)
        .unwrap();
    let blocked = [
        (
            Some(op(NEVER, 1, SemaphoreWidth::Bits32)),
            op(WORD32, 7, SemaphoreWidth::Bits32),
        ),
        (None, op(WORD32, LAST32, SemaphoreWidth::Bits32)),
        (None, op(WORD64, LAST64, SemaphoreWidth::Bits64)),
    ];
    for (wait, signal) in blocked {
        ring.launch_ordered(
            &add,
            &inputs,
            (&out.1, 0),
            n as u64,
            &[],
            wait,
            Some(signal),
        )
        .unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(ring.poll().unwrap().is_none(), "a blocked launch completed");
    assert_eq!(ring.outstanding(), 3);
    for (word, width) in [
        (WORD32, SemaphoreWidth::Bits32),
        (WORD64, SemaphoreWidth::Bits64),
    ] {
        assert_eq!(
            sem_shm.load_word(word as usize, width).unwrap(),
            0,
            "word {word} was signalled"
        );
    }
    BlockedRing {
        ring,
        add,
        sem_shm,
        sem,
        _buffers: vec![a, b, out],
    }
}

/// The words the SDK must have released: the last value of each blocked
/// signal, and not the settled word.
fn expected_release(blocked: &BlockedRing) -> Vec<ReleasedWord> {
    vec![
        ReleasedWord {
            buffer: blocked.sem.ring_index,
            offset: WORD32,
            width: SemaphoreWidth::Bits32,
            value: LAST32,
            written: Ok(()),
        },
        ReleasedWord {
            buffer: blocked.sem.ring_index,
            offset: WORD64,
            width: SemaphoreWidth::Bits64,
            value: LAST64,
            written: Ok(()),
        },
    ]
}

/// Joins the two waiters: each saw exactly the value the SDK promised,
/// within [`RELEASE_BOUND`] of `killed`.
fn assert_waiters_released(waiters: Vec<(u64, Waiter)>, killed: Instant) {
    for (expected, waiter) in waiters {
        let (value, at) = waiter
            .join()
            .unwrap()
            .unwrap_or_else(|| panic!("the waiter for {expected} was never released"));
        assert_eq!(value, expected, "the waiter saw another value");
        assert!(
            at.duration_since(killed) < RELEASE_BOUND,
            "released {:?} after the kill",
            at.duration_since(killed)
        );
    }
}

fn start_waiters(sem_shm: &Arc<HostShm>) -> Vec<(u64, Waiter)> {
    vec![
        (
            LAST32,
            waiter(sem_shm.clone(), WORD32 as usize, SemaphoreWidth::Bits32),
        ),
        (
            LAST64,
            waiter(sem_shm.clone(), WORD64 as usize, SemaphoreWidth::Bits64),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn when_the_executor_dies_the_sdk_releases_the_rings_waiters() {
    let daemon = Daemon::start(&[]);
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("release-executor").await.unwrap();
    let mut blocked = blocked_ring(&session).await;
    let waiters = start_waiters(&blocked.sem_shm);
    let mut events = session.events();
    let generation = blocked.ring.generation();
    let executor = client.info().await.unwrap().devices[0].clone();
    assert_eq!(executor.generation, generation);
    let pid = executor_pid(&client, 0).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let killed = Instant::now();
    // The words are written before the restart reaches the session's
    // events, so a caller that reacts to it finds them released.
    let new_generation = tokio::time::timeout(RELEASE_BOUND, async {
        loop {
            if let Ok(SessionEvent::ExecutorRestarted { new_generation, .. }) = events.recv().await
            {
                return new_generation;
            }
        }
    })
    .await
    .expect("an ExecutorRestarted event");
    let words = [
        (WORD32, SemaphoreWidth::Bits32),
        (WORD64, SemaphoreWidth::Bits64),
    ];
    let seen: Vec<u64> = words
        .iter()
        .map(|(offset, width)| blocked.sem_shm.load_word(*offset as usize, *width).unwrap())
        .collect();
    assert_eq!(seen, [LAST32, LAST64], "released before the event");
    assert_waiters_released(waiters, killed);

    let orphaned = blocked.ring.orphaned().expect("the ring is orphaned");
    assert_eq!(
        orphaned.cause,
        OrphanCause::ExecutorRestarted {
            device_uuid: "HOST-0".into(),
            old_generation: generation,
            new_generation,
            cause: "exited".into(),
        }
    );
    assert_eq!(orphaned.released, expected_release(&blocked));
    // The settled word was proven written by its sync completion: the SDK
    // left the client's reset alone.
    assert_eq!(
        blocked
            .sem_shm
            .load_word(SETTLED as usize, SemaphoreWidth::Bits32)
            .unwrap(),
        0
    );
    // The ring takes nothing more, and says why rather than waiting.
    let (a, b) = (&blocked._buffers[0].1, &blocked._buffers[1].1);
    let refused = blocked
        .ring
        .launch(&blocked.add, &[(a, 0), (b, 0)], (b, 0), 8, &[]);
    assert!(
        matches!(
            refused,
            Err(Error::RingOrphaned(OrphanCause::ExecutorRestarted { .. }))
        ),
        "{refused:?}"
    );
    let waited = blocked.ring.wait(Duration::from_secs(1));
    assert!(matches!(waited, Err(Error::RingOrphaned(_))), "{waited:?}");

    // A new ring in the new generation works, with the kernel reloaded.
    session.reload(&blocked.add).await.unwrap();
    let mut ring = session.open_ring(16, 0).await.unwrap();
    assert_eq!(ring.generation(), new_generation);
    ring.bind_semaphores(&blocked.sem, blocked.sem_shm.clone())
        .unwrap();
    let descriptor = ring
        .descriptor(&blocked.add, &[(a, 0), (b, 0)], (b, 0), 8, &[])
        .unwrap()
        .with_sync(true)
        .with_signal(SemaphoreOp {
            buffer: blocked.sem.ring_index,
            offset: SETTLED,
            value: 11,
            width: SemaphoreWidth::Bits32,
        })
        .unwrap();
    ring.submit(&descriptor).unwrap();
    assert_eq!(next(&mut ring).outcome, Ok(()));
    assert_eq!(
        blocked
            .sem_shm
            .load_word(SETTLED as usize, SemaphoreWidth::Bits32)
            .unwrap(),
        11
    );
    assert!(ring.orphaned().is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn when_the_daemon_dies_the_sdk_releases_the_rings_waiters() {
    let mut daemon = Daemon::start(&[]);
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("release-daemon").await.unwrap();
    let mut blocked = blocked_ring(&session).await;
    let waiters = start_waiters(&blocked.sem_shm);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.pid()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let killed = Instant::now();
    assert_waiters_released(waiters, killed);
    let orphaned = blocked.ring.orphaned().expect("the ring is orphaned");
    assert!(
        matches!(orphaned.cause, OrphanCause::SessionEnded { .. }),
        "{:?}",
        orphaned.cause
    );
    assert_eq!(orphaned.released, expected_release(&blocked));
    assert_eq!(
        blocked
            .sem_shm
            .load_word(SETTLED as usize, SemaphoreWidth::Bits32)
            .unwrap(),
        0
    );
    let (a, b) = (&blocked._buffers[0].1, &blocked._buffers[1].1);
    let refused = blocked
        .ring
        .launch(&blocked.add, &[(a, 0), (b, 0)], (b, 0), 8, &[]);
    assert!(
        matches!(
            refused,
            Err(Error::RingOrphaned(OrphanCause::SessionEnded { .. }))
        ),
        "{refused:?}"
    );
    assert!(!session.is_open());
    daemon.wait(Duration::from_secs(5));
}
