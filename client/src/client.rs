//! Connecting to ptxd: the [`Client`], which calls that need no session go
//! through and which opens [`Session`]s.
//!
//! A `Client` is one HTTP/2 connection (tonic `Channel`); clones share it.
//! Over a Unix socket the connector dials the path again whenever the channel
//! reconnects, so a restarted daemon at the same path is picked up; there,
//! unary launches go as packets on the fd socket (see `fd_lane`), else on a
//! second HTTP/2 connection of their own, opened at the first launch (see
//! `lane`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ptxd_proto::v1 as pb;
use ptxd_proto::v1::ptxd_client::PtxdClient;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::error::Error;
use crate::fd_lane::{FdLane, DEFAULT_REPLY_SPIN};
use crate::lane::Lane;
use crate::session::{Session, SessionOptions};
use crate::types::DaemonInfo;
use ptxd_ipc::socket_dir::checked_default_socket_path;

/// Where a daemon listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A Unix socket path.
    Unix(PathBuf),
    /// A TCP endpoint URL, e.g. `http://127.0.0.1:50051`.
    Tcp(String),
}

impl std::str::FromStr for Target {
    type Err = Error;

    /// `unix:PATH`, a path starting with `/` or `.`, `http://HOST:PORT`, or a
    /// bare `HOST:PORT` (taken as `http://`).
    fn from_str(text: &str) -> Result<Self, Error> {
        let text = text.trim();
        if let Some(path) = text.strip_prefix("unix:") {
            // `unix:///path` (gRPC's URI form) and `unix:/path` both mean /path.
            let path = path.strip_prefix("//").unwrap_or(path);
            if path.is_empty() {
                return Err(Error::InvalidInput("empty unix socket path".into()));
            }
            return Ok(Target::Unix(PathBuf::from(path)));
        }
        if text.starts_with('/') || text.starts_with('.') {
            return Ok(Target::Unix(PathBuf::from(text)));
        }
        if text.is_empty() {
            return Err(Error::InvalidInput("empty connect target".into()));
        }
        let url = if text.starts_with("http://") || text.starts_with("https://") {
            text.to_owned()
        } else {
            format!("http://{text}")
        };
        url.parse::<Uri>()
            .ok()
            .filter(|uri| uri.host().is_some())
            .ok_or_else(|| Error::InvalidInput(format!("not a TCP address: {text:?}")))?;
        Ok(Target::Tcp(url))
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Unix(path) => write!(f, "unix:{}", path.display()),
            Target::Tcp(url) => f.write_str(url),
        }
    }
}

/// A connection to ptxd.
#[derive(Debug, Clone)]
pub struct Client {
    channel: Channel,
    grpc: PtxdClient<Channel>,
    /// The daemon's fd socket, beside its gRPC socket (Unix transport only).
    fd_socket: Option<PathBuf>,
    /// Unary launches' own connection (Unix sockets only).
    lane: Option<Arc<Lane>>,
    /// Unary launches as packets on the fd socket (Unix sockets only).
    fd_lane: Option<Arc<FdLane>>,
}

impl Client {
    /// Connects to a target: `unix:PATH`, a path, `http://HOST:PORT` or
    /// `HOST:PORT` (see [`Target`]).
    pub async fn connect(target: &str) -> Result<Self, Error> {
        match target.parse::<Target>()? {
            Target::Unix(path) => Self::connect_unix(path).await,
            Target::Tcp(url) => Self::connect_tcp(&url).await,
        }
    }

    /// Connects to the daemon at `$PTXD_SOCKET` when set (as the daemon and
    /// the `ptxd` CLI read it), else at
    /// [`checked_default_socket_path`](crate::checked_default_socket_path),
    /// whose directory must be safe to trust ([`Error::UnsafeSocketDir`]
    /// otherwise).
    pub async fn connect_default() -> Result<Self, Error> {
        match std::env::var_os("PTXD_SOCKET").filter(|p| !p.is_empty()) {
            Some(path) => Self::connect_unix(PathBuf::from(path)).await,
            None => Self::connect_unix(checked_default_socket_path()?).await,
        }
    }

