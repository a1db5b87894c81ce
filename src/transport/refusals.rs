//! Refusals as the operator sees them, whichever transport sent them: one
//! function, [`record`], logs one line for a refusal and counts it by
//! reason. Over gRPC it is called by one tower layer around every gRPC
//! service, which reads each call's final status; handlers and request
//! decoding only build statuses, and none of them records a refusal it
//! returns. A refusal no status carries (a `LaunchStream` message, a packet
//! on the packet socket) is recorded where the transport makes it, through
//! [`record_error`].
//!
//! Invariants:
//! - Every refusal a transport sends is recorded once, by [`record`]: the
//!   same counter and label (`ptxd_refusals_total{reason}`), the same log
//!   line (rpc, transport, peer, reason, message), INTERNAL at error level,
//!   every other refusal at info level, one line a second per reason at
//!   most.
//! - Each call's status is observed at most once, where it goes on the
//!   wire: in the response headers of a trailers-only response (every unary
//!   refusal, and a streaming call refused before its first message), or in
//!   the trailers (every unary success, and a stream that ends with a
//!   status). A call whose client goes away before its status is sent is
//!   not observed.
//! - A refusal is a status with ptxd's `google.rpc.ErrorInfo` (domain
//!   [`ptxd_proto::ERROR_DOMAIN`]) whose reason is on the closed list; it is
//!   counted under that reason, the one label `ptxd_refusals_total` has. A
//!   status without one (made by tonic itself, or by the health and
//!   reflection services) is logged at debug level and not counted.
//! - Observing changes nothing: headers, frames and trailers pass through
//!   as the service produced them.
//! - A `LaunchStream` refuses one request inside an OK message
//!   (`LaunchResponse.error`), not with a status: the stream goes on, so
//!   this layer never sees it. [`super::grpc`] records those where it
//!   makes them.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use ptxd_proto::v1::Reason;
use tonic::body::Body;
use tonic::{Code, Status};
use tonic_types::StatusExt;

use crate::connections::{request_log, Origin};
use crate::error::Error;
use crate::observe::Observer;

/// The transport a refusal went out on, as its log line names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carrier {
    /// gRPC over HTTP/2 ([`super::grpc`]).
    Http2,
    /// The packet socket ([`super::packet`]).
    Packet,
}

impl Carrier {
    fn name(self) -> &'static str {
        match self {
            Carrier::Http2 => "http2",
            Carrier::Packet => "fd socket",
        }
    }
}

/// Records one refusal: counts it under its reason and logs it (see the
/// module's invariants). `rpc` names the call (`Launch`), `peer` who made
/// it.
pub fn record(
    observer: &Observer,
    rpc: &str,
    carrier: Carrier,
    peer: Origin,
    code: Code,
    reason: Reason,
    message: &str,
) {
    let reason = reason.wire_name();
    observer.refusal(reason);
    // A client can cause any number of refusals: one line a second per
    // reason, counting the ones it stands for (the metrics count each).
    let Some(count) = request_log().admit(reason) else {
        return;
    };
    let transport = carrier.name();
    if code == Code::Internal {
        tracing::error!(rpc, transport, %peer, reason, message, count, "internal error");
    } else {
        tracing::info!(rpc, transport, %peer, reason, message, count, "refused");
    }
}

/// Records the refusal `error` is, for a transport that sends it without
/// a status the layer could read.
pub fn record_error(observer: &Observer, rpc: &str, carrier: Carrier, peer: Origin, error: &Error) {
    let refusal = error.refusal();
    record(
        observer,
        rpc,
        carrier,
        peer,
        refusal.code,
        refusal.reason,
        &refusal.message,
    );
}

/// The layer that logs and counts the refusals of the services it wraps.
#[derive(Debug, Clone)]
pub struct RefusalLayer {
    observer: Observer,
}

impl RefusalLayer {
    pub fn new(observer: Observer) -> Self {
        RefusalLayer { observer }
    }
}

impl<S> tower::Layer<S> for RefusalLayer {
    type Service = Refusals<S>;

    fn layer(&self, inner: S) -> Refusals<S> {
        Refusals {
            inner,
            observer: self.observer.clone(),
        }
    }
}

