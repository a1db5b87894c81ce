//! What a request may hold before it is whole, and what a request that does
//! not decode gets back.
//!
//! Invariants:
//! - A gRPC message is charged to its peer (uid, or TCP address) and to the
//!   daemon from the moment its 5-byte header arrives until its last byte has
//!   been handed to the decoder or its request ends: at most
//!   `max_buffered_request_bytes_per_uid` per peer and
//!   `max_buffered_request_bytes` in all. A message over either budget fails
//!   its request at once (`LIMIT_EXCEEDED`) instead of waiting, so a slow or
//!   stalled client cannot hold memory without bound nor make others wait.
//! - A request must arrive in time: a unary request's body (its one message
//!   and its end) within `request_read_timeout` of the call's start, and in
//!   a streaming request each message within `request_read_timeout` of its
//!   first byte. Otherwise the request fails (`LIMIT_EXCEEDED`,
//!   `limit=request_read_timeout`) and its charge is given back: a stalled
//!   client holds its budget for a bounded time only.
//! - A message whose header announces more than `max_request_bytes` fails
//!   its request with `LIMIT_EXCEEDED`, `limit=max_request_bytes`, before
//!   any of its body is buffered.
//! - A `ptxd.v1.Ptxd` request that is not valid protobuf is refused with
//!   `INVALID_ARGUMENT` and an ErrorInfo (`field` where the decoder names
//!   one), never INTERNAL. In a `LaunchStream`, such a message fails that one
//!   request (answered in its place, with its `tag` when the tag can be read)
//!   and the stream goes on.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http_body::{Body as HttpBody, Frame, SizeHint};
use prost::Message;
use ptxd_proto::v1::{self as api, ptxd_server::PtxdServer};
use tonic::body::Body;
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic::server::NamedService;
use tonic::{Code, Status};

use super::{DecodedLaunch, PtxdService};
use crate::connections::Origin;
use crate::error::Error;

type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send + 'static>>;

/// The byte budgets of incomplete request messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetLimits {
    pub max_request_bytes: u64,
    pub max_buffered: u64,
    pub max_buffered_per_peer: u64,
    pub read_timeout: Duration,
}

#[derive(Debug, Default)]
struct Charged {
    total: u64,
    per_peer: HashMap<Origin, u64>,
}

/// Bytes of incomplete request messages, in all and per peer.
#[derive(Debug)]
pub struct RequestBudget {
    limits: BudgetLimits,
    charged: Mutex<Charged>,
}

impl RequestBudget {
    pub fn new(limits: BudgetLimits) -> Arc<Self> {
        Arc::new(RequestBudget {
            limits,
            charged: Mutex::new(Charged::default()),
        })
    }

    /// Bytes charged now, in all.
    pub fn charged(&self) -> u64 {
        self.charged.lock().map(|c| c.total).unwrap_or(0)
    }

    /// Charges a message of `bytes` to `peer`, or refuses it.
    fn charge(self: &Arc<Self>, peer: Origin, bytes: u64) -> Result<Charge, Error> {
        if bytes > self.limits.max_request_bytes {
            return Err(Error::LimitExceeded {
                limit: "max_request_bytes",
                value: self.limits.max_request_bytes,
            });
        }
        let exceeded = |limit, value| Error::LimitExceeded { limit, value };
        let mut charged = self.charged.lock().map_err(|_| Error::Internal {
            message: "the request budget is poisoned".into(),
        })?;
        let held = charged.per_peer.get(&peer).copied().unwrap_or(0);
        if held + bytes > self.limits.max_buffered_per_peer {
            return Err(exceeded(
                "max_buffered_request_bytes_per_uid",
                self.limits.max_buffered_per_peer,
            ));
        }
        if charged.total + bytes > self.limits.max_buffered {
            return Err(exceeded(
                "max_buffered_request_bytes",
                self.limits.max_buffered,
            ));
        }
        charged.total += bytes;
        *charged.per_peer.entry(peer).or_insert(0) += bytes;
        Ok(Charge {
            budget: Arc::clone(self),
            peer,
            bytes,
        })
    }
}

