//! The h2 lane: unary `Launch` calls on an HTTP/2 connection of their
//! own, spoken with `h2` directly rather than through tonic's `Channel`.
//! The second of a launch's transports ([`crate::transport`]).
//!
//! Why: a call through a `Channel` passes a buffer task, hyper's dispatch,
//! a send task and a body-pipe task, and goes out in two writes (h2 gives a
//! new stream no send window until its HEADERS are written, so hyper sends
//! the message after them). On the lane the caller's own task queues the
//! HEADERS and the one DATA frame together and reads the reply itself: the
//! connection's task is the only one between it and the socket. Measured
//! with `ptxd bench` (BENCHMARKS.md), this is the largest share of a unary
//! launch's round trip that lies outside the daemon.
//!
//! Invariants:
//! - Only on a Unix socket. There a session is bound to the caller's uid,
//!   so a second connection of the same process may use it; over TCP a
//!   session is bound to the one connection that opened it, and launches
//!   stay on the channel.
//! - The wire is the generated client's: the same path, headers and
//!   length-prefixed message, and a refusal arrives as the same `Status` and
//!   becomes the same [`Error`].
//! - A launch is never sent twice. A call falls back to the channel only
//!   when the daemon cannot have seen it: the lane could not be opened, the
//!   request could not be queued, the daemon refused the stream
//!   (REFUSED_STREAM), or it turned the lane's connection away before
//!   reading it (a GOAWAY with ENHANCE_YOUR_CALM on a lane that has served
//!   nothing: the per-uid connection cap). Any other failure is returned as
//!   the channel would return it (`Status` UNAVAILABLE).
//! - Dialled lazily, at the first launch, and used only once the daemon
//!   answered a PING on it: a client that never launches holds one
//!   connection, as before, and a lane the daemon turns away is found out
//!   before a launch is sent on it. A lane refused before it served a call
//!   is not dialled again by this client; one that breaks after serving (a
//!   daemon restart) is dialled again, at the next launch.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use h2::client::SendRequest;
use prost::Message;
use ptxd_proto::v1 as pb;

use crate::error::Error;
use crate::transport::LaneError;

/// The `Launch` method (the path the generated client sends; the authority
/// is a placeholder, as on the channel: a socket path is not a host name).
const LAUNCH_URI: &str = "http://localhost/ptxd.v1.Ptxd/Launch";
/// The largest reply accepted (tonic's default decoding limit); a
/// `LaunchResponse` is a few bytes.
const MAX_REPLY_BYTES: usize = 4 << 20;
/// How long opening the lane may take before launches use the channel.
const DIAL_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the lane stands.
#[derive(Debug)]
enum State {
    /// Not dialled (yet, or again after it broke having served).
    Closed,
    /// Open; `served` once a call went through it.
    Open {
        sender: SendRequest<Bytes>,
        served: bool,
    },
    /// Refused before serving a call: launches use the channel.
    Off,
}

/// A client's launch lane; shared by its clones and sessions.
#[derive(Debug)]
pub(crate) struct Lane {
    socket: PathBuf,
    state: Mutex<State>,
}

