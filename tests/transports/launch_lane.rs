//! The SDK's launch lane (unary launches on a second connection, Unix
//! sockets only) against the real daemon: launches go through it, and when
//! the daemon turns its connection away they fall back to the channel. The
//! clients here launch on HTTP/2 only (`without_fd_lane`): tests/transports/fd_lane.rs
//! has the fd socket's path, which the SDK tries first.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support::{corpus, Daemon};
use ptxd_client::{Client, HostShm, Launch, LoadOptions, Session};

/// Loads the add kernel and runs it on `n` elements, checking the sums.
async fn add(session: &Session, n: usize) {
    let kernel = session
        .load_ptx(
            0,
            corpus("add_f32_scalar.ptx"),
            "add_f32_scalar",
            LoadOptions::default(),
        )
        .await
        .unwrap();
    let bytes = n as u64 * 4;
    let (mut a, mut b, out) = (
        HostShm::create(bytes).unwrap(),
        HostShm::create(bytes).unwrap(),
        HostShm::create(bytes).unwrap(),
    );
    let values: Vec<f32> = (0..n).map(|i| i as f32).collect();
    a.write_f32(0, &values).unwrap();
    b.write_f32(0, &values).unwrap();
    let mut operands = Vec::new();
    for shm in [&a, &b, &out] {
        operands.push(session.register_shm(shm, None).await.unwrap().operand());
    }
    let output = operands.pop().unwrap();
    for sync in [false, true] {
        let launch = Launch::new(operands.clone(), output.clone(), n as u64).sync(sync);
        session.launch(&kernel, &launch).await.unwrap();
    }
    let sums = out.read_f32(0, n).unwrap();
    assert!(sums.iter().zip(&values).all(|(s, v)| *s == 2.0 * v));
}

/// How many sockets process `pid` holds open.
fn sockets(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("socket:"))
        .count()
}

/// [`sockets`] once it has held still for 300 ms (the start-up probe's
/// connection may not be closed yet; seen on a loaded two-core machine).
fn settled_sockets(pid: i32) -> usize {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut last = sockets(pid);
    let mut since = std::time::Instant::now();
    while std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
        let now = sockets(pid);
        if now != last {
            (last, since) = (now, std::time::Instant::now());
        } else if since.elapsed() >= std::time::Duration::from_millis(300) {
            break;
        }
    }
    last
}

#[tokio::test]
async fn unary_launches_take_one_connection_of_their_own() {
    let daemon = Daemon::start(&[]);
    let client = Client::connect(&daemon.target())
        .await
        .unwrap()
        .without_fd_lane();
    let session = client.open_session("lane").await.unwrap();
    let before = settled_sockets(daemon.pid());
    add(&session, 1000).await;
    crate::support::wait_until(
        "the lane's connection",
        std::time::Duration::from_secs(5),
        || sockets(daemon.pid()) == before + 1,
    );
    // Clones and other sessions of the client share it.
    let other = client.clone().open_session("lane 2").await.unwrap();
    add(&other, 10).await;
    add(&session, 10).await;
    assert_eq!(sockets(daemon.pid()), before + 1);
    // A client over an existing channel has no lane.
    let plain = Client::from_channel(client.channel());
    let third = plain.open_session("no lane").await.unwrap();
    add(&third, 10).await;
    assert_eq!(sockets(daemon.pid()), before + 1);
}

#[tokio::test]
async fn launches_fall_back_to_the_channel_when_the_lane_is_turned_away() {
    // One connection per uid: the client's channel takes it, and the lane's
    // connection is turned away with a GOAWAY.
    let daemon = Daemon::start(&["--max-connections-per-uid", "1"]);
    // The start-up probe's connection may not be closed yet.
    let mut client = None;
    for _ in 0..100 {
        if let Ok(connected) = Client::connect(&daemon.target()).await {
            let connected = connected.without_fd_lane();
            if connected.info().await.is_ok() {
                client = Some(connected);
                break;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let client = client.expect("the daemon never accepted a client");
    let session = client.open_session("lane refused").await.unwrap();
    add(&session, 1000).await;
    // And again, once the lane is off.
    add(&session, 10).await;
    session.close().await.unwrap();
}
