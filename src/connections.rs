//! Connections: the file-descriptor limit, how many connections the daemon
//! holds (in all and per peer), and the deadline for the HTTP/2 handshake.
//!
//! Invariants:
//! - At start the soft `RLIMIT_NOFILE` is raised to the hard limit.
//! - Client connections never hold more than `max_connections` descriptors,
//!   buffers passed by descriptor never more than `max_fd_buffers`, and the
//!   fd socket at most twice its connection cap; by default these shares
//!   ([`fd_budget`]) add up to no more than the descriptor limit minus
//!   [`FD_RESERVE`]: whatever clients do, the front keeps descriptors for
//!   respawning an executor (socketpair, pipes, the child's exec), its
//!   listeners, the metrics endpoint and its logs, and an executor (whose
//!   limit is the front's) has room for every registration it re-opens.
//! - One peer (a uid on the Unix socket, an IP address over TCP, where there
//!   is no uid) holds at most `max_connections_per_uid` connections.
//! - A connection over either cap is accepted and closed at once, after an
//!   HTTP/2 GOAWAY (`ENHANCE_YOUR_CALM`) whose debug data names the limit.
//! - A connection that has not sent the HTTP/2 client preface and its first
//!   frame (the client's SETTINGS) whole within the handshake timeout is
//!   closed.
//! - `accept` failing for want of descriptors or memory (EMFILE, ENFILE,
//!   ENOBUFS, ENOMEM) never stops a listener: it pauses and retries, and says
//!   so in the log at most once per burst.
//! - Every log line a client can cause goes through a [`LogLimit`]: at most
//!   one line per kind (per key) a second, which counts the events it
//!   stands for. A flood of refusals is never a flood of log lines.
//! - A connection the daemon closes is closed lingering (as HTTP servers
//!   close since Apache): its write side is shut first, so the peer reads
//!   everything sent and then end-of-file, and what the peer still sends is
//!   read and discarded until it closes, for at most [`LINGER`] and
//!   [`LINGER_BYTES`]. Closing a socket with unread bytes in it resets the
//!   connection (on a Unix socket the peer's writes fail with `EPIPE` and
//!   its reads with `ECONNRESET`): an HTTP/2 client still sending on a
//!   stream whose final status was already written would lose that status
//!   to the reset.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use futures_util::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::time::Sleep;
use tonic::transport::server::{Connected, TcpConnectInfo, UdsConnectInfo};

/// Descriptors kept out of the connection cap by default: executor respawns,
/// listeners, the metrics endpoint (at most 64 connections), executor links
/// (one per device) and logs.
pub const FD_RESERVE: u64 = 256;

/// The HTTP/2 client preface (24 bytes) and the 9-byte header of the frame
/// that must follow it (SETTINGS, whose payload length is the header's first
/// 3 bytes): a connection has shaken hands once it has sent these and that
/// payload.
const PREFACE_BYTES: usize = 24;
const FRAME_HEADER_BYTES: usize = 9;

/// How long the accept loop pauses when the process is out of descriptors.
const EXHAUSTED_PAUSE: Duration = Duration::from_millis(100);

/// The longest a closing connection keeps reading (and discarding) what its
/// peer still sends, after its write side is shut. Well under the stop
/// sequence's grace for connections (`server::FLUSH_GRACE`).
pub const LINGER: Duration = Duration::from_secs(1);

/// The most a closing connection reads and discards before it closes anyway.
pub const LINGER_BYTES: usize = 16 << 20;

/// The descriptor limit in effect after [`raise_fd_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdLimit {
    pub soft: u64,
    pub hard: u64,
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (systemd's default
/// soft limit is 1024) and returns the limit in effect. Failing to raise it
/// is logged and leaves the soft limit as it was.
pub fn raise_fd_limit() -> FdLimit {
    use nix::sys::resource::{getrlimit, setrlimit, Resource, RLIM_INFINITY};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        tracing::warn!("cannot read RLIMIT_NOFILE; assuming 1024");
        return FdLimit {
            soft: 1024,
            hard: 1024,
        };
    };
    // Linux refuses an infinite NOFILE: the ceiling is fs.nr_open.
    let target = if hard == RLIM_INFINITY {
        std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(1 << 20)
    } else {
        hard
    };
    if soft >= target {
        return FdLimit { soft, hard };
    }
    match setrlimit(Resource::RLIMIT_NOFILE, target, hard) {
        Ok(()) => {
            tracing::debug!(from = soft, to = target, "raised RLIMIT_NOFILE");
            FdLimit { soft: target, hard }
        }
        Err(error) => {
            tracing::warn!(%error, soft, hard, "cannot raise RLIMIT_NOFILE");
            FdLimit { soft, hard }
        }
    }
}

