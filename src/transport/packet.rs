//! The packet transport (the "fd socket"): descriptors, and unary launches
//! and loads, one `SOCK_SEQPACKET` packet each way.
//!
//! A Unix socket beside the gRPC socket, named after it with `.fds`
//! appended, with the same mode. One exchange per packet: the client sends
//! an encoded `FdAttach` whose body is one of
//! - a token (`RegisterBuffer` with source `posix_fd`, or `OpenRing` with
//!   `by_fd`, returned it), with exactly one descriptor (`SCM_RIGHTS`);
//! - a `LaunchRequest`, run as the `Launch` RPC runs it;
//! - a `LoadKernelRequest`, run as the `LoadKernel` RPC runs it;
//!
//! and ptxd answers with one encoded `FdAttachReply`. The calls run through
//! [`super::calls`] (the same front call, conversions and metrics as over
//! gRPC) and every refusal sent here is recorded by
//! [`super::refusals::record`], as the gRPC layer records its own. The
//! peer's uid comes from the kernel (`SO_PEERCRED`), never from the packet.
//!
//! Invariants:
//! - A descriptor is owned from the moment it is received: one that does
//!   not complete a registration is closed before the reply is sent.
//! - A packet that is truncated or undecodable, has no body or an empty
//!   token, a token without exactly one descriptor, or a call with any, is
//!   refused (INVALID_ARGUMENT) and ends the connection.
//! - On drain (`stop`) the socket takes no new connection, and those it
//!   has keep being answered (DRAINING: nothing new runs) for the drain's
//!   grace, as a `LaunchStream` is; then each ends with one unsolicited
//!   DRAINING refusal, after the packet it was answering: a client that
//!   kept sending reads a status, never just a closed socket. Every packet
//!   answered DRAINING was not run.
//! - At most [`FdSocketLimits::max_connections`] connections are served at
//!   once, and at most [`FdSocketLimits::max_per_uid`] of one uid. When all
//!   are taken, a uid holding none still gets one: the idlest connection of
//!   the uid holding the most is ended to make room (it gets a
//!   LIMIT_EXCEEDED refusal, limit `fd_socket_connections`, in place of its
//!   next answer), so no set of uids can lock another out of descriptor
//!   passing. A uid holding some gets one only from a uid holding at least
//!   two more. Others get one refusal (LIMIT_EXCEEDED) before anything
//!   they sent is read, and are closed, so a client knows its packet was
//!   not run. A connection ended to make room closes within its current
//!   answer, and ended ones never number more than the cap, so the socket
//!   never holds more than twice the cap in descriptors.
//! - Each connection is closed after [`FdSocketLimits::idle_timeout`]
//!   without a packet (or with a reply it does not read), and a connection
//!   handles one packet at a time, so a local user cannot make the daemon
//!   hold more than one unregistered descriptor per connection.
//! - Before a connection the daemon ends is closed, it is shut for reading
//!   (the client's further sends fail) and what the client queued on it is
//!   read and dropped (a bounded number of packets), so that the close does
//!   not reset the client's socket over the refusal it was sent.
//! - Every refusal that answers a packet is recorded once
//!   ([`super::refusals::record`]: `ptxd_refusals_total{reason}` and one
//!   rate-limited log line, transport `fd socket`), as a gRPC call's status
//!   is. A connection refused or ended at the caps, or at the drain's end,
//!   is not a call: like a gRPC connection turned away, it is logged
//!   (rate-limited) and not counted as a refusal.
//! - Every log line a client can cause here is rate-limited
//!   ([`crate::connections::LogLimit`]).

use std::collections::HashMap;
use std::future::Future;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::{
    accept4, bind, getsockopt, listen, socket, sockopt, AddressFamily, Backlog, SockFlag, SockType,
    UnixAddr,
};
use prost::Message;
use ptxd_ipc::packet::{
    recv_async_in, recv_packet_in, send_packet, spin_recv_in, PacketBuffer, PacketMeta,
};

