//! Starts the real `ptxd` binary on a temporary socket for integration tests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running daemon; SIGTERM and wait on drop.
pub struct Daemon {
    pub child: Child,
    pub socket: PathBuf,
    pub dir: tempfile::TempDir,
}

pub const CORPUS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/corpus");

pub fn corpus(name: &str) -> String {
    std::fs::read_to_string(Path::new(CORPUS).join(name)).unwrap()
}

impl Daemon {
    /// `ptxd serve --backend host` with `extra` flags.
    pub fn start(extra: &[&str]) -> Daemon {
        Self::start_with(extra, |_| {})
    }

    /// [`Daemon::start`] with the command adjusted before it is spawned
    /// (environment, resource limits, where stderr goes).
    pub fn start_with(extra: &[&str], adjust: impl FnOnce(&mut Command)) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("ptxd.sock");
        let mut command = Command::new(env!("CARGO_BIN_EXE_ptxd"));
        command
            .arg("serve")
            .arg("--backend")
            .arg("host")
            .arg("--socket")
            .arg(&socket)
            // A test's client connections may still be open when it stops
            // the daemon (its runtime is blocked in the drop): keep the
            // drain short unless the test sets it.
            .args(if extra.contains(&"--drain-timeout") {
                &[][..]
            } else {
                &["--drain-timeout", "1s"][..]
            })
            .args(extra)
            .env(
                "RUST_LOG",
                std::env::var("PTXD_TEST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null());
        adjust(&mut command);
        let child = command.spawn().unwrap();
        let mut daemon = Daemon { child, socket, dir };
        daemon.wait_ready();
        daemon
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("ptxd exited before serving: {status}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("ptxd did not serve within 30 s");
    }

    pub fn target(&self) -> String {
        format!("unix:{}", self.socket.display())
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid()),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                return self.child.wait().unwrap();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.terminate();
        }
    }
}

/// Random f32 values in [-4, 4).
pub fn random_f32(n: usize) -> Vec<f32> {
    (0..n).map(|_| rand::random::<f32>() * 8.0 - 4.0).collect()
}

/// Is `pid` a live process (not a zombie)?
pub fn process_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.split_whitespace().nth(2).is_some_and(|s| s != "Z"),
        Err(_) => false,
    }
}

/// Number of mappings of `/dev/shm` objects whose name contains `needle` in
/// process `pid`.
pub fn shm_mappings(pid: u32, needle: &str) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map(|maps| {
            maps.lines()
                .filter(|l| l.contains("/dev/shm/") && l.contains(needle))
                .count()
        })
        .unwrap_or(0)
}

pub fn wait_until(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if condition() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("timed out after {timeout:?} waiting for {what}");
}
