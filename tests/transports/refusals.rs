//! The transport seam against the real daemon on the host backend: every
//! refusal either transport sends (gRPC over HTTP/2, the packet socket) is
//! counted once, under its reason, in `ptxd_refusals_total`, and a packet's
//! body is a `oneof` (a token, a launch or a load).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use crate::support::{corpus, free_port, get_metrics, wait_for_port, Daemon};
use ptxd_client::{Client, HostShm, Launch, LoadOptions};
use ptxd_ipc::packet::{connect_seqpacket, fd_socket_path, recv_packet, send_packet};
use ptxd_proto::v1 as pb;
use rand::Rng;

/// `ptxd_refusals_total` by reason, from one scrape of `/metrics`.
async fn refusals(port: u16) -> BTreeMap<String, u64> {
    let (_, body) = get_metrics(port).await;
    body.lines()
        .filter_map(|line| line.strip_prefix("ptxd_refusals_total{reason=\""))
        .map(|rest| {
            let (reason, value) = rest.split_once("\"} ").unwrap();
            (reason.to_owned(), value.trim().parse().unwrap())
        })
        .collect()
}

/// One packet out (with `fd`) on a fresh connection, its refusal's reason
/// back.
fn refused_packet(path: &Path, body: Option<pb::fd_attach::Body>, fd: Option<&OwnedFd>) -> String {
    let socket = connect_seqpacket(path, false).unwrap();
    let packet = prost::Message::encode_to_vec(&pb::FdAttach { body });
    send_packet(socket.as_fd(), &packet, fd.map(|f| f.as_fd()), false).unwrap();
    let reply = recv_packet(socket.as_fd(), false).unwrap().unwrap();
    let reply = <pb::FdAttachReply as prost::Message>::decode(reply.bytes.as_slice()).unwrap();
    match reply.result {
        Some(pb::fd_attach_reply::Result::Refused(refused)) => refused.reason,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_refusal_is_counted_once_by_its_reason_whichever_transport_sent_it() {
    let port = free_port();
    let daemon = Daemon::start(&["--metrics", &format!("127.0.0.1:{port}")]);
    wait_for_port(port);
    let mut rng = rand::rng();
    let packets = Client::connect(&daemon.target()).await.unwrap();
    let http2 = Client::connect(&daemon.target())
        .await
        .unwrap()
        .without_fd_lane();
    let session = packets.open_session("seam").await.unwrap();
    let kernel = session
        .load_ptx(
            0,
            corpus("add_f32_scalar.ptx"),
            "add_f32_scalar",
            LoadOptions::default(),
        )
        .await
        .unwrap();
    let n = rng.random_range(16..4096u64);
    let mut operands = Vec::new();
    let mut objects = Vec::new();
    for _ in 0..3 {
        let shm = HostShm::create(n * 4).unwrap();
        operands.push(session.register_shm(&shm, None).await.unwrap().operand());
        objects.push(shm);
    }
    // One element past the buffers: refused before it runs, on either
    // transport.
    let past = Launch::new(operands[..2].to_vec(), operands[2].clone(), n + 1);

    let before = refusals(port).await;
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    let mut count = |reason: String| *expected.entry(reason).or_default() += 1;
    for _ in 0..rng.random_range(1..4) {
        // A launch by packet (the SDK's first choice on a Unix socket).
        let error = session.launch(&kernel, &past).await.unwrap_err();
        count(error.refusal().unwrap().wire_name().to_owned());
        // The same launch by HTTP/2 (the session is the uid's, on any of
        // its connections).
        let request = past.to_proto(session.id(), kernel.handle().to_owned(), 1);
        let status = http2.raw().launch(request).await.unwrap_err();
        let error = ptxd_client::Error::from(status);
        count(error.refusal().unwrap().wire_name().to_owned());
    }
    let path = fd_socket_path(&daemon.socket);
    let memfd = OwnedFd::from(tempfile::tempfile().unwrap());
    for _ in 0..rng.random_range(1..4) {
        // A token that was never issued, with its descriptor.
        let token = format!("fdt-{:016x}", rng.random::<u64>());
        let body = Some(pb::fd_attach::Body::Token(token));
        count(refused_packet(&path, body, Some(&memfd)));
        // A packet without a body: refused, and the connection ends.
        let reason = refused_packet(&path, None, None);
        assert_eq!(reason, "INVALID_ARGUMENT");
        count(reason);
    }
    let after = refusals(port).await;
    let counted: BTreeMap<String, u64> = after
        .iter()
        .map(|(reason, value)| (reason.clone(), value - before.get(reason).unwrap_or(&0)))
        .filter(|(_, delta)| *delta > 0)
        .collect();
    assert_eq!(counted, expected, "counted / sent");
    assert!(expected.len() >= 3, "{expected:?}");
    drop(objects);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_packet_whose_body_is_a_load_loads_as_the_rpc_does() {
    let daemon = Daemon::start(&[]);
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("load by packet").await.unwrap();
    let path = fd_socket_path(&daemon.socket);
    let ptx = corpus("add_f32_scalar.ptx");
    let load = pb::LoadKernelRequest {
        session: session.id().to_owned(),
        artifact: ptx.clone().into_bytes(),
        symbol: "add_f32_scalar".into(),
        kind: pb::ArtifactKind::Ptx as i32,
        ..Default::default()
    };
    let socket = connect_seqpacket(&path, false).unwrap();
    let packet = prost::Message::encode_to_vec(&pb::FdAttach {
        body: Some(pb::fd_attach::Body::Load(load.clone())),
    });
    send_packet(socket.as_fd(), &packet, None, false).unwrap();
    let reply = recv_packet(socket.as_fd(), false).unwrap().unwrap();
    let reply = <pb::FdAttachReply as prost::Message>::decode(reply.bytes.as_slice()).unwrap();
    let Some(pb::fd_attach_reply::Result::Loaded(by_packet)) = reply.result else {
        panic!("expected a load, got {reply:?}");
    };
    let by_grpc = client.raw().load_kernel(load).await.unwrap().into_inner();
    assert!(by_packet.kernel.starts_with("krn-"), "{by_packet:?}");
    assert!(by_grpc.cache_hit, "the packet's load filled the cache");
    assert_eq!(by_packet.signature, by_grpc.signature);
}