use crate::connections::LogLimit;
use crate::spin::Spinners;
use ptxd_proto::v1 as api;
use ptxd_proto::v1::fd_attach::Body;
use ptxd_proto::v1::fd_attach_reply::Result as Answer;
use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;

use crate::connections::Origin;
use crate::error::Error;
use crate::front::{Attached, Front};
use crate::sessions::{Caller, Peer};

use super::calls::{opened_ring, registered_buffer, Calls};
use super::refusals::{record_error, Carrier};

/// Connections served at once, by default.
pub const MAX_CONNECTIONS: usize = 64;

/// Connections one uid may hold at once, by default, so that one local
/// user cannot take every connection from the others.
pub const MAX_CONNECTIONS_PER_UID: usize = 8;

/// How long a connection may sit without sending a packet, by default.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Packets of a connection being closed that are read and dropped first.
const DRAIN_PACKETS: usize = 16;

/// The fd socket's caps (`--fd-socket-*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdSocketLimits {
    pub max_connections: usize,
    pub max_per_uid: usize,
    pub idle_timeout: Duration,
}

impl Default for FdSocketLimits {
    fn default() -> Self {
        FdSocketLimits {
            max_connections: MAX_CONNECTIONS,
            max_per_uid: MAX_CONNECTIONS_PER_UID,
            idle_timeout: IDLE_TIMEOUT,
        }
    }
}

/// Binds the fd socket at `path` with `mode`, replacing a stale socket
/// file (the caller has made sure no daemon serves the gRPC socket).
pub fn bind_fd_socket(path: &Path, mode: u32) -> std::io::Result<OwnedFd> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path)?,
        Ok(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ))
        }
        Err(_) => {}
    }
    let fd = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?;
    bind(fd.as_raw_fd(), &UnixAddr::new(path)?)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    listen(&fd, Backlog::new(128).unwrap_or(Backlog::MAXCONN))?;
    Ok(fd)
}

/// Why a connection was turned away at the caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refused {
    Total(usize),
    PerUid(usize),
}

impl Refused {
    fn limit(self) -> (&'static str, usize) {
        match self {
            Refused::Total(value) => ("fd_socket_connections", value),
            Refused::PerUid(value) => ("fd_socket_connections_per_uid", value),
        }
    }
}

/// One live connection, as the table sees it.
#[derive(Debug)]
struct Entry {
    uid: u32,
    /// Since when it waits for a packet; `None` while it answers one.
    idle_since: Option<Instant>,
    /// Ended to make room for another uid: it closes at its next wait.
    leaving: bool,
    evict: Arc<Notify>,
}

/// The live connections: who holds them, which are idle, which leave.
#[derive(Debug)]
struct Table {
    limits: FdSocketLimits,
    entries: Mutex<(u64, HashMap<u64, Entry>)>,
}

/// A connection's place in the table, given back on drop.
struct Place {
    table: Arc<Table>,
    id: u64,
    evict: Arc<Notify>,
}

/// Who was admitted, and whose connection was ended to make room.
struct Admitted {
    place: Place,
    evicted_uid: Option<u32>,
}

