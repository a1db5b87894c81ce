//! Unary launches as packets on the fd socket (the SDK's first choice on a
//! Unix socket) against the real daemon on the host backend: results,
//! refusals identical to gRPC's, malformed packets, and the fall-back to
//! HTTP/2 when the daemon turns a connection away at its caps.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use crate::support::{corpus, random_f32, Daemon};
use ptxd_client::{Client, Error, HostShm, Kernel, Launch, LoadOptions, Operand, Session};
use ptxd_ipc::packet::{connect_seqpacket, fd_socket_path, recv_packet, send_packet};
use ptxd_proto::v1 as pb;

/// Connected `SOCK_SEQPACKET` sockets the daemon accepted on `path` (from
/// /proc/net/unix: an accepted socket carries its listener's name).
fn accepted_on(path: &Path) -> usize {
    let path = path.to_string_lossy();
    std::fs::read_to_string("/proc/net/unix")
        .unwrap()
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // Num RefCount Protocol Flags Type St Inode Path
            fields.len() == 8 && fields[4] == "0005" && fields[5] == "03" && fields[7] == path
        })
        .count()
}

struct Add {
    kernel: Kernel,
    inputs: Vec<Operand>,
    output: Operand,
    a: Vec<f32>,
    b: Vec<f32>,
    out: HostShm,
}

/// The corpus add kernel, loaded in `session`.
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

/// The add kernel over `n` fresh random elements, the output poisoned.
async fn add(session: &Session, n: usize) -> Add {
    let kernel = load_add(session).await;
    let bytes = n as u64 * 4;
    let (a, b) = (random_f32(n), random_f32(n));
    let mut shm_a = HostShm::create(bytes).unwrap();
    let mut shm_b = HostShm::create(bytes).unwrap();
    let mut out = HostShm::create(bytes).unwrap();
    shm_a.write_f32(0, &a).unwrap();
    shm_b.write_f32(0, &b).unwrap();
    out.write_f32(0, &vec![f32::NAN; n]).unwrap();
    let mut inputs = Vec::new();
    for shm in [&shm_a, &shm_b] {
        inputs.push(session.register_shm(shm, None).await.unwrap().operand());
    }
    let output = session.register_shm(&out, None).await.unwrap().operand();
    // The registrations map the objects; the names can go.
    drop((shm_a, shm_b));
    Add {
        kernel,
        inputs,
        output,
        a,
        b,
        out,
    }
}

impl Add {
    fn launch(&self, n: u64) -> Launch {
        Launch::new(self.inputs.clone(), self.output.clone(), n)
    }

    fn check(&self) {
        let got = self.out.read_f32(0, self.a.len()).unwrap();
        for (i, got) in got.iter().enumerate() {
            assert_eq!(
                got.to_bits(),
                (self.a[i] + self.b[i]).to_bits(),
                "element {i}"
            );
        }
    }
}

/// The refusals the daemon logged as made on the fd socket.
const FD_REFUSAL: &str = "transport=\"fd socket\"";

