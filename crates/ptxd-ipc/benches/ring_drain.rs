//! The launch ring's own cost on the host, no kernels: a client thread
//! keeps `DEPTH` launches outstanding, a server thread takes each and
//! answers it, and the two ways of answering run side by side in one run:
//!
//! - `per-launch`: every answer published at once (`Server::complete`: the
//!   completion's sequence word and the submission tail stored and the
//!   client's futex word read per launch), as the
//!   executor's ring loop did before issue 22;
//! - `drained`: answers posted and published together once the ring has
//!   nothing more ready or every `FLUSH_EVERY` answers (`Server::post`,
//!   `Server::flush`), as the loop does now.
//!
//! Also a round trip with one launch outstanding (the latency figure, where
//! both ways publish every answer). Run: `cargo bench -p ptxd-ipc --bench ring_drain`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use ptxd_ipc::ring::{CompletionStatus, Descriptor, OperandRef, Server, Submitter};

const LAUNCHES: u64 = 200_000;
const SLOTS: u32 = 64;
const FLUSH_EVERY: u64 = 32;
const ROUNDS: usize = 7;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    PerLaunch,
    Drained,
}

fn descriptor(ticket: u64) -> Descriptor {
    let inputs = [OperandRef {
        buffer: 1,
        offset: 0,
    }; 2];
    Descriptor::new(ticket, 0, &inputs, OperandRef::default(), 1 << 16)
        .unwrap()
        .with_scalars(&[2.0])
        .unwrap()
}

/// Runs `LAUNCHES` launches with up to `depth` outstanding; returns the
/// elapsed time and, with `depth == 1`, each round trip.
fn run(mode: Mode, depth: u64) -> (Duration, Vec<Duration>) {
    let mut client = Submitter::create(SLOTS).unwrap();
    let mut server = Server::open(client.name(), None).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let stop = Arc::clone(&done);
    let serving = thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            match server.poll().unwrap() {
                Some(_) => match mode {
                    Mode::PerLaunch => {
                        server.complete(CompletionStatus::Ok, 0).unwrap();
                    }
                    Mode::Drained => {
                        server.post(CompletionStatus::Ok, 0).unwrap();
                        if server.unpublished() >= FLUSH_EVERY {
                            server.flush();
                        }
                    }
                },
                None => {
                    server.flush();
                    std::hint::spin_loop();
                }
            }
        }
    });
    let templates: Vec<Descriptor> = (0..SLOTS as u64).map(descriptor).collect();
    let mut trips = Vec::new();
    let started = Instant::now();
    let (mut sent, mut answered) = (0u64, 0u64);
    let mut last = Instant::now();
    while answered < LAUNCHES {
        while sent < LAUNCHES && sent - answered < depth {
            let mut d = templates[(sent % SLOTS as u64) as usize].clone();
            d.ticket = sent;
            if depth == 1 {
                last = Instant::now();
            }
            if client.try_submit(&d).is_err() {
                break;
            }
            sent += 1;
        }
        while let Some(completion) = client.poll_completion().unwrap() {
            assert_eq!(completion.ticket, answered);
            answered += 1;
            if depth == 1 {
                trips.push(last.elapsed());
            }
        }
        std::hint::spin_loop();
    }
    let elapsed = started.elapsed();
    done.store(true, Ordering::Relaxed);
    serving.join().unwrap();
    (elapsed, trips)
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[at].as_secs_f64() * 1e6
}

fn main() {
    // Each round runs both ways back to back, so a machine busy with other
    // work slows both; the median of the per-round ratios is the figure.
    let mut ratios = Vec::new();
    let mut rates = [Vec::new(), Vec::new()];
    for round in 0..ROUNDS {
        let mut seconds = [0.0; 2];
        // Alternate which way goes first.
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let mode = [Mode::PerLaunch, Mode::Drained][i];
            seconds[i] = run(mode, u64::from(SLOTS)).0.as_secs_f64();
        }
        let rate = |s: f64| LAUNCHES as f64 / s;
        println!(
            "ring_drain: round {round}: per-launch {:.0}/s, drained {:.0}/s, ratio {:.2}x",
            rate(seconds[0]),
            rate(seconds[1]),
            seconds[0] / seconds[1]
        );
        ratios.push(seconds[0] / seconds[1]);
        rates[0].push(rate(seconds[0]));
        rates[1].push(rate(seconds[1]));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "ring_drain: {LAUNCHES} launches, {SLOTS} outstanding, median of {ROUNDS} rounds: per-launch {:.0}/s, drained {:.0}/s, drained/per-launch throughput {:.2}x",
        median(&mut rates[0]),
        median(&mut rates[1]),
        median(&mut ratios)
    );
    for (i, mode) in [Mode::PerLaunch, Mode::Drained].into_iter().enumerate() {
        let (_, mut trips) = run(mode, 1);
        trips.sort();
        println!(
            "ring_drain: round trip, one outstanding, {}: p50 {:.2} us, p99 {:.2} us",
            ["per-launch", "drained"][i],
            percentile(&trips, 0.50),
            percentile(&trips, 0.99)
        );
    }
}
