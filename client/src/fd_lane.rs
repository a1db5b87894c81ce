//! Unary launches and kernel loads over the packet socket (the fd
//! socket): one `SOCK_SEQPACKET` packet out, one back, no HTTP/2 on either
//! side. The first of a unary call's transports ([`crate::transport`]).
//!
//! Why: on a Unix socket a call through HTTP/2 (even on the h2 lane of
//! [`crate::lane`]) passes hyper's connection and stream tasks in the
//! daemon and h2's in this process. A packet on the fd socket is read by
//! one task in the daemon, which calls the same code as the RPC and writes
//! the answer back (BENCHMARKS.md has what that buys).
//!
//! Invariants:
//! - The daemon runs the packet's call exactly as the `Launch` or
//!   `LoadKernel` RPC (the caller is the socket's peer, checked by the
//!   kernel), and a refusal comes back with the same code, reason and
//!   metadata, so it becomes the same [`Error`].
//! - A call is never sent twice. It goes to gRPC instead only when the
//!   daemon cannot have read it: the packet would not fit, no connection
//!   could be opened or none is free, the send failed, the daemon turned a
//!   fresh connection away at its caps (its refusal, when it arrives
//!   before the call is sent), or the connection was reset: a Unix socket
//!   closed with unread data resets its peer, so a reset says the daemon
//!   closed the connection (its caps, its idle timeout, its exit) without
//!   reading the call, and a refusal at the caps on any connection (one
//!   the daemon ended to make room for another uid). A connection the
//!   daemon closed at the end of its drain leaves a DRAINING refusal
//!   behind, which is the call's answer (it did not run). Anything else
//!   after a send (a close without a reset, a broken reply) is returned as
//!   a broken gRPC call would be (`Status` UNAVAILABLE).
//! - A connection carries one exchange at a time; this client keeps at
//!   most [`MAX_CONNECTIONS`] and drops one that idled [`IDLE_LIMIT`], well
//!   before the daemon's own idle timeout (30 s) could close it under a
//!   send. A call cancelled between its send and its reply drops its
//!   connection, so no reply is ever read by the wrong call.
//! - A call polls for its reply for up to the lane's spin
//!   ([`DEFAULT_REPLY_SPIN`], [`crate::Client::with_reply_spin`]) before
//!   its task sleeps, yielding to the runtime between polls: a reply that
//!   comes within the spin costs no wake-up of this thread.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use prost::Message;
use ptxd_proto::v1 as pb;
use tokio::io::unix::AsyncFd;

use crate::error::Error;
use crate::fd_buffers::decode_reply;
use crate::transport::LaneError;
use ptxd_ipc::packet::{
    connect_seqpacket, recv_packet_in, recv_spinning_in, send_async, PacketBuffer, MAX_PACKET,
};

/// Connections one client keeps to the fd socket for launches (the daemon
/// serves 8 per uid, and registrations by descriptor need one too).
pub(crate) const MAX_CONNECTIONS: usize = 4;

/// How long an unused connection is kept.
const IDLE_LIMIT: Duration = Duration::from_secs(10);

/// After the daemon turned a connection away at its caps, how long launches
/// go by gRPC before a connection is tried again.
const BACKOFF: Duration = Duration::from_secs(1);

/// The `limit` metadata of the daemon's refusal of a connection at its caps.
const CAP_LIMITS: [&str; 2] = ["fd_socket_connections", "fd_socket_connections_per_uid"];

/// A connection and its receive buffer (kept, not zeroed per reply).
#[derive(Debug)]
struct Conn {
    socket: AsyncFd<OwnedFd>,
    buffer: PacketBuffer,
}

#[derive(Debug)]
struct Idle {
    conn: Conn,
    since: Instant,
}

#[derive(Debug, Default)]
struct Pool {
    idle: Vec<Idle>,
    /// Connections lent to calls in flight.
    lent: usize,
    /// No new connection before this instant (the daemon's caps).
    backoff_until: Option<Instant>,
}

/// How long a call on the fd socket polls for its reply before its task
/// sleeps, unless [`crate::Client::with_reply_spin`] says otherwise.
pub const DEFAULT_REPLY_SPIN: Duration = Duration::from_micros(200);

/// A client's fd socket launch lane; shared by its clones and sessions.
#[derive(Debug)]
pub(crate) struct FdLane {
    path: PathBuf,
    pool: Mutex<Pool>,
    spin: Duration,
}

