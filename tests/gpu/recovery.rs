//! GPU tests of recovery (issue 23): the persistent compiled-kernel cache
//! (`--kernel-cache-dir`: a restarted executor and a second daemon load a
//! known kernel from it, a corrupted entry is compiled again, never loaded)
//! and the hot spare (`--spare-executor`: promoted after a kernel fault,
//! with a bystander's results exact), with the fault → first launch time of
//! a surviving session printed with and without them (a measurement: run
//! with `--nocapture` to read it; nothing is asserted on time), and per
//! fault the breakdown of where the time went: the daemon's and executors'
//! `ptxd::recovery` marks (fault raised, report read, death reported, the
//! successor taken over, registrations opened, generation published) beside
//! the bystander's own (its refusals, re-load, launch submitted, completed),
//! all on one clock (microseconds since the epoch).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ptxd_client::cuda::{CudaDevice, DeviceAllocation};
use ptxd_client::{Client, Kernel, Launch, LoadOptions, Session, SessionEvent};

use super::daemon_support::{executor_pid, Daemon};
use super::executor_client::corpus;
use super::{device, rng};

fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "kc"))
        .collect();
    found.sort();
    found
}

async fn load_add(session: &Session) -> (Kernel, Duration) {
    let text = String::from_utf8(corpus("add_f32_scalar.ptx")).unwrap();
    let started = Instant::now();
    let kernel = session
        .load_ptx(0, text, "add_f32_scalar", LoadOptions::default())
        .await
        .unwrap();
    (kernel, started.elapsed())
}

pub(super) struct Operands {
    a: Vec<f32>,
    b: Vec<f32>,
    _a_mem: DeviceAllocation,
    _b_mem: DeviceAllocation,
    out_mem: DeviceAllocation,
    pub(super) launch: Launch,
}

pub(super) async fn operands(session: &Session, dev: &CudaDevice, n: usize) -> Operands {
    use rand::Rng;
    let mut rng = rng();
    let a: Vec<f32> = (0..n).map(|_| rng.random_range(-4.0..4.0)).collect();
    let b: Vec<f32> = (0..n).map(|_| rng.random_range(-4.0..4.0)).collect();
    let register = |mem: &DeviceAllocation| {
        session.register_cuda_ipc(mem.ipc_handle().unwrap(), dev.uuid(), mem.size() as u64)
    };
    let a_mem = dev.alloc(n * 4).unwrap();
    a_mem.upload(0, &a).unwrap();
    let b_mem = dev.alloc(n * 4).unwrap();
    b_mem.upload(0, &b).unwrap();
    let out_mem = dev.alloc(n * 4).unwrap();
    let a_buf = register(&a_mem).await.unwrap();
    let b_buf = register(&b_mem).await.unwrap();
    let out_buf = register(&out_mem).await.unwrap();
    let launch = Launch::new(
        [a_buf.operand(), b_buf.operand()],
        out_buf.operand(),
        n as u64,
    )
    .sync(true);
    Operands {
        a,
        b,
        _a_mem: a_mem,
        _b_mem: b_mem,
        out_mem,
        launch,
    }
}

/// Launches `kernel` over poisoned output and compares every element.
pub(super) async fn check_add(session: &Session, kernel: &Kernel, ops: &Operands, when: &str) {
    let n = ops.a.len();
    ops.out_mem
        .upload(0, &vec![f32::from_bits(0x7fc0_dead); n])
        .unwrap();
    session.launch(kernel, &ops.launch).await.unwrap();
    let mut out = vec![0f32; n];
    ops.out_mem.download(0, &mut out).unwrap();
    for (i, (got, (a, b))) in out.iter().zip(ops.a.iter().zip(&ops.b)).enumerate() {
        assert_eq!(got.to_bits(), (a + b).to_bits(), "element {i} {when}");
    }
}

