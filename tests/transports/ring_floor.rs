//! The ring's floor (issue 22, item 3) on the host backend: a burst that
//! keeps the ring full is answered in submission order, each launch exactly
//! once, with the outcome and the output of that launch, while the executor
//! drains every published slot per wake-up and publishes its answers in
//! batches.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::VecDeque;
use std::time::Duration;

use crate::support::processes::on_cpu_time;
use crate::support::ring_completions::{next, refusal};
use crate::support::{f32_buffer, load, random_f32, Daemon};
use ptxd_client::Client;
use rand::Rng;

/// What one launch of the burst is, and so what its completion and its
/// output chunk must be.
#[derive(Debug, Clone, Copy)]
enum Shot {
    /// `add` of a's chunk at `shift` elements and b's chunk.
    Add { shift: usize },
    /// `affine` of a's chunk with its own scalars.
    Affine { scale: f32, bias: f32 },
    /// An output that overruns its buffer: refused, nothing written.
    TooSmall,
}

/// A burst of launches, kept at the ring's depth, mixing two kernels with
/// fresh operands and scalars and refusals: the completions come back in
/// ticket order, each ticket once, each with its own outcome; every output
/// chunk is checked element by element against its launch (poisoned
/// before, so a launch that ran twice, ran with another launch's scalars,
/// or did not run shows).
#[tokio::test(flavor = "multi_thread")]
async fn a_full_ring_burst_is_answered_in_order_exactly_once() {
    let daemon = Daemon::start(&[]);
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("ring-floor").await.unwrap();
    let add = load(&session, "add_f32_scalar.ptx", "add_f32_scalar").await;
    let affine = load(&session, "affine_f32_scalar.ptx", "affine_f32_scalar").await;
    const DEPTH: u64 = 16;
    let (chunk, launches) = (97usize, 600usize);
    let a = random_f32(chunk * launches + 64);
    let b = random_f32(chunk);
    let (_a_shm, a_buf) = f32_buffer(&session, Some(&a), a.len()).await;
    let (_b_shm, b_buf) = f32_buffer(&session, Some(&b), chunk).await;
    let (mut out_shm, out_buf) = f32_buffer(&session, None, chunk * launches).await;
    out_shm
        .write_f32(0, &vec![f32::NAN; chunk * launches])
        .unwrap();
    let mut ring = session.open_ring(DEPTH as u32, 0).await.unwrap();

    let mut rng = rand::rng();
    let mut shots = Vec::with_capacity(launches);
    let mut pending: VecDeque<(u64, usize)> = VecDeque::new();
    let mut answered = 0usize;
    let mut check = |ring: &mut ptxd_client::LaunchRing,
                     pending: &mut VecDeque<(u64, usize)>,
                     shots: &[Shot]| {
        let done = next(ring);
        let (ticket, index) = pending.pop_front().expect("a completion for no launch");
        assert_eq!(done.ticket, ticket, "launch {index}: out of order");
        match shots[index] {
            Shot::TooSmall => assert_eq!(refusal(&done), "BUFFER_TOO_SMALL", "launch {index}"),
            _ => assert_eq!(done.outcome, Ok(()), "launch {index}"),
        }
        answered += 1;
    };
    for index in 0..launches {
        while ring.outstanding() >= DEPTH {
            check(&mut ring, &mut pending, &shots);
        }
        let shot = match rng.random_range(0..10) {
            0 => Shot::TooSmall,
            1..=3 => Shot::Affine {
                scale: rng.random_range(-2.0f32..2.0),
                bias: rng.random_range(-1.0f32..1.0),
            },
            _ => Shot::Add {
                shift: rng.random_range(0..64),
            },
        };
        shots.push(shot);
        let at = (index * chunk) as u64 * 4;
        let ticket = match shot {
            Shot::Add { shift } => ring.launch(
                &add,
                &[(&a_buf, ((index * chunk + shift) * 4) as u64), (&b_buf, 0)],
                (&out_buf, at),
                chunk as u64,
                &[],
            ),
            Shot::Affine { scale, bias } => ring.launch(
                &affine,
                &[(&a_buf, at)],
                (&out_buf, at),
                chunk as u64,
                &[scale, bias],
            ),
            Shot::TooSmall => ring.launch(
                &add,
                &[(&a_buf, 0), (&b_buf, 0)],
                (&out_buf, at + 4),
                (chunk * (launches - index)) as u64,
                &[],
            ),
        }
        .unwrap();
        pending.push_back((ticket, index));
    }
    while !pending.is_empty() {
        check(&mut ring, &mut pending, &shots);
    }
    assert_eq!(answered, launches);
    assert_eq!(ring.outstanding(), 0);
    // Nothing is answered twice: no completion is left over.
    assert!(ring.wait(Duration::from_millis(200)).unwrap().is_none());

    let out = out_shm.read_f32(0, chunk * launches).unwrap();
    for (index, shot) in shots.iter().enumerate() {
        for i in 0..chunk {
            let got = out[index * chunk + i];
            match *shot {
                Shot::Add { shift } => assert_eq!(
                    got.to_bits(),
                    (a[index * chunk + shift + i] + b[i]).to_bits(),
                    "launch {index}, element {i}"
                ),
                Shot::Affine { scale, bias } => assert_eq!(
                    got.to_bits(),
                    a[index * chunk + i].mul_add(scale, bias).to_bits(),
                    "launch {index}, element {i}"
                ),
                Shot::TooSmall => {
                    assert!(got.is_nan(), "refused launch {index} wrote element {i}")
                }
            }
        }
    }
}

