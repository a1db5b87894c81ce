//! Recovery from a lost executor, on the host backend: the executor-down
//! lease event while restarts fail and the device coming back; the hot
//! spare (`--spare-executor`) kept in step with the registrations, promoted
//! when the serving executor dies (also when it dies itself during the
//! promotion), replaced when it dies waiting, with descriptors and
//! processes flat over many promotions; a kernel cache directory that is
//! not the daemon's; the verdict cache (a restarted daemon loads a kernel
//! it verified before without verifying it, a damaged entry is verified
//! again, a refusal is not kept, two daemons share one directory); and
//! measurements of kill → first successful launch with and without a spare
//! (`recovery_time_with_and_without_a_spare`) and of a daemon restart's
//! reload of 32 kernels (`restart_reload_time_of_a_32_kernel_working_set`),
//! ignored: run them by hand, in release.
//!
//! Restarts are made to fail without a hook in the daemon: the daemon runs
//! from a private copy of the `ptxd` binary, and an executor is spawned
//! from the daemon's own executable, so taking the copy's execute
//! permission away makes every spawn fail (EACCES, even as root) and giving
//! it back lets the next attempt succeed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::processes::{children, open_fds};
use crate::support::{corpus, executor_pid, ptxd_bin, random_f32, Daemon};
use ptxd_client::{
    Buffer, Client, Error, HostShm, Kernel, Launch, LoadOptions, OrphanCause, Session, SessionEvent,
};

/// A daemon started from its own copy of the binary, whose execute
/// permission the test controls.
struct PrivateDaemon {
    daemon: Daemon,
    binary: PathBuf,
}