/// A gRPC service whose final statuses are observed.
#[derive(Debug, Clone)]
pub struct Refusals<S> {
    inner: S,
    observer: Observer,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<S, B> tower::Service<http::Request<B>> for Refusals<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<http::Response<Body>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let call = Call {
            rpc: rpc_name(request.uri().path()).to_owned(),
            peer: Origin::of(request.extensions()),
            observer: self.observer.clone(),
        };
        let response = self.inner.call(request);
        Box::pin(async move { Ok(call.watch(response.await?)) })
    }
}

/// The method of a gRPC path (`/ptxd.v1.Ptxd/LoadKernel`: `LoadKernel`),
/// as the log lines name it.
fn rpc_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// One call, until its status is seen.
#[derive(Debug)]
struct Call {
    rpc: String,
    peer: Origin,
    observer: Observer,
}

impl Call {
    /// Observes a trailers-only response now; otherwise wraps the body to
    /// observe its trailers.
    fn watch(self, response: http::Response<Body>) -> http::Response<Body> {
        if let Some(status) = Status::from_header_map(response.headers()) {
            self.observe(&status);
            return response;
        }
        response.map(|inner| {
            Body::new(Watched {
                inner,
                call: Some(self),
            })
        })
    }

    fn observe(self, status: &Status) {
        let Call {
            rpc,
            peer,
            observer,
        } = self;
        if status.code() == Code::Ok {
            tracing::debug!(rpc, "ok");
            return;
        }
        let message = status.message();
        let Some(info) = status
            .get_details_error_info()
            .filter(|info| info.domain == ptxd_proto::ERROR_DOMAIN)
        else {
            tracing::debug!(rpc, %peer, code = ?status.code(), message, "failed");
            return;
        };
        let Some(reason) = Reason::from_wire_name(&info.reason) else {
            // Every ptxd refusal is built from the closed list in
            // `error.rs`; this would be a bug there, not a client's doing.
            if let Some(count) = request_log().admit("off the list") {
                tracing::warn!(rpc, %peer, reason = info.reason, message, count, "refused with a reason off the list");
            }
            return;
        };
        record(
            &observer,
            &rpc,
            Carrier::Http2,
            peer,
            status.code(),
            reason,
            message,
        );
    }
}

/// A response body that observes the status in its trailers, and passes
/// every frame on unchanged.
struct Watched {
    inner: Body,
    call: Option<Call>,
}