impl Table {
    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, HashMap<u64, Entry>)> {
        // Plain bookkeeping: a panic while holding the lock cannot leave it
        // inconsistent.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for a connection of `uid`, ending another uid's idlest
    /// connection when that is fair (see the module's invariants).
    fn admit(self: &Arc<Self>, uid: u32) -> Result<Admitted, Refused> {
        let limits = self.limits;
        let mut guard = self.lock();
        let (next_id, entries) = &mut *guard;
        let mut held: HashMap<u32, usize> = HashMap::new();
        let mut leaving = 0;
        for entry in entries.values() {
            if entry.leaving {
                leaving += 1;
            } else {
                *held.entry(entry.uid).or_default() += 1;
            }
        }
        let mine = held.get(&uid).copied().unwrap_or(0);
        if mine >= limits.max_per_uid {
            return Err(Refused::PerUid(limits.max_per_uid));
        }
        let live: usize = held.values().sum();
        let mut evicted_uid = None;
        if live >= limits.max_connections {
            // The uid holding the most, if it holds enough more than this
            // one: one more when this one holds none, else two more.
            let needed = if mine == 0 { 1 } else { mine + 2 };
            let victim_uid = held
                .iter()
                .filter(|(other, count)| **other != uid && **count >= needed)
                .max_by_key(|(other, count)| (**count, std::cmp::Reverse(**other)))
                .map(|(other, _)| *other);
            let Some(victim_uid) = victim_uid.filter(|_| leaving < limits.max_connections) else {
                return Err(Refused::Total(limits.max_connections));
            };
            // Its idlest connection; one answering a packet only if none
            // waits (it then leaves after that answer).
            let victim = entries
                .iter_mut()
                .filter(|(_, e)| e.uid == victim_uid && !e.leaving)
                .min_by_key(|(id, e)| (e.idle_since.is_none(), e.idle_since, **id))
                .map(|(_, e)| e);
            let Some(victim) = victim else {
                return Err(Refused::Total(limits.max_connections));
            };
            victim.leaving = true;
            victim.evict.notify_one();
            evicted_uid = Some(victim_uid);
        }
        *next_id += 1;
        let id = *next_id;
        let evict = Arc::new(Notify::new());
        entries.insert(
            id,
            Entry {
                uid,
                idle_since: Some(Instant::now()),
                leaving: false,
                evict: evict.clone(),
            },
        );
        Ok(Admitted {
            place: Place {
                table: self.clone(),
                id,
                evict,
            },
            evicted_uid,
        })
    }
}

impl Place {
    /// Marks the connection waiting for a packet (`true`) or answering one;
    /// false once it was ended to make room.
    fn set_idle(&self, idle: bool) -> bool {
        let mut guard = self.table.lock();
        match guard.1.get_mut(&self.id) {
            Some(entry) => {
                entry.idle_since = idle.then(Instant::now);
                !entry.leaving
            }
            None => false,
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.table.lock().1.remove(&self.id);
    }
}

/// The fd socket's log lines a client can cause, each rate-limited.
#[derive(Debug, Default)]
struct Logs {
    limit: LogLimit,
}

impl Logs {
    fn refused(&self, uid: u32, refused: Refused) {
        let (limit, value) = refused.limit();
        if let Some(count) = self.limit.admit(limit) {
            tracing::warn!(
                uid,
                limit,
                value,
                count,
                "fd socket connections refused at a cap"
            );
        }
    }

    fn evicted(&self, uid: u32, evicted_uid: u32) {
        if let Some(count) = self.limit.admit("evicted") {
            tracing::info!(
                uid,
                evicted_uid,
                count,
                "fd socket full: ended the idlest connection of the uid holding the most"
            );
        }
    }

    fn accept_failed(&self, error: &std::io::Error) {
        if let Some(count) = self.limit.admit("accept failed") {
            tracing::warn!(%error, count, "fd socket accept failed");
        }
    }