/// One message's bytes, given back when dropped.
#[derive(Debug)]
struct Charge {
    budget: Arc<RequestBudget>,
    peer: Origin,
    bytes: u64,
}

impl Drop for Charge {
    fn drop(&mut self) {
        if let Ok(mut charged) = self.budget.charged.lock() {
            charged.total = charged.total.saturating_sub(self.bytes);
            if let Some(held) = charged.per_peer.get_mut(&self.peer) {
                *held = held.saturating_sub(self.bytes);
                if *held == 0 {
                    charged.per_peer.remove(&self.peer);
                }
            }
        }
    }
}

/// The read deadline of a request body.
enum Deadline {
    /// Nothing is awaited (a streaming request between messages).
    Idle,
    /// To be armed on the next poll (which runs inside the runtime).
    Wanted,
    Armed(Pin<Box<tokio::time::Sleep>>),
}

/// A request body that charges each gRPC message to the budget while it is
/// incomplete and fails it when it does not arrive in time. It reads the
/// 5-byte message headers and passes every frame through unchanged.
struct BudgetedBody {
    inner: Body,
    budget: Arc<RequestBudget>,
    peer: Origin,
    /// A streaming request: the deadline runs per message, not per body.
    streaming: bool,
    deadline: Deadline,
    header: [u8; 5],
    header_len: usize,
    /// Body bytes of the current message still to come.
    remaining: u64,
    charge: Option<Charge>,
    failed: bool,
}

impl BudgetedBody {
    fn new(inner: Body, budget: Arc<RequestBudget>, peer: Origin, streaming: bool) -> Self {
        BudgetedBody {
            inner,
            budget,
            peer,
            streaming,
            deadline: if streaming {
                Deadline::Idle
            } else {
                Deadline::Wanted
            },
            header: [0; 5],
            header_len: 0,
            remaining: 0,
            charge: None,
            failed: false,
        }
    }

    /// Fails the request with `error`: gives its charge back and answers
    /// every later poll with the end of the body. (The refusal reaches the
    /// client as the call's status, where `refusals` logs and counts it.)
    fn fail(&mut self, error: Error) -> Status {
        self.failed = true;
        self.charge = None;
        self.deadline = Deadline::Idle;
        error.to_status()
    }

    /// Follows the message framing through `data`, charging each message
    /// when its header is complete and releasing it with its last byte.
    fn account(&mut self, mut data: &[u8]) -> Result<(), Error> {
        while !data.is_empty() {
            if self.remaining > 0 {
                let take = data
                    .len()
                    .min(usize::try_from(self.remaining).unwrap_or(usize::MAX));
                self.remaining -= take as u64;
                data = &data[take..];
                if self.remaining == 0 {
                    self.charge = None;
                    if self.streaming {
                        self.deadline = Deadline::Idle;
                    }
                }
                continue;
            }
            if self.streaming && matches!(self.deadline, Deadline::Idle) {
                self.deadline = Deadline::Wanted;
            }
            let take = data.len().min(5 - self.header_len);
            self.header[self.header_len..self.header_len + take].copy_from_slice(&data[..take]);
            self.header_len += take;
            data = &data[take..];
            if self.header_len == 5 {
                self.header_len = 0;
                let len = u64::from(u32::from_be_bytes([
                    self.header[1],
                    self.header[2],
                    self.header[3],
                    self.header[4],
                ]));
                if len > 0 {
                    self.charge = Some(self.budget.charge(self.peer, len)?);
                    self.remaining = len;
                } else if self.streaming {
                    self.deadline = Deadline::Idle;
                }
            }
        }
        Ok(())
    }
}

