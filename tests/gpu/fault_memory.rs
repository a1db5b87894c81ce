//! GPU memory, descriptors and processes over 100 kernel faults (issue 23's
//! last goal: "flat after 100 faults"), on the CUDA backend: without a
//! spare, and with the spare and the kernel cache (the recovery paths that
//! open and close the most: a context per executor, every IPC buffer opened
//! again, cached modules loaded again).
//!
//! Each fault is the faulting tenant's cubin storing to address 0 (a new
//! faulting session every time, dropped after); a bystander session holds
//! registered buffers throughout, loads its kernel again after every restart
//! and checks it bit for bit. Every 10 faults, once the faulted executor is
//! reaped (the daemon has exactly the children it should), the test samples
//! the device's used memory (nvidia-smi, MiB), the daemon's open descriptors
//! and its child processes, prints the series, and asserts them flat: the
//! processes exactly, the descriptors no more than at the first sample, the
//! device memory within [`MEMORY_TOLERANCE_MIB`] of the first sample (a
//! leaked context is about 500 MiB, a leaked IPC mapping of the bystander's
//! buffers 1 MiB each per fault, so 100 faults of either leak are far past
//! it).
//!
//! Device memory is the whole device's: run alone (`tests/gpu/run.sh` runs
//! `fault_memory::` as its own step, after the parallel tests). It takes
//! about a minute per mode on an H200 (the driver reports each fault after
//! 100–150 ms; a new context costs about 190 ms without a spare).

use std::time::{Duration, Instant};

use ptxd_client::{Client, LoadOptions, SessionEvent};

use super::daemon_support::Daemon;
use super::device;
use super::executor_client::corpus;
use super::fd::used_mib;
use super::processes::{children, open_fds};
use super::recovery::{check_add, fault, operands, prepare_fault, trusting_daemon};

const FAULTS: usize = 100;
const SAMPLE_EVERY: usize = 10;
/// How far the device's used memory may stray from the first sample.
const MEMORY_TOLERANCE_MIB: u64 = 64;

/// One sample of the series.
#[derive(Debug, Clone, Copy)]
struct Sample {
    faults: usize,
    used_mib: u64,
    fds: usize,
    processes: usize,
}

/// Samples once the daemon has exactly `executors` children (the faulted
/// one reaped, a new spare started) and the device's used memory reads the
/// same twice 200 ms apart (a context's teardown or start finished).
async fn sample(daemon: &Daemon, uuid: &str, executors: usize, faults: usize) -> Sample {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = None;
    loop {
        let kids = children(daemon.pid()).len();
        let used = used_mib(uuid);
        if kids == executors && last == Some(used) {
            return Sample {
                faults,
                used_mib: used,
                fds: open_fds(daemon.pid()),
                processes: kids,
            };
        }
        assert!(
            Instant::now() < deadline,
            "after {faults} faults the daemon has {kids} children, not {executors} \
             (or the device's memory never settled: {used} MiB)"
        );
        last = (kids == executors).then_some(used);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn flat_over_faults(mode: &str, extra: &[&str], executors: usize) {
    let dev = device();
    let daemon = trusting_daemon(&dev, extra);
    let client = Client::connect(&daemon.target()).await.unwrap();
    let bystander = client.open_session("bystander").await.unwrap();
    let mut events = bystander.events();
    let ops = operands(&bystander, &dev, 1 << 14).await;
    let text = String::from_utf8(corpus("add_f32_scalar.ptx")).unwrap();
    let load = || bystander.load_ptx(0, text.clone(), "add_f32_scalar", LoadOptions::default());
    let add = load().await.unwrap();
    check_add(&bystander, &add, &ops, &format!("{mode}: before")).await;
    let mut samples = vec![sample(&daemon, dev.uuid(), executors, 0).await];
    for round in 1..=FAULTS {
        let faulting = prepare_fault(&client, &dev).await;
        fault(&faulting).await;
        drop(faulting);
        tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                match events.recv().await {
                    Ok(SessionEvent::ExecutorRestarted { .. }) => return,
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(e) => panic!("the bystander's events ended: {e}"),
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{mode}: no restart after fault {round}"));
        let add = load().await.unwrap();
        check_add(
            &bystander,
            &add,
            &ops,
            &format!("{mode}: after fault {round}"),
        )
        .await;
        bystander.unload(&add).await.unwrap();
        if round % SAMPLE_EVERY == 0 {
            samples.push(sample(&daemon, dev.uuid(), executors, round).await);
        }
    }
    let series: Vec<String> = samples
        .iter()
        .map(|s| {
            format!(
                "{:>3} faults: {:>6} MiB used, {:>4} fds, {} executors",
                s.faults, s.used_mib, s.fds, s.processes
            )
        })
        .collect();
    println!(
        "{mode}: device memory, daemon descriptors and executors over {FAULTS} faults\n  {}",
        series.join("\n  ")
    );
    let first = samples[0];
    for s in &samples {
        assert_eq!(s.processes, executors, "{mode}: {s:?}");
        assert!(
            s.used_mib.abs_diff(first.used_mib) <= MEMORY_TOLERANCE_MIB,
            "{mode}: device memory {} MiB after {} faults, {} MiB at first (tolerance \
             {MEMORY_TOLERANCE_MIB} MiB)\n  {}",
            s.used_mib,
            s.faults,
            first.used_mib,
            series.join("\n  ")
        );
    }
    // A dead executor's channel closes once the last task holding its link
    // lets go: given a moment, nothing may be left over.
    let settled = Instant::now() + Duration::from_secs(3);
    let mut fds = open_fds(daemon.pid());
    while fds > first.fds && Instant::now() < settled {
        tokio::time::sleep(Duration::from_millis(50)).await;
        fds = open_fds(daemon.pid());
    }
    assert!(
        fds <= first.fds,
        "{mode}: the daemon's descriptors grew from {} to {fds} over {FAULTS} faults\n  {}",
        first.fds,
        series.join("\n  ")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn device_memory_descriptors_and_processes_stay_flat_over_100_faults() {
    flat_over_faults("no spare", &[], 1).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn with_a_spare_and_the_kernel_cache_they_stay_flat_over_100_faults() {
    let home = tempfile::tempdir().unwrap();
    let cache = home.path().join("kernels");
    let cache = cache.to_str().unwrap();
    flat_over_faults(
        "spare and kernel cache",
        &["--spare-executor", "--kernel-cache-dir", cache],
        2,
    )
    .await;
}