/// How a descriptor limit is shared out by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdBudget {
    /// Client connections over gRPC (all listeners).
    pub connections: u64,
    /// Buffers passed by descriptor (each holds one in the front and one in
    /// its executor, whose limit is the same).
    pub fd_buffers: u64,
}

/// The default shares of a descriptor limit: [`FD_RESERVE`] is kept (half
/// the limit when it is too small for that); of the rest a quarter goes to
/// buffers passed by descriptor, twice the fd socket's connection cap to
/// the fd socket (connections it ends to make room may linger while they
/// close), and what remains, but at least a quarter, to gRPC connections.
pub fn fd_budget(fd_limit: u64, fd_socket_connections: u64) -> FdBudget {
    let usable = usable_fds(fd_limit);
    let fd_buffers = (usable / 4).max(1);
    let connections = usable
        .saturating_sub(fd_buffers)
        .saturating_sub(fd_socket_connections.saturating_mul(2))
        .max(usable / 4)
        .max(1);
    FdBudget {
        connections,
        fd_buffers,
    }
}

/// The descriptors clients may hold under `fd_limit`: all but
/// [`FD_RESERVE`], or half when the limit is too small for that.
pub fn usable_fds(fd_limit: u64) -> u64 {
    if fd_limit > 2 * FD_RESERVE {
        fd_limit - FD_RESERVE
    } else {
        fd_limit / 2
    }
}

/// The soft `RLIMIT_NOFILE` in effect (1024 when it cannot be read).
pub fn current_fd_limit() -> u64 {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map(|(soft, _)| soft)
        .unwrap_or(1024)
}

/// Who is at the other end of a connection, for per-peer caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Origin {
    /// A Unix-socket peer, by its uid (SO_PEERCRED).
    Uid(u32),
    /// A TCP peer, which has no uid, by its address.
    Ip(IpAddr),
    /// A peer whose credentials could not be read.
    Unknown,
}

impl Origin {
    /// The peer of a request, from the connect info tonic puts in its
    /// extensions.
    pub fn of(extensions: &http::Extensions) -> Origin {
        if let Some(info) = extensions.get::<UdsConnectInfo>() {
            return info
                .peer_cred
                .map_or(Origin::Unknown, |cred| Origin::Uid(cred.uid()));
        }
        if let Some(addr) = extensions
            .get::<TcpConnectInfo>()
            .and_then(|info| info.remote_addr)
        {
            return Origin::Ip(addr.ip());
        }
        Origin::Unknown
    }
}

impl From<crate::sessions::Caller> for Origin {
    /// A caller as the peer its connection came from.
    fn from(caller: crate::sessions::Caller) -> Origin {
        match caller {
            crate::sessions::Caller::Local(peer) => Origin::Uid(peer.uid),
            crate::sessions::Caller::Remote {
                connection: Some(address),
            } => Origin::Ip(address.ip()),
            crate::sessions::Caller::Remote { connection: None } => Origin::Unknown,
        }
    }
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Uid(uid) => write!(f, "uid {uid}"),
            Origin::Ip(ip) => write!(f, "tcp {ip}"),
            Origin::Unknown => f.write_str("an unidentified peer"),
        }
    }
}

/// The connection caps and the handshake deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub max_per_peer: usize,
    pub handshake_timeout: Duration,
}

/// Why a connection was turned away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    Total { limit: usize },
    PerPeer { peer: Origin, limit: usize },
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Total { limit } => write!(
                f,
                "ptxd: LIMIT_EXCEEDED limit=max_connections value={limit}"
            ),
            Refused::PerPeer { peer, limit } => write!(
                f,
                "ptxd: LIMIT_EXCEEDED limit=max_connections_per_uid value={limit} ({peer})"
            ),
        }
    }
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    per_peer: HashMap<Origin, usize>,
}

/// A rate limit for log lines a client can cause: at most one line per
/// key per [`LOG_INTERVAL`]. The line that goes out carries how many events
/// it stands for (itself and those not logged since the previous one).
/// Keys are static names from a closed set (kinds of line, refusal
/// reasons), so the table stays small whatever clients do.
#[derive(Debug, Default)]
pub struct LogLimit {
    lines: Mutex<HashMap<&'static str, LogLine>>,
}

