//! Recovery from a lost executor, on the host backend: the executor-down
//! lease event while restarts fail, and the device coming back.
//!
//! Restarts are made to fail without a hook in the daemon: the daemon runs
//! from a private copy of the `ptxd` binary, and an executor is spawned
//! from the daemon's own executable, so taking the copy's execute
//! permission away makes every spawn fail (EACCES, even as root) and giving
//! it back lets the next attempt succeed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{corpus, executor_pid, ptxd_bin, random_f32, Daemon};
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
    let private = PrivateDaemon::start(&[]);
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
        OrphanCause::ExecutorRestarted {
            device_uuid,
            old_generation,
            cause,
            ..
        } => {
            assert_eq!(device_uuid, &before.uuid);
            assert_eq!(*old_generation, before.generation);
            assert!(cause.contains("executor down"), "{cause}");
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

    // Back: the next attempt succeeds and says so.
    private.allow_executors(true);
    let (old, new) = next_event(&mut events, Duration::from_secs(10), |e| match e {
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