async fn restart(client: &Client, session: &Session) {
    let mut events = session.events();
    let pid = executor_pid(client, 0).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            if let Ok(SessionEvent::ExecutorRestarted { .. }) = events.recv().await {
                return;
            }
        }
    })
    .await
    .expect("an ExecutorRestarted event");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_kernel_cache_serves_restarts_and_other_daemons_and_never_loads_a_corrupt_entry() {
    let dev = device();
    let home = tempfile::tempdir().unwrap();
    let cache = home.path().join("kernels");
    let cache_arg = cache.to_str().unwrap().to_owned();
    let flags = ["--devices", dev.uuid(), "--kernel-cache-dir", &cache_arg];
    let daemon = Daemon::start_backend("cuda", &flags, |_| {});
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("kernel-cache").await.unwrap();
    let n = 1 << 16;
    let ops = operands(&session, &dev, n).await;

    let (add, compiled_in) = load_add(&session).await;
    check_add(&session, &add, &ops, "compiled").await;
    let stored = entries(&cache);
    assert_eq!(stored.len(), 1, "one entry for one kernel: {stored:?}");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&cache), 0o700);
    assert_eq!(mode(&stored[0]), 0o600);
    let original = std::fs::read(&stored[0]).unwrap();

    // A restarted executor loads it from the cache.
    restart(&client, &session).await;
    let (cached, cached_in) = load_add(&session).await;
    check_add(&session, &cached, &ops, "loaded from the cache").await;
    eprintln!("load: compiled {compiled_in:?}, from the cache {cached_in:?}");
    assert_eq!(entries(&cache), stored);

    // A corrupted entry (one bit of the machine code) is discarded and
    // compiled again: the result stays exact.
    let mut corrupt = original.clone();
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0x10;
    std::fs::write(&stored[0], &corrupt).unwrap();
    restart(&client, &session).await;
    let (recompiled, _) = load_add(&session).await;
    check_add(&session, &recompiled, &ops, "after the entry was corrupted").await;
    let rewritten = std::fs::read(&stored[0]).unwrap();
    assert_ne!(rewritten, corrupt, "the corrupt entry was replaced");

    // A second daemon on the same directory loads it too.
    let other = Daemon::start_backend("cuda", &flags, |_| {});
    let other_client = Client::connect(&other.target()).await.unwrap();
    let other_session = other_client.open_session("kernel-cache-2").await.unwrap();
    let other_ops = operands(&other_session, &dev, n).await;
    let (shared, _) = load_add(&other_session).await;
    check_add(&other_session, &shared, &other_ops, "in a second daemon").await;
    assert_eq!(entries(&cache).len(), 1);
}

/// A daemon on `dev` that trusts this uid's cubins (for the faulting
/// kernel), with `extra` flags, logging when a spare is ready.
pub(super) fn trusting_daemon(dev: &CudaDevice, extra: &[&str]) -> Daemon {
    let trust = format!("uid:{}", nix::unistd::getuid());
    let mut flags = vec![
        "--devices",
        dev.uuid(),
        "--trust-unverified-artifacts",
        &trust,
    ];
    flags.extend_from_slice(extra);
    Daemon::start_backend("cuda", &flags, |command| {
        command.env(
            "RUST_LOG",
            "warn,ptxd::front::supervise=info,ptxd::recovery=debug",
        );
    })
}

/// Microseconds since the epoch: the clock of the daemon's recovery marks.
fn unix_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// The daemon's `ptxd::recovery` marks logged in `[from, to]` (µs since
/// the epoch): (timestamp, phase and the line's other fields).
fn recovery_marks(log: &str, from: u64, to: u64) -> Vec<(u64, String)> {
    let mut marks: Vec<(u64, String)> = log
        .lines()
        .filter_map(|line| line.split_once("ptxd::recovery: ").map(|(_, rest)| rest))
        .filter_map(|rest| {
            let at: u64 = rest
                .split_once("at_us=")?
                .1
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()?;
            let phase = rest.split_once("phase=\"")?.1.split('"').next()?.to_owned();
            let fields: Vec<&str> = rest
                .split_whitespace()
                .filter(|f| !f.starts_with("phase=") && !f.starts_with("at_us="))
                .collect();
            Some((at, format!("{phase} {}", fields.join(" "))))
        })
        .filter(|(at, _)| (from..=to).contains(at))
        .collect();
    marks.sort();
    marks
}

/// Prints one fault's recovery: every mark (the daemon's and the
/// bystander's) relative to the faulting launch's submission.
fn print_breakdown(title: &str, origin: u64, mut marks: Vec<(u64, String)>) {
    marks.sort();
    let mut text =
        format!("recovery breakdown, {title} (ms after the faulting launch was sent):\n");
    let mut last = origin;
    for (at, what) in &marks {
        let since = at.saturating_sub(origin) as f64 / 1000.0;
        let step = at.saturating_sub(last) as f64 / 1000.0;
        text.push_str(&format!("  {since:>9.3}  (+{step:>8.3})  {what}\n"));
        last = (*at).max(last);
    }
    eprintln!("{text}");
}