/// A connection lent to one call; given back only by [`Lent::give_back`].
struct Lent<'l> {
    lane: &'l FdLane,
    conn: Option<Conn>,
    fresh: bool,
}

impl Lent<'_> {
    fn give_back(mut self) {
        if let Some(conn) = self.conn.take() {
            let mut pool = self.lane.lock();
            pool.idle.push(Idle {
                conn,
                since: Instant::now(),
            });
        }
    }
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        // Given back or not (a cancelled or broken call drops its socket),
        // the loan ends.
        let mut pool = self.lane.lock();
        pool.lent = pool.lent.saturating_sub(1);
    }
}

impl FdLane {
    /// The lane to the fd socket at `path`, whose calls poll for their
    /// reply for up to `spin`.
    pub(crate) fn new(path: PathBuf, spin: Duration) -> FdLane {
        FdLane {
            path,
            pool: Mutex::new(Pool::default()),
            spin,
        }
    }

    /// A fresh lane to the same socket, whose calls spin for `spin`.
    pub(crate) fn with_spin(&self, spin: Duration) -> FdLane {
        FdLane::new(self.path.clone(), spin)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pool> {
        // A pool of sockets and counters: a panic cannot leave it
        // inconsistent beyond a lost socket.
        self.pool.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An idle connection, or a new one if the pool has room; `None`: use
    /// gRPC.
    fn borrow(&self) -> Option<Lent<'_>> {
        let now = Instant::now();
        let reused = {
            let mut pool = self.lock();
            pool.idle
                .retain(|idle| now.duration_since(idle.since) < IDLE_LIMIT);
            if let Some(idle) = pool.idle.pop() {
                pool.lent += 1;
                Some(idle.conn)
            } else if pool.lent >= MAX_CONNECTIONS
                || pool.backoff_until.is_some_and(|until| now < until)
            {
                return None;
            } else {
                pool.lent += 1;
                None
            }
        };
        let mut lent = Lent {
            lane: self,
            conn: reused,
            fresh: false,
        };
        if lent.conn.is_none() {
            let socket = connect_seqpacket(&self.path, true).ok()?;
            // SAFETY: the AsyncFd owns the OwnedFd, so the descriptor stays
            // open and names the same socket until the AsyncFd drops.
            let socket = unsafe { AsyncFd::register(socket) }.ok()?;
            lent.conn = Some(Conn {
                socket,
                buffer: PacketBuffer::new(),
            });
            lent.fresh = true;
        }
        Some(lent)
    }

    /// Runs `request` over the fd socket (see the module docs).
    pub(crate) async fn launch(
        &self,
        request: &pb::LaunchRequest,
    ) -> Result<pb::LaunchResponse, LaneError> {
        match self.call(&encode_call(LAUNCH_FIELD, request)).await? {
            pb::fd_attach_reply::Result::Launched(response) => Ok(response),
            other => Err(LaneError::Failed(Error::Protocol(format!(
                "the fd socket answered a launch with {other:?}"
            )))),
        }
    }

    /// Loads a kernel over the fd socket (see the module docs); an
    /// artifact too large for one packet goes by gRPC.
    pub(crate) async fn load(
        &self,
        request: &pb::LoadKernelRequest,
    ) -> Result<pb::LoadKernelResponse, LaneError> {
        match self.call(&encode_call(LOAD_FIELD, request)).await? {
            pb::fd_attach_reply::Result::Loaded(response) => Ok(response),
            other => Err(LaneError::Failed(Error::Protocol(format!(
                "the fd socket answered a kernel load with {other:?}"
            )))),
        }
    }

    /// One exchange: `packet` (an encoded `FdAttach`) out, its reply's
    /// result (a refusal as the error gRPC would have given) back.
    async fn call(&self, packet: &[u8]) -> Result<pb::fd_attach_reply::Result, LaneError> {
        if packet.len() > MAX_PACKET {
            return Err(LaneError::NotSent);
        }
        let mut lent = self.borrow().ok_or(LaneError::NotSent)?;
        let conn = lent.conn.as_mut().ok_or(LaneError::NotSent)?;
        // A failed send was not read: the daemon closed the connection (a
        // restart, its drain, room for another uid), or the socket broke.
        // The connection is dropped; a refusal the daemon left on it says
        // why.
        if send_async(&conn.socket, packet, None).await.is_err() {
            return Err(self.left_behind(conn, lent.fresh));
        }
        let broken = |what: String| {
            LaneError::Failed(Error::Status(tonic::Status::unavailable(format!(
                "the fd socket connection broke during a call: {what}"
            ))))
        };
        let reply = match recv_spinning_in(&conn.socket, &mut conn.buffer, self.spin).await {
            Ok(Some(meta)) => decode_reply(conn.buffer.bytes(&meta), meta),
            Ok(None) => return Err(broken("the daemon closed it".into())),
            // The daemon closed the connection with the packet still in its
            // queue (the kernel resets a Unix socket closed with unread
            // data): it never read the call. A fresh connection closed so
            // was turned away at the daemon's caps (its refusal packet is
            // hidden behind the reset).
            Err(nix::errno::Errno::ECONNRESET) => return Err(self.left_behind(conn, lent.fresh)),
            Err(e) => return Err(broken(e.to_string())),
        };
        match reply {
            Ok(result) => {
                lent.give_back();
                Ok(result)
            }
            // Turned away at the caps (a fresh connection), or ended to make
            // room for another uid: the call was not read.
            Err(error) if turned_away(&error) => {
                if lent.fresh {
                    self.lock().backoff_until = Some(Instant::now() + BACKOFF);
                }
                Err(LaneError::NotSent)
            }
            Err(error) => {
                // A refusal of the call: the connection goes on.
                lent.give_back();
                Err(LaneError::Failed(error))
            }
        }
    }
}

impl FdLane {
    /// What a connection the daemon closed before reading the call means:
    /// its drain (a DRAINING refusal left on it: the call did not run, and
    /// gRPC would say the same), or else a call to send by gRPC. A fresh
    /// connection closed so was turned away at the caps: back off.
    fn left_behind(&self, conn: &mut Conn, fresh: bool) -> LaneError {
        use std::os::fd::AsFd;
        let mut left = None;
        // The kernel reports the reset first, then what was queued.
        for _ in 0..2 {
            match recv_packet_in(conn.socket.get_ref().as_fd(), true, &mut conn.buffer) {
                Ok(Some(meta)) => {
                    left = Some(decode_reply(conn.buffer.bytes(&meta), meta));
                    break;
                }
                Err(nix::errno::Errno::ECONNRESET | nix::errno::Errno::EINTR) => {}
                Ok(None) | Err(_) => break,
            }
        }
        match left {
            Some(Err(error)) if error.reason_name() == "DRAINING" => LaneError::Failed(error),
            _ => {
                if fresh {
                    self.lock().backoff_until = Some(Instant::now() + BACKOFF);
                }
                LaneError::NotSent
            }
        }
    }
}

/// The field numbers of `FdAttach.body`'s calls (ptxd.proto).
const LAUNCH_FIELD: u32 = 2;
const LOAD_FIELD: u32 = 3;

/// An `FdAttach` whose body is `call`, in field `field`, encoded from a
/// borrow (prost would need the request owned, in the oneof's variant):
/// the request is not cloned (a load's artifact is up to 64 KiB).
fn encode_call(field: u32, call: &impl Message) -> Vec<u8> {
    let mut packet = Vec::with_capacity(call.encoded_len() + 8);
    prost::encoding::message::encode(field, call, &mut packet);
    packet
}

/// Whether `error` is the daemon's refusal of a connection at its caps.
fn turned_away(error: &Error) -> bool {
    error.refusal().is_some_and(|refusal| {
        refusal.wire_name() == "LIMIT_EXCEEDED"
            && refusal
                .metadata()
                .get("limit")
                .is_some_and(|limit| CAP_LIMITS.contains(&limit.as_str()))
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_call_encoded_from_a_borrow_decodes_as_the_fd_attach_it_stands_for() {
        let launch = pb::LaunchRequest {
            session: "s-1".into(),
            kernel: "k-2".into(),
            n: 4099,
            tag: 7,
            params: vec![1.5, -2.0],
            ..Default::default()
        };
        let decoded = pb::FdAttach::decode(encode_call(LAUNCH_FIELD, &launch).as_slice()).unwrap();
        assert_eq!(
            decoded,
            pb::FdAttach {
                body: Some(pb::fd_attach::Body::Launch(launch)),
            }
        );
        let load = pb::LoadKernelRequest {
            session: "s-1".into(),
            artifact: (0..=255).collect(),
            symbol: "add".into(),
            ..Default::default()
        };
        let decoded = pb::FdAttach::decode(encode_call(LOAD_FIELD, &load).as_slice()).unwrap();
        assert_eq!(
            decoded,
            pb::FdAttach {
                body: Some(pb::fd_attach::Body::Load(load)),
            }
        );
    }
}