impl Lane {
    pub(crate) fn new(socket: PathBuf) -> Lane {
        Lane {
            socket,
            state: Mutex::new(State::Closed),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is replaced whole under the lock: a poisoned lock still
        // holds a consistent state.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The open lane's sender, dialling it when it is closed; `None` when
    /// the lane is off or cannot be opened (then it is off).
    async fn sender(&self) -> Option<(SendRequest<Bytes>, bool)> {
        match &*self.lock() {
            State::Open { sender, served } => return Some((sender.clone(), *served)),
            State::Off => return None,
            State::Closed => {}
        }
        match dial(&self.socket).await {
            Ok(sender) => {
                let mut state = self.lock();
                // Another call may have opened it meanwhile: keep that one.
                match &*state {
                    State::Open { sender, served } => Some((sender.clone(), *served)),
                    State::Off => None,
                    State::Closed => {
                        *state = State::Open {
                            sender: sender.clone(),
                            served: false,
                        };
                        Some((sender, false))
                    }
                }
            }
            Err(error) => {
                tracing::debug!(%error, "the launch lane cannot be opened; launches use the channel");
                *self.lock() = State::Off;
                None
            }
        }
    }

    /// Notes how a call on the lane ended.
    fn settle(&self, outcome: &Result<pb::LaunchResponse, Failure>) {
        let mut state = self.lock();
        match (outcome, &mut *state) {
            (Ok(_), State::Open { served, .. }) => *served = true,
            // A refusal is an answer: the connection is fine.
            (Err(Failure::Refused(_)), State::Open { served, .. }) => *served = true,
            (Err(Failure::Unsent | Failure::Broke(_)), State::Open { served, .. }) => {
                let next = if *served { State::Closed } else { State::Off };
                tracing::debug!(?next, "the launch lane failed");
                *state = next;
            }
            _ => {}
        }
    }

    /// One unary `Launch` on the lane.
    pub(crate) async fn launch(
        &self,
        request: &pb::LaunchRequest,
    ) -> Result<pb::LaunchResponse, LaneError> {
        let Some((sender, served)) = self.sender().await else {
            return Err(LaneError::NotSent);
        };
        let outcome = unary(sender, request, served).await;
        self.settle(&outcome);
        match outcome {
            Ok(response) => Ok(response),
            Err(Failure::Unsent) => Err(LaneError::NotSent),
            Err(Failure::Refused(status)) => Err(LaneError::Failed(status.into())),
            Err(Failure::Broke(error)) => Err(LaneError::Failed(Error::Status(
                tonic::Status::unavailable(format!("the launch connection to ptxd broke: {error}")),
            ))),
        }
    }
}

/// How a call on the lane failed.
#[derive(Debug)]
enum Failure {
    /// The daemon cannot have seen the request.
    Unsent,
    /// The daemon answered with a non-OK status.
    Refused(tonic::Status),
    /// The connection or stream broke after the request may have arrived.
    Broke(String),
}

/// Opens an HTTP/2 connection on the socket and waits for the daemon to
/// answer a PING on it, so that a connection the daemon turns away (over
/// the per-uid cap) fails here, before any launch is sent on it. The
/// connection's task runs until every sender is dropped or it ends.
async fn dial(socket: &Path) -> Result<SendRequest<Bytes>, String> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| format!("connect {}: {e}", socket.display()))?;
    let (sender, mut connection) = h2::client::handshake(stream)
        .await
        .map_err(|e| format!("HTTP/2 handshake: {e}"))?;
    let ping_pong = connection.ping_pong();
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "the launch lane's connection ended");
        }
    });
    let Some(mut ping_pong) = ping_pong else {
        return Err("the connection's PING handle was taken".into());
    };
    match tokio::time::timeout(DIAL_TIMEOUT, ping_pong.ping(h2::Ping::opaque())).await {
        Ok(Ok(_pong)) => Ok(sender),
        Ok(Err(e)) => Err(format!("the daemon did not answer a PING: {e}")),
        Err(_) => Err(format!("no PONG within {DIAL_TIMEOUT:?}")),
    }
}

/// The request's gRPC message: not compressed, its length, its bytes.
fn frame(request: &pb::LaunchRequest) -> Bytes {
    let len = request.encoded_len();
    let mut buf = BytesMut::with_capacity(5 + len);
    buf.put_u8(0);
    // A LaunchRequest is bounded by the daemon's request limit, far below
    // 4 GiB; a larger one is refused by the daemon's limit on its header.
    buf.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    request.encode_raw(&mut buf);
    buf.freeze()
}

/// The reply's one message, from the bytes of the response body.
fn unframe(mut body: Bytes) -> Result<pb::LaunchResponse, String> {
    if body.len() < 5 {
        return Err(format!("a reply of {} bytes has no message", body.len()));
    }
    let compressed = body.get_u8();
    let len = body.get_u32() as usize;
    if compressed != 0 {
        return Err("a compressed reply (ptxd never compresses)".into());
    }
    if len != body.len() {
        return Err(format!(
            "a reply announcing {len} bytes carries {}",
            body.len()
        ));
    }
    pb::LaunchResponse::decode(body).map_err(|e| format!("the reply does not decode: {e}"))
}

