//! The `/metrics` HTTP endpoint: the listen-address check (loopback unless
//! allowed), binding, the axum router (`GET`/`HEAD /metrics`, 404, 405) and
//! the server loop over hyper, with its limits on request heads, time and
//! connections.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::{header, HeaderValue, Method, StatusCode};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use super::{Metrics, CONTENT_TYPE};

/// The most bytes of a request head (line and headers) the endpoint takes;
/// a longer one is answered 431.
pub const MAX_REQUEST_HEAD_BYTES: usize = 8 * 1024;

/// How long a client has to send its request head, and then again to take
/// the answer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The most connections served at once; later ones are closed unanswered.
pub const MAX_CONNECTIONS: usize = 64;

/// Why a metrics address was refused or could not be bound.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The address is not loopback and remote serving was not allowed.
    #[error(
        "metrics address {addr} is not a loopback address; \
         pass --metrics-allow-remote to serve metrics beyond this host"
    )]
    RemoteNotAllowed {
        /// The refused address.
        addr: SocketAddr,
    },
    /// The address could not be bound.
    #[error("cannot listen for metrics on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: io::Error,
    },
}

/// Refuses a non-loopback metrics address unless `allow_remote`: the metrics
/// name devices and reveal load patterns, which are nobody else's business
/// by default. An unspecified address (`0.0.0.0`, `::`) counts as remote.
pub fn check_listen_addr(addr: SocketAddr, allow_remote: bool) -> Result<(), MetricsError> {
    // `::ffff:127.0.0.1` is loopback too, though `Ipv6Addr::is_loopback`
    // says otherwise; canonicalize first.
    if allow_remote || addr.ip().to_canonical().is_loopback() {
        Ok(())
    } else {
        Err(MetricsError::RemoteNotAllowed { addr })
    }
}

/// Checks `addr` with [`check_listen_addr`] and binds it.
pub async fn bind(addr: SocketAddr, allow_remote: bool) -> Result<TcpListener, MetricsError> {
    check_listen_addr(addr, allow_remote)?;
    TcpListener::bind(addr)
        .await
        .map_err(|source| MetricsError::Bind { addr, source })
}

/// Serves `GET /metrics` (and `HEAD`) on `listener` until `shutdown`
/// completes: HTTP/1.1 by hyper, routing by axum (both already in the build,
/// under tonic). Every other path is 404 and every other method 405; a
/// request hyper cannot parse is 400, one whose head is over
/// [`MAX_REQUEST_HEAD_BYTES`] 431. Each connection carries one request
/// (no keep-alive). Connections still being answered when `shutdown`
/// completes are dropped.
///
/// Accept errors (e.g. out of file descriptors) are logged and retried after
/// a pause: losing the metrics endpoint for good over a transient error
/// would be worse than a missed scrape.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let routes = routes(metrics);
    let mut shutdown = std::pin::pin!(shutdown);
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => return Ok(()),
            accepted = listener.accept() => accepted,
        };
        while connections.try_join_next().is_some() {}
        match accepted {
            Ok((stream, peer)) => {
                if connections.len() >= MAX_CONNECTIONS {
                    tracing::warn!(%peer, "metrics: too many connections, closing");
                    continue;
                }
                connections.spawn(answer(stream, peer, routes.clone()));
            }
            Err(error) => {
                tracing::warn!(%error, "metrics: accept failed");
                tokio::select! {
                    () = &mut shutdown => return Ok(()),
                    () = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
            }
        }
    }
}

/// Answers the one request of a connection. The client has
/// [`REQUEST_TIMEOUT`] to send the request head, and as long again to take
/// the answer.
async fn answer(stream: TcpStream, peer: SocketAddr, routes: axum::Router) {
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(REQUEST_TIMEOUT)
        .max_header_size(MAX_REQUEST_HEAD_BYTES)
        .keep_alive(false)
        .serve_connection(
            hyper_util::rt::TokioIo::new(stream),
            hyper_util::service::TowerToHyperService::new(routes),
        );
    match tokio::time::timeout(2 * REQUEST_TIMEOUT, connection).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::debug!(%peer, %error, "metrics: connection failed"),
        Err(_elapsed) => tracing::debug!(%peer, "metrics: connection timed out"),
    }
}

/// `GET`/`HEAD /metrics` and nothing else.
fn routes(metrics: Arc<Metrics>) -> axum::Router {
    axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(exposition).fallback(method_not_allowed),
        )
        .fallback(unknown_path)
        .with_state(metrics)
}

async fn exposition(State(metrics): State<Arc<Metrics>>) -> Response {
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], metrics.render()).into_response()
}

/// Another path: 404, unless the method is one no path here takes.
async fn unknown_path(method: Method) -> Response {
    if method == Method::GET || method == Method::HEAD {
        plain(StatusCode::NOT_FOUND)
    } else {
        method_not_allowed().await
    }
}

async fn method_not_allowed() -> Response {
    let mut response = plain(StatusCode::METHOD_NOT_ALLOWED);
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
    response
}