impl HttpBody for BudgetedBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if this.failed {
            return Poll::Ready(None);
        }
        let timeout = this.budget.limits.read_timeout;
        if matches!(this.deadline, Deadline::Wanted) {
            this.deadline = Deadline::Armed(Box::pin(tokio::time::sleep(timeout)));
        }
        if let Deadline::Armed(sleep) = &mut this.deadline {
            if sleep.as_mut().poll(cx).is_ready() {
                let error = Error::LimitExceeded {
                    limit: "request_read_timeout",
                    value: timeout.as_secs_f64().ceil() as u64,
                };
                return Poll::Ready(Some(Err(this.fail(error))));
            }
        }
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        match &frame {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    if let Err(error) = this.account(data.chunk()) {
                        return Poll::Ready(Some(Err(this.fail(error))));
                    }
                }
            }
            Some(Err(_)) | None => this.deadline = Deadline::Idle,
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The tower layer that puts every request body under the budget.
#[derive(Debug, Clone)]
pub struct BudgetLayer {
    budget: Arc<RequestBudget>,
}

impl BudgetLayer {
    pub fn new(budget: Arc<RequestBudget>) -> Self {
        BudgetLayer { budget }
    }
}

impl<S> tower::Layer<S> for BudgetLayer {
    type Service = Budgeted<S>;

    fn layer(&self, inner: S) -> Budgeted<S> {
        Budgeted {
            inner,
            budget: Arc::clone(&self.budget),
        }
    }
}

/// A service whose request bodies are under the budget.
#[derive(Debug, Clone)]
pub struct Budgeted<S> {
    inner: S,
    budget: Arc<RequestBudget>,
}

impl<S> tower::Service<http::Request<Body>> for Budgeted<S>
where
    S: tower::Service<http::Request<Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let peer = Origin::of(request.extensions());
        let budget = Arc::clone(&self.budget);
        // Requests that stream messages (possibly idle in between); every
        // other method takes one message.
        let path = request.uri().path();
        let streaming = path == LAUNCH_STREAM_PATH || path.starts_with("/grpc.reflection.");
        self.inner
            .call(request.map(|inner| Body::new(BudgetedBody::new(inner, budget, peer, streaming))))
    }
}

/// The refusal of a message that is not valid protobuf, from the decoder's
/// error text: with the field path it names (`inputs.buffer` for a bad
/// `buffer` inside an `inputs` operand), if any.
fn undecodable(text: &str) -> Error {
    // prost keeps the path only in its message: "failed to decode Protobuf
    // message: Inner.field: Outer.field: description", innermost first (and
    // tonic-prost passes that message on as the status message).
    let detail = text
        .strip_prefix("failed to decode Protobuf message: ")
        .unwrap_or(text);
    let mut path = Vec::new();
    let mut rest = detail;
    while let Some((head, tail)) = rest.split_once(": ") {
        match head.split_once('.') {
            Some((message, field))
                if !message.is_empty()
                    && !field.is_empty()
                    && message
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_')
                    && field.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') =>
            {
                path.push(field.to_string());
                rest = tail;
            }
            _ => break,
        }
    }
    path.reverse();
    Error::Undecodable {
        field: path.join("."),
        message: detail.to_string(),
    }
}

/// The `tag` of a `LaunchRequest` (field 10) that does not decode as a
/// whole, if the fields before the bad one let it be read; else 0.
fn salvage_tag(mut bytes: &[u8]) -> u64 {
    use prost::encoding::{decode_key, decode_varint, skip_field, DecodeContext, WireType};
    while bytes.has_remaining() {
        let Ok((tag, wire_type)) = decode_key(&mut bytes) else {
            return 0;
        };
        if tag == 10 && wire_type == WireType::Varint {
            return decode_varint(&mut bytes).unwrap_or(0);
        }
        if skip_field(wire_type, tag, &mut bytes, DecodeContext::default()).is_err() {
            return 0;
        }
    }
    0
}

