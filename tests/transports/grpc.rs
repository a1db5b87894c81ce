//! The transport as a hostile local user meets it, on the real daemon (host
//! backend): raw Unix-socket connections that never shake hands, too many
//! connections, a descriptor limit too small for the clients, slow clients
//! holding incomplete requests, hand-made bad gRPC frames, control
//! characters in what the daemon logs and echoes, and a squatted socket
//! directory.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{corpus, random_f32, run_to_exit, wait_until, Daemon};
use bytes::Bytes;
use prost::Message;
use ptxd_client::{Client, HostShm, Launch, LoadOptions};
use ptxd_proto::v1 as api;
use tonic_types::StatusExt;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// An empty client SETTINGS frame: with the preface, a finished handshake.
const EMPTY_SETTINGS: &[u8] = &[0, 0, 0, 4, 0, 0, 0, 0, 0];

/// How long until the daemon closes `stream` (reads to EOF or error),
/// collecting what it sent; `None` if it is still open after `within`.
fn closed_within(
    stream: &mut std::os::unix::net::UnixStream,
    within: Duration,
) -> Option<(Duration, Vec<u8>)> {
    let started = Instant::now();
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = within.checked_sub(started.elapsed())?;
        stream
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        match stream.read(&mut buf) {
            Ok(0) => return Some((started.elapsed(), received)),
            Ok(n) => received.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return None
            }
            Err(_) => return Some((started.elapsed(), received)),
        }
    }
}

fn vm_rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// Opens a client with a real call, so the connection is counted before the
/// test goes on.
async fn live_client(daemon: &Daemon) -> Client {
    let client = Client::connect(&daemon.target()).await.unwrap();
    client.info().await.unwrap();
    client
}

#[tokio::test]
async fn a_connection_that_never_shakes_hands_is_closed_after_the_handshake_timeout() {
    let daemon = Daemon::start(&["--handshake-timeout", "1s"]);
    let opened = Instant::now();
    let mut silent = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
    let mut half = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
    half.write_all(&PREFACE[..10]).unwrap();
    // The preface and a SETTINGS header announcing 6 bytes that never come.
    let mut cut = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
    cut.write_all(PREFACE).unwrap();
    cut.write_all(&[0, 0, 6, 4, 0, 0, 0, 0, 0]).unwrap();
    let mut shaken = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
    shaken.write_all(PREFACE).unwrap();
    shaken.write_all(EMPTY_SETTINGS).unwrap();

    for (name, stream) in [
        ("silent", &mut silent),
        ("half a preface", &mut half),
        ("a cut SETTINGS frame", &mut cut),
    ] {
        closed_within(stream, Duration::from_secs(6))
            .unwrap_or_else(|| panic!("the {name} connection was still open after 6 s"));
        let after = opened.elapsed();
        assert!(
            after >= Duration::from_millis(700),
            "{name} closed too early: {after:?}"
        );
    }
    // A connection that shook hands is not subject to the deadline (it is
    // answered by keepalive instead, every 10 s by default).
    assert!(
        closed_within(&mut shaken, Duration::from_millis(2500)).is_none(),
        "a connection that shook hands was closed"
    );
    // And the daemon serves on.
    let client = live_client(&daemon).await;
    assert!(!client.info().await.unwrap().devices.is_empty());
}