    /// Connects over a Unix socket.
    pub async fn connect_unix(path: impl Into<PathBuf>) -> Result<Self, Error> {
        let path = path.into();
        let fd_socket = ptxd_ipc::packet::fd_socket_path(&path);
        let lane = Arc::new(Lane::new(path.clone()));
        let fd_lane = Arc::new(FdLane::new(fd_socket.clone(), DEFAULT_REPLY_SPIN));
        // The authority is a placeholder: it must be a plain host name, since
        // tonic's HTTP/2 layer rejects a socket path there.
        let channel = Endpoint::from_static("http://localhost")
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(path).await?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                }
            }))
            .await?;
        let mut client = Client {
            lane: Some(lane),
            fd_lane: Some(fd_lane),
            ..Self::from_channel(channel)
        };
        client.fd_socket = Some(fd_socket);
        Ok(client)
    }

    /// Connects over TCP to a URL such as `http://127.0.0.1:50051`.
    pub async fn connect_tcp(url: &str) -> Result<Self, Error> {
        let endpoint = Endpoint::from_shared(url.to_owned())?;
        Ok(Self::from_channel(endpoint.connect().await?))
    }

    /// A client over an existing tonic channel (every call, launches too,
    /// goes through it).
    pub fn from_channel(channel: Channel) -> Self {
        Client {
            grpc: PtxdClient::new(channel.clone()),
            channel,
            fd_socket: None,
            lane: None,
            fd_lane: None,
        }
    }

    /// The same client, with its sessions' unary launches on HTTP/2 only
    /// (the h2 lane, else the channel), never as packets on the fd socket:
    /// for comparing the two paths (`ptxd bench`), or a daemon whose fd
    /// socket cannot be reached.
    pub fn without_fd_lane(self) -> Self {
        Client {
            fd_lane: None,
            ..self
        }
    }

    /// The same client, with its unary calls on the fd socket polling for
    /// their reply for up to `spin` (zero: not at all) before the calling
    /// task sleeps; the default is [`DEFAULT_REPLY_SPIN`]. A reply that
    /// comes within the spin is read without this thread being put to
    /// sleep and woken (on a VM that wake-up costs about as much as the
    /// daemon's work on a launch); the price is up to `spin` of this
    /// thread's time per call, shared with the runtime's other tasks, as
    /// the poll yields between tries.
    pub fn with_reply_spin(self, spin: Duration) -> Self {
        let fd_lane = self
            .fd_lane
            .as_ref()
            .map(|lane| Arc::new(lane.with_spin(spin)));
        Client { fd_lane, ..self }
    }

    /// The generated gRPC client on the same connection: an escape hatch for
    /// requests the SDK would not build (e.g. tests of the daemon's
    /// validation).
    pub fn raw(&self) -> PtxdClient<Channel> {
        self.grpc.clone()
    }

    /// The underlying channel, for the other services ptxd serves on the
    /// same connection (grpc.health.v1, reflection).
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// The daemon's version, backend, devices, slot usage and limits.
    pub async fn info(&self) -> Result<DaemonInfo, Error> {
        let response = self.raw().get_info(pb::GetInfoRequest {}).await?;
        Ok(response.into_inner().into())
    }

    /// Opens a session labelled `label`, without automatic kernel reload.
    pub async fn open_session(&self, label: &str) -> Result<Session, Error> {
        self.open_session_with(SessionOptions::new(label)).await
    }

    /// Opens a session with options.
    pub async fn open_session_with(&self, options: SessionOptions) -> Result<Session, Error> {
        let mut session = Session::open(self.raw(), self.lane.clone(), options).await?;
        session.fd_socket = self.fd_socket.clone();
        session.fd_lane = self.fd_lane.clone();
        Ok(session)
    }

    /// The daemon's fd socket (`<socket>.fds`), over which buffers pass by
    /// file descriptor; `None` over TCP, which cannot carry descriptors.
    pub fn fd_socket(&self) -> Option<&std::path::Path> {
        self.fd_socket.as_deref()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse() {
        let cases = [
            ("unix:/run/ptxd.sock", Target::Unix("/run/ptxd.sock".into())),
            (
                "unix:///run/ptxd.sock",
                Target::Unix("/run/ptxd.sock".into()),
            ),
            ("/tmp/x.sock", Target::Unix("/tmp/x.sock".into())),
            ("./x.sock", Target::Unix("./x.sock".into())),
            (
                "http://127.0.0.1:50051",
                Target::Tcp("http://127.0.0.1:50051".into()),
            ),
            (
                "127.0.0.1:50051",
                Target::Tcp("http://127.0.0.1:50051".into()),
            ),
            ("localhost:7", Target::Tcp("http://localhost:7".into())),
        ];
        for (text, expected) in cases {
            assert_eq!(text.parse::<Target>().unwrap(), expected, "{text}");
        }
        for bad in ["", "unix:", "http://", "a b:1"] {
            assert!(
                matches!(bad.parse::<Target>(), Err(Error::InvalidInput(_))),
                "{bad:?}"
            );
        }
    }

    #[tokio::test]
    async fn connecting_to_a_missing_socket_is_a_transport_error() {
        let dir = std::env::temp_dir().join(format!("ptxd-client-missing-{}", std::process::id()));
        let error = Client::connect_unix(dir.join("nothing.sock"))
            .await
            .unwrap_err();
        assert!(matches!(error, Error::Transport(_)), "{error:?}");
    }
}