/// One key's last line and the events not logged since.
#[derive(Debug)]
struct LogLine {
    last: Instant,
    unlogged: u64,
}

/// The daemon's limit for the log lines requests cause, keyed by refusal
/// reason (or by the kind of line, e.g. a failed clean-up): one line a
/// second per key at most, over every transport.
pub fn request_log() -> &'static LogLimit {
    static LIMIT: std::sync::LazyLock<LogLimit> = std::sync::LazyLock::new(LogLimit::new);
    &LIMIT
}

/// How often one kind of client-caused line may be written.
pub const LOG_INTERVAL: Duration = Duration::from_secs(1);

impl LogLimit {
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts one event of kind `key`: `Some(events)` when its line may go
    /// out now (`events` it stands for, at least 1), `None` when it is
    /// only counted.
    pub fn admit(&self, key: &'static str) -> Option<u64> {
        self.admit_at(key, Instant::now())
    }

    fn admit_at(&self, key: &'static str, now: Instant) -> Option<u64> {
        // Plain counters: a panic while holding the lock cannot leave them
        // inconsistent.
        let mut lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        match lines.get_mut(key) {
            Some(line) if now.duration_since(line.last) < LOG_INTERVAL => {
                line.unlogged += 1;
                None
            }
            Some(line) => {
                let events = line.unlogged + 1;
                line.last = now;
                line.unlogged = 0;
                Some(events)
            }
            None => {
                lines.insert(
                    key,
                    LogLine {
                        last: now,
                        unlogged: 0,
                    },
                );
                Some(1)
            }
        }
    }
}

/// The live connections, counted in all and per peer.
#[derive(Debug)]
pub struct ConnectionTable {
    limits: ConnectionLimits,
    counts: Mutex<Counts>,
    log: LogLimit,
}

impl ConnectionTable {
    pub fn new(limits: ConnectionLimits) -> Arc<Self> {
        Arc::new(ConnectionTable {
            limits,
            counts: Mutex::new(Counts::default()),
            log: LogLimit::new(),
        })
    }

    pub fn limits(&self) -> ConnectionLimits {
        self.limits
    }

    /// Live connections.
    pub fn open(&self) -> usize {
        self.counts.lock().map(|c| c.total).unwrap_or(0)
    }

    /// Counts a new connection from `peer`, or says which cap it is over.
    pub fn admit(self: &Arc<Self>, peer: Origin) -> Result<ConnectionGuard, Refused> {
        let Ok(mut counts) = self.counts.lock() else {
            // A poisoned table cannot count: refuse rather than overrun.
            return Err(Refused::Total {
                limit: self.limits.max_connections,
            });
        };
        if counts.total >= self.limits.max_connections {
            return Err(Refused::Total {
                limit: self.limits.max_connections,
            });
        }
        let held = counts.per_peer.entry(peer).or_insert(0);
        if *held >= self.limits.max_per_peer {
            return Err(Refused::PerPeer {
                peer,
                limit: self.limits.max_per_peer,
            });
        }
        *held += 1;
        counts.total += 1;
        Ok(ConnectionGuard {
            table: Arc::clone(self),
            peer,
        })
    }

    /// Logs a refusal, at most one line a second (a flood of refused
    /// connections must not become a flood of log lines).
    fn log_refusal(&self, refused: Refused) {
        if let Some(count) = self.log.admit("connections refused") {
            tracing::warn!(refused = %refused, count, "connections refused");
        }
    }
}

/// One counted connection; uncounted when dropped (the connection closed).
#[derive(Debug)]
pub struct ConnectionGuard {
    table: Arc<ConnectionTable>,
    peer: Origin,
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        if let Ok(mut counts) = self.table.counts.lock() {
            counts.total = counts.total.saturating_sub(1);
            if let Some(held) = counts.per_peer.get_mut(&self.peer) {
                *held = held.saturating_sub(1);
                if *held == 0 {
                    counts.per_peer.remove(&self.peer);
                }
            }
        }
    }
}

/// An admitted connection: counted while it lives, and closed if it does
/// not shake hands in time.
#[derive(Debug)]
pub struct Conn<IO> {
    io: IO,
    _guard: ConnectionGuard,
    /// Until the handshake bytes have arrived.
    handshake: Option<Handshake>,
    /// Once the write side is shut: the lingering close under way.
    closing: Option<Linger>,
}