impl PrivateDaemon {
    fn start(extra: &[&str]) -> PrivateDaemon {
        let dir = tempfile::tempdir().unwrap();
        let binary = dir.path().join("ptxd");
        std::fs::copy(ptxd_bin(), &binary).unwrap();
        set_executable(&binary, true);
        let socket = dir.path().join("ptxd.sock");
        let mut command = Command::new(&binary);
        command
            .args(["serve", "--backend", "host", "--socket"])
            .arg(&socket)
            .args(["--drain-timeout", "1s"])
            .args(extra)
            .env(
                "RUST_LOG",
                std::env::var("PTXD_TEST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null());
        PrivateDaemon {
            daemon: Daemon::spawn(command, socket, dir),
            binary,
        }
    }

    /// Makes every executor spawn fail (`false`) or succeed again.
    fn allow_executors(&self, allowed: bool) {
        set_executable(&self.binary, allowed);
    }
}

fn set_executable(path: &Path, executable: bool) {
    let mode = if executable { 0o755 } else { 0o644 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn kill(pid: u32) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
}

async fn f32_buffer(session: &Session, values: &[f32]) -> (HostShm, Buffer) {
    let mut shm = HostShm::create((values.len() * 4) as u64).unwrap();
    shm.write_f32(0, values).unwrap();
    let buffer = session.register_shm(&shm, None).await.unwrap();
    (shm, buffer)
}

async fn load_add(session: &Session) -> Kernel {
    session
        .load_ptx(
            0,
            corpus("add_f32_scalar.ptx"),
            "add_f32_scalar",
            LoadOptions::default(),
        )
        .await
        .unwrap()
}

/// The next event that `pick` accepts, within `bound`.
async fn next_event<T>(
    events: &mut tokio::sync::broadcast::Receiver<SessionEvent>,
    bound: Duration,
    mut pick: impl FnMut(SessionEvent) -> Option<T>,
) -> T {
    tokio::time::timeout(bound, async {
        loop {
            match events.recv().await {
                Ok(event) => {
                    if let Some(picked) = pick(event) {
                        return picked;
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(e) => panic!("the lease's events ended: {e}"),
            }
        }
    })
    .await
    .expect("the event did not come in time")
}

/// What an `ExecutorDown` event says.
#[derive(Debug)]
struct Down {
    device_uuid: String,
    generation: u64,
    cause: String,
    failed_restarts: u32,
    restart_error: String,
    retry_in: Duration,
}

fn down(event: SessionEvent) -> Option<Down> {
    match event {
        SessionEvent::ExecutorDown {
            device_uuid,
            generation,
            cause,
            failed_restarts,
            restart_error,
            retry_in,
        } => Some(Down {
            device_uuid,
            generation,
            cause,
            failed_restarts,
            restart_error,
            retry_in,
        }),
        SessionEvent::ExecutorRestarted { .. } => panic!("restarted while spawns must fail"),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn while_restarts_fail_sessions_hear_the_device_is_down_and_then_that_it_is_back() {
    let port = crate::support::free_port();
    let metrics = format!("127.0.0.1:{port}");
    let private = PrivateDaemon::start(&["--metrics", &metrics]);
    // `ptxd_device_executor_available{device}` from one scrape.
    let available = |uuid: String| async move {
        let (_, body) = crate::support::get_metrics(port).await;
        let series = format!("ptxd_device_executor_available{{device=\"{uuid}\"}} ");
        body.lines()
            .find_map(|line| line.strip_prefix(series.as_str()))
            .map(|value| value.trim().to_string())
            .unwrap_or_else(|| panic!("no {series} in\n{body}"))
    };
    let client = Client::connect(&private.daemon.target()).await.unwrap();
    let session = client.open_session("down").await.unwrap();
    let bystander = client.open_session("bystander").await.unwrap();
    let mut events = session.events();
    let mut bystander_events = bystander.events();
    let add = load_add(&session).await;
    let n = 4096;
    let (a, b) = (random_f32(n), random_f32(n));
    let (_a, a_buf) = f32_buffer(&session, &a).await;
    let (_b, b_buf) = f32_buffer(&session, &b).await;
    let (out_shm, out_buf) = f32_buffer(&session, &vec![f32::NAN; n]).await;
    let mut ring = session.open_ring(16, 0).await.unwrap();
    let before = client.info().await.unwrap().devices[0].clone();
    assert_eq!(ring.generation(), before.generation);

    private.allow_executors(false);
    kill(executor_pid(&client, 0).await);
    let killed = Instant::now();

    // The first failed attempt is reported at once (it fails fast), naming
    // the generation that died, why, and when the next attempt comes.
    let first = next_event(&mut events, Duration::from_secs(10), down).await;
    let told_after = killed.elapsed();
    assert_eq!(first.device_uuid, before.uuid);
    assert_eq!(first.generation, before.generation);
    assert_eq!(first.cause, "exited");
    assert_eq!(first.failed_restarts, 1);
    assert!(
        first.restart_error.contains("Permission denied"),
        "{first:?}"
    );
    assert_eq!(first.retry_in, Duration::from_millis(50));
    assert!(
        told_after < Duration::from_secs(2),
        "told {told_after:?} after the kill"
    );
    // Every session hears it, not only the one with work on the device.
    let told = next_event(&mut bystander_events, Duration::from_secs(10), down).await;
    assert_eq!(told.generation, before.generation);

    // The SDK orphaned the ring of the dead generation on the down event:
    // its waiters are released now, not after a restart that may never come.
    let orphaned = ring
        .orphaned()
        .expect("the ring is orphaned on the down event");
    match &orphaned.cause {
        OrphanCause::ExecutorDown {
            device_uuid,
            generation,
            cause,
            restart_error,
        } => {
            assert_eq!(device_uuid, &before.uuid);
            assert_eq!(*generation, before.generation);
            assert_eq!(cause, "exited");
            assert!(
                restart_error.contains("Permission denied"),
                "{restart_error}"
            );
        }
        other => panic!("orphaned for another cause: {other:?}"),
    }

    // Restarts go on failing, each reported, with the back-off doubling.
    let second = next_event(&mut events, Duration::from_secs(10), down).await;
    assert_eq!(second.failed_restarts, 2);
    assert_eq!(second.retry_in, Duration::from_millis(100));
    assert_eq!(second.generation, before.generation);

    // Meanwhile the device refuses work with typed reasons: the dead
    // generation's kernel is stale, and nothing can be loaded.
    let launch = Launch::new(
        [a_buf.operand(), b_buf.operand()],
        out_buf.operand(),
        n as u64,
    )
    .sync(true);
    let stale = session.launch(&add, &launch).await.unwrap_err();
    assert_eq!(stale.reason_name(), "STALE_KERNEL", "{stale}");
    let unavailable = session
        .load_ptx(
            0,
            corpus("add_f32_scalar.ptx"),
            "add_f32_scalar",
            LoadOptions::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(
        unavailable.reason_name(),
        "EXECUTOR_UNAVAILABLE",
        "{unavailable}"
    );
    let info = client.info().await.unwrap().devices[0].clone();
    assert!(!info.available);
    // The alerting gauge says so too (deploy/prometheus/alerts.yml).
    assert_eq!(available(before.uuid.clone()).await, "0");

    // Back: the next attempt succeeds and says so. It comes within the
    // back-off of the moment, which doubles up to 10 s: the wait is longer.
    private.allow_executors(true);
    let (old, new) = next_event(&mut events, Duration::from_secs(30), |e| match e {
        SessionEvent::ExecutorRestarted {
            old_generation,
            new_generation,
            ..
        } => Some((old_generation, new_generation)),
        _ => None,
    })
    .await;
    assert_eq!(old, before.generation);
    let after = client.info().await.unwrap().devices[0].clone();
    assert!(after.available);
    assert_eq!(available(before.uuid.clone()).await, "1");
    assert_eq!(after.generation, new);
    assert_ne!(new, old);

    // Reloaded, the kernel computes exact results on the buffers the new
    // executor re-opened.
    let fresh = load_add(&session).await;
    session.launch(&fresh, &launch).await.unwrap();
    let out = out_shm.read_f32(0, n).unwrap();
    for i in 0..n {
        assert_eq!(out[i].to_bits(), (a[i] + b[i]).to_bits(), "element {i}");
    }
    assert!(matches!(
        ring.launch(&add, &[(&a_buf, 0), (&b_buf, 0)], (&out_buf, 0), 8, &[]),
        Err(Error::RingOrphaned(_))
    ));
}

/// A daemon with spare executors, logging when each spare is ready.
fn spare_daemon() -> Daemon {
    Daemon::start_with(&["--spare-executor"], |command| {
        command.env("RUST_LOG", "warn,ptxd::front::supervise=info");
    })
}

/// Waits until the daemon has its serving executor and a spare ready
/// beside it (started, and said so in the log); returns the spare's pid.
async fn spare_ready(daemon: &Daemon, client: &Client) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let serving = executor_pid(client, 0).await;
        let kids = children(daemon.pid());
        if kids.len() == 2 && kids.contains(&serving) {
            let spare = kids.iter().copied().find(|p| *p != serving).unwrap();
            let ready = format!("spare executor ready device=HOST-0 pid={spare} ");
            if daemon.stderr().contains(&ready) {
                return spare;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no spare beside {serving}: children {kids:?}\n{}",
            daemon.stderr()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn restarted(events: &mut tokio::sync::broadcast::Receiver<SessionEvent>) -> (u64, u64) {
    next_event(events, Duration::from_secs(20), |e| match e {
        SessionEvent::ExecutorRestarted {
            old_generation,
            new_generation,
            ..
        } => Some((old_generation, new_generation)),
        _ => None,
    })
    .await
}

/// A session's add over fresh random data on registered buffers.
struct AddCase {
    a: Vec<f32>,
    b: Vec<f32>,
    _a: HostShm,
    _b: HostShm,
    out: HostShm,
    launch: Launch,
}

impl AddCase {
    async fn new(session: &Session, n: usize) -> AddCase {
        let (a, b) = (random_f32(n), random_f32(n));
        let (a_shm, a_buf) = f32_buffer(session, &a).await;
        let (b_shm, b_buf) = f32_buffer(session, &b).await;
        let (out, out_buf) = f32_buffer(session, &vec![f32::NAN; a.len()]).await;
        let launch = Launch::new(
            [a_buf.operand(), b_buf.operand()],
            out_buf.operand(),
            n as u64,
        )
        .sync(true);
        AddCase {
            a,
            b,
            _a: a_shm,
            _b: b_shm,
            out,
            launch,
        }
    }

    /// Launches over a poisoned output and compares every element.
    async fn check(&mut self, session: &Session, kernel: &Kernel, when: &str) {
        let n = self.a.len();
        self.out.write_f32(0, &vec![f32::NAN; n]).unwrap();
        session.launch(kernel, &self.launch).await.unwrap();
        let out = self.out.read_f32(0, n).unwrap();
        for (i, (got, (a, b))) in out.iter().zip(self.a.iter().zip(&self.b)).enumerate() {
            assert_eq!(got.to_bits(), (a + b).to_bits(), "element {i} {when}");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_spare_is_promoted_when_the_executor_dies_and_the_next_spare_starts() {
    let daemon = spare_daemon();
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("spare").await.unwrap();
    let mut events = session.events();
    let add = load_add(&session).await;
    let mut case = AddCase::new(&session, 4096).await;
    case.check(&session, &add, "before").await;
    let spare = spare_ready(&daemon, &client).await;
    let serving = executor_pid(&client, 0).await;
    let before = client.info().await.unwrap().devices[0].clone();
    // The spare is kept in step with the registrations: it maps what is
    // registered, and unmaps what is released, while it waits.
    let mapped = |pid: u32, count: usize, what: &str| {
        crate::support::wait_until(what, Duration::from_secs(10), || {
            crate::support::shm_mappings(pid, "ptxd") == count
        })
    };
    mapped(spare, 3, "the spare to map the three buffers");
    let (_extra, extra_buf) = f32_buffer(&session, &random_f32(64)).await;
    mapped(
        spare,
        4,
        "the spare to map a buffer registered after it started",
    );
    session.release_buffer(&extra_buf).await.unwrap();
    mapped(spare, 3, "the spare to unmap a released buffer");
    let (_late, late_buf) = f32_buffer(&session, &random_f32(64)).await;

    kill(serving);
    let (old, new) = restarted(&mut events).await;
    assert_eq!(old, before.generation);
    // The spare serves now, in a new generation, with the same guarantees:
    // the old kernel is stale and the buffers were re-opened in it.
    assert_eq!(
        executor_pid(&client, 0).await,
        spare,
        "the spare was promoted"
    );
    let after = client.info().await.unwrap().devices[0].clone();
    assert_eq!(after.generation, new);
    assert_ne!(new, old);
    assert!(after.available);
    let stale = session.launch(&add, &case.launch).await.unwrap_err();
    assert_eq!(stale.reason_name(), "STALE_KERNEL", "{stale}");
    let fresh = load_add(&session).await;
    case.check(&session, &fresh, "on the promoted spare").await;
    // Whether or not the spare had mapped the last buffer before it was
    // promoted, it maps it now.
    assert_eq!(crate::support::shm_mappings(spare, "ptxd"), 4);
    let late = client
        .raw()
        .list_buffers(ptxd_proto::v1::ListBuffersRequest {
            session: session.id().to_owned(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        late.buffers
            .iter()
            .any(|b| b.buffer == late_buf.handle && b.generation == new && b.live),
        "the late buffer lives in the new generation: {late:?}"
    );

    // The next spare starts in the background, and is promoted in turn.
    let next = spare_ready(&daemon, &client).await;
    assert!(next != spare && next != serving);
    kill(spare);
    restarted(&mut events).await;
    assert_eq!(executor_pid(&client, 0).await, next);
    let again = load_add(&session).await;
    case.check(&session, &again, "on the second spare").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_spare_that_dies_during_its_promotion_is_replaced_by_a_fresh_executor() {
    let daemon = spare_daemon();
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("spare-fault").await.unwrap();
    let mut events = session.events();
    let mut case = AddCase::new(&session, 1000).await;
    // Buffers to re-open make the promotion take a while.
    let mut held = Vec::new();
    for _ in 0..100 {
        held.push(f32_buffer(&session, &random_f32(16)).await);
    }
    for round in 0..3 {
        let spare = spare_ready(&daemon, &client).await;
        let serving = executor_pid(&client, 0).await;
        // Both at once: the spare dies before or while it is promoted.
        kill(serving);
        kill(spare);
        restarted(&mut events).await;
        let now = executor_pid(&client, 0).await;
        assert!(now != serving && now != spare, "round {round}");
        let add = load_add(&session).await;
        case.check(&session, &add, &format!("after round {round}"))
            .await;
        assert_eq!(
            crate::support::shm_mappings(now, "ptxd"),
            3 + held.len(),
            "every buffer re-opened in round {round}"
        );
    }
    spare_ready(&daemon, &client).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn descriptors_and_processes_stay_flat_over_many_promotions() {
    let daemon = spare_daemon();
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("flat").await.unwrap();
    let mut events = session.events();
    let mut case = AddCase::new(&session, 256).await;
    let mut baseline = None;
    for round in 0..100 {
        spare_ready(&daemon, &client).await;
        if round == 1 {
            baseline = Some(open_fds(daemon.pid()));
        }
        kill(executor_pid(&client, 0).await);
        restarted(&mut events).await;
        let add = load_add(&session).await;
        case.check(&session, &add, &format!("after kill {round}"))
            .await;
        session.unload(&add).await.unwrap();
    }
    spare_ready(&daemon, &client).await;
    let kids = children(daemon.pid());
    assert_eq!(kids.len(), 2, "serving and spare only: {kids:?}");
    // A dead executor's channel is closed once the last task holding its
    // link lets go (a spare's sync task wakes every 100 ms): give them a
    // moment, then nothing may be left over.
    let baseline = baseline.unwrap();
    let settled = Instant::now() + Duration::from_secs(10);
    let mut fds = open_fds(daemon.pid());
    while fds > baseline && Instant::now() < settled {
        tokio::time::sleep(Duration::from_millis(50)).await;
        fds = open_fds(daemon.pid());
    }
    assert!(
        fds <= baseline,
        "the daemon's descriptors grew from {baseline} to {fds} over 99 promotions"
    );
}

/// Two deaths in a row: the promoted spare dies as soon as it serves,
/// before the next spare is ready; a fresh executor replaces it, each
/// restart is announced with its own generation, kernels of either old
/// generation are refused stale, and the results after are exact.
#[tokio::test(flavor = "multi_thread")]
async fn two_deaths_in_a_row_are_two_restarts_and_the_spare_comes_back() {
    let daemon = spare_daemon();
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("twice").await.unwrap();
    let mut events = session.events();
    let mut case = AddCase::new(&session, 777).await;
    for round in 0..3 {
        let before = load_add(&session).await;
        case.check(&session, &before, &format!("round {round} before"))
            .await;
        let spare = spare_ready(&daemon, &client).await;
        kill(executor_pid(&client, 0).await);
        let (first_old, first_new) = restarted(&mut events).await;
        let promoted = executor_pid(&client, 0).await;
        assert_eq!(promoted, spare, "round {round}: the spare was promoted");
        // At once: most often before the next spare is ready (either way
        // the device must come back).
        kill(promoted);
        let (second_old, second_new) = restarted(&mut events).await;
        assert_eq!(second_old, first_new, "round {round}");
        assert!(
            first_old < first_new && first_new < second_new,
            "round {round}"
        );
        let err = session.launch(&before, &case.launch).await.unwrap_err();
        assert_eq!(err.reason_name(), "STALE_KERNEL", "round {round}: {err}");
        let after = load_add(&session).await;
        case.check(&session, &after, &format!("round {round} after"))
            .await;
        session.unload(&after).await.unwrap();
    }
    spare_ready(&daemon, &client).await;
}

/// Kill → first successful launch of a surviving session, with and without
/// a spare, on the host backend: a measurement, not a timed test. Run with
/// `cargo test --release --test recovery -- --ignored --nocapture recovery_time`.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a measurement; run by hand"]
async fn recovery_time_with_and_without_a_spare() {
    const ROUNDS: usize = 15;
    const BUFFERS: usize = 64;
    const KERNELS: usize = 32;
    for spare in [false, true] {
        let daemon = if spare {
            spare_daemon()
        } else {
            Daemon::start(&[])
        };
        let client = Client::connect(&daemon.target()).await.unwrap();
        let session = client.open_session("measure").await.unwrap();
        let mut case = AddCase::new(&session, 4096).await;
        let mut held = Vec::new();
        for _ in 0..BUFFERS - 3 {
            held.push(f32_buffer(&session, &random_f32(1024)).await);
        }
        let mut times = Vec::new();
        let mut told = Vec::new();
        // When each restart reached the session, stamped as it arrives.
        let arrivals = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Instant>::new()));
        let mut events = session.events();
        let stamping = arrivals.clone();
        let stamper = tokio::spawn(async move {
            while let Ok(event) = events.recv().await {
                if let SessionEvent::ExecutorRestarted { .. } = event {
                    stamping.lock().unwrap().push(Instant::now());
                }
            }
        });
        for _ in 0..ROUNDS {
            if spare {
                spare_ready(&daemon, &client).await;
            }
            let mut kernels = Vec::new();
            for _ in 0..KERNELS {
                kernels.push(load_add(&session).await);
            }
            case.check(&session, &kernels[0], "before the kill").await;
            let killed = Instant::now();
            kill(executor_pid(&client, 0).await);
            // The session's first launch that succeeds, reloading its
            // kernel when it is stale.
            let mut kernel = kernels[0].clone();
            loop {
                match session.launch(&kernel, &case.launch).await {
                    Ok(_) => break,
                    Err(e) if e.reason_name() == "STALE_KERNEL" => {
                        if let Ok(fresh) = session
                            .load_ptx(
                                0,
                                corpus("add_f32_scalar.ptx"),
                                "add_f32_scalar",
                                LoadOptions::default(),
                            )
                            .await
                        {
                            // Launched again at once, not after the pause.
                            kernel = fresh;
                            continue;
                        }
                    }
                    Err(_) => {}
                }
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
            times.push(killed.elapsed());
            let announced = arrivals.lock().unwrap().last().copied();
            if let Some(at) = announced.filter(|at| *at > killed) {
                told.push(at - killed);
            }
            case.check(&session, &kernel, "after the kill").await;
        }
        stamper.abort();
        times.sort();
        told.sort();
        println!(
            "host backend, spare {spare}: kill -> ExecutorRestarted at the session: min {:?} p50 {:?} max {:?} ({} rounds)",
            told[0],
            told[told.len() / 2],
            told[told.len() - 1],
            told.len()
        );
        println!(
            "host backend, spare {spare}: kill -> first successful launch over {ROUNDS} kills \
             ({BUFFERS} buffers, {KERNELS} kernels): min {:?} p50 {:?} max {:?}",
            times[0],
            times[ROUNDS / 2],
            times[ROUNDS - 1]
        );
    }
}

#[test]
fn a_kernel_cache_directory_that_is_not_the_daemons_stops_it_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real");
    std::fs::create_dir(&real).unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, b"not a directory").unwrap();
    for (bad, why) in [(&link, "a symbolic link"), (&file, "not a directory")] {
        let socket = dir.path().join("ptxd.sock");
        let mut command = crate::support::serve_command("host", &socket, &["--kernel-cache-dir"]);
        command.arg(bad);
        let output = crate::support::run_to_exit(command, Duration::from_secs(30));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{stderr}");
        assert!(
            stderr.contains(&format!(
                "kernel cache directory {} is not a directory of this user ({why})",
                bad.display()
            )),
            "{stderr}"
        );
    }
    // A fresh path is created, private.
    let fresh = dir.path().join("a/b/kernels");
    let socket = dir.path().join("fresh.sock");
    let mut command = Command::new(ptxd_bin());
    command
        .args(["serve", "--backend", "host", "--socket"])
        .arg(&socket)
        .arg("--kernel-cache-dir")
        .arg(&fresh)
        .stdin(Stdio::null());
    let daemon = Daemon::spawn(command, socket, tempfile::tempdir().unwrap());
    let mode = std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
    drop(daemon);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_spare_that_dies_while_waiting_is_replaced_and_the_device_serves_on() {
    let daemon = spare_daemon();
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("spare-dies").await.unwrap();
    let mut events = session.events();
    let add = load_add(&session).await;
    let mut case = AddCase::new(&session, 512).await;
    let serving = executor_pid(&client, 0).await;
    let generation = client.info().await.unwrap().devices[0].generation;
    let mut spares = vec![spare_ready(&daemon, &client).await];
    for round in 0..5 {
        let dying = *spares.last().unwrap();
        kill(dying);
        crate::support::wait_until("the spare to die", Duration::from_secs(10), || {
            !crate::support::process_alive(dying as i32)
        });
        let next = spare_ready(&daemon, &client).await;
        assert!(!spares.contains(&next), "round {round}: {next} again");
        spares.push(next);
        // The serving executor and its generation are untouched: the
        // session's kernel is not stale and nothing was announced.
        assert_eq!(executor_pid(&client, 0).await, serving);
        case.check(&session, &add, &format!("after spare {round} died"))
            .await;
    }
    assert_eq!(
        client.info().await.unwrap().devices[0].generation,
        generation
    );
    assert!(
        events.try_recv().is_err(),
        "no lease event for a spare's death"
    );
}

/// The first `count` kernels of the JIT corpus's Triton family (every one
/// the verifier proves), as (text, entry): a working set of distinct real
/// kernels.
/// What a daemon with `--kernel-cache-dir` logs once per verifier run that
/// kept its verdict, and once per verdict served from disk
/// (`front::kernels::VERDICT_LOG`, at debug).
const VERIFIED: &str = "PTX verified; its verdict is kept";
const RECALLED: &str = "PTX verdict served from the verdict cache";

/// A host daemon whose kernel cache (and so verdict cache) is `cache`,
/// logging the verdict cache's decisions.
fn verdict_daemon(cache: &Path) -> Daemon {
    Daemon::start_with(
        &["--kernel-cache-dir", cache.to_str().unwrap()],
        |command| {
            command.env("RUST_LOG", "warn,ptxd::verdicts=debug");
        },
    )
}

fn logged(daemon: &Daemon, line: &str) -> usize {
    daemon.stderr().matches(line).count()
}

/// The verdict entries under `cache`.
fn verdict_entries(cache: &Path) -> Vec<PathBuf> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(cache.join("verdicts"))
        .map(|listing| listing.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    entries.sort();
    entries
}

/// Issue 23: a restarted daemon loads a kernel it verified before without
/// verifying it (the verdict comes from disk), and the kernel launches with
/// exact results; an entry damaged on disk (a payload byte flipped, the file
/// cut short, another key's entry under its name) is not used: the kernel
/// is verified again, launches exactly, and its entry is whole again.
#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_daemon_loads_a_kept_verdict_without_verifying_and_a_damaged_one_is_verified_again(
) {
    let cache = tempfile::tempdir().unwrap();
    let mut first_signature = None;
    for round in ["first", "restart", "flipped", "truncated", "foreign"] {
        if let [entry] = &verdict_entries(cache.path())[..] {
            let mut bytes = std::fs::read(entry).unwrap();
            match round {
                // Past the 80-byte header: the payload.
                "flipped" => {
                    let at = 80 + rand::random::<u64>() as usize % (bytes.len() - 80);
                    bytes[at] ^= 0x10;
                }
                "truncated" => bytes.truncate(bytes.len() - 1 - bytes.len() / 3),
                "foreign" => {
                    // A whole, valid entry of another kernel under this name.
                    let daemon = verdict_daemon(cache.path());
                    let client = Client::connect(&daemon.target()).await.unwrap();
                    let session = client.open_session("other").await.unwrap();
                    crate::support::load(&session, "affine_f32_scalar.ptx", "affine_f32_scalar")
                        .await;
                    let other = verdict_entries(cache.path())
                        .into_iter()
                        .find(|p| p != entry)
                        .unwrap();
                    bytes = std::fs::read(&other).unwrap();
                    std::fs::remove_file(other).unwrap();
                }
                _ => {}
            }
            std::fs::write(entry, &bytes).unwrap();
        }
        let daemon = verdict_daemon(cache.path());
        let client = Client::connect(&daemon.target()).await.unwrap();
        let session = client.open_session("verdicts").await.unwrap();
        let add = load_add(&session).await;
        let mut case = AddCase::new(&session, 3000 + rand::random::<u8>() as usize).await;
        case.check(&session, &add, round).await;
        let expected = if round == "restart" { (0, 1) } else { (1, 0) };
        assert_eq!(
            (logged(&daemon, VERIFIED), logged(&daemon, RECALLED)),
            expected,
            "{round}: (verified, recalled)\n{}",
            daemon.stderr()
        );
        // The verdict from disk is the verifier's: the same signature and
        // launch contract.
        let signature = add.signature();
        assert_eq!(
            first_signature.get_or_insert_with(|| signature.clone()),
            &signature,
            "{round}"
        );
        assert_eq!(verdict_entries(cache.path()).len(), 1, "{round}");
    }
}

/// A refused kernel's refusal is not kept: after a restart it is verified
/// again and refused with the same reason and details.
#[tokio::test(flavor = "multi_thread")]
async fn a_kernel_refused_before_a_restart_is_refused_again_with_the_same_reason() {
    let cache = tempfile::tempdir().unwrap();
    let refused = corpus("nvcc/refused-ptx/grid_stride.sm_90.ptx");
    let mut refusals = Vec::new();
    for _ in 0..2 {
        let daemon = verdict_daemon(cache.path());
        let client = Client::connect(&daemon.target()).await.unwrap();
        let session = client.open_session("refused").await.unwrap();
        let error = session
            .load_ptx(
                0,
                refused.clone(),
                "grid_stride_scale_f32",
                LoadOptions::default(),
            )
            .await
            .unwrap_err();
        let refusal = error.refusal().expect("a refusal");
        refusals.push((
            error.reason_name(),
            refusal.message().to_owned(),
            refusal.metadata().clone(),
        ));
        assert_eq!(logged(&daemon, RECALLED), 0);
    }
    assert_eq!(refusals[0].0, "NON_SCALAR_ABI", "{:?}", refusals[0]);
    assert_eq!(refusals[0], refusals[1]);
    assert!(verdict_entries(cache.path()).is_empty());
}

/// Two daemons on one cache directory at once: each serves the verdicts
/// the other kept, both keep verdicts of the same kernels concurrently,
/// and a third daemon afterwards verifies nothing of the 16 kernels.
#[tokio::test(flavor = "multi_thread")]
async fn two_daemons_sharing_a_cache_directory_serve_each_others_verdicts() {
    let cache = tempfile::tempdir().unwrap();
    let set = triton_working_set(16);
    let (first, second) = set.split_at(8);
    let a = verdict_daemon(cache.path());
    let b = verdict_daemon(cache.path());
    let client_a = Client::connect(&a.target()).await.unwrap();
    let client_b = Client::connect(&b.target()).await.unwrap();
    load_working_set(&client_a, first).await;
    assert_eq!(logged(&a, VERIFIED), 8);
    load_working_set(&client_b, first).await;
    assert_eq!((logged(&b, VERIFIED), logged(&b, RECALLED)), (0, 8));
    // Both at once, every load of both sent together.
    tokio::join!(
        load_working_set_at_once(&client_a, second),
        load_working_set_at_once(&client_b, second)
    );
    let verified_second = logged(&a, VERIFIED) - 8 + logged(&b, VERIFIED);
    assert!((8..=16).contains(&verified_second), "{verified_second}");
    let entries = verdict_entries(cache.path());
    assert_eq!(entries.len(), 16, "{entries:?}");
    assert!(entries
        .iter()
        .all(|p| p.extension().is_some_and(|e| e == "kc")));
    let c = verdict_daemon(cache.path());
    let client_c = Client::connect(&c.target()).await.unwrap();
    load_working_set(&client_c, &set).await;
    assert_eq!((logged(&c, VERIFIED), logged(&c, RECALLED)), (0, 16));
}

fn triton_working_set(count: usize) -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/jit");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("triton/manifest.json")).unwrap())
            .unwrap();
    let set: Vec<(String, String)> = manifest["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .take(count)
        .map(|k| {
            let file = k["file"].as_str().unwrap();
            let text = std::fs::read_to_string(root.join(file)).unwrap();
            (text, k["entry"].as_str().unwrap().to_owned())
        })
        .collect();
    assert_eq!(set.len(), count, "the Triton corpus holds fewer kernels");
    set
}

/// Loads the working set in a new session, one after the other; the time
/// from the first request to the last answer.
async fn load_working_set(client: &Client, set: &[(String, String)]) -> Duration {
    let session = client.open_session("working-set").await.unwrap();
    let started = Instant::now();
    for (text, entry) in set {
        session
            .load_ptx(0, text.clone(), entry, LoadOptions::default())
            .await
            .unwrap_or_else(|e| panic!("{entry}: {e}"));
    }
    let took = started.elapsed();
    session.close().await.unwrap();
    took
}

/// [`load_working_set`] with every load sent at once (the verifier runs
/// as many as the tenant's share of it allows at a time).
async fn load_working_set_at_once(client: &Client, set: &[(String, String)]) -> Duration {
    let session = client.open_session("working-set").await.unwrap();
    let started = Instant::now();
    let loads = set
        .iter()
        .map(|(text, entry)| session.load_ptx(0, text.clone(), entry, LoadOptions::default()));
    for (loaded, (_, entry)) in futures_util::future::join_all(loads)
        .await
        .into_iter()
        .zip(set)
    {
        loaded.unwrap_or_else(|e| panic!("{entry}: {e}"));
    }
    let took = started.elapsed();
    session.close().await.unwrap();
    took
}

fn spread(mut times: Vec<Duration>) -> String {
    times.sort();
    format!(
        "min {:?} p50 {:?} max {:?} ({} runs)",
        times[0],
        times[times.len() / 2],
        times[times.len() - 1],
        times.len()
    )
}

/// Daemon restart → a working set of 32 distinct real kernels (the Triton
/// corpus) loaded again (issue 23: ≤ 50 ms), on the host backend, beside
/// what the parts cost: the same loads in a daemon that has verified them
/// (its canonical memo and kernel slots warm: no verification, no executor
/// load), and after an executor restart (memo warm, every kernel loaded
/// into the new executor again), and after a restart with the verdict cache
/// (`--kernel-cache-dir`: the verdicts read from disk, no verification). A
/// measurement, not a timed test. Run with
/// `cargo test --release --test daemon -- --ignored --nocapture restart_reload`.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a measurement; run by hand"]
async fn restart_reload_time_of_a_32_kernel_working_set() {
    const ROUNDS: usize = 7;
    let set = triton_working_set(32);
    let (mut daemon_restarted, mut warm, mut executor_restarted) =
        (Vec::new(), Vec::new(), Vec::new());
    let mut at_once = Vec::new();
    // The verdict cache: one directory, its verdicts kept by a daemon
    // before the rounds; each round's daemons are restarts that find them.
    let cache = tempfile::tempdir().unwrap();
    {
        let primer = verdict_daemon(cache.path());
        let client = Client::connect(&primer.target()).await.unwrap();
        load_working_set(&client, &set).await;
        assert_eq!(logged(&primer, VERIFIED), set.len());
    }
    let (mut kept_one_by_one, mut kept_at_once) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let daemon = verdict_daemon(cache.path());
        let client = Client::connect(&daemon.target()).await.unwrap();
        kept_one_by_one.push(load_working_set(&client, &set).await);
        let daemon = verdict_daemon(cache.path());
        let client = Client::connect(&daemon.target()).await.unwrap();
        kept_at_once.push(load_working_set_at_once(&client, &set).await);
        assert_eq!(logged(&daemon, VERIFIED), 0, "{}", daemon.stderr());
    }
    for _ in 0..ROUNDS {
        // A fresh daemon is a restarted one: nothing of the last survives.
        let daemon = Daemon::start(&[]);
        let client = Client::connect(&daemon.target()).await.unwrap();
        daemon_restarted.push(load_working_set(&client, &set).await);
        let fresh = Daemon::start(&[]);
        let fresh_client = Client::connect(&fresh.target()).await.unwrap();
        at_once.push(load_working_set_at_once(&fresh_client, &set).await);
        warm.push(load_working_set(&client, &set).await);
        let session = client.open_session("watch").await.unwrap();
        let mut events = session.events();
        kill(executor_pid(&client, 0).await);
        restarted(&mut events).await;
        executor_restarted.push(load_working_set(&client, &set).await);
    }
    println!(
        "host backend: daemon restart -> 32 Triton kernels loaded again: {}",
        spread(daemon_restarted)
    );
    println!(
        "host backend: daemon restart -> the same 32 sent at once: {}",
        spread(at_once)
    );
    println!(
        "host backend: daemon restart, verdicts kept on disk -> 32 loaded again one by one: {}",
        spread(kept_one_by_one)
    );
    println!(
        "host backend: daemon restart, verdicts kept on disk -> the same 32 sent at once: {}",
        spread(kept_at_once)
    );
    println!(
        "host backend: the same 32 in a daemon that loaded them before: {}",
        spread(warm)
    );
    println!(
        "host backend: the same 32 after an executor restart (verdicts kept): {}",
        spread(executor_restarted)
    );
}