#[tokio::test]
async fn connections_per_uid_are_capped_and_the_refusal_names_the_limit() {
    let daemon = Daemon::start(&[
        "--max-connections-per-uid",
        "4",
        "--handshake-timeout",
        "60s",
    ]);
    let first = live_client(&daemon).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut raw = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
        raw.write_all(PREFACE).unwrap();
        raw.write_all(EMPTY_SETTINGS).unwrap();
        held.push(raw);
    }
    // The three raw connections are accepted (none is closed) ...
    std::thread::sleep(Duration::from_millis(300));
    for raw in &mut held {
        assert!(closed_within(raw, Duration::from_millis(100)).is_none());
    }
    // ... and the fifth connection of this uid is closed at once, after a
    // GOAWAY that names the limit.
    let mut over = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
    let (after, goaway) = closed_within(&mut over, Duration::from_secs(3))
        .expect("the connection over the per-uid cap was left open");
    assert!(after < Duration::from_secs(2), "{after:?}");
    let text = String::from_utf8_lossy(&goaway);
    assert!(
        text.contains("limit=max_connections_per_uid value=4"),
        "{text:?}"
    );
    assert_eq!(goaway[12], 7, "the second frame is a GOAWAY: {goaway:?}");
    // An SDK client over the cap fails; once connections close, one succeeds.
    let refused = async { Client::connect(&daemon.target()).await?.info().await };
    assert!(refused.await.is_err());
    drop(held.pop());
    drop(held.pop());
    let mut served = false;
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok(client) = Client::connect(&daemon.target()).await {
            if client.info().await.is_ok() {
                served = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(served, "a client was refused after connections were freed");
    first.info().await.unwrap();
}

/// `ptxd serve` under `RLIMIT_NOFILE` of `soft`/`hard`.
fn start_with_fd_limit(extra: &[&str], soft: u64, hard: u64) -> Daemon {
    Daemon::start_with(extra, move |command| {
        // SAFETY: between fork and exec only `setrlimit` runs, which is
        // async-signal-safe; nothing is allocated and no lock is taken.
        unsafe {
            command.pre_exec(move || {
                nix::sys::resource::setrlimit(
                    nix::sys::resource::Resource::RLIMIT_NOFILE,
                    soft,
                    hard,
                )
                .map_err(std::io::Error::from)
            });
        }
    })
}

fn nofile_limits(pid: i32) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let fields: Vec<u64> = line
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    (fields[0], fields[1])
}

#[tokio::test]
async fn the_daemon_raises_its_descriptor_limit_to_the_hard_limit() {
    let daemon = start_with_fd_limit(&[], 256, 1000);
    assert_eq!(nofile_limits(daemon.pid()), (1000, 1000));
    live_client(&daemon).await;
}