/// A lingering close: the deadline, and the bytes discarded so far.
#[derive(Debug)]
struct Linger {
    deadline: Pin<Box<Sleep>>,
    discarded: usize,
}

/// How far a connection has come through its handshake.
#[derive(Debug)]
struct Handshake {
    deadline: Pin<Box<Sleep>>,
    /// Bytes read so far.
    seen: usize,
    /// The payload length of the first frame, from its header.
    first_frame_length: [u8; 3],
}

impl Handshake {
    /// Notes `bytes`, read after the first `self.seen`; true once the
    /// preface and the whole first frame have arrived.
    fn read(&mut self, bytes: &[u8]) -> bool {
        for (i, byte) in bytes.iter().enumerate() {
            let at = self.seen + i;
            if (PREFACE_BYTES..PREFACE_BYTES + 3).contains(&at) {
                self.first_frame_length[at - PREFACE_BYTES] = *byte;
            }
        }
        self.seen += bytes.len();
        let [a, b, c] = self.first_frame_length;
        let payload = (usize::from(a) << 16) | (usize::from(b) << 8) | usize::from(c);
        self.seen >= PREFACE_BYTES + FRAME_HEADER_BYTES + payload
    }
}

impl<IO> Conn<IO> {
    fn new(io: IO, guard: ConnectionGuard, handshake_timeout: Duration) -> Self {
        Conn {
            io,
            _guard: guard,
            handshake: Some(Handshake {
                deadline: Box::pin(tokio::time::sleep(handshake_timeout)),
                seen: 0,
                first_frame_length: [0; 3],
            }),
            closing: None,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Conn<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(handshake) = &mut this.handshake {
            if handshake.deadline.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no HTTP/2 preface within the handshake timeout",
                )));
            }
        }
        let before = buf.filled().len();
        let result = ready!(Pin::new(&mut this.io).poll_read(cx, buf));
        if let Some(handshake) = &mut this.handshake {
            if handshake.read(&buf.filled()[before..]) {
                this.handshake = None;
            }
        }
        Poll::Ready(result)
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Conn<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    /// The lingering close (see the module's invariants): shut the write
    /// side, then read and discard until the peer closes, [`LINGER`] has
    /// passed or [`LINGER_BYTES`] were read. A read error ends it too: the
    /// connection is closing either way.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.closing.is_none() {
            ready!(Pin::new(&mut this.io).poll_shutdown(cx))?;
            this.closing = Some(Linger {
                deadline: Box::pin(tokio::time::sleep(LINGER)),
                discarded: 0,
            });
        }
        let Some(linger) = &mut this.closing else {
            return Poll::Ready(Ok(()));
        };
        let mut scratch = [0u8; 8192];
        loop {
            if linger.deadline.as_mut().poll(cx).is_ready() || linger.discarded >= LINGER_BYTES {
                return Poll::Ready(Ok(()));
            }
            let mut buf = ReadBuf::new(&mut scratch);
            match ready!(Pin::new(&mut this.io).poll_read(cx, &mut buf)) {
                Ok(()) if buf.filled().is_empty() => return Poll::Ready(Ok(())),
                Ok(()) => linger.discarded += buf.filled().len(),
                Err(_) => return Poll::Ready(Ok(())),
            }
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl<IO: Connected> Connected for Conn<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// A listener the accept loop can drive.
pub trait Listener {
    type Io;
    fn poll_accept_peer(&self, cx: &mut Context<'_>) -> Poll<io::Result<(Self::Io, Origin)>>;
    /// Writes what fits of `bytes` without waiting (a best-effort goodbye).
    fn try_write(io: &Self::Io, bytes: &[u8]);
}

impl Listener for UnixListener {
    type Io = UnixStream;

    fn poll_accept_peer(&self, cx: &mut Context<'_>) -> Poll<io::Result<(UnixStream, Origin)>> {
        self.poll_accept(cx).map_ok(|(stream, _)| {
            let peer = stream
                .peer_cred()
                .map_or(Origin::Unknown, |cred| Origin::Uid(cred.uid()));
            (stream, peer)
        })
    }

    fn try_write(io: &UnixStream, bytes: &[u8]) {
        let _ = io.try_write(bytes);
    }
}

impl Listener for TcpListener {
    type Io = TcpStream;

    fn poll_accept_peer(&self, cx: &mut Context<'_>) -> Poll<io::Result<(TcpStream, Origin)>> {
        self.poll_accept(cx)
            .map_ok(|(stream, addr)| (stream, Origin::Ip(addr.ip())))
    }

    fn try_write(io: &TcpStream, bytes: &[u8]) {
        let _ = io.try_write(bytes);
    }
}

/// An HTTP/2 server preface (empty SETTINGS) followed by a GOAWAY with
/// ENHANCE_YOUR_CALM whose debug data is `message`.
fn goaway(message: &str) -> Vec<u8> {
    let debug = &message.as_bytes()[..message.len().min(1024)];
    let length = 8 + debug.len();
    let mut out = vec![0, 0, 0, 0x4, 0, 0, 0, 0, 0];
    out.extend_from_slice(&[
        (length >> 16) as u8,
        (length >> 8) as u8,
        length as u8,
        0x7,
        0,
        0,
        0,
        0,
        0,
    ]);
    out.extend_from_slice(&0u32.to_be_bytes()); // last stream id
    out.extend_from_slice(&0xbu32.to_be_bytes()); // ENHANCE_YOUR_CALM
    out.extend_from_slice(debug);
    out
}

/// Is this accept error the process (or system) running out of descriptors
/// or memory, as opposed to one connection failing?
fn is_exhaustion(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc_errno) if [nix::libc::EMFILE, nix::libc::ENFILE, nix::libc::ENOBUFS, nix::libc::ENOMEM]
            .contains(&libc_errno)
    )
}