/// A plain-text answer that says its status.
fn plain(status: StatusCode) -> Response {
    let body = format!(
        "{} {}\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or_default()
    );
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use rand::Rng;
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::super::strict_reader::Exposition as Parsed;

    #[test]
    fn only_loopback_is_allowed_without_the_flag() {
        let port = 9464;
        let loopback: [IpAddr; 3] = [
            Ipv4Addr::LOCALHOST.into(),
            Ipv4Addr::new(127, 3, 2, 1).into(),
            Ipv6Addr::LOCALHOST.into(),
        ];
        for ip in loopback {
            assert!(
                check_listen_addr(SocketAddr::new(ip, port), false).is_ok(),
                "{ip}"
            );
        }
        let mapped: IpAddr = Ipv4Addr::LOCALHOST.to_ipv6_mapped().into();
        assert!(check_listen_addr(SocketAddr::new(mapped, port), false).is_ok());
        let remote: [IpAddr; 4] = [
            Ipv4Addr::UNSPECIFIED.into(),
            Ipv4Addr::new(10, 0, 0, 7).into(),
            Ipv6Addr::UNSPECIFIED.into(),
            "fd00::1".parse().unwrap(),
        ];
        for ip in remote {
            let addr = SocketAddr::new(ip, port);
            assert!(
                matches!(
                    check_listen_addr(addr, false),
                    Err(MetricsError::RemoteNotAllowed { addr: refused }) if refused == addr
                ),
                "{ip}"
            );
            assert!(check_listen_addr(addr, true).is_ok(), "{ip}");
        }
    }

    async fn exchange(addr: SocketAddr, request: &[u8]) -> String {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(request).await.unwrap();
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.unwrap();
        String::from_utf8(response).unwrap()
    }

    fn split_response(response: &str) -> (&str, Vec<(String, String)>, &str) {
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        let mut lines = head.split("\r\n");
        let status = lines.next().unwrap();
        let headers = lines
            .map(|line| {
                let (name, value) = line.split_once(": ").unwrap();
                (name.to_ascii_lowercase(), value.to_owned())
            })
            .collect();
        (status, headers, body)
    }

    fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
        headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    #[tokio::test]
    async fn the_endpoint_serves_metrics_and_nothing_else() {
        let metrics = Metrics::new(64);
        let listener = bind("127.0.0.1:0".parse().unwrap(), false).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, Arc::clone(&metrics), async {
            let _ = stopped.await;
        }));

        let faults = rand::rng().random_range(1..50u64);
        for _ in 0..faults {
            metrics.record_kernel_fault("GPU-1234");
        }
        let response = exchange(
            addr,
            b"GET /metrics?x=1 HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n",
        )
        .await;
        let (status, headers, body) = split_response(&response);
        assert_eq!(status, "HTTP/1.1 200 OK");
        let content_type = header(&headers, "content-type").unwrap();
        assert!(
            content_type.starts_with("text/plain; version=0.0.4"),
            "{content_type}"
        );
        assert_eq!(
            header(&headers, "content-length"),
            Some(body.len().to_string().as_str())
        );
        // One request per connection, said so to the client.
        assert_eq!(header(&headers, "connection"), Some("close"));
        let parsed = Parsed::parse(body).unwrap();
        assert_eq!(
            parsed.value("ptxd_kernel_faults_total", &[("device", "GPU-1234")]),
            Some(faults as f64)
        );

        // hyper answers an HTTP/1.0 request in HTTP/1.0.
        let response = exchange(addr, b"HEAD /metrics HTTP/1.0\r\n\r\n").await;
        let (status, headers, body) = split_response(&response);
        assert_eq!(status, "HTTP/1.0 200 OK");
        assert!(body.is_empty());
        assert_ne!(header(&headers, "content-length"), Some("0"));
        let response = exchange(addr, b"HEAD /metrics HTTP/1.1\r\n\r\n").await;
        let (status, headers, body) = split_response(&response);
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert!(body.is_empty());
        assert_ne!(header(&headers, "content-length"), Some("0"));

        let response = exchange(addr, b"GET /other HTTP/1.1\r\n\r\n").await;
        assert!(response.starts_with("HTTP/1.1 404 "), "{response}");
        let response = exchange(addr, b"GET / HTTP/1.1\r\n\r\n").await;
        assert!(response.starts_with("HTTP/1.1 404 "), "{response}");
        let response = exchange(addr, b"HEAD /other HTTP/1.1\r\n\r\n").await;
        assert!(response.starts_with("HTTP/1.1 404 "), "{response}");
        for request in [
            &b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n"[..],
            b"DELETE /other HTTP/1.1\r\n\r\n",
        ] {
            let response = exchange(addr, request).await;
            let (status, headers, _) = split_response(&response);
            assert!(status.starts_with("HTTP/1.1 405 "), "{response}");
            assert_eq!(header(&headers, "allow"), Some("GET, HEAD"), "{response}");
        }
        let response = exchange(addr, b"garbage\r\n\r\n").await;
        assert!(response.starts_with("HTTP/1.1 400 "), "{response}");
        let mut huge = b"GET /metrics HTTP/1.1\r\n".to_vec();
        while huge.len() <= MAX_REQUEST_HEAD_BYTES {
            huge.extend_from_slice(b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
        }
        let response = exchange(addr, &huge).await;
        assert!(response.starts_with("HTTP/1.1 431 "), "{response}");

        // A request split over many writes still gets its answer.
        let mut stream = TcpStream::connect(addr).await.unwrap();
        for piece in [&b"GET /met"[..], b"rics HTTP/1.1\r", b"\n\r", b"\n"] {
            stream.write_all(piece).await.unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");

        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("serve stops on shutdown")
            .unwrap()
            .unwrap();
        assert!(TcpStream::connect(addr).await.is_err(), "listener closed");
    }
}