#[tokio::test]
async fn idle_connections_cannot_use_up_the_descriptors_an_executor_respawn_needs() {
    // 300 descriptors: the connection cap is half of them. Without a cap,
    // 400 idle connections leave none for the respawn's socketpair and the
    // device stays down.
    let daemon = start_with_fd_limit(
        &[
            "--max-connections-per-uid",
            "10000",
            "--handshake-timeout",
            "60s",
        ],
        300,
        300,
    );
    let client = live_client(&daemon).await;
    let before = client.info().await.unwrap().devices[0].clone();
    let executor_pid = client
        .raw()
        .get_info(api::GetInfoRequest {})
        .await
        .unwrap()
        .into_inner()
        .devices[0]
        .executor_pid;

    let mut idle = Vec::new();
    for _ in 0..400 {
        let mut raw = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
        let _ = raw.write_all(PREFACE);
        idle.push(raw);
    }
    // The ones over the cap are closed at once: looked at until at least
    // 250 are (a loaded machine may take more than a fixed pause to
    // accept and refuse 400); one closed only at the handshake timeout
    // (60 s) still fails.
    let opened = Instant::now();
    let mut closed = vec![false; idle.len()];
    let deadline = opened + Duration::from_secs(20);
    while closed.iter().filter(|c| **c).count() < 400 - 150 && Instant::now() < deadline {
        for (raw, closed) in idle.iter_mut().zip(closed.iter_mut()) {
            if !*closed {
                *closed = closed_within(raw, Duration::from_millis(1)).is_some();
            }
        }
    }
    let closed = closed.iter().filter(|c| **c).count();
    eprintln!(
        "{closed} of 400 idle connections closed {:?} after the last was opened",
        opened.elapsed()
    );
    assert!(
        closed >= 400 - 150,
        "only {closed} of 400 connections were refused"
    );

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(executor_pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let mut respawned = None;
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let device = client.info().await.unwrap().devices[0].clone();
        if device.available && device.generation != before.generation {
            respawned = Some(device);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let device = respawned
        .expect("the executor was not respawned within 30 s while clients held connections");
    assert!(device.restarts >= 1);

    // The new executor works.
    let session = client.open_session("after respawn").await.unwrap();
    let kernel = session
        .load_ptx(
            0,
            corpus("add_f32_scalar.ptx"),
            "add_f32_scalar",
            LoadOptions::default(),
        )
        .await
        .unwrap();
    let n = 1000;
    let (a, b) = (random_f32(n), random_f32(n));
    let mut shms = Vec::new();
    let mut buffers = Vec::new();
    for values in [Some(&a), Some(&b), None] {
        let mut shm = HostShm::create((n * 4) as u64).unwrap();
        shm.write_f32(0, values.map_or(&vec![f32::NAN; n][..], |v| &v[..]))
            .unwrap();
        buffers.push(session.register_shm(&shm, None).await.unwrap());
        shms.push(shm);
    }
    let launch = Launch::new(
        [buffers[0].operand(), buffers[1].operand()],
        buffers[2].operand(),
        n as u64,
    )
    .sync(true);
    session.launch(&kernel, &launch).await.unwrap();
    let out = shms[2].read_f32(0, n).unwrap();
    for i in 0..n {
        assert_eq!(out[i].to_bits(), (a[i] + b[i]).to_bits(), "element {i}");
    }
    drop(idle);
}

// --- raw HTTP/2 ---------------------------------------------------------

async fn h2_connect(socket: &Path) -> h2::client::SendRequest<Bytes> {
    let stream = tokio::net::UnixStream::connect(socket).await.unwrap();
    let (send, connection) = h2::client::handshake(stream).await.unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    send.ready().await.unwrap()
}

fn grpc_request(path: &str) -> http::Request<()> {
    http::Request::builder()
        .method("POST")
        .uri(format!("http://localhost{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap()
}

/// A gRPC message frame: flag, length, `message`.
fn frame(message: &[u8]) -> Vec<u8> {
    let mut out = vec![0];
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// The status of a call from its response headers (trailers-only) or its
/// trailers, and the messages of its body.
async fn finish(response: h2::client::ResponseFuture) -> (tonic::Status, Vec<Bytes>) {
    let response = response.await.unwrap();
    if let Some(status) = tonic::Status::from_header_map(response.headers()) {
        return (status, Vec::new());
    }
    let mut body = response.into_body();
    let mut data = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let trailers = body.trailers().await.unwrap().expect("no trailers");
    let status = tonic::Status::from_header_map(&trailers).expect("no grpc-status in the trailers");
    let mut messages = Vec::new();
    let mut rest = &data[..];
    while rest.len() >= 5 {
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        messages.push(Bytes::copy_from_slice(&rest[5..5 + len]));
        rest = &rest[5 + len..];
    }
    (status, messages)
}

/// A unary call with a hand-made body.
async fn raw_unary(
    send: &mut h2::client::SendRequest<Bytes>,
    path: &str,
    body: Vec<u8>,
) -> tonic::Status {
    let (response, mut stream) = send.send_request(grpc_request(path), false).unwrap();
    stream.send_data(Bytes::from(body), true).unwrap();
    finish(response).await.0
}

fn error_info(status: &tonic::Status) -> tonic_types::ErrorInfo {
    status
        .get_details_error_info()
        .unwrap_or_else(|| panic!("no ErrorInfo on {status:?}"))
}

#[tokio::test]
async fn undecodable_requests_are_invalid_argument_with_the_field() {
    let daemon = Daemon::start(&[]);
    let mut send = h2_connect(&daemon.socket).await;
    // (what, message bytes, the field the refusal must name)
    let cases: [(&str, Vec<u8>, Option<&str>); 7] = [
        (
            "invalid UTF-8 in session",
            vec![0x0a, 0x02, 0xff, 0xfe],
            Some("session"),
        ),
        ("truncated varint in n", vec![0x28, 0xff], Some("n")),
        (
            "nested invalid UTF-8",
            vec![0x1a, 0x04, 0x0a, 0x02, 0xc3, 0x28],
            Some("inputs.buffer"),
        ),
        (
            "wrong wire type for inputs",
            vec![0x18, 0x01],
            Some("inputs"),
        ),
        (
            "length past the end",
            vec![0x12, 0x40, 0x61],
            Some("kernel"),
        ),
        ("field number 0", vec![0x00, 0x01], None),
        ("invalid wire type 7", vec![0x0f], None),
    ];
    for (what, message, field) in cases {
        let status = raw_unary(&mut send, "/ptxd.v1.Ptxd/Launch", frame(&message)).await;
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{what}: {status:?}"
        );
        let info = error_info(&status);
        assert_eq!(info.reason, "INVALID_ARGUMENT", "{what}");
        assert_eq!(info.domain, "ptxd", "{what}");
        assert_eq!(
            info.metadata.get("field").map(String::as_str),
            field,
            "{what}: {info:?}"
        );
    }
    // The same for another method, and a message cut short by the end of
    // the request.
    let status = raw_unary(
        &mut send,
        "/ptxd.v1.Ptxd/OpenSession",
        frame(&[0x0a, 0x01, 0x80]),
    )
    .await;
    assert_eq!(
        error_info(&status)
            .metadata
            .get("field")
            .map(String::as_str),
        Some("label")
    );
    let mut cut = frame(&[0x0a, 0x05, b'a']);
    cut.truncate(7);
    let cut_short = raw_unary(&mut send, "/ptxd.v1.Ptxd/CloseSession", cut).await;
    assert_eq!(
        cut_short.code(),
        tonic::Code::InvalidArgument,
        "{cut_short:?}"
    );
    assert_eq!(error_info(&cut_short).reason, "INVALID_ARGUMENT");
}

#[tokio::test]
async fn an_oversize_message_is_limit_exceeded_naming_max_request_bytes() {
    let daemon = Daemon::start(&[
        "--max-request-bytes",
        "1048576",
        "--max-artifact-bytes",
        "1048576",
    ]);
    let mut send = h2_connect(&daemon.socket).await;
    // The header announces 2 MiB; the refusal must not wait for the body.
    let mut body = vec![0];
    body.extend_from_slice(&(2u32 << 20).to_be_bytes());
    body.extend_from_slice(&[0x0a; 64]);
    let (response, mut stream) = send
        .send_request(grpc_request("/ptxd.v1.Ptxd/LoadKernel"), false)
        .unwrap();
    stream.send_data(Bytes::from(body), false).unwrap();
    let (status, _) = tokio::time::timeout(Duration::from_secs(5), finish(response))
        .await
        .expect("the oversize refusal waited for the rest of the message");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    let info = error_info(&status);
    assert_eq!(info.reason, "LIMIT_EXCEEDED");
    assert_eq!(info.metadata["limit"], "max_request_bytes");
    assert_eq!(info.metadata["value"], "1048576");
}

#[tokio::test]
async fn a_bad_frame_in_a_launch_stream_fails_that_request_only() {
    let daemon = Daemon::start(&[]);
    let client = live_client(&daemon).await;
    let session = client.open_session("raw stream").await.unwrap();
    let kernel = session
        .load_ptx(
            0,
            corpus("add_f32_scalar.ptx"),
            "add_f32_scalar",
            LoadOptions::default(),
        )
        .await
        .unwrap();
    let n = 256;
    let (a, b) = (random_f32(n), random_f32(n));
    let mut shms = Vec::new();
    let mut handles = Vec::new();
    for values in [Some(&a), Some(&b), None] {
        let mut shm = HostShm::create((n * 4) as u64).unwrap();
        shm.write_f32(0, values.map_or(&vec![f32::NAN; n][..], |v| &v[..]))
            .unwrap();
        handles.push(session.register_shm(&shm, None).await.unwrap().handle);
        shms.push(shm);
    }
    let good = |tag: u64| api::LaunchRequest {
        session: session.id().to_string(),
        kernel: kernel.handle(),
        inputs: vec![
            api::Operand {
                buffer: handles[0].clone(),
                offset: 0,
            },
            api::Operand {
                buffer: handles[1].clone(),
                offset: 0,
            },
        ],
        output: Some(api::Operand {
            buffer: handles[2].clone(),
            offset: 0,
        }),
        n: n as u64,
        sync: true,
        tag,
        ..Default::default()
    };
    // tag = 2, then a session that is not UTF-8.
    let bad = [0x50, 0x02, 0x0a, 0x02, 0xff, 0xfe];
    let mut body = frame(&good(1).encode_to_vec());
    body.extend(frame(&bad));
    body.extend(frame(&good(3).encode_to_vec()));

    let mut send = h2_connect(&daemon.socket).await;
    let (response, mut stream) = send
        .send_request(grpc_request("/ptxd.v1.Ptxd/LaunchStream"), false)
        .unwrap();
    stream.send_data(Bytes::from(body), true).unwrap();
    let (status, messages) = tokio::time::timeout(Duration::from_secs(10), finish(response))
        .await
        .unwrap();
    assert_eq!(
        status.code(),
        tonic::Code::Ok,
        "the stream ended with {status:?}"
    );
    let answers: Vec<api::LaunchResponse> = messages
        .iter()
        .map(|m| api::LaunchResponse::decode(m.clone()).unwrap())
        .collect();
    assert_eq!(
        answers.iter().map(|r| r.tag).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    assert!(answers[0].error.is_none(), "{:?}", answers[0]);
    assert!(answers[2].error.is_none(), "{:?}", answers[2]);
    let refused = answers[1]
        .error
        .as_ref()
        .expect("the bad frame was not refused");
    assert_eq!(refused.code, tonic::Code::InvalidArgument as i32);
    assert_eq!(refused.reason, "INVALID_ARGUMENT");
    assert_eq!(refused.metadata["field"], "session");
    let out = shms[2].read_f32(0, n).unwrap();
    for i in 0..n {
        assert_eq!(out[i].to_bits(), (a[i] + b[i]).to_bits(), "element {i}");
    }
}

#[tokio::test]
async fn slow_clients_holding_incomplete_requests_cannot_grow_the_daemon() {
    const MIB: u64 = 1 << 20;
    let daemon = Daemon::start(&[
        "--max-request-bytes",
        &(8 * MIB).to_string(),
        "--max-artifact-bytes",
        &(8 * MIB).to_string(),
        "--max-buffered-request-bytes-per-uid",
        &(16 * MIB).to_string(),
        "--max-buffered-request-bytes",
        &(32 * MIB).to_string(),
    ]);
    // Warm up (executor up, one load) before the baseline.
    let warm = live_client(&daemon).await;
    let session = warm.open_session("warm").await.unwrap();
    session
        .load_ptx(
            0,
            corpus("add_f32_scalar.ptx"),
            "add_f32_scalar",
            LoadOptions::default(),
        )
        .await
        .unwrap();
    let baseline = vm_rss_kib(daemon.pid());

    // 24 connections, each sending all but the last byte of a 6 MiB
    // LoadKernel: 144 MiB if the daemon buffered them all.
    let message_len = 6 * MIB as usize;
    let mut pending = Vec::new();
    let mut streams = Vec::new();
    for _ in 0..24 {
        let mut send = h2_connect(&daemon.socket).await;
        let (response, mut stream) = send
            .send_request(grpc_request("/ptxd.v1.Ptxd/LoadKernel"), false)
            .unwrap();
        let mut body = vec![0];
        body.extend_from_slice(&(message_len as u32).to_be_bytes());
        body.resize(5 + message_len - 1, 0x0a);
        stream.send_data(Bytes::from(body), false).unwrap();
        pending.push(tokio::spawn(async move {
            tokio::time::timeout(Duration::from_secs(5), finish(response))
                .await
                .ok()
        }));
        streams.push((send, stream));
    }
    let mut refused = 0;
    for answer in pending {
        if let Some((status, _)) = answer.await.unwrap() {
            assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
            let info = error_info(&status);
            assert_eq!(info.reason, "LIMIT_EXCEEDED");
            assert_eq!(info.metadata["limit"], "max_buffered_request_bytes_per_uid");
            refused += 1;
        }
    }
    // Two 6 MiB messages fit this uid's 16 MiB; every other one is refused.
    assert_eq!(refused, 22, "refused {refused} of 24 slow requests");
    let grown_mib = vm_rss_kib(daemon.pid()).saturating_sub(baseline) / 1024;
    assert!(
        grown_mib < 48,
        "daemon RSS grew by {grown_mib} MiB (baseline {baseline} KiB)"
    );

    // A later client of the same uid is still served, while the slow
    // requests are held.
    let later = live_client(&daemon).await;
    let session = later.open_session("later").await.unwrap();
    session
        .load_ptx(
            0,
            corpus("affine_f32_scalar.ptx"),
            "affine_f32_scalar",
            LoadOptions::default(),
        )
        .await
        .unwrap();
    eprintln!("slow clients: baseline {baseline} KiB, grown {grown_mib} MiB, refused {refused}/24");
    drop(streams);
}

#[tokio::test]
async fn a_stalled_request_is_refused_after_the_read_timeout_and_its_budget_freed() {
    const MIB: usize = 1 << 20;
    let daemon = Daemon::start(&[
        "--request-read-timeout",
        "1s",
        "--max-request-bytes",
        &(8 * MIB).to_string(),
        "--max-artifact-bytes",
        &(8 * MIB).to_string(),
        "--max-buffered-request-bytes-per-uid",
        &(8 * MIB).to_string(),
    ]);
    let message = |complete: bool| {
        let mut body = vec![0];
        body.extend_from_slice(&(6 * MIB as u32).to_be_bytes());
        body.resize(5 + 6 * MIB - usize::from(!complete), 0x0a);
        Bytes::from(body)
    };
    let mut send = h2_connect(&daemon.socket).await;
    let started = Instant::now();
    // All but the last byte of a 6 MiB LoadKernel, and a GetInfo that sends
    // nothing at all.
    let (stalled, mut stalled_body) = send
        .send_request(grpc_request("/ptxd.v1.Ptxd/LoadKernel"), false)
        .unwrap();
    stalled_body.send_data(message(false), false).unwrap();
    let (silent, _silent_body) = send
        .send_request(grpc_request("/ptxd.v1.Ptxd/GetInfo"), false)
        .unwrap();
    for (what, response) in [("stalled", stalled), ("silent", silent)] {
        let (status, _) = tokio::time::timeout(Duration::from_secs(5), finish(response))
            .await
            .unwrap_or_else(|_| panic!("the {what} request was not refused within 5 s"));
        let elapsed = started.elapsed();
        assert!(
            elapsed >= Duration::from_millis(900),
            "{what} refused after {elapsed:?}"
        );
        assert_eq!(
            status.code(),
            tonic::Code::ResourceExhausted,
            "{what}: {status:?}"
        );
        let info = error_info(&status);
        assert_eq!(info.reason, "LIMIT_EXCEEDED");
        assert_eq!(info.metadata["limit"], "request_read_timeout");
        assert_eq!(info.metadata["value"], "1");
    }
    // The 6 MiB are this uid's again: a complete message of that size is
    // read and decoded (and refused for what it says, not for its size).
    let (response, mut body) = send
        .send_request(grpc_request("/ptxd.v1.Ptxd/LoadKernel"), false)
        .unwrap();
    body.send_data(message(true), true).unwrap();
    let (status, _) = tokio::time::timeout(Duration::from_secs(5), finish(response))
        .await
        .unwrap();
    assert_ne!(error_info(&status).reason, "LIMIT_EXCEEDED", "{status:?}");
}

#[tokio::test]
async fn control_characters_from_clients_are_escaped_in_refusals_and_logs() {
    let daemon = Daemon::start_with(&["--log-format", "text"], |command| {
        command.env("RUST_LOG", "info");
    });
    let client = live_client(&daemon).await;
    let session = client.open_session("escapes\nlabel").await.unwrap();
    let forged = "HOST-7\nFORGED-LINE ERROR ptxd: root password accepted";
    let refusal = client
        .raw()
        .load_kernel(api::LoadKernelRequest {
            session: session.id().to_string(),
            device: Some(api::DeviceSelector {
                selector: Some(api::device_selector::Selector::Uuid(forged.into())),
            }),
            kind: api::ArtifactKind::Ptx as i32,
            artifact: corpus("add_f32_scalar.ptx").into_bytes(),
            symbol: "add_f32_scalar".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(error_info(&refusal).reason, "UNKNOWN_DEVICE");
    assert!(!refusal.message().contains('\n'), "{:?}", refusal.message());
    assert!(
        refusal.message().contains("HOST-7\\nFORGED-LINE"),
        "{:?}",
        refusal.message()
    );
    assert!(!error_info(&refusal).metadata["device"].contains('\n'));
    // A symbol with an escape sequence and a newline.
    let symbol = "nope\u{1b}[2J\r\nFORGED-LINE again";
    let refusal = session
        .load_ptx(
            0,
            corpus("add_f32_scalar.ptx"),
            symbol,
            LoadOptions::default(),
        )
        .await
        .unwrap_err();
    let text = refusal.to_string();
    assert!(!text.contains(['\n', '\r', '\u{1b}']), "{text:?}");

    drop(session);
    drop(client);
    wait_until("the refusals to be logged", Duration::from_secs(5), || {
        daemon.stderr().matches("refused").count() >= 2
    });
    let logged = daemon.stderr();
    for line in logged.lines() {
        assert!(
            !line.trim_start().starts_with("FORGED-LINE"),
            "a forged log line: {line:?}\n{logged}"
        );
        assert!(
            !line.contains('\u{1b}'),
            "an escape sequence reached the log: {line:?}"
        );
    }
    assert!(logged.contains("HOST-7\\nFORGED-LINE"), "{logged}");
}

// --- the default socket directory ----------------------------------------

/// `ptxd` with the default socket resolution: no `XDG_RUNTIME_DIR`, the
/// temp dir `tmp`, no `--socket`.
fn default_socket_command(tmp: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(crate::support::ptxd_bin());
    command
        .args(args)
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("PTXD_SOCKET")
        .env("TMPDIR", tmp)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// The default socket directory under `tmp` for this user; as root, the
/// default is /run/ptxd, which the test cannot use, so the test is root-aware.
fn default_dir(tmp: &Path) -> std::path::PathBuf {
    tmp.join(format!("ptxd-{}", nix::unistd::geteuid().as_raw()))
}

fn serve_fails_with(tmp: &Path, needle: &str) {
    let output = run_to_exit(
        default_socket_command(tmp, &["serve", "--backend", "host"]),
        Duration::from_secs(10),
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "ptxd served from an unsafe socket directory"
    );
    assert!(stderr.contains(needle), "{stderr}");
}

#[test]
fn the_daemon_and_the_sdk_refuse_a_squatted_default_socket_directory() {
    if nix::unistd::geteuid().is_root() {
        // Root's default socket is /run/ptxd/ptxd.sock, not in the temp
        // dir; the same checks run as a non-root user below.
        run_as_nobody_or_check_directly();
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    squatted_directory_cases(tmp.path());
}

/// As root: the directory checks with the default path of root itself are
/// not reachable from the temp dir, so check the temp-dir default through a
/// child run as uid 65534 (nobody).
fn run_as_nobody_or_check_directly() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let dir = tmp.path().join("ptxd-65534");
    let tmp_path = tmp.path().to_owned();
    let run = |args: &[&str]| {
        let mut command = default_socket_command(&tmp_path, args);
        command.uid(65534).gid(65534);
        run_to_exit(command, Duration::from_secs(10))
    };
    // World-writable without the sticky bit.
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    nix::unistd::chown(&dir, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
    let out = run(&["serve", "--backend", "host"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("without the sticky bit"),
        "{out:?}"
    );
    let out = run(&["info"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).starts_with("UNSAFE_SOCKET_DIR: "),
        "{out:?}"
    );
    // Owned by another user (root here).
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    nix::unistd::chown(&dir, Some(nix::unistd::Uid::from_raw(4242)), None).unwrap();
    let out = run(&["serve", "--backend", "host"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("owned by uid 4242"),
        "{out:?}"
    );
    let out = run(&["info"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("owned by uid 4242"),
        "{out:?}"
    );
    // A symlink to a good directory.
    std::fs::remove_dir(&dir).unwrap();
    let real = tmp.path().join("real");
    std::fs::create_dir(&real).unwrap();
    nix::unistd::chown(&real, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
    std::os::unix::fs::symlink(&real, &dir).unwrap();
    let out = run(&["serve", "--backend", "host"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is a symlink"),
        "{out:?}"
    );
    let out = run(&["info"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is a symlink"),
        "{out:?}"
    );
    // Missing: the daemon creates it, mode 0700, and serves.
    std::fs::remove_file(&dir).unwrap();
    let mut command = default_socket_command(tmp.path(), &["serve", "--backend", "host"]);
    command.uid(65534).gid(65534).stdout(Stdio::null());
    let _daemon = Daemon::spawn(command, dir.join("ptxd.sock"), tmp);
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o700);
    let out = run(&["info"]);
    assert!(out.status.success(), "{out:?}");
}

fn squatted_directory_cases(tmp: &Path) {
    let dir = default_dir(tmp);
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    serve_fails_with(tmp, "without the sticky bit");
    let out = default_socket_command(tmp, &["info"]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).starts_with("UNSAFE_SOCKET_DIR: "),
        "{out:?}"
    );
    std::fs::remove_dir(&dir).unwrap();
    let real = tmp.join("real");
    std::fs::create_dir(&real).unwrap();
    std::os::unix::fs::symlink(&real, &dir).unwrap();
    serve_fails_with(tmp, "is a symlink");
}