/// The `LaunchStream` codec: a message that does not decode becomes an
/// item of the stream instead of ending it.
#[derive(Debug, Clone, Copy, Default)]
struct LaunchCodec;

#[derive(Debug, Clone, Copy, Default)]
struct LaunchDecoder;

impl Decoder for LaunchDecoder {
    type Item = DecodedLaunch;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<DecodedLaunch>, Status> {
        let bytes = buf.copy_to_bytes(buf.remaining());
        Ok(Some(api::LaunchRequest::decode(bytes.clone()).map_err(
            |error| (undecodable(&error.to_string()), salvage_tag(&bytes)),
        )))
    }
}

impl Codec for LaunchCodec {
    type Encode = api::LaunchResponse;
    type Decode = DecodedLaunch;
    type Encoder = tonic_prost::ProstEncoder<api::LaunchResponse>;
    type Decoder = LaunchDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        LaunchDecoder
    }
}

/// The `ptxd.v1.Ptxd` service as served: the generated server, with
/// `LaunchStream` decoded by `LaunchCodec` and the statuses tonic gives a
/// request that does not decode turned into typed refusals.
#[derive(Debug, Clone)]
pub struct PtxdRoutes {
    generated: PtxdServer<PtxdService>,
    service: PtxdService,
    max_message_bytes: usize,
}

const LAUNCH_STREAM_PATH: &str = "/ptxd.v1.Ptxd/LaunchStream";

impl PtxdRoutes {
    pub fn new(service: PtxdService, max_message_bytes: usize) -> Self {
        PtxdRoutes {
            generated: PtxdServer::new(service.clone())
                .max_decoding_message_size(max_message_bytes)
                .max_encoding_message_size(max_message_bytes),
            service,
            max_message_bytes,
        }
    }
}

impl NamedService for PtxdRoutes {
    const NAME: &'static str = <PtxdServer<PtxdService> as NamedService>::NAME;
}

/// The typed refusal for a status tonic produced itself while decoding a
/// request (it carries no ErrorInfo; every status ptxd makes does).
fn retype(status: &Status, max_request_bytes: u64) -> Option<Error> {
    if !status.details().is_empty() {
        return None;
    }
    let message = status.message();
    match status.code() {
        Code::Internal if message.starts_with("failed to decode Protobuf message") => {
            Some(undecodable(message))
        }
        Code::Internal
            if message.starts_with("Unexpected EOF decoding stream")
                || message.starts_with("protocol error: received message with") =>
        {
            Some(Error::Undecodable {
                field: String::new(),
                message: message.to_string(),
            })
        }
        // tonic's own size check, behind the budget's (which names the
        // limit first).
        Code::OutOfRange if message.contains("message length too large") => {
            Some(Error::LimitExceeded {
                limit: "max_request_bytes",
                value: max_request_bytes,
            })
        }
        _ => None,
    }
}