/// The admitted connections of a listener, as tonic's `incoming` stream.
/// It never yields an error: refusals and failed accepts are handled here.
#[derive(Debug)]
pub struct Incoming<L> {
    listener: L,
    table: Arc<ConnectionTable>,
    pause: Option<Pin<Box<Sleep>>>,
    exhausted_since: Option<Instant>,
}

impl<L> Incoming<L> {
    pub fn new(listener: L, table: Arc<ConnectionTable>) -> Self {
        Incoming {
            listener,
            table,
            pause: None,
            exhausted_since: None,
        }
    }
}

impl<L: Listener + Unpin> Stream for Incoming<L> {
    type Item = io::Result<Conn<L::Io>>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(pause) = &mut this.pause {
                ready!(pause.as_mut().poll(cx));
                this.pause = None;
            }
            match ready!(this.listener.poll_accept_peer(cx)) {
                Ok((io, peer)) => {
                    if let Some(since) = this.exhausted_since.take() {
                        if this.table.log.admit("accepting again").is_some() {
                            tracing::info!(after = ?since.elapsed(), "accepting connections again");
                        }
                    }
                    match this.table.admit(peer) {
                        Ok(guard) => {
                            let timeout = this.table.limits.handshake_timeout;
                            return Poll::Ready(Some(Ok(Conn::new(io, guard, timeout))));
                        }
                        Err(refused) => {
                            L::try_write(&io, &goaway(&refused.to_string()));
                            this.table.log_refusal(refused);
                        }
                    }
                }
                Err(error) if is_exhaustion(&error) => {
                    if this.exhausted_since.is_none() {
                        // Once per episode, and clients can start episodes:
                        // at most one line a second too.
                        if let Some(count) = this.table.log.admit("exhausted") {
                            tracing::error!(%error, open = this.table.open(), episodes = count, "accept: out of descriptors or memory; pausing");
                        }
                        this.exhausted_since = Some(Instant::now());
                    }
                    this.pause = Some(Box::pin(tokio::time::sleep(EXHAUSTED_PAUSE)));
                }
                Err(error) => tracing::debug!(%error, "accept failed"),
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn limits(total: usize, per_peer: usize) -> ConnectionLimits {
        ConnectionLimits {
            max_connections: total,
            max_per_peer: per_peer,
            handshake_timeout: Duration::from_secs(5),
        }
    }

    #[test]
    fn caps_count_in_all_and_per_peer_and_free_on_drop() {
        let table = ConnectionTable::new(limits(3, 2));
        let a1 = table.admit(Origin::Uid(1)).unwrap();
        let _a2 = table.admit(Origin::Uid(1)).unwrap();
        assert_eq!(
            table.admit(Origin::Uid(1)).unwrap_err(),
            Refused::PerPeer {
                peer: Origin::Uid(1),
                limit: 2
            }
        );
        let _b1 = table.admit(Origin::Uid(2)).unwrap();
        assert_eq!(
            table.admit(Origin::Uid(3)).unwrap_err(),
            Refused::Total { limit: 3 }
        );
        drop(a1);
        assert_eq!(table.open(), 2);
        let _a3 = table.admit(Origin::Uid(1)).unwrap();
    }

    #[tokio::test]
    async fn the_handshake_ends_with_the_whole_first_frame() {
        let mut handshake = Handshake {
            deadline: Box::pin(tokio::time::sleep(Duration::from_secs(1))),
            seen: 0,
            first_frame_length: [0; 3],
        };
        let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
        assert!(!handshake.read(&preface[..20]));
        // The rest of the preface and a SETTINGS header announcing 12 bytes,
        // split inside the length field.
        let mut rest = preface[20..].to_vec();
        rest.extend_from_slice(&[0, 0]);
        assert!(!handshake.read(&rest));
        assert!(!handshake.read(&[12, 4, 0, 0, 0, 0, 0]));
        assert!(!handshake.read(&[0; 11]));
        assert!(handshake.read(&[0]));
    }

    /// A peer still sending when the daemon closes its connection reads the
    /// daemon's last bytes and then end-of-file, and its writes keep
    /// succeeding; without the lingering close the unread bytes reset the
    /// connection (the peer's write fails with EPIPE, its read with
    /// ECONNRESET), which is how an HTTP/2 client still sending on a
    /// stream loses that stream's final status. The close ends when the
    /// peer closes, not at the deadline.
    #[tokio::test]
    async fn a_closing_connection_lingers_so_a_sending_peer_reads_its_answer() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let table = ConnectionTable::new(limits(4, 4));
        let (server, mut client) = UnixStream::pair().unwrap();
        let guard = table.admit(Origin::Uid(1)).unwrap();
        let mut conn = Conn::new(server, guard, Duration::from_secs(5));
        conn.handshake = None;
        // Bytes the daemon never reads.
        client.write_all(&[7u8; 4096]).await.unwrap();
        let closing = tokio::spawn(async move {
            conn.write_all(b"final status").await.unwrap();
            let started = Instant::now();
            conn.shutdown().await.unwrap();
            drop(conn);
            started.elapsed()
        });
        // The peer sends more after the daemon began to close, then reads.
        tokio::time::sleep(Duration::from_millis(50)).await;
        client.write_all(&[8u8; 4096]).await.unwrap();
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await.unwrap();
        assert_eq!(answer, b"final status");
        drop(client);
        let lingered = closing.await.unwrap();
        assert!(
            lingered < LINGER,
            "the close waited for the deadline: {lingered:?}"
        );
        assert_eq!(table.open(), 0);
    }