/// Waits until `daemon` logged a spare ready that is not `serving`.
async fn spare_ready(daemon: &Daemon, client: &Client) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let serving = executor_pid(client, 0).await;
        let log = daemon.stderr();
        let ready = log
            .lines()
            .filter(|l| l.contains("spare executor ready"))
            .filter_map(|l| l.split("pid=").nth(1))
            .filter_map(|rest| rest.split_whitespace().next())
            .filter_map(|pid| pid.parse::<u32>().ok())
            .filter(|pid| *pid != serving)
            .any(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists());
        if ready {
            return;
        }
        assert!(Instant::now() < deadline, "no spare became ready:\n{log}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The add kernel's text under another entry name: a distinct kernel (its
/// own canonical text, slot and JIT).
fn add_named(i: usize) -> String {
    String::from_utf8(corpus("add_f32_scalar.ptx"))
        .unwrap()
        .replace("add_f32_scalar", &format!("add_f32_scalar_{i}"))
}

/// A tenant that is not the bystander, ready to fault the device with the
/// cubin that stores to address 0: its session, kernel, buffer and launch.
pub(super) struct Faulting {
    session: Session,
    kernel: Kernel,
    _mem: DeviceAllocation,
    launch: Launch,
}

/// Faults the device: the faulting tenant's launch, answered KERNEL_FAULT.
pub(super) async fn fault(faulting: &Faulting) {
    let err = faulting
        .session
        .launch(&faulting.kernel, &faulting.launch)
        .await
        .unwrap_err();
    assert_eq!(err.reason_name(), "KERNEL_FAULT", "{err}");
}

pub(super) async fn prepare_fault(client: &Client, dev: &CudaDevice) -> Faulting {
    let session = client.open_session("faulting").await.unwrap();
    let cubin = std::fs::read(super::executor_client::corpus_dir().join("store_to_null.cubin"))
        .expect("run.sh builds store_to_null.cubin");
    let abi = ptxd_client::DeclaredAbi {
        inputs: 1,
        scalar_params: 0,
        element_size: 4,
    };
    let kernel = session
        .load_cubin(0, cubin, "store_to_null", abi)
        .await
        .unwrap();
    let mem = dev.alloc(4096).unwrap();
    let buffer = session
        .register_cuda_ipc(mem.ipc_handle().unwrap(), dev.uuid(), 4096)
        .await
        .unwrap();
    let launch = Launch::new([buffer.operand()], buffer.operand(), 1024).sync(true);
    Faulting {
        session,
        kernel,
        _mem: mem,
        launch,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fault_is_recovered_faster_with_a_spare_and_the_kernel_cache() {
    const ROUNDS: usize = 3;
    const BUFFERS: usize = 64;
    const KERNELS: usize = 32;
    let dev = device();
    let home = tempfile::tempdir().unwrap();
    let cache = home.path().join("kernels");
    let cache_arg = cache.to_str().unwrap().to_owned();
    let modes: [(&str, Vec<&str>); 2] = [
        ("neither", vec![]),
        (
            "spare and kernel cache",
            vec!["--spare-executor", "--kernel-cache-dir", &cache_arg],
        ),
    ];
    for (mode, extra) in modes {
        let spare = extra.contains(&"--spare-executor");
        let daemon = trusting_daemon(&dev, &extra);
        let client = Client::connect(&daemon.target()).await.unwrap();
        let session = client.open_session("bystander").await.unwrap();
        let n = 1 << 14;
        let ops = operands(&session, &dev, n).await;
        let mut held = Vec::new();
        for _ in 0..BUFFERS - 3 {
            let mem = dev.alloc(4096).unwrap();
            let buffer = session
                .register_cuda_ipc(mem.ipc_handle().unwrap(), dev.uuid(), 4096)
                .await
                .unwrap();
            held.push((mem, buffer));
        }
        let texts: Vec<String> = (0..KERNELS).map(add_named).collect();
        let mut first_launch = Vec::new();
        let mut working_set = Vec::new();
        for round in 0..ROUNDS {
            let mut kernels = Vec::new();
            for (i, text) in texts.iter().enumerate() {
                let kernel = session
                    .load_ptx(
                        0,
                        text.clone(),
                        &format!("add_f32_scalar_{i}"),
                        LoadOptions::default(),
                    )
                    .await
                    .unwrap();
                kernels.push(kernel);
            }
            check_add(&session, &kernels[0], &ops, "before the fault").await;
            if spare {
                spare_ready(&daemon, &client).await;
                if round == 0 {
                    // What the spare costs on the GPU: its context, and the
                    // mappings of the bystander's buffers it holds open.
                    let apps = std::process::Command::new("nvidia-smi")
                        .args([
                            "--query-compute-apps=pid,used_memory",
                            "--format=csv,noheader",
                        ])
                        .output()
                        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                        .unwrap_or_else(|e| format!("nvidia-smi: {e}"));
                    eprintln!(
                        "GPU memory per process (serving executor {}, daemon {}; the other ptxd one is the spare):\n{apps}",
                        executor_pid(&client, 0).await,
                        daemon.pid()
                    );
                }
            }
            // The faulting tenant is set up before the clock starts (its
            // session, cubin and buffer are not the recovery's cost), and
            // kept until the bystander has launched again.
            let faulting = prepare_fault(&client, &dev).await;
            let origin = unix_micros();
            let faulted = Instant::now();
            fault(&faulting).await;
            let mut mine = vec![(unix_micros(), "test: KERNEL_FAULT answered".to_string())];
            // The bystander's first launch that succeeds, reloading its
            // kernel when it is stale.
            let mut kernel = kernels[0].clone();
            let mut unavailable = 0;
            loop {
                let submitted = unix_micros();
                match session.launch(&kernel, &ops.launch).await {
                    Ok(_) => {
                        mine.push((submitted, "bystander: launch submitted".into()));
                        mine.push((unix_micros(), "bystander: launch completed".into()));
                        break;
                    }
                    Err(e) if e.reason_name() == "STALE_KERNEL" => {
                        mine.push((unix_micros(), "bystander: STALE_KERNEL".into()));
                        let reloaded = session
                            .load_ptx(
                                0,
                                texts[0].clone(),
                                "add_f32_scalar_0",
                                LoadOptions::default(),
                            )
                            .await;
                        mine.push((
                            unix_micros(),
                            format!(
                                "bystander: re-load done ({})",
                                if reloaded.is_ok() { "ok" } else { "failed" }
                            ),
                        ));
                        if let Ok(fresh) = reloaded {
                            kernel = fresh;
                            continue;
                        }
                    }
                    Err(e) => {
                        assert_eq!(e.reason_name(), "EXECUTOR_UNAVAILABLE", "{e}");
                        unavailable += 1;
                        if unavailable == 1 {
                            mine.push((
                                unix_micros(),
                                "bystander: first EXECUTOR_UNAVAILABLE".into(),
                            ));
                        }
                    }
                }
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
            first_launch.push(faulted.elapsed());
            if unavailable > 0 {
                mine.push((
                    unix_micros(),
                    format!("bystander: {unavailable} EXECUTOR_UNAVAILABLE in all"),
                ));
            }
            drop(faulting);
            // The daemon's marks of this fault: its log is written by now
            // but for the faulted executor's reaping, given a moment.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let mut marks = recovery_marks(&daemon.stderr(), origin, unix_micros());
            marks.extend(mine);
            print_breakdown(&format!("{mode}, fault {round}"), origin, marks);
            check_add(
                &session,
                &kernel,
                &ops,
                &format!("after fault {round} ({mode})"),
            )
            .await;
            // The rest of the working set, loaded again.
            let reload = Instant::now();
            for (i, text) in texts.iter().enumerate().skip(1) {
                session
                    .load_ptx(
                        0,
                        text.clone(),
                        &format!("add_f32_scalar_{i}"),
                        LoadOptions::default(),
                    )
                    .await
                    .unwrap();
            }
            working_set.push(reload.elapsed());
        }
        eprintln!(
            "H200 recovery, {mode}: fault -> bystander's first successful launch \
             ({BUFFERS} buffers, {KERNELS} kernels) {first_launch:?}; the other {} kernels \
             reloaded in {working_set:?}",
            KERNELS - 1
        );
    }
}
