//! The launch ring end to end on the host backend: the real daemon, the
//! SDK's `LaunchRing`, shared memory in between. Every ring launch is
//! compared element by element with a reference; every refusal is checked
//! for the exact reason a unary Launch gives; a client that scribbles over
//! its ring loses its ring and nothing else; when the executor or the
//! daemon dies, the SDK releases the ring's semaphore waiters itself, with
//! the exact values the lost launches would have written.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support::processes::cpu_time;
use crate::support::ring_completions;

use std::io::{Seek, SeekFrom, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::{executor_pid, f32_buffer, load, random_f32, Daemon};
use ptxd_client::ring::{SemaphoreOp, SemaphoreWidth};
use ptxd_client::{
    Buffer, Client, Error, HostShm, Kernel, Launch, LaunchRing, OrphanCause, ReleasedWord, Session,
    SessionEvent,
};
use rand::Rng;
use ring_completions::{next, refusal};

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
    // 0x300 + 2 * 2048) lies past the first page. Cut the object to its
    // first page under the executor's mapping: the executor's next poll
    // loads that slot's sequence word (layout 2 publishes a slot by a word
    // inside it), on a page that no longer exists.
    let path = format!("/dev/shm{}", ring.shm_name());
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(4096).unwrap();
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

/// Another session, launching over gRPC throughout a test: every result is
/// compared element by element with the reference.
struct Bystander {
    session: Session,
    affine: Kernel,
}

impl Bystander {
    async fn new(client: &Client) -> Bystander {
        let session = client.open_session("bystander").await.unwrap();
        let affine = load(&session, "affine_f32_scalar.ptx", "affine_f32_scalar").await;
        Bystander { session, affine }
    }

    /// One launch over fresh random data, checked; returns how long it took
    /// from its registration to its release.
    async fn check(&self) -> Duration {
        let started = Instant::now();
        let n = rand::rng().random_range(1..4097usize);
        let x = random_f32(n);
        let (_x_shm, x_buf) = f32_buffer(&self.session, Some(&x), n).await;
        let (y_shm, y_buf) = f32_buffer(&self.session, None, n).await;
        let (a, b) = (rand::random::<f32>() * 4.0 - 2.0, rand::random::<f32>());
        self.session
            .launch(
                &self.affine,
                &Launch::new([x_buf.operand()], y_buf.operand(), n as u64)
                    .params([f64::from(a), f64::from(b)])
                    .sync(true),
            )
            .await
            .unwrap();
        let y = y_shm.read_f32(0, n).unwrap();
        for i in 0..n {
            let (fused, plain) = (x[i].mul_add(a, b), x[i] * a + b);
            assert!(
                y[i].to_bits() == fused.to_bits() || y[i].to_bits() == plain.to_bits(),
                "bystander element {i}: {} * {a} + {b} gave {}",
                x[i],
                y[i]
            );
        }
        self.session.release_buffer(&x_buf).await.unwrap();
        self.session.release_buffer(&y_buf).await.unwrap();
        started.elapsed()
    }
}

/// A ring with the add kernel, its operands, and a semaphore buffer of 64
/// bytes bound to it, all zero.
struct SemRing {
    ring: LaunchRing,
    add: Kernel,
    sem_shm: Arc<HostShm>,
    sem: Buffer,
    a: Vec<f32>,
    b: Vec<f32>,
    n: usize,
    buffers: Vec<(HostShm, Buffer)>,
}

impl SemRing {
    async fn open(session: &Session) -> SemRing {
        let add = load(session, "add_f32_scalar.ptx", "add_f32_scalar").await;
        let n = 256;
        let (a, b) = (random_f32(n), random_f32(n));
        let a_buf = f32_buffer(session, Some(&a), n).await;
        let b_buf = f32_buffer(session, Some(&b), n).await;
        let out = f32_buffer(session, None, n).await;
        let sem_shm = Arc::new(HostShm::create(64).unwrap());
        let sem = session.register_shm(&sem_shm, None).await.unwrap();
        let mut ring = session.open_ring(16, 0).await.unwrap();
        ring.bind_semaphores(&sem, sem_shm.clone()).unwrap();
        SemRing {
            ring,
            add,
            sem_shm,
            sem,
            a,
            b,
            n,
            buffers: vec![a_buf, b_buf, out],
        }
    }

    fn word(&self, offset: u64, value: u64) -> SemaphoreOp {
        SemaphoreOp {
            buffer: self.sem.ring_index,
            offset,
            value,
            width: SemaphoreWidth::Bits32,
        }
    }

    /// Submits the add over every element, waiting on / signalling words.
    fn submit(&mut self, wait: Option<SemaphoreOp>, signal: Option<SemaphoreOp>) -> u64 {
        let inputs = [(&self.buffers[0].1, 0), (&self.buffers[1].1, 0)];
        self.ring
            .launch_ordered(
                &self.add,
                &inputs,
                (&self.buffers[2].1, 0),
                self.n as u64,
                &[],
                wait,
                signal,
            )
            .unwrap()
    }

    /// The output is the sum, element by element (then poisoned again).
    fn assert_sum(&mut self) {
        let out = self.buffers[2].0.read_f32(0, self.n).unwrap();
        assert_eq!(out.len(), self.n);
        for (i, got) in out.iter().enumerate() {
            let want = self.a[i] + self.b[i];
            assert_eq!(got.to_bits(), want.to_bits(), "element {i}");
        }
        self.buffers[2]
            .0
            .write_f32(0, &vec![f32::NAN; self.n])
            .unwrap();
    }

    /// The semaphore object's length, set through its file (the test's own
    /// mapping of it is not touched while it is short).
    fn set_sem_len(&self, len: u64) {
        let path = format!("/dev/shm{}", self.sem_shm.name());
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .unwrap()
            .set_len(len)
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_semaphore_on_a_shrunk_buffer_fails_its_launch_not_the_executor() {
    let daemon = Daemon::start(&[]);
    let client = Client::connect(&daemon.target()).await.unwrap();
    let bystander = Bystander::new(&client).await;
    let session = client.open_session("shrinker").await.unwrap();
    let mut sem = SemRing::open(&session).await;
    let before = executor_pid(&client, 0).await;
    bystander.check().await;

    // A launch waits on word 0, which nobody sets; the object is cut to
    // nothing under the wait: the executor's next look at the word faults.
    let waiting = sem.submit(Some(sem.word(0, 1)), None);
    std::thread::sleep(Duration::from_millis(200));
    assert!(sem.ring.poll().unwrap().is_none(), "the wait ended early");
    sem.set_sem_len(0);
    let done = next(&mut sem.ring);
    assert_eq!(done.ticket, waiting);
    // What a unary launch on a shrunk buffer gets.
    assert_eq!(refusal(&done), "BUFFER_TOO_SMALL", "{done:?}");
    bystander.check().await;

    // A launch that signals the shrunk object: the kernel runs, the signal
    // is not written, and the launch says so.
    let signalling = sem.submit(None, Some(sem.word(8, 5)));
    let done = next(&mut sem.ring);
    assert_eq!(done.ticket, signalling);
    assert_eq!(refusal(&done), "BUFFER_TOO_SMALL", "{done:?}");
    sem.assert_sum();
    // And a launch that waits on it is refused before it looks.
    sem.submit(Some(sem.word(4, 1)), None);
    assert_eq!(refusal(&next(&mut sem.ring)), "BUFFER_TOO_SMALL");

    // The executor lives: same process, the bystander's launches exact, and
    // the shrinker's ring goes on once its object is whole again.
    assert_eq!(executor_pid(&client, 0).await, before);
    bystander.check().await;
    sem.set_sem_len(64);
    sem.sem_shm
        .store_word(0, SemaphoreWidth::Bits32, 1)
        .unwrap();
    let ticket = sem.submit(Some(sem.word(0, 1)), Some(sem.word(8, 9)));
    let done = next(&mut sem.ring);
    assert_eq!((done.ticket, done.outcome), (ticket, Ok(())));
    assert_eq!(sem.sem_shm.load_word(8, SemaphoreWidth::Bits32).unwrap(), 9);
    sem.assert_sum();
    assert_eq!(executor_pid(&client, 0).await, before);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_ring_blocked_on_its_semaphore_holds_up_no_other_request() {
    let daemon = Daemon::start(&[]);
    let client = Client::connect(&daemon.target()).await.unwrap();
    let bystander = Bystander::new(&client).await;
    let blocker = client.open_session("blocker").await.unwrap();
    let mut blocked = SemRing::open(&blocker).await;
    // Waits on a word nobody writes: up to 10 s.
    blocked.submit(Some(blocked.word(0, 1)), None);
    std::thread::sleep(Duration::from_millis(200));
    assert!(blocked.ring.poll().unwrap().is_none());

    let bound = Duration::from_secs(1);
    let prompt = |what: &str, took: Duration| {
        assert!(took < bound, "{what} took {took:?} behind a blocked ring");
    };
    // The bystander: launches (register, launch, release each time), a
    // ring of its own, a kernel unloaded (its last reference), a buffer
    // registered and released.
    prompt("a bystander's launch", bystander.check().await);
    let started = Instant::now();
    let mut own = bystander.session.open_ring(8, 0).await.unwrap();
    prompt("a bystander's OpenRing", started.elapsed());
    let started = Instant::now();
    let extra = load(&bystander.session, "add_f32_scalar.ptx", "add_f32_scalar").await;
    let scale = load(&bystander.session, "spin_f32.ptx", "spin_f32").await;
    assert!(
        bystander.session.unload(&scale).await.unwrap(),
        "the slot was freed"
    );
    prompt("a bystander's load and unload", started.elapsed());
    let n = 1000;
    let (a, b) = (random_f32(n), random_f32(n));
    let (_a, a_buf) = f32_buffer(&bystander.session, Some(&a), n).await;
    let (_b, b_buf) = f32_buffer(&bystander.session, Some(&b), n).await;
    let (out_shm, out_buf) = f32_buffer(&bystander.session, None, n).await;
    let ticket = own
        .launch(
            &extra,
            &[(&a_buf, 0), (&b_buf, 0)],
            (&out_buf, 0),
            n as u64,
            &[],
        )
        .unwrap();
    let done = next(&mut own);
    assert_eq!((done.ticket, done.outcome), (ticket, Ok(())));
    let out = out_shm.read_f32(0, n).unwrap();
    for i in 0..n {
        assert_eq!(out[i].to_bits(), (a[i] + b[i]).to_bits(), "element {i}");
    }
    let started = Instant::now();
    bystander.session.release_buffer(&out_buf).await.unwrap();
    prompt("a bystander's CloseBuffer", started.elapsed());
    // The blocker itself: releasing a buffer its blocked ring holds, and
    // opening a new ring in place of the blocked one.
    let started = Instant::now();
    let (_, out) = blocked.buffers.pop().unwrap();
    blocker.release_buffer(&out).await.unwrap();
    prompt("the blocker's CloseBuffer", started.elapsed());
    let started = Instant::now();
    let mut again = blocker.open_ring(8, 0).await.unwrap();
    prompt("the blocker's second OpenRing", started.elapsed());
    prompt("a bystander's launch", bystander.check().await);
    // Sessions that leave with their rings waiting (CloseStream for each)
    // hold up nothing either.
    for i in 0..4 {
        let leaver = client.open_session(&format!("leaver-{i}")).await.unwrap();
        let mut waiting = SemRing::open(&leaver).await;
        waiting.submit(Some(waiting.word(0, 1)), None);
        std::thread::sleep(Duration::from_millis(50));
        let started = Instant::now();
        drop(waiting);
        leaver.close().await.unwrap();
        prompt("a session's close with its ring waiting", started.elapsed());
    }
    prompt("a bystander's launch", bystander.check().await);
    // The new ring serves.
    let (c, c_buf) = f32_buffer(&blocker, None, blocked.n).await;
    let inputs = [(&blocked.buffers[0].1, 0), (&blocked.buffers[1].1, 0)];
    again
        .launch(&blocked.add, &inputs, (&c_buf, 0), blocked.n as u64, &[])
        .unwrap();
    assert_eq!(next(&mut again).outcome, Ok(()));
    let got = c.read_f32(0, blocked.n).unwrap();
    assert_eq!(got.len(), blocked.n);
    for (i, got) in got.iter().enumerate() {
        let want = blocked.a[i] + blocked.b[i];
        assert_eq!(got.to_bits(), want.to_bits(), "element {i}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn rings_waiting_on_their_semaphores_cost_no_cpu() {
    let daemon = Daemon::start(&[]);
    let client = Client::connect(&daemon.target()).await.unwrap();
    let bystander = Bystander::new(&client).await;
    let mut waiting = Vec::new();
    for i in 0..8 {
        let session = client.open_session(&format!("waiter-{i}")).await.unwrap();
        let mut sem = SemRing::open(&session).await;
        sem.submit(Some(sem.word(0, 1)), None);
        waiting.push((session, sem));
    }
    std::thread::sleep(Duration::from_millis(300));
    let pid = executor_pid(&client, 0).await;
    let (cpu, wall) = (cpu_time(pid), Instant::now());
    std::thread::sleep(Duration::from_secs(2));
    let (used, over) = (cpu_time(pid) - cpu, wall.elapsed());
    eprintln!("8 waiting rings: the executor used {used:?} of CPU in {over:?}");
    assert!(
        used < over / 10,
        "8 rings waiting on their semaphores cost the executor {used:?} of CPU in {over:?}"
    );
    bystander.check().await;
    // Each wait is still live, and ends when its word is written.
    for (_, sem) in &mut waiting {
        assert!(sem.ring.poll().unwrap().is_none());
        sem.sem_shm
            .store_word(0, SemaphoreWidth::Bits32, 1)
            .unwrap();
        assert_eq!(next(&mut sem.ring).outcome, Ok(()));
        sem.assert_sum();
    }
    bystander.check().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn ring_timeouts_count_against_the_session_like_grpc_timeouts() {
    let daemon = Daemon::start(&[
        "--max-kernel-time",
        "300ms",
        "--max-kernel-timeouts-per-session",
        "2",
    ]);
    let client = Client::connect(&daemon.target()).await.unwrap();
    let bystander = Bystander::new(&client).await;
    let before = executor_pid(&client, 0).await;

    // Ring first: two semaphore waits that never end time out...
    let session = client.open_session("ring-waiter").await.unwrap();
    let mut sem = SemRing::open(&session).await;
    for _ in 0..2 {
        let started = Instant::now();
        let ticket = sem.submit(Some(sem.word(0, 1)), Some(sem.word(8, 3)));
        let done = next(&mut sem.ring);
        assert_eq!(done.ticket, ticket);
        assert_eq!(refusal(&done), "KERNEL_TIMEOUT", "{done:?}");
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(250) && took < Duration::from_secs(3),
            "{took:?}"
        );
        // The signal was written all the same.
        assert_eq!(sem.sem_shm.load_word(8, SemaphoreWidth::Bits32).unwrap(), 3);
        sem.sem_shm
            .store_word(8, SemaphoreWidth::Bits32, 0)
            .unwrap();
        bystander.check().await;
    }
    // ...and the session is over its limit on the ring and on gRPC.
    sem.submit(None, Some(sem.word(8, 4)));
    let done = next(&mut sem.ring);
    assert_eq!(refusal(&done), "LIMIT_EXCEEDED", "{done:?}");
    assert_eq!(sem.sem_shm.load_word(8, SemaphoreWidth::Bits32).unwrap(), 4);
    let x = &sem.buffers[0].1;
    let err = session
        .launch(
            &sem.add,
            &Launch::new([x.operand(), x.operand()], sem.buffers[2].1.operand(), 8),
        )
        .await
        .unwrap_err();
    assert_eq!(err.reason_name(), "LIMIT_EXCEEDED", "{err}");

    // gRPC first: a session refused after two looping kernels is refused on
    // a ring it opens afterwards too.
    let looper = client.open_session("looper").await.unwrap();
    let spin = load(&looper, "spin_f32.ptx", "spin_f32").await;
    let (_x, x) = f32_buffer(&looper, Some(&[0.0; 64]), 64).await;
    let (_y, y) = f32_buffer(&looper, None, 64).await;
    for _ in 0..2 {
        let err = looper
            .launch(
                &spin,
                &Launch::new([x.operand()], y.operand(), 64).sync(true),
            )
            .await
            .unwrap_err();
        assert_eq!(err.reason_name(), "KERNEL_TIMEOUT", "{err}");
    }
    let mut ring = looper.open_ring(8, 0).await.unwrap();
    let started = Instant::now();
    ring.launch(&spin, &[(&x, 0)], (&y, 0), 64, &[]).unwrap();
    let done = next(&mut ring);
    assert_eq!(refusal(&done), "LIMIT_EXCEEDED", "{done:?}");
    assert!(
        started.elapsed() < Duration::from_millis(250),
        "the looping kernel ran"
    );

    // Nothing restarted, and the bystander was never touched.
    assert_eq!(executor_pid(&client, 0).await, before);
    bystander.check().await;
}

/// A 32-bit-index kernel (NVRTC's `int i = blockIdx.x * blockDim.x +
/// threadIdx.x`, from the JIT corpus) on the ring: launches run and match
/// the reference, and a count past its `index_fits_i32` precondition (at
/// the block it launches with) is refused by name, as its unary launch is.
#[tokio::test(flavor = "multi_thread")]
async fn a_kernel_with_a_precondition_runs_on_the_ring_and_is_held_to_it() {
    let daemon = Daemon::start(&[]);
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("ring idx32").await.unwrap();
    let add = load(&session, "jit/nvrtc/add_f32_idx32_O3.ptx", "add_f32_idx32").await;
    assert!(
        add.state()
            .signature
            .contract
            .contains("index_fits_i32: grid × block <= 2^31"),
        "{}",
        add.state().signature.contract
    );
    let n = 3000 + rand::rng().random_range(0..1000usize);
    let (a, b) = (random_f32(n), random_f32(n));
    let (_a_shm, a_buf) = f32_buffer(&session, Some(&a), n).await;
    let (_b_shm, b_buf) = f32_buffer(&session, Some(&b), n).await;
    let (out_shm, out_buf) = f32_buffer(&session, None, n).await;
    let mut ring = session.open_ring(16, 0).await.unwrap();
    ring.launch(
        &add,
        &[(&a_buf, 0), (&b_buf, 0)],
        (&out_buf, 0),
        n as u64,
        &[],
    )
    .unwrap();
    assert_eq!(next(&mut ring).outcome, Ok(()));
    let out = out_shm.read_f32(0, n).unwrap();
    for i in 0..n {
        assert_eq!(out[i].to_bits(), (a[i] + b[i]).to_bits(), "element {i}");
    }
    // Past 2^31 threads the 32-bit index would wrap: refused before the
    // buffers are even looked at, on the ring as on the unary path.
    let past = (1u64 << 31) + 1;
    ring.launch(&add, &[(&a_buf, 0), (&b_buf, 0)], (&out_buf, 0), past, &[])
        .unwrap();
    assert_eq!(refusal(&next(&mut ring)), "INVALID_ARGUMENT");
    let unary = session
        .launch(
            &add,
            &Launch::new([a_buf.operand(), b_buf.operand()], out_buf.operand(), past),
        )
        .await
        .unwrap_err();
    assert_eq!(unary.reason_name(), "INVALID_ARGUMENT", "{unary}");
    assert_eq!(
        unary
            .refusal()
            .unwrap()
            .metadata()
            .get("precondition")
            .map(String::as_str),
        Some("index_fits_i32"),
        "{unary}"
    );
}
