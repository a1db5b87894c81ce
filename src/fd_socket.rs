//! The fd socket: where clients send the descriptors of buffers they
//! register by file descriptor (`RegisterBuffer` with source `posix_fd`).
//!
//! A `SOCK_SEQPACKET` Unix socket beside the gRPC socket, named after it
//! with `.fds` appended, with the same mode. One exchange per packet: the
//! client sends an encoded `FdAttach` (the token `RegisterBuffer` returned)
//! with exactly one descriptor (`SCM_RIGHTS`); ptxd answers with one
//! encoded `FdAttachReply`. The peer's uid comes from the kernel
//! (`SO_PEERCRED`), never from the packet.
//!
//! The same socket carries the hot unary calls without HTTP/2: an
//! `FdAttach` with `launch` (or `load`) set and no descriptor is run as the
//! `Launch` (or `LoadKernel`) RPC would run it (`PtxdService::fd_socket_*`:
//! the same front call, metrics and refusal accounting), with the socket's
//! peer as the caller.
//!
//! Invariants:
//! - A descriptor is owned from the moment it is received: one that does
//!   not complete a registration is closed before the reply is sent.
//! - A packet that is truncated or undecodable, a token without exactly one
//!   descriptor, a call with any, or a packet with more than one or none of
//!   them is refused (INVALID_ARGUMENT) and ends the connection.
//! - On drain (`stop`), connections waiting for a packet are closed, and
//!   a packet already read is answered first: the drain waits for it.
//! - At most [`MAX_CONNECTIONS`] connections are served at once, and at
//!   most [`MAX_CONNECTIONS_PER_UID`] of one uid; others get one refusal
//!   (LIMIT_EXCEEDED) before anything they sent is read, and are closed, so
//!   a client knows its packet was not run. Each is closed after
//!   [`IDLE_TIMEOUT`] without a packet (or with a reply it does not read),
//!   and a
//!   connection handles one packet at a time, so a local user cannot make
//!   the daemon hold more than one unregistered descriptor per connection.

use std::collections::HashMap;
use std::future::Future;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::socket::{
    accept4, bind, getsockopt, listen, socket, sockopt, AddressFamily, Backlog, SockFlag, SockType,
    UnixAddr,
};
use prost::Message;
use ptxd_client::fd_passing::{recv_async_in, send_packet, spin_recv_in, PacketBuffer, PacketMeta};

use crate::spin::Spinners;
use ptxd_proto::v1 as api;
use tokio::io::unix::AsyncFd;
use tokio::sync::Semaphore;

use crate::error::Error;
use crate::front::Attached;
use crate::service::PtxdService;
use crate::sessions::{Caller, Peer};

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 64;

/// Connections one uid may hold at once, so that one local user cannot
/// take every connection from the others.
pub const MAX_CONNECTIONS_PER_UID: usize = 8;

/// How long a connection may sit without sending a packet.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

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

/// Serves the fd socket until `stop` resolves. After each reply a
/// connection polls for its next packet for up to the daemon's spin
/// (`--front-spin`), when `spinners` grants it, before its task sleeps.
pub async fn serve(
    listener: OwnedFd,
    service: PtxdService,
    spinners: Arc<Spinners>,
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
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let per_uid: Arc<Mutex<HashMap<u32, usize>>> = Arc::default();
    let mut connections = tokio::task::JoinSet::new();
    let (stopping, stopped) = tokio::sync::watch::channel(false);
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
                tracing::warn!(error = %e, "fd socket accept failed");
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
                tracing::warn!(error = %e, "fd socket peer without credentials");
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            tracing::warn!(
                max = MAX_CONNECTIONS,
                "fd socket connection refused: too many open"
            );
            turn_away(&connection, "fd_socket_connections", MAX_CONNECTIONS);
            continue;
        };
        let Some(uid_slot) = UidSlot::take(&per_uid, peer.uid) else {
            tracing::warn!(
                uid = peer.uid,
                max = MAX_CONNECTIONS_PER_UID,
                "fd socket connection refused: too many open for this uid"
            );
            turn_away(
                &connection,
                "fd_socket_connections_per_uid",
                MAX_CONNECTIONS_PER_UID,
            );
            continue;
        };
        let service = service.clone();
        let stopped = stopped.clone();
        let spinners = spinners.clone();
        connections.spawn(async move {
            serve_connection(connection, peer, service, spinners, stopped).await;
            drop((permit, uid_slot));
        });
    }
    // Draining: connections waiting for a packet close; one whose packet
    // was read answers it first, so nothing read is dropped (the caller
    // bounds the wait by the drain timeout).
    let _ = stopping.send(true);
    while connections.join_next().await.is_some() {}
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

/// One of a uid's connections, given back on drop.
struct UidSlot {
    table: Arc<Mutex<HashMap<u32, usize>>>,
    uid: u32,
}

impl UidSlot {
    fn lock(table: &Mutex<HashMap<u32, usize>>) -> std::sync::MutexGuard<'_, HashMap<u32, usize>> {
        // Plain counters: a panic while holding the lock cannot leave them
        // inconsistent.
        table.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn take(table: &Arc<Mutex<HashMap<u32, usize>>>, uid: u32) -> Option<UidSlot> {
        let mut counts = Self::lock(table);
        let count = counts.entry(uid).or_default();
        if *count >= MAX_CONNECTIONS_PER_UID {
            return None;
        }
        *count += 1;
        Some(UidSlot {
            table: table.clone(),
            uid,
        })
    }
}