    fn no_credentials(&self, error: Errno) {
        if let Some(count) = self.limit.admit("no credentials") {
            tracing::warn!(%error, count, "fd socket peer without credentials");
        }
    }
}

/// Serves the fd socket until `stop` resolves, then drains it (see the
/// module's invariants): connections are answered (DRAINING) for `grace`,
/// then end with a DRAINING refusal. After each reply a connection polls
/// for its next packet for up to the daemon's spin (`--front-spin`), when
/// `spinners` grants it, before its task sleeps.
pub async fn serve(
    listener: OwnedFd,
    calls: Calls,
    spinners: Arc<Spinners>,
    limits: FdSocketLimits,
    grace: Duration,
    stop: impl Future<Output = ()>,
) {
    // SAFETY: the AsyncFd owns the listening socket, which stays open and
    // the same socket until it drops.
    let listener = match unsafe { AsyncFd::register(listener) } {
        Ok(listener) => listener,
        Err(e) => {
            tracing::error!(error = %e, "cannot watch the fd socket");
            return;
        }
    };
    let table = Arc::new(Table {
        limits,
        entries: Mutex::new((0, HashMap::new())),
    });
    let logs = Logs::default();
    // Room for what a turned-away connection queued, kept for the next.
    let mut spare = PacketBuffer::new();
    let mut connections = tokio::task::JoinSet::new();
    let (cut_tx, cut) = tokio::sync::watch::channel(false);
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            () = &mut stop => break,
            // Reaps the connections that ended, so the set stays small.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = accept(&listener) => accepted,
        };
        let connection = match accepted {
            Ok(connection) => connection,
            Err(e) => {
                logs.accept_failed(&e);
                // EMFILE and friends: back off instead of spinning.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let peer = match getsockopt(&connection, sockopt::PeerCredentials) {
            Ok(credentials) => Peer {
                uid: credentials.uid(),
                gid: credentials.gid(),
                pid: Some(credentials.pid()),
            },
            Err(e) => {
                logs.no_credentials(e);
                continue;
            }
        };
        let place = match table.admit(peer.uid) {
            Ok(admitted) => {
                if let Some(evicted_uid) = admitted.evicted_uid {
                    logs.evicted(peer.uid, evicted_uid);
                }
                admitted.place
            }
            Err(refused) => {
                logs.refused(peer.uid, refused);
                let (limit, value) = refused.limit();
                close_with(connection, limit_refusal(limit, value), &mut spare);
                continue;
            }
        };
        let calls = calls.clone();
        let cut = cut.clone();
        let spinners = spinners.clone();
        connections.spawn(async move {
            serve_connection(connection, peer, calls, spinners, limits, place, cut).await;
        });
    }
    // Draining: no new connections; the open ones are answered (DRAINING,
    // nothing new runs) for the grace, then end with a DRAINING refusal
    // once their current answer is out. The caller bounds the wait by the
    // drain timeout.
    drop(listener);
    let cut_after_grace = async {
        tokio::time::sleep(grace).await;
        let _ = cut_tx.send(true);
        std::future::pending::<()>().await;
    };
    tokio::pin!(cut_after_grace);
    loop {
        tokio::select! {
            () = &mut cut_after_grace => {}
            joined = connections.join_next() => if joined.is_none() { break },
        }
    }
}