    #[test]
    fn a_log_limit_lets_one_line_a_second_per_key_and_counts_the_rest() {
        let limit = LogLimit::new();
        let start = Instant::now();
        assert_eq!(limit.admit_at("a", start), Some(1));
        for i in 1..1000 {
            let now = start + Duration::from_micros(i);
            assert_eq!(limit.admit_at("a", now), None);
        }
        // Another key has its own line.
        assert_eq!(limit.admit_at("b", start), Some(1));
        // A second on, the next line stands for itself and the 999 before.
        assert_eq!(limit.admit_at("a", start + LOG_INTERVAL), Some(1000));
        assert_eq!(limit.admit_at("a", start + LOG_INTERVAL), None);
    }

    #[test]
    fn the_default_shares_keep_the_reserve() {
        let budget = fd_budget(1024, 64);
        assert_eq!(budget.fd_buffers, 192);
        assert_eq!(budget.connections, 1024 - 256 - 192 - 128);
        assert!(budget.fd_buffers + budget.connections + 128 <= 1024 - FD_RESERVE);
        let small = fd_budget(300, 64);
        assert_eq!((small.fd_buffers, small.connections), (37, 37));
        assert_eq!(
            fd_budget(0, 64),
            FdBudget {
                connections: 1,
                fd_buffers: 1
            }
        );
    }

    #[test]
    fn goaway_is_a_settings_then_a_goaway_frame() {
        let frames = goaway("hi");
        assert_eq!(&frames[..9], &[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        assert_eq!(&frames[9..13], &[0, 0, 10, 7]);
        assert_eq!(&frames[22..26], &[0, 0, 0, 0xb]);
        assert_eq!(&frames[26..], b"hi");
    }

    #[test]
    fn raising_the_limit_reaches_the_hard_limit() {
        let limit = raise_fd_limit();
        let (soft, hard) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
        assert_eq!((limit.soft, limit.hard), (soft, hard));
        if hard != nix::sys::resource::RLIM_INFINITY {
            assert_eq!(soft, hard);
        }
    }
}