/// An idle daemon with open rings (issue 22's goal: under 1 % of a
/// core). Four sessions hold kernels and buffers; the daemon and its
/// executor are measured idle without rings, then with each session's ring
/// open after a launch through it: the rings, spun out and asleep on their
/// futexes (waking once a `POLL_SLICE` and sleeping again without a spin),
/// cost 1–2 % of a core here (a debug build on a shared VM: 1.2 %
/// measured, 1.6 % when each wake spun first); the test fails only at the
/// cost of a ring that never sleeps (a whole core). Both figures are printed
/// (`cargo test --test transports idle -- --nocapture`).
#[tokio::test(flavor = "multi_thread")]
async fn idle_rings_sleep_instead_of_spinning() {
    let daemon = Daemon::start(&[]);
    let client = Client::connect(&daemon.target()).await.unwrap();
    let n = 4096;
    let (a, b) = (random_f32(n), random_f32(n));
    let mut open = Vec::new();
    for i in 0..4 {
        let session = client.open_session(&format!("idle-{i}")).await.unwrap();
        let add = load(&session, "add_f32_scalar.ptx", "add_f32_scalar").await;
        let (a_shm, a_buf) = f32_buffer(&session, Some(&a), n).await;
        let (b_shm, b_buf) = f32_buffer(&session, Some(&b), n).await;
        let (out_shm, out_buf) = f32_buffer(&session, None, n).await;
        open.push((
            session,
            add,
            [a_shm, b_shm, out_shm],
            [a_buf, b_buf, out_buf],
        ));
    }
    let executor = crate::support::executor_pid(&client, 0).await;
    let daemon_pid = u32::try_from(daemon.pid()).unwrap();
    let used = || on_cpu_time(daemon_pid) + on_cpu_time(executor);
    // The share of a core the daemon and its executor use over 3 s.
    let idle_share = || {
        std::thread::sleep(Duration::from_millis(300));
        let (before, wall) = (used(), std::time::Instant::now());
        std::thread::sleep(Duration::from_secs(3));
        (used() - before).as_secs_f64() / wall.elapsed().as_secs_f64() * 100.0
    };
    let without = idle_share();
    let mut rings = Vec::new();
    for (session, add, shm, [a_buf, b_buf, out_buf]) in &open {
        let mut ring = session.open_ring(16, 0).await.unwrap();
        ring.launch(add, &[(a_buf, 0), (b_buf, 0)], (out_buf, 0), n as u64, &[])
            .unwrap();
        assert_eq!(refusal(&next(&mut ring)), "");
        let out = shm[2].read_f32(0, n).unwrap();
        for k in 0..n {
            assert_eq!(out[k].to_bits(), (a[k] + b[k]).to_bits(), "element {k}");
        }
        rings.push(ring);
    }
    let with = idle_share();
    eprintln!("idle daemon: {without:.2} % of a core without rings, {with:.2} % with 4 open rings");
    // What this asserts is the class, not the figure: a ring that kept
    // spinning costs a whole core (four: 400 %); asleep, the four cost
    // 1–2 % here. The figure itself is a benchmark's (printed above, and
    // `ptxd bench`'s idle row on the H200), never a timed test's: a
    // loaded 2-core machine read 2.07 %.
    assert!(
        with - without < 20.0,
        "4 idle rings cost {:.2} % of a core",
        with - without
    );
    drop(rings);
}