impl tower::Service<http::Request<Body>> for PtxdRoutes {
    type Response = http::Response<Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Result<http::Response<Body>, std::convert::Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let limit = self.max_message_bytes;
        if request.uri().path() == LAUNCH_STREAM_PATH {
            let service = self.service.clone();
            return Box::pin(async move {
                let handler = tower::service_fn(
                    move |request: tonic::Request<tonic::Streaming<DecodedLaunch>>| {
                        let service = service.clone();
                        async move {
                            let peer = super::peer(&request);
                            Ok::<_, Status>(tonic::Response::new(
                                service.answer_launches(peer, request.into_inner()),
                            ))
                        }
                    },
                );
                let mut grpc = tonic::server::Grpc::new(LaunchCodec)
                    .apply_max_message_size_config(Some(limit), Some(limit));
                Ok(grpc.streaming(handler, request).await)
            });
        }
        let call = tower::Service::call(&mut self.generated, request);
        Box::pin(async move {
            let Ok(mut response) = call.await;
            if let Some(status) = Status::from_header_map(response.headers()) {
                if let Some(error) = retype(&status, limit as u64) {
                    let headers = response.headers_mut();
                    for name in ["grpc-status", "grpc-message", "grpc-status-details-bin"] {
                        headers.remove(name);
                    }
                    let _ = error.to_status().add_header(headers);
                }
            }
            Ok(response)
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn limits() -> BudgetLimits {
        BudgetLimits {
            max_request_bytes: 100,
            max_buffered: 250,
            max_buffered_per_peer: 150,
            read_timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn budgets_hold_per_peer_and_in_all() {
        let budget = RequestBudget::new(limits());
        let a = budget.charge(Origin::Uid(1), 100).unwrap();
        let refused = budget.charge(Origin::Uid(1), 60).unwrap_err();
        assert_eq!(
            refused,
            Error::LimitExceeded {
                limit: "max_buffered_request_bytes_per_uid",
                value: 150
            }
        );
        let _b = budget.charge(Origin::Uid(2), 100).unwrap();
        assert_eq!(
            budget.charge(Origin::Uid(3), 60).unwrap_err(),
            Error::LimitExceeded {
                limit: "max_buffered_request_bytes",
                value: 250
            }
        );
        assert_eq!(
            budget.charge(Origin::Uid(3), 101).unwrap_err(),
            Error::LimitExceeded {
                limit: "max_request_bytes",
                value: 100
            }
        );
        drop(a);
        assert_eq!(budget.charged(), 100);
        let _c = budget.charge(Origin::Uid(1), 100).unwrap();
    }

    #[test]
    fn framing_charges_a_message_until_its_last_byte() {
        let budget = RequestBudget::new(limits());
        let mut body = BudgetedBody::new(Body::empty(), Arc::clone(&budget), Origin::Uid(7), true);
        // A header split across chunks, then the body in two parts.
        body.account(&[0, 0, 0]).unwrap();
        assert_eq!(budget.charged(), 0);
        body.account(&[0, 40, 1, 2]).unwrap();
        assert_eq!(budget.charged(), 40);
        body.account(&[0; 37]).unwrap();
        assert_eq!(budget.charged(), 40);
        // The last byte, and a whole second message, in one chunk.
        let mut chunk = vec![9];
        chunk.extend_from_slice(&[0, 0, 0, 0, 3, 1, 2, 3]);
        body.account(&chunk).unwrap();
        assert_eq!(budget.charged(), 0);
        // An announced length over max_request_bytes.
        assert!(body.account(&[0, 0, 0, 0, 101]).is_err());
    }

    #[test]
    fn decode_errors_name_the_field_path() {
        // Operand.buffer (field 1 of inputs, field 3 of LaunchRequest) with
        // invalid UTF-8.
        let bytes = [0x1a, 0x04, 0x0a, 0x02, 0xff, 0xfe];
        let error = api::LaunchRequest::decode(&bytes[..]).unwrap_err();
        match undecodable(&error.to_string()) {
            Error::Undecodable { field, message } => {
                assert_eq!(field, "inputs.buffer", "{message}");
            }
            other => panic!("{other:?}"),
        }
        let truncated = api::LaunchRequest::decode(&[0x28][..]).unwrap_err();
        let Error::Undecodable { field, .. } = undecodable(&truncated.to_string()) else {
            unreachable!()
        };
        assert_eq!(field, "n");
    }

    #[test]
    fn the_tag_is_salvaged_when_it_precedes_the_damage() {
        // tag = 300 (field 10, varint), then a string with invalid UTF-8.
        let bytes = [0x50, 0xac, 0x02, 0x0a, 0x02, 0xff, 0xfe];
        assert!(api::LaunchRequest::decode(&bytes[..]).is_err());
        assert_eq!(salvage_tag(&bytes), 300);
        assert_eq!(salvage_tag(&[0x0f]), 0);
    }
}
