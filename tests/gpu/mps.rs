//! What a kernel fault inside ptxd does to another process on the same GPU,
//! with and without MPS (issue 22: "measure what a faulting kernel launched
//! by ptxd does to the other MPS clients on that GPU, against ptxd's
//! containment without MPS").
//!
//! A bystander process (python3 with torch, not a ptxd client) computes
//! `x * 2 + 1` on the GPU in a loop and checks every result, while a tenant
//! faults ptxd's executor (a trusted cubin that stores to address 0) and a
//! surviving ptxd session waits for its first exact launch after the fault.
//! `bash .gpu/run.sh mps-fault` runs this once without MPS and once under
//! an MPS control daemon of its own (`CUDA_MPS_PIPE_DIRECTORY` set).
//!
//! Asserted: without MPS the bystander never sees an error or a wrong
//! result (ptxd's containment: the fault ends only ptxd's executor) and the
//! surviving session's launches are exact again; under MPS ptxd reports its
//! executor as an MPS client, and while it cannot restart it (the MPS
//! server waits for every client of the faulted server to exit, this test
//! process included) the survivor's launches get typed refusals, never a
//! hang. Printed (a measurement, nothing
//! asserted on it): the bystander's outcome and its longest stall, and the
//! fault → survivor's first launch time. Under MPS the bystander is let
//! exit before ptxd's recovery is awaited: the MPS server refuses new
//! clients (ptxd's next executor) until every client of the faulted server
//! has exited (the first run of this test, H200 2026-12-02, waited 60 s
//! with the bystander alive and ptxd's restarts refused
//! CUDA_ERROR_MPS_SERVER_NOT_READY).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ptxd_client::{Client, LoadOptions};

use super::device;
use super::executor_client::corpus;
use super::recovery::{check_add, fault, operands, prepare_fault, trusting_daemon};

/// The bystander: prints READY once its context is up, then computes and
/// checks until its stdin closes; prints `OK` with its iterations and its
/// longest gap between two checked results, or `ERROR`/`WRONG` and exits.
const BYSTANDER: &str = r#"
import sys, threading, time
import torch
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
dev = torch.device("cuda", 0)
x = torch.arange(1 << 20, device=dev, dtype=torch.float32)
expect = x * 2 + 1
torch.cuda.synchronize()
print("READY", flush=True)
start = last = time.monotonic()
ok = 0
gap = 0.0
try:
    while not stop.is_set():
        y = x * 2 + 1
        torch.cuda.synchronize()
        if not torch.equal(y, expect):
            print(f"WRONG t={time.monotonic() - start:.4f} ok={ok}", flush=True)
            sys.exit(4)
        ok += 1
        now = time.monotonic()
        gap = max(gap, now - last)
        last = now
except Exception as e:
    text = f"{type(e).__name__}: {e}".replace("\n", " ")
    print(f"ERROR t={time.monotonic() - start:.4f} ok={ok} {text}", flush=True)
    sys.exit(3)
print(f"OK ok={ok} longest_gap_ms={gap * 1e3:.3f}", flush=True)
"#;

