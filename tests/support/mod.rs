//! What every integration suite shares, in one place: the real daemon
//! ([`daemon`]), the corpus, random inputs, small waits and probes, and the
//! kernels and references several suites use. Each suite includes it as
//! `mod support;` and uses its own part of it (hence `dead_code` allowed).
//! `benches/` and `fuzz/` include single files of it by `#[path]`.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod attack_kernels;
pub mod big_kernels;
pub mod daemon;
pub mod mutants;
pub mod nvcc_ref;
pub mod processes;
pub mod ring_completions;

use std::path::Path;
use std::time::{Duration, Instant};

#[allow(unused_imports)] // each suite uses its own part
pub use daemon::{executor_pid, ptxd_bin, run_to_exit, serve_command, Daemon};

pub const CORPUS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/corpus");

pub fn corpus(name: &str) -> String {
    std::fs::read_to_string(Path::new(CORPUS).join(name)).unwrap()
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

/// [`wait_until`] for a test whose own tasks must go on while it waits (a
/// launch spawned on a current-thread runtime is sent only while the test
/// yields): looks every 20 ms, yielding to the runtime in between.
pub async fn wait_until_async(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if condition() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out after {timeout:?} waiting for {what}");
}

/// Waits (up to 30 s) until process `pid` has used `amount` of CPU more
/// than `before` (a [`processes::cpu_time`] taken before a long kernel was
/// launched): that kernel is running there. A fixed sleep only guesses it;
/// on a loaded machine the launch may not even have been sent yet.
pub async fn wait_until_running(pid: u32, before: Duration, amount: Duration) {
    wait_until_async(
        &format!("process {pid} to run a kernel ({amount:?} of CPU)"),
        Duration::from_secs(30),
        || processes::cpu_time(pid) >= before + amount,
    )
    .await;
}

/// The harness name of test `name` in the module whose `module_path!()` is
/// `module` (the crate's own name dropped), for a test that re-runs its own
/// binary with `--exact` to get a child process.
pub fn test_name(module: &str, name: &str) -> String {
    match module.split_once("::") {
        Some((_crate, path)) => format!("{path}::{name}"),
        None => name.to_string(),
    }
}

/// The refusal's reason name (`BUFFER_TOO_SMALL`, ...).
pub fn reason(error: &ptxd_client::Error) -> &'static str {
    error.reason_name()
}

/// One key of the refusal's metadata, or "" when there is none.
pub fn meta<'a>(error: &'a ptxd_client::Error, key: &str) -> &'a str {
    error
        .refusal()
        .and_then(|r| r.metadata().get(key))
        .map(String::as_str)
        .unwrap_or("")
}

/// Loads corpus file `file`'s entry `symbol` on device 0.
pub async fn load(session: &ptxd_client::Session, file: &str, symbol: &str) -> ptxd_client::Kernel {
    session
        .load_ptx(0, corpus(file), symbol, ptxd_client::LoadOptions::default())
        .await
        .unwrap()
}

/// An f32 shm buffer of `n` elements holding `values`, or poisoned (NaN)
/// when there are none, registered in `session`.
pub async fn f32_buffer(
    session: &ptxd_client::Session,
    values: Option<&[f32]>,
    n: usize,
) -> (ptxd_client::HostShm, ptxd_client::Buffer) {
    let mut shm = ptxd_client::HostShm::create((n * 4) as u64).unwrap();
    match values {
        Some(v) => shm.write_f32(0, v).unwrap(),
        None => shm.write_f32(0, &vec![f32::NAN; n]).unwrap(),
    }
    let buffer = session.register_shm(&shm, None).await.unwrap();
    (shm, buffer)
}

/// A free loopback port (there is a short race until the daemon binds it).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits (up to 10 s) until something listens on loopback `port`.
pub fn wait_for_port(port: u16) {
    wait_until(
        &format!("port {port} to open"),
        Duration::from_secs(10),
        || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
    );
}

/// One `GET /metrics` on loopback `port` (HTTP/1.1, connection closed by
/// the server): the response's head and body, the status asserted 200.
pub async fn get_metrics(port: u16) -> (String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: ptxd-tests\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let response = String::from_utf8(response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    (head.to_owned(), body.to_owned())
}
