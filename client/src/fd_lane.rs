//! Unary launches and kernel loads over the fd socket: one
//! `SOCK_SEQPACKET` packet out, one back, no HTTP/2 on either side.
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
//!   reading the call. Anything else after a send (a close without a
//!   reset, a broken reply) is returned as a broken gRPC call would be
//!   (`Status` UNAVAILABLE).
//! - A connection carries one exchange at a time; this client keeps at
//!   most [`MAX_CONNECTIONS`] and drops one that idled [`IDLE_LIMIT`], well
//!   before the daemon's own idle timeout (30 s) could close it under a
//!   send. A call cancelled between its send and its reply drops its
//!   connection, so no reply is ever read by the wrong call.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use prost::Message;
use ptxd_proto::v1 as pb;
use tokio::io::unix::AsyncFd;

use crate::error::Error;
use crate::fd_buffers::decode_reply;
use crate::fd_passing::{connect_seqpacket, recv_async, send_async, MAX_PACKET};
use crate::lane::LaneError;

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

#[derive(Debug)]
struct Idle {
    socket: AsyncFd<OwnedFd>,
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

/// A client's fd socket launch lane; shared by its clones and sessions.
#[derive(Debug)]
pub(crate) struct FdLane {
    path: PathBuf,
    pool: Mutex<Pool>,
}

/// A connection lent to one call; given back only by [`Lent::give_back`].
struct Lent<'l> {
    lane: &'l FdLane,
    socket: Option<AsyncFd<OwnedFd>>,
    fresh: bool,
}

impl Lent<'_> {
    fn socket(&self) -> Option<&AsyncFd<OwnedFd>> {
        self.socket.as_ref()
    }

    fn give_back(mut self) {
        if let Some(socket) = self.socket.take() {
            let mut pool = self.lane.lock();
            pool.idle.push(Idle {
                socket,
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
    /// The lane to the fd socket at `path`.
    pub(crate) fn new(path: PathBuf) -> FdLane {
        FdLane {
            path,
            pool: Mutex::new(Pool::default()),
        }
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
                Some(idle.socket)
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
            socket: reused,
            fresh: false,
        };
        if lent.socket.is_none() {
            let socket = connect_seqpacket(&self.path, true).ok()?;
            // SAFETY: the AsyncFd owns the OwnedFd, so the descriptor stays
            // open and names the same socket until the AsyncFd drops.
            lent.socket = Some(unsafe { AsyncFd::register(socket) }.ok()?);
            lent.fresh = true;
        }
        Some(lent)
    }

    /// Runs `request` over the fd socket (see the module docs).
    pub(crate) async fn launch(
        &self,
        request: &pb::LaunchRequest,
    ) -> Result<pb::LaunchResponse, LaneError> {
        let call = pb::FdAttach {
            launch: Some(request.clone()),
            ..Default::default()
        };
        match self.call(&call).await? {
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
        let call = pb::FdAttach {
            load: Some(request.clone()),
            ..Default::default()
        };
        match self.call(&call).await? {
            pb::fd_attach_reply::Result::Loaded(response) => Ok(response),
            other => Err(LaneError::Failed(Error::Protocol(format!(
                "the fd socket answered a kernel load with {other:?}"
            )))),
        }
    }

    /// One exchange: `call` out, its reply's result (a refusal as the
    /// error gRPC would have given) back.
    async fn call(&self, call: &pb::FdAttach) -> Result<pb::fd_attach_reply::Result, LaneError> {
        if call.encoded_len() > MAX_PACKET {
            return Err(LaneError::NotSent);
        }
        let packet = call.encode_to_vec();
        let lent = self.borrow().ok_or(LaneError::NotSent)?;
        let socket = lent.socket().ok_or(LaneError::NotSent)?;
        // A failed send was not read: the daemon closed the connection (a
        // restart), or the socket broke. The connection is dropped.
        send_async(socket, &packet, None)
            .await
            .map_err(|_| LaneError::NotSent)?;
        let broken = |what: String| {
            LaneError::Failed(Error::Status(tonic::Status::unavailable(format!(
                "the fd socket connection broke during a call: {what}"
            ))))
        };
        let reply = match recv_async(socket).await {
            Ok(Some(reply)) => reply,
            Ok(None) => return Err(broken("the daemon closed it".into())),
            // The daemon closed the connection with the packet still in its
            // queue (the kernel resets a Unix socket closed with unread
            // data): it never read the call. A fresh connection closed so
            // was turned away at the daemon's caps (its refusal packet is
            // hidden behind the reset).
            Err(nix::errno::Errno::ECONNRESET) => {
                if lent.fresh {
                    self.lock().backoff_until = Some(Instant::now() + BACKOFF);
                }
                return Err(LaneError::NotSent);
            }
            Err(e) => return Err(broken(e.to_string())),
        };
        match decode_reply(reply) {
            Ok(result) => {
                lent.give_back();
                Ok(result)
            }
            Err(error) if lent.fresh && turned_away(&error) => {
                self.lock().backoff_until = Some(Instant::now() + BACKOFF);
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