async fn accept(listener: &AsyncFd<OwnedFd>) -> std::io::Result<OwnedFd> {
    loop {
        let mut ready = listener.readable().await?;
        match accept4(
            listener.get_ref(),
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        ) {
            Ok(fd) => return Ok(fd),
            Err(Errno::EAGAIN) => ready.clear_ready(),
            Err(Errno::EINTR | Errno::ECONNABORTED) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// The refusal of a connection at (or ended to make room under) a cap.
fn limit_refusal(limit: &'static str, value: usize) -> api::FdAttachReply {
    refused(Error::LimitExceeded {
        limit,
        value: value as u64,
    })
}

/// Ends a connection the daemon will not serve further: sends `reply` (best
/// effort: a full queue drops it, the close still says enough), reads and
/// drops what the client queued, so that the close does not reset the
/// client's socket before it reads `reply`, and closes it.
/// `buffer` is room for one packet the caller keeps (not a fresh 64 KiB
/// for each connection turned away).
fn close_with(connection: OwnedFd, reply: api::FdAttachReply, buffer: &mut PacketBuffer) {
    let _ = send_packet(connection.as_fd(), &reply.encode_to_vec(), None, true);
    // No packet can come in after this (the client's sends fail with
    // EPIPE), so once the queue is read the close resets nothing.
    let _ = nix::sys::socket::shutdown(connection.as_raw_fd(), nix::sys::socket::Shutdown::Read);
    for _ in 0..DRAIN_PACKETS {
        // Descriptors it carried close as the packet drops.
        match recv_packet_in(connection.as_fd(), true, buffer) {
            Ok(Some(_)) | Err(Errno::EINTR) => {}
            Ok(None) | Err(_) => break,
        }
    }
}

/// What one packet asks for.
enum Ask {
    /// A descriptor for a token.
    Attach { token: String, fd: OwnedFd },
    /// A unary launch.
    Launch(api::LaunchRequest),
    /// A kernel load.
    Load(api::LoadKernelRequest),
}

/// Why a connection stops waiting for its next packet.
enum Wait {
    Packet(PacketMeta),
    /// The client closed it, broke it, or idled out.
    Gone,
    /// Ended to make room for another uid.
    Evicted,
    /// The drain's grace is over.
    Cut,
}

/// One client connection of `peer`: packets in, replies out, until it
/// closes, breaks the protocol, idles out, is ended to make room or the
/// drain ends it.
async fn serve_connection(
    connection: OwnedFd,
    peer: Peer,
    calls: Calls,
    spinners: Arc<Spinners>,
    limits: FdSocketLimits,
    place: Place,
    mut cut: tokio::sync::watch::Receiver<bool>,
) {
    // SAFETY: as for the listener: owned by the AsyncFd until it drops.
    let Ok(connection) = (unsafe { AsyncFd::register(connection) }) else {
        return;
    };
    // One packet's room for the connection's life, not a fresh one each.
    let mut buffer = PacketBuffer::new();
    loop {
        let staying = place.set_idle(true);
        let wait = if !staying {
            Wait::Evicted
        } else if *cut.borrow() {
            Wait::Cut
        } else {
            tokio::select! {
                biased;
                _ = cut.wait_for(|cut| *cut) => Wait::Cut,
                () = place.evict.notified() => Wait::Evicted,
                received = tokio::time::timeout(limits.idle_timeout, next_packet(&connection, &mut buffer, &spinners)) => match received {
                    Ok(Ok(Some(packet))) => Wait::Packet(packet),
                    Ok(Ok(None) | Err(_)) | Err(_) => Wait::Gone,
                },
            }
        };
        let packet = match wait {
            Wait::Packet(packet) => packet,
            Wait::Gone => return,
            Wait::Evicted => {
                let limit = limit_refusal("fd_socket_connections", limits.max_connections);
                return close_with(connection.into_inner(), limit, &mut buffer);
            }
            Wait::Cut => {
                return close_with(
                    connection.into_inner(),
                    refused(Error::Draining),
                    &mut buffer,
                )
            }
        };
        place.set_idle(false);
        let caller = Caller::Local(peer);
        // A packet that does not parse ends the connection; a refusal of
        // what it asks does not.
        let (rpc, result, keep_going) = match parse(buffer.bytes(&packet), packet) {
            Ok(Ask::Attach { token, fd }) => {
                let result = attach(calls.front(), token, fd, peer.uid).await;
                ("FdAttach", result, true)
            }
            Ok(Ask::Launch(request)) => {
                let result = calls.launch(caller, request).await;
                ("Launch", result.map(Answer::Launched), true)
            }
            Ok(Ask::Load(request)) => {
                let result = calls.load(caller, request).await;
                ("LoadKernel", result.map(Answer::Loaded), true)
            }
            Err(refusal) => ("FdAttach", Err(refusal), false),
        };
        let reply = match result {
            Ok(answer) => api::FdAttachReply {
                result: Some(answer),
            },
            Err(error) => {
                let peer = Origin::Uid(peer.uid);
                record_error(calls.observer(), rpc, Carrier::Packet, peer, &error);
                refused(error)
            }
        };
        // A client that stops reading its replies fills its queue; the
        // reply then waits at most the idle timeout, so such a client cannot
        // hold its connection slot (nor a drain) for good.
        let sent = tokio::time::timeout(
            limits.idle_timeout,
            send(&connection, &reply.encode_to_vec()),
        )
        .await;
        if !matches!(sent, Ok(Ok(()))) || !keep_going {
            return;
        }
    }
}

/// The connection's next packet: polled for while `spinners` grants a
/// spin (the permit goes back when the spin ends, not when the packet
/// comes), then waited for.
async fn next_packet(
    connection: &AsyncFd<OwnedFd>,
    buffer: &mut PacketBuffer,
    spinners: &Arc<Spinners>,
) -> nix::Result<Option<PacketMeta>> {
    let (spin, permit) = spinners.take();
    if let Some(received) = spin_recv_in(connection, buffer, spin).await {
        return received;
    }
    drop(permit);
    recv_async_in(connection, buffer).await
}

/// What a packet asks for, or why it is refused (every descriptor it
/// carried is closed when the packet drops).
fn parse(bytes: &[u8], packet: PacketMeta) -> Result<Ask, Error> {
    let invalid = |message: &str| Error::InvalidArgument {
        field: "packet",
        message: message.to_owned(),
    };
    if packet.truncated {
        return Err(invalid(&format!(
            "a packet is at most {} bytes",
            ptxd_ipc::packet::MAX_PACKET
        )));
    }
    let attach =
        api::FdAttach::decode(bytes).map_err(|e| invalid(&format!("not an FdAttach: {e}")))?;
    let mut fds = packet.fds;
    let call = match attach.body {
        None => return Err(invalid("a packet holds a token, a launch or a load")),
        Some(Body::Token(token)) => {
            if token.is_empty() {
                return Err(invalid("a token is not empty"));
            }
            if fds.len() != 1 {
                return Err(invalid(&format!(
                    "a token's packet carries exactly one descriptor, not {}",
                    fds.len()
                )));
            }
            let fd = fds.pop().ok_or_else(|| invalid("no descriptor"))?;
            return Ok(Ask::Attach { token, fd });
        }
        Some(Body::Launch(launch)) => Ask::Launch(launch),
        Some(Body::Load(load)) => Ask::Load(load),
    };
    if !fds.is_empty() {
        return Err(invalid(&format!(
            "a call carries no descriptor, not {}",
            fds.len()
        )));
    }
    Ok(call)
}

/// A descriptor for `token`, registered (a buffer) or opened (a ring) by
/// the front for `uid`.
async fn attach(front: &Arc<Front>, token: String, fd: OwnedFd, uid: u32) -> Result<Answer, Error> {
    let front = front.clone();
    // Spawned, so that a client that hangs up mid-open cannot cancel the
    // open half-way (the open commits or undoes).
    let attached = tokio::spawn(async move { front.attach_fd(&token, fd, uid).await })
        .await
        .unwrap_or_else(|e| {
            Err(Error::Internal {
                message: format!("the fd registration task failed: {e}"),
            })
        })?;
    Ok(match attached {
        Attached::Buffer(buffer) => Answer::Registered(registered_buffer(buffer)),
        Attached::Ring(ring) => Answer::Ring(opened_ring(ring)),
    })
}

/// The refusal packet for `error`: the code, reason and metadata a gRPC
/// status would carry. (Recording it is the sender's: a packet's refusal is
/// recorded where it is answered; a connection's, at a cap or the drain's
/// end, is logged by [`Logs`] as the gRPC listener logs its own.)
fn refused(error: Error) -> api::FdAttachReply {
    let refusal = error.to_launch_error();
    api::FdAttachReply {
        result: Some(api::fd_attach_reply::Result::Refused(api::FdRefusal {
            code: refusal.code,
            message: refusal.message,
            reason: refusal.reason,
            metadata: refusal.metadata,
        })),
    }
}

async fn send(connection: &AsyncFd<OwnedFd>, bytes: &[u8]) -> std::io::Result<()> {
    loop {
        let mut ready = connection.writable().await?;
        match send_packet(connection.get_ref().as_fd(), bytes, None, true) {
            Err(Errno::EAGAIN) => ready.clear_ready(),
            Err(Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
            Ok(()) => return Ok(()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn table(max_connections: usize, max_per_uid: usize) -> Arc<Table> {
        Arc::new(Table {
            limits: FdSocketLimits {
                max_connections,
                max_per_uid,
                idle_timeout: IDLE_TIMEOUT,
            },
            entries: Mutex::new((0, HashMap::new())),
        })
    }

    fn refusal(result: Result<Admitted, Refused>) -> Refused {
        match result {
            Ok(_) => panic!("admitted"),
            Err(refused) => refused,
        }
    }

    #[test]
    fn a_uid_holding_none_gets_a_place_from_the_uid_holding_the_most() {
        let table = table(3, 3);
        let a: Vec<Place> = (0..3).map(|_| table.admit(1).unwrap().place).collect();
        // The second is the idlest: the others answer a packet.
        a[0].set_idle(false);
        a[2].set_idle(false);
        let b = table.admit(2).unwrap();
        assert_eq!(b.evicted_uid, Some(1));
        assert!(a[0].set_idle(false) && !a[1].set_idle(true) && a[2].set_idle(false));
        // Uid 2 holds one, uid 1 two: not enough more to take another.
        assert_eq!(refusal(table.admit(2)), Refused::Total(3));
        // Nor may uid 1 take its place back, nor a third uid evict the last
        // of uid 2 while uid 1 holds more.
        assert_eq!(refusal(table.admit(1)), Refused::Total(3));
        let c = table.admit(3).unwrap();
        assert_eq!(c.evicted_uid, Some(1));
        // A connection that left frees its place when it closes.
        drop(a);
        assert_eq!(table.lock().1.len(), 2);
        assert!(table.admit(1).is_ok());
    }

    /// What `parse` makes of a packet holding `body` and `fds` descriptors:
    /// the ask's name, or the refusal's message.
    fn parsed(body: Option<Body>, fds: usize) -> Result<&'static str, String> {
        let bytes = api::FdAttach { body }.encode_to_vec();
        let fds = (0..fds)
            .map(|_| OwnedFd::from(std::fs::File::open("/dev/null").unwrap()))
            .collect();
        let meta = PacketMeta {
            len: bytes.len(),
            fds,
            truncated: false,
        };
        match parse(&bytes, meta) {
            Ok(Ask::Attach { .. }) => Ok("attach"),
            Ok(Ask::Launch(_)) => Ok("launch"),
            Ok(Ask::Load(_)) => Ok("load"),
            Err(Error::InvalidArgument { field, message }) => {
                assert_eq!(field, "packet");
                Err(message)
            }
            Err(other) => panic!("refused otherwise: {other:?}"),
        }
    }

    #[test]
    fn a_packet_asks_for_its_one_body_with_the_descriptors_that_body_takes() {
        let token = || Some(Body::Token(format!("fdt-{:x}", rand::random::<u64>())));
        let launch = || Some(Body::Launch(api::LaunchRequest::default()));
        let load = || Some(Body::Load(api::LoadKernelRequest::default()));
        assert_eq!(parsed(token(), 1), Ok("attach"));
        assert_eq!(parsed(launch(), 0), Ok("launch"));
        assert_eq!(parsed(load(), 0), Ok("load"));
        let refused = |body, fds| parsed(body, fds).unwrap_err();
        assert!(refused(None, 0).contains("a token, a launch or a load"));
        assert!(refused(None, 1).contains("a token, a launch or a load"));
        assert!(refused(Some(Body::Token(String::new())), 1).contains("a token is not empty"));
        for fds in [0, 2] {
            let message = refused(token(), fds);
            assert!(
                message.contains(&format!("exactly one descriptor, not {fds}")),
                "{message}"
            );
        }
        assert!(refused(launch(), 1).contains("a call carries no descriptor, not 1"));
        assert!(refused(load(), 3).contains("a call carries no descriptor, not 3"));
        let truncated = PacketMeta {
            len: 0,
            fds: Vec::new(),
            truncated: true,
        };
        assert!(matches!(
            parse(&[], truncated),
            Err(Error::InvalidArgument { .. })
        ));
    }

    #[test]
    fn the_per_uid_cap_holds_with_room_in_all() {
        let table = table(8, 2);
        let _held: Vec<Admitted> = (0..2).map(|_| table.admit(7).unwrap()).collect();
        assert_eq!(refusal(table.admit(7)), Refused::PerUid(2));
        assert!(table.admit(8).unwrap().evicted_uid.is_none());
    }
}