impl HttpBody for Watched {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        let status = frame
            .as_ref()
            .and_then(|frame| frame.as_ref().ok())
            .and_then(Frame::trailers_ref)
            .and_then(Status::from_header_map);
        if let Some(status) = status {
            if let Some(call) = this.call.take() {
                call.observe(&status);
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Arc;

    use http::HeaderMap;
    use tower::{Layer, ServiceExt};

    use super::*;
    use crate::error::Error;
    use crate::metrics::Metrics;

    /// A response body of fixed frames.
    struct Frames(VecDeque<Frame<Bytes>>);

    impl HttpBody for Frames {
        type Data = Bytes;
        type Error = Status;

        fn poll_frame(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
            Poll::Ready(self.get_mut().0.pop_front().map(Ok))
        }
    }

    fn trailers(status: &Status) -> Frame<Bytes> {
        let mut trailers = HeaderMap::new();
        status.add_header(&mut trailers).unwrap();
        Frame::trailers(trailers)
    }

    fn refusals(metrics: &Metrics, reason: &str) -> u64 {
        let prefix = format!("ptxd_refusals_total{{reason=\"{reason}\"}} ");
        let rendered = metrics.render();
        let line = rendered
            .lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .expect("every reason is rendered");
        line.parse().unwrap()
    }

    /// Sends one request through the layer to a service that answers
    /// `response`, reads the whole body and returns its frames.
    async fn exchange(
        metrics: &Arc<Metrics>,
        response: impl FnOnce() -> http::Response<Body> + Send + 'static,
    ) -> (http::Response<()>, Vec<Frame<Bytes>>) {
        let response = std::sync::Mutex::new(Some(response));
        let inner = tower::service_fn(move |_request: http::Request<Body>| {
            let response = response.lock().unwrap().take().unwrap();
            async move { Ok::<_, std::convert::Infallible>(response()) }
        });
        let service = RefusalLayer::new(Observer::new(Some(Arc::clone(metrics)))).layer(inner);
        let request = http::Request::builder()
            .uri("/ptxd.v1.Ptxd/Launch")
            .body(Body::empty())
            .unwrap();
        let Ok(response) = service.oneshot(request).await;
        let (parts, mut body) = response.into_parts();
        let mut frames = Vec::new();
        while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
        {
            frames.push(frame.unwrap());
        }
        (http::Response::from_parts(parts, ()), frames)
    }

    #[tokio::test]
    async fn a_trailers_only_refusal_is_counted_once_by_its_reason() {
        let metrics = Metrics::new(8);
        let (response, frames) =
            exchange(&metrics, || Error::Draining.to_status().into_http()).await;
        assert_eq!(
            Status::from_header_map(response.headers()).unwrap().code(),
            Code::Unavailable
        );
        assert!(frames.is_empty());
        assert_eq!(refusals(&metrics, "DRAINING"), 1);
        assert_eq!(refusals(&metrics, "INTERNAL"), 0);
    }

    #[tokio::test]
    async fn a_status_in_the_trailers_is_counted_after_the_messages() {
        let metrics = Metrics::new(8);
        let internal = Error::Internal {
            message: "boom".into(),
        }
        .to_status();
        let sent = vec![
            Frame::data(Bytes::from_static(b"\0\0\0\0\x01a")),
            Frame::data(Bytes::from_static(b"\0\0\0\0\x01b")),
            trailers(&internal),
        ];
        let expected: Vec<_> = sent
            .iter()
            .map(|frame| (frame.data_ref().cloned(), frame.trailers_ref().cloned()))
            .collect();
        let (_, frames) = exchange(&metrics, move || {
            http::Response::new(Body::new(Frames(sent.into())))
        })
        .await;
        let received: Vec<_> = frames
            .iter()
            .map(|frame| (frame.data_ref().cloned(), frame.trailers_ref().cloned()))
            .collect();
        assert_eq!(received, expected, "frames pass through unchanged");
        assert_eq!(refusals(&metrics, "INTERNAL"), 1);
    }

    #[tokio::test]
    async fn successes_and_statuses_without_ptxds_error_info_are_not_counted() {
        let metrics = Metrics::new(8);
        let before = metrics.render();
        let ok = || http::Response::new(Body::new(Frames(vec![trailers(&Status::ok(""))].into())));
        exchange(&metrics, ok).await;
        exchange(&metrics, || {
            Status::unimplemented("no such method").into_http()
        })
        .await;
        let foreign = || {
            Status::with_error_details(
                Code::NotFound,
                "unknown service",
                tonic_types::ErrorDetails::with_error_info(
                    "DRAINING",
                    "example.com",
                    std::collections::HashMap::new(),
                ),
            )
            .into_http()
        };
        exchange(&metrics, foreign).await;
        assert_eq!(metrics.render(), before);
    }

    #[tokio::test]
    async fn a_refusal_outside_a_status_counts_as_the_same_refusal_in_one() {
        // Through the layer, as gRPC sends it...
        let metrics = Metrics::new(8);
        let error = || Error::LimitExceeded {
            limit: "fd_socket_connections",
            value: rand::random::<u64>() % 1000,
        };
        exchange(&metrics, move || error().to_status().into_http()).await;
        let through_the_layer = metrics.render();
        // ...and recorded directly, as the packet socket and a
        // `LaunchStream` message do: the same counter, the same label.
        let direct = Metrics::new(8);
        let observer = Observer::new(Some(Arc::clone(&direct)));
        record_error(
            &observer,
            "Launch",
            Carrier::Packet,
            Origin::Uid(7),
            &error(),
        );
        assert_eq!(direct.render(), through_the_layer);
        assert_eq!(refusals(&direct, "LIMIT_EXCEEDED"), 1);
    }

    #[test]
    fn the_rpc_is_the_last_path_segment() {
        assert_eq!(rpc_name("/ptxd.v1.Ptxd/LoadKernel"), "LoadKernel");
        assert_eq!(rpc_name("/grpc.health.v1.Health/Check"), "Check");
        assert_eq!(rpc_name(""), "");
    }
}