/// Whether an h2 error proves the daemon never took the stream: it refused
/// the stream, or (on a connection that has served nothing) it turned the
/// connection away at once, as it does one over the per-uid cap. A GOAWAY
/// on a connection that served may follow requests the daemon did take.
fn never_taken(error: &h2::Error, served: bool) -> bool {
    error.reason() == Some(h2::Reason::REFUSED_STREAM)
        || (!served
            && error.is_go_away()
            && error.is_remote()
            && error.reason() == Some(h2::Reason::ENHANCE_YOUR_CALM))
}

async fn unary(
    sender: SendRequest<Bytes>,
    request: &pb::LaunchRequest,
    served: bool,
) -> Result<pb::LaunchResponse, Failure> {
    let mut sender = sender.ready().await.map_err(|_| Failure::Unsent)?;
    let head = http::Request::post(http::Uri::from_static(LAUNCH_URI))
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .body(())
        .map_err(|_| Failure::Unsent)?;
    let (response, mut body) = sender
        .send_request(head, false)
        .map_err(|_| Failure::Unsent)?;
    body.send_data(frame(request), true)
        .map_err(|e| Failure::Broke(e.to_string()))?;
    let broke = |e: h2::Error| {
        if never_taken(&e, served) {
            Failure::Unsent
        } else {
            Failure::Broke(e.to_string())
        }
    };
    let response = response.await.map_err(broke)?;
    let (head, mut stream) = response.into_parts();
    // A refusal comes trailers-only: the status is in the headers.
    if let Some(status) = tonic::Status::from_header_map(&head.headers) {
        return Err(refused_or(status));
    }
    if head.status != http::StatusCode::OK {
        return Err(Failure::Broke(format!("HTTP status {}", head.status)));
    }
    let mut message = BytesMut::new();
    while let Some(chunk) = stream.data().await {
        let chunk = chunk.map_err(|e| Failure::Broke(e.to_string()))?;
        // Give the window back, or the connection stalls after 64 KiB.
        let _ = stream.flow_control().release_capacity(chunk.len());
        if message.len() + chunk.len() > MAX_REPLY_BYTES + 5 {
            return Err(Failure::Broke("the reply is too large".into()));
        }
        message.extend_from_slice(&chunk);
    }
    let trailers = stream
        .trailers()
        .await
        .map_err(|e| Failure::Broke(e.to_string()))?;
    match trailers.as_ref().and_then(tonic::Status::from_header_map) {
        Some(status) if status.code() == tonic::Code::Ok => {
            unframe(message.freeze()).map_err(Failure::Broke)
        }
        Some(status) => Err(refused_or(status)),
        None => Err(Failure::Broke(
            "the reply ended without a gRPC status".into(),
        )),
    }
}

/// A non-OK status is the daemon's answer; an OK one in the headers means
/// an empty reply, which a `Launch` never is.
fn refused_or(status: tonic::Status) -> Failure {
    if status.code() == tonic::Code::Ok {
        Failure::Broke("an OK status without a reply".into())
    } else {
        Failure::Refused(status)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_message_frames_and_unframes() {
        let request = pb::LaunchRequest {
            session: "ses-1".into(),
            n: 4096,
            tag: 7,
            ..Default::default()
        };
        let framed = frame(&request);
        assert_eq!(framed[0], 0);
        assert_eq!(
            u32::from_be_bytes([framed[1], framed[2], framed[3], framed[4]]) as usize,
            framed.len() - 5
        );
        assert_eq!(pb::LaunchRequest::decode(&framed[5..]).unwrap(), request);
        let reply = pb::LaunchResponse {
            tag: 7,
            micros: 12,
            error: None,
        };
        let mut body = BytesMut::new();
        body.put_u8(0);
        body.put_u32(reply.encoded_len() as u32);
        reply.encode_raw(&mut body);
        assert_eq!(unframe(body.freeze()).unwrap(), reply);
    }

    #[test]
    fn a_malformed_reply_is_refused() {
        assert!(unframe(Bytes::from_static(&[0, 0, 0])).is_err());
        assert!(unframe(Bytes::from_static(&[1, 0, 0, 0, 0])).is_err());
        assert!(unframe(Bytes::from_static(&[0, 0, 0, 0, 9, 1])).is_err());
        // An empty message is a default reply, not an error.
        assert_eq!(
            unframe(Bytes::from_static(&[0, 0, 0, 0, 0])).unwrap(),
            pb::LaunchResponse::default()
        );
    }
}