/// The bystander's exit status once its stdin is closed: killed if it is
/// still running 15 s later (a process stuck in a CUDA call after the fault).
fn finish(child: &mut std::process::Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return status;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    child.wait().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fault_in_ptxd_and_a_bystander_process_on_the_same_gpu() {
    let under_mps = std::env::var_os("CUDA_MPS_PIPE_DIRECTORY").is_some();
    let torch = Command::new("python3")
        .args(["-c", "import torch; assert torch.cuda.is_available()"])
        .status();
    if !torch.is_ok_and(|s| s.success()) {
        eprintln!("skipped: no python3 with torch and CUDA here");
        return;
    }
    let config = if under_mps {
        "under MPS"
    } else {
        "without MPS"
    };
    let dev = device();
    let daemon = trusting_daemon(&dev, &[]);
    let client = Client::connect(&daemon.target()).await.unwrap();
    let reported = client.info().await.unwrap().devices[0].mps_enabled;
    assert_eq!(
        reported,
        under_mps,
        "GetInfo's mps_enabled {config}:\n{}",
        daemon.stderr()
    );
    let session = client.open_session("survivor").await.unwrap();
    let ops = operands(&session, &dev, 1 << 14).await;
    let text = String::from_utf8(corpus("add_f32_scalar.ptx")).unwrap();
    let load = || session.load_ptx(0, text.clone(), "add_f32_scalar", LoadOptions::default());
    let mut kernel = load().await.unwrap();
    check_add(&session, &kernel, &ops, "before the fault").await;

    let mut bystander = Command::new("python3")
        .args(["-c", BYSTANDER])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let (lines_tx, lines) = mpsc::channel::<String>();
    let stdout = bystander.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                return;
            }
        }
    });
    let ready = lines.recv_timeout(Duration::from_secs(60));
    assert_eq!(ready.as_deref(), Ok("READY"), "the bystander did not start");
    // Let it run a little before the fault.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let faulting = prepare_fault(&client, &dev).await;
    let faulted = Instant::now();
    fault(&faulting).await;
    let answered = faulted.elapsed();
    // Under MPS a fatal fault reaches every client of the MPS server, and
    // the server takes no new client (ptxd's next executor gets
    // CUDA_ERROR_MPS_SERVER_NOT_READY) until all of them have exited: read
    // the bystander's outcome and let it exit first. Without MPS the
    // bystander keeps computing while ptxd recovers, and stops after.
    let mut outcome = None;
    let mut bystander_gone = None;
    if under_mps {
        let line = lines
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|e| format!("no outcome within 10 s ({e})"));
        outcome = Some((line, faulted.elapsed()));
        drop(bystander.stdin.take());
        let status = finish(&mut bystander);
        bystander_gone = Some((status, faulted.elapsed()));
    }
    // Without MPS: the survivor's first exact launch (reload when stale,
    // wait while the executor is down). Under MPS the server takes no new
    // client until every client of the faulted server has exited, and this
    // test process is one (it owns the survivor's memory): ptxd cannot
    // restart its executor while the test runs, so what is checked is that
    // the survivor gets typed refusals, promptly, and never a hang.
    let recovered = if under_mps {
        let mut seen = Vec::new();
        let until = Instant::now() + Duration::from_secs(3);
        while Instant::now() < until {
            let answer = tokio::time::timeout(
                Duration::from_secs(10),
                session.launch(&kernel, &ops.launch),
            )
            .await
            .expect("a launch while ptxd cannot restart its executor hung");
            let reason = match answer {
                Ok(_) => "ran".to_owned(),
                Err(e) => e.reason_name().to_owned(),
            };
            if !seen.contains(&reason) {
                seen.push(reason);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let available = client.info().await.unwrap().devices[0].available;
        format!("not while this process lives (ptxd's answers meanwhile: {seen:?}; device available: {available})")
    } else {
        let deadline = faulted + Duration::from_secs(90);
        let recovered = loop {
            match session.launch(&kernel, &ops.launch).await {
                Ok(_) => break faulted.elapsed(),
                Err(e) if e.reason_name() == "STALE_KERNEL" => {
                    if let Ok(fresh) = load().await {
                        kernel = fresh;
                        continue;
                    }
                }
                Err(e) => assert!(
                    ["EXECUTOR_UNAVAILABLE", "KERNEL_FAULT"].contains(&e.reason_name()),
                    "{e}"
                ),
            }
            assert!(
                Instant::now() < deadline,
                "ptxd did not serve the survivor within 90 s of the fault {config}:\n{}",
                daemon.stderr()
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        check_add(
            &session,
            &kernel,
            &ops,
            &format!("after the fault {config}"),
        )
        .await;
        format!("{recovered:?} after the fault")
    };
    let (outcome, outcome_at) = match outcome {
        Some(seen) => seen,
        None => {
            // Keep the bystander running a moment past the recovery.
            tokio::time::sleep(Duration::from_millis(300)).await;
            drop(bystander.stdin.take());
            let line = lines
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|e| format!("no outcome ({e})"));
            (line, faulted.elapsed())
        }
    };
    let (status, gone_at) = match bystander_gone {
        Some(gone) => gone,
        None => (finish(&mut bystander), faulted.elapsed()),
    };
    eprintln!(
        "MPS fault ({config}; ptxd's executor an MPS client: {reported}): the fault was answered \
         in {answered:?}; the bystander process: {outcome} (read {outcome_at:?} after the fault, \
         exited {gone_at:?} after it, {status}); the surviving ptxd session's first exact \
         launch: {recovered}"
    );
    if !under_mps {
        assert!(
            outcome.starts_with("OK ") && status.success(),
            "ptxd's fault reached another process on the GPU without MPS: {outcome} ({status})"
        );
    }
}