/// A daemon that logs refusals (info).
fn daemon() -> Daemon {
    Daemon::start_with(&[], |command| {
        command.env("RUST_LOG", "info");
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn sdk_launches_go_as_fd_socket_packets_and_match_the_reference() {
    let daemon = daemon();
    let fd_path = fd_socket_path(&daemon.socket);
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("fd lane").await.unwrap();
    let n = 4099;
    assert_eq!(accepted_on(&fd_path), 0);
    // The kernel's load opens the client's connection to the fd socket.
    let job = add(&session, n).await;
    assert_eq!(accepted_on(&fd_path), 1);
    for sync in [false, true, true] {
        session
            .launch(&job.kernel, &job.launch(n as u64).sync(sync))
            .await
            .unwrap();
    }
    job.check();
    // One connection carried them all, and it stays for the next launch.
    assert_eq!(accepted_on(&fd_path), 1);
    let other = client.open_session("fd lane 2").await.unwrap();
    let job = add(&other, 77).await;
    other
        .launch(&job.kernel, &job.launch(77).sync(true))
        .await
        .unwrap();
    job.check();
    assert_eq!(accepted_on(&fd_path), 1);
    // Nothing about them was logged as a refusal.
    assert!(!daemon.stderr().contains(FD_REFUSAL), "{}", daemon.stderr());
}

#[tokio::test(flavor = "multi_thread")]
async fn refusals_over_the_fd_socket_are_the_ones_grpc_gives() {
    let daemon = daemon();
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("fd refusals").await.unwrap();
    let http2 = Client::connect(&daemon.target())
        .await
        .unwrap()
        .without_fd_lane();
    let n = 1000;
    let job = add(&session, n).await;
    // Too many elements for the buffers, then a handle of no kernel.
    let too_big = job.launch(n as u64 + 1);
    let over_fd = session.launch(&job.kernel, &too_big).await.unwrap_err();
    // The same session's launch over HTTP/2 (the handle is the session's):
    // a client without the fd lane, on the session's own id, through the
    // generated client.
    let request = too_big.to_proto(session.id(), job.kernel.handle().to_owned(), 0);
    let over_grpc: Error = http2.raw().launch(request).await.unwrap_err().into();
    let (fd_refusal, grpc_refusal) = (over_fd.refusal().unwrap(), over_grpc.refusal().unwrap());
    assert_eq!(fd_refusal.wire_name(), "BUFFER_TOO_SMALL");
    assert_eq!(fd_refusal.wire_name(), grpc_refusal.wire_name());
    assert_eq!(fd_refusal.code(), grpc_refusal.code());
    assert_eq!(fd_refusal.metadata(), grpc_refusal.metadata());
    assert_eq!(fd_refusal.message(), grpc_refusal.message());
    assert_eq!(
        fd_refusal.metadata()["needed_bytes"],
        (4 * (n + 1)).to_string()
    );
    // Refused over the fd socket, logged as such, once.
    crate::support::wait_until(
        "the refusal's log line",
        std::time::Duration::from_secs(5),
        || daemon.stderr().contains(FD_REFUSAL),
    );
    let stderr = daemon.stderr();
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains(FD_REFUSAL)).collect();
    assert!(lines[0].contains("BUFFER_TOO_SMALL"), "{stderr}");
    assert_eq!(lines.len(), 1, "{stderr}");
    // Nothing ran: the output is still poisoned.
    assert!(job.out.read_f32(0, n).unwrap().iter().all(|v| v.is_nan()));
    // And the connection goes on: the right launch runs on it.
    session
        .launch(&job.kernel, &job.launch(n as u64).sync(true))
        .await
        .unwrap();
    job.check();
}

/// Sends `packet` (with `fd`) on a fresh connection and returns the reply
/// and whether the daemon then closed the connection.
fn exchange(path: &Path, packet: &[u8], fd: Option<&OwnedFd>) -> (pb::FdAttachReply, bool) {
    let socket = connect_seqpacket(path, false).unwrap();
    send_packet(socket.as_fd(), packet, fd.map(|f| f.as_fd()), false).unwrap();
    let reply = recv_packet(socket.as_fd(), false).unwrap().unwrap();
    let reply = <pb::FdAttachReply as prost::Message>::decode(reply.bytes.as_slice()).unwrap();
    let closed = recv_packet(socket.as_fd(), false).unwrap().is_none();
    (reply, closed)
}

fn refusal(reply: &pb::FdAttachReply) -> (&str, &str) {
    match &reply.result {
        Some(pb::fd_attach_reply::Result::Refused(refused)) => {
            (refused.reason.as_str(), refused.message.as_str())
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_launch_packet_with_a_descriptor_or_a_token_is_refused_and_runs_nothing() {
    let daemon = Daemon::start(&[]);
    let path = fd_socket_path(&daemon.socket);
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("fd packets").await.unwrap();
    let n = 256;
    let job = add(&session, n).await;
    let request =
        job.launch(n as u64)
            .sync(true)
            .to_proto(session.id(), job.kernel.handle().to_owned(), 7);
    let packet =
        |body: Option<pb::fd_attach::Body>| prost::Message::encode_to_vec(&pb::FdAttach { body });
    let launch = |request: pb::LaunchRequest| Some(pb::fd_attach::Body::Launch(request));
    let memfd = OwnedFd::from(tempfile::tempfile().unwrap());
    for (what, bytes, fd, message) in [
        (
            "a launch with a descriptor",
            packet(launch(request.clone())),
            Some(&memfd),
            "a call carries no descriptor",
        ),
        (
            "an empty token, with a descriptor",
            packet(Some(pb::fd_attach::Body::Token(String::new()))),
            Some(&memfd),
            "a token is not empty",
        ),
        (
            "no body, with a descriptor",
            packet(None),
            Some(&memfd),
            "a token, a launch or a load",
        ),
    ] {
        let (reply, closed) = exchange(&path, &bytes, fd);
        let (reason, text) = refusal(&reply);
        assert_eq!(reason, "INVALID_ARGUMENT", "{what}");
        assert!(text.contains(message), "{what}: {text}");
        assert!(closed, "{what}: the connection stays open");
    }
    // An empty FdAttach is an empty packet: refused as one without a body
    // (not taken as a hang-up), and the connection ends.
    let socket = connect_seqpacket(&path, false).unwrap();
    send_packet(socket.as_fd(), &packet(None), None, false).unwrap();
    let reply = recv_packet(socket.as_fd(), false).unwrap().unwrap();
    assert_eq!(refusal_of(&reply.bytes).0, "INVALID_ARGUMENT");
    assert!(recv_packet(socket.as_fd(), false).unwrap().is_none());
    assert!(job.out.read_f32(0, n).unwrap().iter().all(|v| v.is_nan()));
    // The well-formed packet runs, with its tag, and the connection goes
    // on: a second launch on it is answered too.
    let socket = connect_seqpacket(&path, false).unwrap();
    for tag in [7, 8] {
        let request = pb::LaunchRequest {
            tag,
            ..request.clone()
        };
        send_packet(socket.as_fd(), &packet(launch(request)), None, false).unwrap();
        let reply = recv_packet(socket.as_fd(), false).unwrap().unwrap();
        let reply = <pb::FdAttachReply as prost::Message>::decode(reply.bytes.as_slice()).unwrap();
        match reply.result {
            Some(pb::fd_attach_reply::Result::Launched(launched)) => {
                assert_eq!(launched.tag, tag);
                assert!(launched.error.is_none());
            }
            other => panic!("expected a launch, got {other:?}"),
        }
    }
    job.check();
}

#[tokio::test(flavor = "multi_thread")]
async fn past_the_per_uid_cap_a_connection_is_told_and_launches_fall_back_to_http2() {
    let daemon = Daemon::start(&[]);
    let path = fd_socket_path(&daemon.socket);
    // This uid's 8 connections, held open.
    let held: Vec<OwnedFd> = (0..8)
        .map(|_| connect_seqpacket(&path, false).unwrap())
        .collect();
    crate::support::wait_until(
        "8 accepted connections",
        std::time::Duration::from_secs(5),
        || accepted_on(&path) == 8,
    );
    // A ninth is told why before it is closed.
    let ninth = connect_seqpacket(&path, false).unwrap();
    let reply = recv_packet(ninth.as_fd(), false).unwrap().unwrap();
    let reply = <pb::FdAttachReply as prost::Message>::decode(reply.bytes.as_slice()).unwrap();
    let Some(pb::fd_attach_reply::Result::Refused(refused)) = reply.result else {
        panic!("expected a refusal, got {reply:?}");
    };
    assert_eq!(refused.reason, "LIMIT_EXCEEDED");
    assert_eq!(refused.metadata["limit"], "fd_socket_connections_per_uid");
    assert_eq!(refused.metadata["value"], "8");
    assert!(recv_packet(ninth.as_fd(), false).unwrap().is_none());
    // The SDK's launches still run, over HTTP/2, once each.
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("fd cap").await.unwrap();
    let n = 3000;
    let job = add(&session, n).await;
    for _ in 0..3 {
        session
            .launch(&job.kernel, &job.launch(n as u64).sync(true))
            .await
            .unwrap();
    }
    job.check();
    assert_eq!(accepted_on(&path), 8);
    // Once a connection is free again (after the SDK's back-off), the fd
    // socket is used again.
    drop(held);
    crate::support::wait_until(
        "the held connections closed",
        std::time::Duration::from_secs(5),
        || accepted_on(&path) == 0,
    );
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    session
        .launch(&job.kernel, &job.launch(n as u64).sync(true))
        .await
        .unwrap();
    job.check();
    assert_eq!(accepted_on(&path), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn kernel_loads_go_over_the_fd_socket_with_grpcs_answers_and_refusals() {
    let daemon = daemon();
    let fd_path = fd_socket_path(&daemon.socket);
    let client = Client::connect(&daemon.target()).await.unwrap();
    let http2 = Client::connect(&daemon.target())
        .await
        .unwrap()
        .without_fd_lane();
    let first = client.open_session("fd load 1").await.unwrap();
    // The first thing this client sends on the fd socket is the load.
    let n = 2049;
    let job = add(&first, n).await;
    assert_eq!(accepted_on(&fd_path), 1);
    assert!(!job.kernel.state().cache_hit);
    first
        .launch(&job.kernel, &job.launch(n as u64).sync(true))
        .await
        .unwrap();
    job.check();
    // Another session's load of the same text is a cache hit, on the same
    // connection, with the signature the first load got.
    let second = client.open_session("fd load 2").await.unwrap();
    let again = load_add(&second).await;
    assert!(again.state().cache_hit);
    assert_eq!(again.state().signature, job.kernel.state().signature);
    assert_eq!(accepted_on(&fd_path), 1);

    // A refusal: the same reason, code, message and metadata as over gRPC.
    let refused_fd = second
        .load_ptx(
            0,
            corpus("nvcc/refused-ptx/grid_stride.sm_90.ptx"),
            "grid_stride_scale_f32",
            LoadOptions::default(),
        )
        .await
        .unwrap_err();
    let over_http2 = http2.open_session("fd load http2").await.unwrap();
    let refused_grpc = over_http2
        .load_ptx(
            0,
            corpus("nvcc/refused-ptx/grid_stride.sm_90.ptx"),
            "grid_stride_scale_f32",
            LoadOptions::default(),
        )
        .await
        .unwrap_err();
    let (fd, grpc) = (
        refused_fd.refusal().unwrap(),
        refused_grpc.refusal().unwrap(),
    );
    assert_eq!(fd.wire_name(), "NON_SCALAR_ABI");
    assert_eq!(fd.wire_name(), grpc.wire_name());
    assert_eq!(fd.code(), grpc.code());
    assert_eq!(fd.message(), grpc.message());
    assert_eq!(fd.metadata(), grpc.metadata());
    crate::support::wait_until(
        "the refusal's log line",
        std::time::Duration::from_secs(5),
        || {
            daemon.stderr().lines().any(|l| {
                l.contains(FD_REFUSAL)
                    && l.contains("rpc=\"LoadKernel\"")
                    && l.contains("NON_SCALAR_ABI")
            })
        },
    );

    // An artifact past one packet (64 KiB) goes by gRPC, and loads.
    let mut big = corpus("add_f32_scalar.ptx");
    while big.len() <= ptxd_ipc::packet::MAX_PACKET {
        big.push_str("// padding past one fd socket packet\n");
    }
    let padded = second
        .load_ptx(0, big, "add_f32_scalar", LoadOptions::default())
        .await
        .unwrap();
    assert_eq!(padded.state().signature, job.kernel.state().signature);
    assert_eq!(accepted_on(&fd_path), 1);
}

/// Sessions launching at once, with the spins on (the defaults: replies
/// read by the calls that wait for them, from one shared inbox) and off
/// (every reply handed over by the link's reader task): each call gets its
/// own answer (a refusal only where the launch was out of bounds), every
/// result matches the reference, and the spin changes nothing but timing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_calls_get_their_own_replies_with_and_without_the_spins() {
    for (front_spin, reply_spin) in [
        ("200us", ptxd_client::DEFAULT_REPLY_SPIN),
        ("0", std::time::Duration::ZERO),
    ] {
        let daemon = Daemon::start(&["--front-spin", front_spin]);
        let client = Client::connect(&daemon.target())
            .await
            .unwrap()
            .with_reply_spin(reply_spin);
        let mut tasks = tokio::task::JoinSet::new();
        for k in 0..4usize {
            let client = client.clone();
            tasks.spawn(async move {
                let session = client.open_session(&format!("spin {k}")).await.unwrap();
                let n = 500 + 37 * k;
                let job = add(&session, n).await;
                for i in 0..60usize {
                    // Every third launch asks for one element too many.
                    let over = (i + k) % 3 == 0;
                    let launch = job.launch(n as u64 + u64::from(over));
                    match session.launch(&job.kernel, &launch).await {
                        Ok(_) => assert!(!over, "session {k}, launch {i} passed out of bounds"),
                        Err(e) => {
                            assert!(over, "session {k}, launch {i}: {e}");
                            assert_eq!(e.reason_name(), "BUFFER_TOO_SMALL", "{e}");
                        }
                    }
                }
                session
                    .launch(&job.kernel, &job.launch(n as u64).sync(true))
                    .await
                    .unwrap();
                job.check();
                // A cache hit in the same breath.
                let again = load_add(&session).await;
                assert!(again.state().cache_hit);
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.unwrap();
        }
    }
}

// ----- issue 24: the fd socket as a tenant-proof transport -------------------

/// The refusal in a reply packet: (reason, limit metadata), or ("", "")
/// for an answer.
fn refusal_of(bytes: &[u8]) -> (String, String) {
    let reply = <pb::FdAttachReply as prost::Message>::decode(bytes).unwrap();
    match reply.result {
        Some(pb::fd_attach_reply::Result::Refused(refused)) => (
            refused.reason,
            refused.metadata.get("limit").cloned().unwrap_or_default(),
        ),
        _ => (String::new(), String::new()),
    }
}

/// A blocking raw connection to the fd socket with a receive timeout.
fn raw_connection(path: &Path) -> OwnedFd {
    // The daemon answers on its gRPC socket a moment before the fd socket
    // listens.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let socket = loop {
        match connect_seqpacket(path, false) {
            Ok(socket) => break socket,
            Err(e) if std::time::Instant::now() < deadline => {
                eprintln!("fd socket not ready: {e}");
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => panic!("connecting to {}: {e}", path.display()),
        }
    };
    let timeout = nix::sys::time::TimeVal::new(10, 0);
    nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::ReceiveTimeout, &timeout)
        .unwrap();
    socket
}

/// An empty packet is refused as the proto says (INVALID_ARGUMENT, and the
/// connection ends), not taken as the end of the stream.
#[tokio::test(flavor = "multi_thread")]
async fn an_empty_packet_is_refused_not_taken_as_the_end() {
    let daemon = Daemon::start(&[]);
    let path = fd_socket_path(&daemon.socket);
    let socket = raw_connection(&path);
    send_packet(socket.as_fd(), b"", None, false).unwrap();
    let reply = recv_packet(socket.as_fd(), false)
        .unwrap()
        .expect("the daemon closed the connection without an answer");
    assert_eq!(refusal_of(&reply.bytes).0, "INVALID_ARGUMENT");
    assert!(recv_packet(socket.as_fd(), false).unwrap().is_none());
    // A bystander is served throughout.
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("bystander").await.unwrap();
    let job = add(&session, 333).await;
    session
        .launch(&job.kernel, &job.launch(333).sync(true))
        .await
        .unwrap();
    job.check();
}

/// Thousands of connections turned away at the per-uid cap, and thousands
/// of refused launches, write a bounded number of log lines (one a second
/// per kind at most), while a bystander's launches stay exact.
#[tokio::test(flavor = "multi_thread")]
async fn refusals_a_client_causes_write_a_bounded_number_of_log_lines() {
    const FLOOD: usize = 3000;
    let daemon = daemon();
    let path = fd_socket_path(&daemon.socket);
    // The bystander is the same uid (root) as the flood: over gRPC.
    let client = Client::connect(&daemon.target())
        .await
        .unwrap()
        .without_fd_lane();
    let bystander = client.open_session("bystander").await.unwrap();
    let job = add(&bystander, 1001).await;
    let started = std::time::Instant::now();
    // The uid's places (8 by default), one of them used for refused
    // launches.
    let held: Vec<OwnedFd> = (0..8).map(|_| raw_connection(&path)).collect();
    let refused_launch = prost::Message::encode_to_vec(&pb::FdAttach {
        body: Some(pb::fd_attach::Body::Launch(pb::LaunchRequest {
            session: "no-such-session".into(),
            ..Default::default()
        })),
    });
    for i in 0..FLOOD {
        let turned_away = connect_seqpacket(&path, false).unwrap();
        drop(turned_away);
        send_packet(held[0].as_fd(), &refused_launch, None, false).unwrap();
        let reply = recv_packet(held[0].as_fd(), false).unwrap().unwrap();
        assert_ne!(refusal_of(&reply.bytes).0, "", "launch {i} was not refused");
        if i % 1000 == 0 {
            bystander
                .launch(&job.kernel, &job.launch(1001).sync(true))
                .await
                .unwrap();
            job.check();
        }
    }
    // The last turned-away connections and refusals reach the log.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let seconds = started.elapsed().as_secs() as usize + 1;
    let log = daemon.stderr();
    let caps = log
        .lines()
        .filter(|l| l.contains("fd socket connection") && l.contains("refused"))
        .count();
    let launches = log.lines().filter(|l| l.contains("refused")).count() - caps;
    eprintln!("{caps} cap lines and {launches} refusal lines in {seconds} s for {FLOOD} each");
    assert!(
        caps >= 1,
        "the refusals at the cap were never logged:\n{log}"
    );
    assert!(caps <= seconds + 1, "{caps} lines in {seconds} s");
    assert!(
        launches >= 1 && launches <= 2 * (seconds + 1),
        "{launches} lines in {seconds} s"
    );
    bystander
        .launch(&job.kernel, &job.launch(1001).sync(true))
        .await
        .unwrap();
    job.check();
    drop(held);
}

/// Connects to the fd socket as uid 65534 in a forked child, sends a probe
/// (a packet without a token or call: refused INVALID_ARGUMENT when it is
/// read) and returns the refusal's (reason, limit).
fn probe_as_nobody(path: &Path) -> (String, String) {
    let (read_end, write_end) = nix::unistd::pipe().unwrap();
    let path = path.to_owned();
    // SAFETY: the child makes only system calls (and allocations, which
    // glibc's malloc keeps fork-safe) before it exits with _exit.
    match unsafe { nix::unistd::fork() }.unwrap() {
        nix::unistd::ForkResult::Child => {
            let code = (|| {
                nix::unistd::setgid(nix::unistd::Gid::from_raw(65534)).ok()?;
                nix::unistd::setuid(nix::unistd::Uid::from_raw(65534)).ok()?;
                let socket = connect_seqpacket(&path, false).ok()?;
                send_packet(socket.as_fd(), b"probe", None, false).ok()?;
                let reply = recv_packet(socket.as_fd(), false).ok()??;
                nix::unistd::write(&write_end, &reply.bytes).ok()?;
                Some(0)
            })()
            .unwrap_or(1);
            // SAFETY: leaves the forked child without running the parent's
            // destructors or test harness.
            unsafe { nix::libc::_exit(code) };
        }
        nix::unistd::ForkResult::Parent { child } => {
            drop(write_end);
            let status = nix::sys::wait::waitpid(child, None).unwrap();
            assert_eq!(status, nix::sys::wait::WaitStatus::Exited(child, 0));
            let mut bytes = vec![0u8; 4096];
            let len = nix::unistd::read(&read_end, &mut bytes).unwrap();
            refusal_of(&bytes[..len])
        }
    }
}

/// One uid holding every connection of the fd socket does not lock another
/// uid out: the newcomer is served, the idlest connection of the holder is
/// ended with a LIMIT_EXCEEDED refusal in place of its next answer, and
/// the holder cannot take the place back while the newcomer holds one.
#[tokio::test(flavor = "multi_thread")]
async fn a_uid_holding_every_fd_socket_connection_cannot_lock_out_another() {
    use std::os::unix::fs::PermissionsExt;
    if !nix::unistd::geteuid().is_root() {
        panic!("this test switches a child to another uid and must run as root");
    }
    let daemon = Daemon::start(&[
        "--socket-mode",
        "666",
        "--fd-socket-max-connections",
        "4",
        "--fd-socket-max-connections-per-uid",
        "4",
    ]);
    std::fs::set_permissions(daemon.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = fd_socket_path(&daemon.socket);
    let client = Client::connect(&daemon.target())
        .await
        .unwrap()
        .without_fd_lane();
    let bystander = client.open_session("bystander").await.unwrap();
    let job = add(&bystander, 777).await;
    // Root takes every place; the first is the idlest.
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(raw_connection(&path));
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    crate::support::wait_until(
        "four connections",
        std::time::Duration::from_secs(5),
        || accepted_on(&path) == 4,
    );
    // Another uid is served.
    assert_eq!(probe_as_nobody(&path).0, "INVALID_ARGUMENT");
    // The idlest of root's was ended, with a refusal naming the cap.
    let first = held.remove(0);
    let told = recv_packet(first.as_fd(), false)
        .unwrap()
        .expect("the idlest connection was closed without a refusal");
    assert_eq!(
        refusal_of(&told.bytes),
        (
            "LIMIT_EXCEEDED".to_string(),
            "fd_socket_connections".to_string()
        )
    );
    assert!(recv_packet(first.as_fd(), false).unwrap().is_none());
    bystander
        .launch(&job.kernel, &job.launch(777).sync(true))
        .await
        .unwrap();
    job.check();
    // The others of root's are still served (a probe ends each).
    for socket in &held {
        send_packet(socket.as_fd(), b"probe", None, false).unwrap();
        let reply = recv_packet(socket.as_fd(), false).unwrap().unwrap();
        assert_eq!(refusal_of(&reply.bytes).0, "INVALID_ARGUMENT");
    }
}

/// Clients that keep sending launches over the fd socket through a drain:
/// every packet is answered, launches run until the drain and are refused
/// DRAINING (and not run) after it, answers go on through the drain's
/// grace, and each connection ends with a DRAINING refusal, never a reset
/// or a close without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fd_socket_clients_that_keep_sending_through_a_drain_end_with_a_draining_status() {
    const CLIENTS: usize = 3;
    const CAP: usize = 1 << 16;
    let mut daemon = Daemon::start(&["--drain-timeout", "4s"]);
    let path = fd_socket_path(&daemon.socket);
    let client = Client::connect(&daemon.target())
        .await
        .unwrap()
        .without_fd_lane();
    let session = client.open_session("drain").await.unwrap();
    let affine = session
        .load_ptx(
            0,
            corpus("affine_f32_scalar.ptx"),
            "affine_f32_scalar",
            LoadOptions::default(),
        )
        .await
        .unwrap();
    let mut x = HostShm::create(4).unwrap();
    x.write_f32(0, &[1.0]).unwrap();
    let x = session.register_shm(&x, None).await.unwrap();
    let mut outputs = Vec::new();
    let mut threads = Vec::new();
    for _ in 0..CLIENTS {
        let mut out = HostShm::create(CAP as u64 * 4).unwrap();
        out.write_f32(0, &vec![f32::NAN; CAP]).unwrap();
        let buffer = session.register_shm(&out, None).await.unwrap();
        outputs.push(out);
        let packets: Vec<Vec<u8>> = (1..CAP as u64)
            .map(|tag| {
                let launch = Launch::new([x.operand()], buffer.at(tag * 4), 1)
                    .params([tag as f64, 0.0])
                    .sync(true);
                prost::Message::encode_to_vec(&pb::FdAttach {
                    body: Some(pb::fd_attach::Body::Launch(launch.to_proto(
                        session.id(),
                        affine.handle().to_owned(),
                        tag,
                    ))),
                })
            })
            .collect();
        let socket = raw_connection(&path);
        threads.push(std::thread::spawn(move || {
            // (tag, ran?, when) for every answer, and how it ended.
            let mut answers: Vec<(u64, bool, std::time::Instant)> = Vec::new();
            for (i, packet) in packets.iter().enumerate() {
                let tag = i as u64 + 1;
                // Once refused, send at a client's pace: unpaced, a fast
                // machine answers the refusals quicker than the grace lasts
                // and the client runs out of launches before the end (CI
                // answered 64119 refusals in under 2 s).
                if answers.last().is_some_and(|(_, ran, _)| !ran) {
                    std::thread::sleep(std::time::Duration::from_micros(500));
                }
                let sent = send_packet(socket.as_fd(), packet, None, false);
                match recv_packet(socket.as_fd(), false) {
                    Ok(Some(reply)) => {
                        let (reason, _) = refusal_of(&reply.bytes);
                        assert!(
                            reason.is_empty() || reason == "DRAINING",
                            "tag {tag}: {reason}"
                        );
                        answers.push((tag, reason.is_empty(), std::time::Instant::now()));
                    }
                    Ok(None) => return (answers, format!("closed (send: {sent:?})")),
                    Err(e) => return (answers, format!("{e} (send: {sent:?})")),
                }
            }
            (answers, "ran out of launches".to_string())
        }));
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let terminated = std::time::Instant::now();
    let status = tokio::task::spawn_blocking(move || daemon.terminate())
        .await
        .unwrap();
    assert!(status.success(), "{status}");
    for (index, thread) in threads.into_iter().enumerate() {
        let (answers, end) = thread.join().unwrap();
        let ran = answers.iter().filter(|(_, ran, _)| *ran).count();
        let refused: Vec<_> = answers.iter().filter(|(_, ran, _)| !ran).collect();
        eprintln!(
            "client {index}: {} answers ({ran} ran, {} DRAINING), end: {end}",
            answers.len(),
            refused.len()
        );
        assert!(ran > 0, "client {index}");
        assert!(refused.len() > 1, "client {index}: no DRAINING answers");
        // Once refused, never run again; the last answer is DRAINING.
        let first_refused = answers.iter().position(|(_, ran, _)| !ran).unwrap();
        assert!(answers[first_refused..].iter().all(|(_, ran, _)| !ran));
        // The answers went on through the grace (half the drain timeout).
        let last = refused.last().unwrap().2;
        assert!(
            last.duration_since(terminated) > std::time::Duration::from_millis(1500),
            "client {index}: DRAINING answers stopped after {:?}",
            last.duration_since(terminated)
        );
        assert!(end.starts_with("closed"), "client {index} ended with {end}");
        // What ran is exactly what was answered done.
        let out = outputs[index].read_f32(0, CAP).unwrap();
        for (tag, ran, _) in &answers {
            let value = out[*tag as usize];
            if *ran {
                assert_eq!(value, *tag as f32, "client {index} tag {tag}");
            } else {
                assert!(value.is_nan(), "client {index}: refused tag {tag} ran");
            }
        }
        let answered = answers.len();
        assert!(
            out[answered + 1..].iter().all(|v| v.is_nan()),
            "client {index}"
        );
    }
}