impl Drop for UidSlot {
    fn drop(&mut self) {
        let mut counts = Self::lock(&self.table);
        if let Some(count) = counts.get_mut(&self.uid) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                counts.remove(&self.uid);
            }
        }
    }
}

/// Tells a connection turned away at a cap why, before closing it (best
/// effort: a full queue drops the refusal, the close still says enough).
fn turn_away(connection: &OwnedFd, limit: &'static str, value: usize) {
    let refusal = refused(Error::LimitExceeded {
        limit,
        value: value as u64,
    });
    let _ = send_packet(connection.as_fd(), &refusal.encode_to_vec(), None, true);
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

/// One client connection of `peer`: packets in, replies out, until it
/// closes, breaks the protocol or idles out.
async fn serve_connection(
    connection: OwnedFd,
    peer: Peer,
    service: PtxdService,
    spinners: Arc<Spinners>,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    // SAFETY: as for the listener: owned by the AsyncFd until it drops.
    let Ok(connection) = (unsafe { AsyncFd::register(connection) }) else {
        return;
    };
    // One packet's room for the connection's life, not a fresh one each.
    let mut buffer = PacketBuffer::new();
    loop {
        let received = tokio::select! {
            biased;
            _ = stopped.wait_for(|stopped| *stopped) => return,
            received = tokio::time::timeout(IDLE_TIMEOUT, next_packet(&connection, &mut buffer, &spinners)) => received,
        };
        let packet = match received {
            Ok(Ok(Some(packet))) => packet,
            Ok(Ok(None) | Err(_)) | Err(_) => return,
        };
        let (reply, keep_going) = match parse(buffer.bytes(&packet), packet) {
            Ok(Ask::Attach { token, fd }) => {
                let front = service.front().clone();
                // Spawned, so that a client that hangs up mid-open cannot
                // cancel the open half-way (the open commits or undoes).
                let result =
                    tokio::spawn(async move { front.attach_fd(&token, fd, peer.uid).await })
                        .await
                        .unwrap_or_else(|e| {
                            Err(Error::Internal {
                                message: format!("the fd registration task failed: {e}"),
                            })
                        });
                (attached(result), true)
            }
            Ok(Ask::Launch(request)) => {
                let result = service.fd_socket_launch(Caller::Local(peer), request).await;
                (answer(result, api::fd_attach_reply::Result::Launched), true)
            }
            Ok(Ask::Load(request)) => {
                let result = service.fd_socket_load(Caller::Local(peer), request).await;
                (answer(result, api::fd_attach_reply::Result::Loaded), true)
            }
            Err(refusal) => (refused(refusal), false),
        };
        // A client that stops reading its replies fills its queue; the
        // reply then waits at most the idle timeout, so such a client cannot
        // hold its connection slot (nor a drain) for good.
        let sent =
            tokio::time::timeout(IDLE_TIMEOUT, send(&connection, &reply.encode_to_vec())).await;
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
            ptxd_client::fd_passing::MAX_PACKET
        )));
    }
    let attach =
        api::FdAttach::decode(bytes).map_err(|e| invalid(&format!("not an FdAttach: {e}")))?;
    let mut fds = packet.fds;
    let token = (!attach.token.is_empty()).then_some(attach.token);
    let call = match (attach.launch, attach.load) {
        (Some(launch), None) => Some(Ask::Launch(launch)),
        (None, Some(load)) => Some(Ask::Load(load)),
        (None, None) => None,
        (Some(_), Some(_)) => return Err(invalid("a packet holds one call, not two")),
    };
    match (token, call) {
        (None, Some(call)) => {
            if !fds.is_empty() {
                return Err(invalid(&format!(
                    "a call carries no descriptor, not {}",
                    fds.len()
                )));
            }
            Ok(call)
        }
        (Some(token), None) => {
            if fds.len() != 1 {
                return Err(invalid(&format!(
                    "a token's packet carries exactly one descriptor, not {}",
                    fds.len()
                )));
            }
            let fd = fds.pop().ok_or_else(|| invalid("no descriptor"))?;
            Ok(Ask::Attach { token, fd })
        }
        (Some(_), Some(_)) => Err(invalid("a packet holds a token or a call, not both")),
        (None, None) => Err(invalid("a packet holds a token or a call")),
    }
}

fn attached(result: Result<Attached, Error>) -> api::FdAttachReply {
    let result = match result {
        Ok(Attached::Buffer(buffer)) => {
            api::fd_attach_reply::Result::Registered(crate::service::registered_buffer(buffer))
        }
        Ok(Attached::Ring(ring)) => {
            api::fd_attach_reply::Result::Ring(crate::service::opened_ring(ring))
        }
        Err(error) => return refused(error),
    };
    api::FdAttachReply {
        result: Some(result),
    }
}

/// The reply to a call: its answer, or its refusal.
fn answer<T>(
    result: Result<T, Error>,
    answered: impl FnOnce(T) -> api::fd_attach_reply::Result,
) -> api::FdAttachReply {
    match result {
        Ok(response) => api::FdAttachReply {
            result: Some(answered(response)),
        },
        Err(error) => refused(error),
    }
}

/// The refusal packet for `error`: the code, reason and metadata a gRPC
/// status would carry.
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
