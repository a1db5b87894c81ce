//! The real `ptxd` daemon for tests and benchmarks: one place that starts
//! it on a fresh temporary socket, waits until the socket answers, and stops
//! and reaps it on drop.
//!
//! A module of `tests/support` (which re-exports its main items for the host
//! suites); `tests/gpu.rs` and `benches/cuda_launch.rs` include it directly
//! by `#[path]`. Tests may panic, so every failure here is a panic that says
//! what the daemon wrote.
//!
//! Invariants:
//! - The binary is `$PTXD_BIN` when set (the packed one on a GPU machine),
//!   otherwise the one cargo built for this test or bench.
//! - Every wait is bounded: [`START_TIMEOUT`] to answer, [`STOP_TIMEOUT`]
//!   from SIGTERM to exit before SIGKILL.
//! - The daemon's stderr (and its executors', which inherit it) goes to a
//!   file beside the socket, not to the terminal: [`Daemon::stderr`] reads
//!   it, a failed start or wait panics with it, and a daemon dropped while
//!   its test panics prints it. A file and not a pipe: an executor keeps the
//!   write end open after the daemon exits, so a pipe might never end.
//! - A [`Daemon`] is never leaked: dropping it stops the process (SIGTERM,
//!   then SIGKILL) and reaps it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// How long a daemon may take to answer on its socket.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a daemon may take to exit after SIGTERM before it is killed.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(20);
/// How often a wait looks again: short, since the benchmark times a start.
const POLL: Duration = Duration::from_millis(5);

/// The ptxd binary: `$PTXD_BIN` (the packed `.gpu/ptxd`) or the one cargo built.
pub fn ptxd_bin() -> PathBuf {
    std::env::var_os("PTXD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_ptxd")))
}

/// `ptxd serve --backend BACKEND --socket SOCKET EXTRA`, with a 1 s drain
/// unless `extra` sets one (a test's client connections may still be open
/// when it stops the daemon), `RUST_LOG` from `$PTXD_TEST_LOG` (default
/// `warn`) and stdin closed. For tests that run a daemon to its refusal with
/// [`run_to_exit`]; [`Daemon::start_backend`] serves with it.
pub fn serve_command(backend: &str, socket: &Path, extra: &[&str]) -> Command {
    let mut command = Command::new(ptxd_bin());
    command
        .args(["serve", "--backend", backend, "--socket"])
        .arg(socket)
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
    command
}

/// Runs `command` (a ptxd expected to stop by itself, e.g. to refuse its
/// arguments) with its output captured. One still running after `timeout`
/// is killed and the test fails with what it wrote: a daemon that should
/// have refused would otherwise serve forever.
pub fn run_to_exit(mut command: Command, timeout: Duration) -> Output {
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {command:?}: {e}"));
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let (exited, exit) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        let late = exit.recv_timeout(timeout).is_err();
        if late {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        }
        late
    });
    let output = child.wait_with_output().unwrap();
    let _ = exited.send(());
    if watchdog.join().unwrap() {
        panic!(
            "{command:?} did not exit within {timeout:?}\nstdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    output
}

/// A running daemon on a socket in its own temporary directory.
pub struct Daemon {
    child: Child,
    pub socket: PathBuf,
    /// Holds the socket and the stderr log; removed on drop.
    pub dir: tempfile::TempDir,
    stderr_log: PathBuf,
}

impl Daemon {
    /// `ptxd serve --backend host` with `extra` flags.
    pub fn start(extra: &[&str]) -> Daemon {
        Self::start_with(extra, |_| {})
    }

    /// [`Daemon::start`] with the command adjusted before it is spawned
    /// (environment, resource limits, process group).
    pub fn start_with(extra: &[&str], adjust: impl FnOnce(&mut Command)) -> Daemon {
        Self::start_backend("host", extra, adjust)
    }

    /// [`serve_command`] for `backend` on a fresh socket, adjusted, spawned
    /// and answering.
    pub fn start_backend(
        backend: &str,
        extra: &[&str],
        adjust: impl FnOnce(&mut Command),
    ) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("ptxd.sock");
        let mut command = serve_command(backend, &socket, extra);
        adjust(&mut command);
        Self::spawn(command, socket, dir)
    }

    /// Spawns `command`, a ptxd that will serve on `socket`, with its stderr
    /// to a log in `dir`, and waits until `socket` answers. For a command
    /// line [`Daemon::start_backend`] does not make (the default socket).
    pub fn spawn(mut command: Command, socket: PathBuf, dir: tempfile::TempDir) -> Daemon {
        let stderr_log = dir.path().join("ptxd.stderr");
        let log = std::fs::File::create(&stderr_log).unwrap();
        let child = command
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {command:?}: {e}"));
        let mut daemon = Daemon {
            child,
            socket,
            dir,
            stderr_log,
        };
        daemon.wait_ready();
        daemon
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "ptxd exited before serving on {}: {status}\nstderr:\n{}",
                    self.socket.display(),
                    self.stderr()
                );
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "ptxd did not answer on {} within {START_TIMEOUT:?}\nstderr:\n{}",
                    self.socket.display(),
                    self.stderr()
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// The SDK's address of the socket.
    pub fn target(&self) -> String {
        format!("unix:{}", self.socket.display())
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// What the daemon and its executors wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_log).unwrap_or_default()
    }

    /// Sends SIGTERM and waits for the exit status, killing the daemon if it
    /// takes longer than [`STOP_TIMEOUT`].
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid()),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                return self.child.wait().unwrap();
            }
            std::thread::sleep(POLL);
        }
    }

    /// Waits for an exit something else caused (a signal to the process
    /// group); panics with the stderr log after `timeout`.
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "ptxd did not exit within {timeout:?}\nstderr:\n{}",
                    self.stderr()
                );
            }
            std::thread::sleep(POLL);
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.terminate();
        }
        if std::thread::panicking() {
            eprintln!(
                "--- stderr of ptxd (pid {}) ---\n{}",
                self.child.id(),
                self.stderr()
            );
        }
    }
}

/// The pid of device `device`'s executor, as `GetInfo` reports it.
pub async fn executor_pid(client: &ptxd_client::Client, device: usize) -> u32 {
    let info = client
        .raw()
        .get_info(ptxd_proto::v1::GetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    info.devices[device].executor_pid
}
