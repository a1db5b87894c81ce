//! The running daemon: listeners, the gRPC router (service, health,
//! reflection), signals and the drain.
//!
//! Invariants:
//! - ptxd never takes over a socket a live daemon answers on; a stale socket
//!   file (nobody answers) is replaced, and a path that is not a socket is
//!   never deleted.
//! - TCP binds loopback only unless the operator allows remote explicitly.
//! - On SIGTERM/SIGINT: refuse new work (DRAINING), tell every session, let
//!   in-flight calls finish for up to the drain timeout, then release every
//!   session, stop the executors and remove the socket file. A call read on
//!   any transport is answered even past the timeout: the executors stop
//!   while every connection is still open (a launch that never started is
//!   answered DRAINING, one that was running fails), and the connections
//!   outlive them by up to a second to send those answers, never cut off
//!   by a reset.

use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tonic::transport::Server;
use tonic_health::ServingStatus;

use crate::config::ServeConfig;
use crate::connections::{ConnectionLimits, ConnectionTable, Incoming};
use crate::front::{Front, StartError};
use crate::observe::Observer;
use crate::transport::calls::Calls;
use crate::transport::grpc::requests::{BudgetLayer, BudgetLimits, PtxdRoutes, RequestBudget};
use crate::transport::grpc::PtxdService;
use crate::transport::refusals::RefusalLayer;

/// Why the daemon could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("a live ptxd already answers on {0}")]
    AlreadyRunning(PathBuf),
    #[error("{0} exists and is not a socket; refusing to replace it")]
    NotASocket(PathBuf),
    #[error("cannot listen on {path}: {error}")]
    Bind { path: String, error: std::io::Error },
    #[error("--tcp {0} is not a loopback address; pass --tcp-allow-remote to bind it (no authentication!)")]
    RemoteTcp(SocketAddr),
    #[error(transparent)]
    Start(#[from] StartError),
    #[error("reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("signal handling: {0}")]
    Signal(std::io::Error),
    #[error("metrics: {0}")]
    Metrics(#[from] crate::metrics::MetricsError),
    #[error("configuration: {0}")]
    Config(String),
    #[error(transparent)]
    UnsafeSocketDir(#[from] ptxd_ipc::socket_dir::SocketDirError),
}

/// Binds the Unix socket, replacing a stale socket file.
pub fn bind_unix(path: &Path, mode: u32) -> Result<UnixListener, ServeError> {
    let bind_error = |error| ServeError::Bind {
        path: path.display().to_string(),
        error,
    };
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(ServeError::AlreadyRunning(path.to_path_buf()));
            }
            tracing::info!(path = %path.display(), "replacing a stale socket file");
            std::fs::remove_file(path).map_err(bind_error)?;
        }
        Ok(_) => return Err(ServeError::NotASocket(path.to_path_buf())),
        Err(_) => {}
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(bind_error)?;
    }
    let listener = UnixListener::bind(path).map_err(bind_error)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(bind_error)?;
    Ok(listener)
}

type PtxdRouter = tonic::transport::server::Router<
    tower::layer::util::Stack<
        BudgetLayer,
        tower::layer::util::Stack<RefusalLayer, tower::layer::util::Identity>,
    >,
>;

/// Creates the default socket's directory (mode 0700) when it is missing,
/// and refuses one that another user could have planted or may write into.
fn prepare_default_socket_dir(socket: &Path) -> Result<(), ServeError> {
    use std::os::unix::fs::DirBuilderExt;
    let Some(dir) = socket.parent().filter(|p| !p.as_os_str().is_empty()) else {
        return Ok(());
    };
    if std::fs::symlink_metadata(dir).is_err() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|error| ServeError::Bind {
                path: dir.display().to_string(),
                error,
            })?;
    }
    ptxd_ipc::socket_dir::check_socket_dir(dir, nix::unistd::geteuid().as_raw())?;
    Ok(())
}

fn router(
    front: &Arc<Front>,
    observer: Observer,
    config: &ServeConfig,
    health: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
) -> Result<PtxdRouter, ServeError> {
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(ptxd_proto::REFLECTION_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let limit = usize::try_from(config.max_request_bytes).unwrap_or(usize::MAX);
    let refusals = RefusalLayer::new(observer.clone());
    let service = PtxdRoutes::new(PtxdService::new(front.clone(), observer), limit);
    let budget = RequestBudget::new(BudgetLimits {
        max_request_bytes: config.max_request_bytes,
        max_buffered: config.max_buffered_request_bytes,
        max_buffered_per_peer: config.max_buffered_request_bytes_per_uid,
        read_timeout: config.request_read_timeout,
    });
    Ok(Server::builder()
        // Dead peers are found by keepalive (a dead client's Unix
        // connection also closes at once).
        .http2_keepalive_interval(Some(config.keepalive_interval))
        .http2_keepalive_timeout(Some(config.keepalive_timeout))
        .initial_stream_window_size(config.http2_stream_window)
        .initial_connection_window_size(config.http2_connection_window)
        .max_concurrent_streams(config.max_concurrent_streams)
        // Outermost, so that every status any layer or service makes is
        // seen: each refusal is logged and counted there, once.
        .layer(refusals)
        .layer(BudgetLayer::new(budget))
        .add_service(health)
        .add_service(reflection().build_v1()?)
        .add_service(reflection().build_v1alpha()?)
        .add_service(service))
}

/// The connection caps for this process's descriptor limit.
fn connection_limits(config: &ServeConfig, fd_limit: u64) -> ConnectionLimits {
    let to_usize = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    ConnectionLimits {
        max_connections: to_usize(config.max_connections.unwrap_or_else(|| {
            crate::connections::fd_budget(fd_limit, config.fd_socket_max_connections).connections
        })),
        max_per_peer: to_usize(config.max_connections_per_uid),
        handshake_timeout: config.handshake_timeout,
    }
}

/// Says so when the limits let clients hold more descriptors than the
/// limit leaves once the reserve is kept (the defaults do only under a
/// descriptor limit of 512 or less, too small for every share).
fn warn_if_over_the_fd_budget(config: &ServeConfig, fd_limit: u64, max_connections: usize) {
    let budget = crate::connections::fd_budget(fd_limit, config.fd_socket_max_connections);
    let fd_buffers = config.max_fd_buffers.unwrap_or(budget.fd_buffers);
    let held = (max_connections as u64)
        .saturating_add(fd_buffers)
        .saturating_add(config.fd_socket_max_connections.saturating_mul(2));
    if held > crate::connections::usable_fds(fd_limit) {
        tracing::warn!(
            fd_limit,
            max_connections,
            max_fd_buffers = fd_buffers,
            fd_socket_max_connections = config.fd_socket_max_connections,
            "clients may hold more descriptors than the limit leaves after the reserve for \
             executor respawns: raise LimitNOFILE or lower these"
        );
    }
}

/// The fd socket's caps.
fn fd_socket_limits(config: &ServeConfig) -> crate::transport::packet::FdSocketLimits {
    let to_usize = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    crate::transport::packet::FdSocketLimits {
        max_connections: to_usize(config.fd_socket_max_connections),
        max_per_uid: to_usize(config.fd_socket_max_connections_per_uid),
        idle_timeout: config.fd_socket_idle_timeout,
    }
}

async fn wait_for_stop(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Installs the SIGTERM/SIGINT handlers now (a signal that arrives before
/// the returned future is polled still drains instead of killing ptxd).
fn termination() -> Result<impl std::future::Future<Output = &'static str>, ServeError> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).map_err(ServeError::Signal)?;
    let mut int = signal(SignalKind::interrupt()).map_err(ServeError::Signal)?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    })
}

/// How long connections get to send their last answers once the executors
/// have stopped, before they are cut.
const FLUSH_GRACE: Duration = Duration::from_secs(5);

/// Runs the daemon until SIGTERM/SIGINT. `activated` is the listening
/// socket systemd handed over (socket activation); without one, ptxd binds
/// `--socket` itself.
pub async fn serve(
    config: ServeConfig,
    activated: Option<std::os::unix::net::UnixListener>,
) -> Result<(), ServeError> {
    if config.max_buffered_request_bytes_per_uid < config.max_request_bytes
        || config.max_buffered_request_bytes < config.max_buffered_request_bytes_per_uid
    {
        return Err(ServeError::Config(format!(
            "need --max-request-bytes ({}) <= --max-buffered-request-bytes-per-uid ({}) <= \
             --max-buffered-request-bytes ({})",
            config.max_request_bytes,
            config.max_buffered_request_bytes_per_uid,
            config.max_buffered_request_bytes
        )));
    }
    if config.fd_socket_idle_timeout.is_zero() {
        return Err(ServeError::Config(
            "--fd-socket-idle-timeout must be more than 0".into(),
        ));
    }
    let fd_limit = crate::connections::raise_fd_limit();
    let connections = ConnectionTable::new(connection_limits(&config, fd_limit.soft));
    warn_if_over_the_fd_budget(&config, fd_limit.soft, connections.limits().max_connections);
    tracing::info!(
        fd_limit = fd_limit.soft,
        max_connections = connections.limits().max_connections,
        max_connections_per_uid = connections.limits().max_per_peer,
        "connection limits"
    );
    let terminated = termination()?;
    let socket_path = config.socket_path();
    if activated.is_none() && config.socket.is_none() {
        prepare_default_socket_dir(&socket_path)?;
    }
    // Fail before starting executors if another daemon owns the socket.
    if activated.is_none()
        && std::fs::symlink_metadata(&socket_path).is_ok()
        && std::os::unix::net::UnixStream::connect(&socket_path).is_ok()
    {
        return Err(ServeError::AlreadyRunning(socket_path));
    }
    let metrics_listener = match config.metrics {
        Some(addr) => Some(crate::metrics::bind(addr, config.metrics_allow_remote).await?),
        None => None,
    };
    let tcp = match config.tcp {
        Some(addr) if !addr.ip().is_loopback() && !config.tcp_allow_remote => {
            return Err(ServeError::RemoteTcp(addr))
        }
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .map_err(|error| ServeError::Bind {
                    path: addr.to_string(),
                    error,
                })?,
        ),
        None => None,
    };

    let metrics = metrics_listener
        .as_ref()
        .map(|_| crate::metrics::Metrics::new(config.slots));
    let observer = Observer::new(metrics.clone());
    let front = Front::start(&config, observer.clone()).await?;
    if let Some(metrics) = &metrics {
        let weak = Arc::downgrade(&front);
        metrics.set_refresh(move |m| {
            if let Some(front) = weak.upgrade() {
                let gauges = front.gauges();
                m.set_sessions(gauges.sessions);
                m.set_buffers(gauges.buffers, gauges.buffer_bytes);
                m.set_slots_used(gauges.slots_used);
                m.set_loaded_bytes(gauges.loaded_bytes, gauges.loaded_bytes_limit);
                for (uuid, generation, _) in &gauges.devices {
                    m.set_generation(uuid, *generation);
                }
                for (uuid, enabled) in &gauges.mps {
                    m.set_mps_enabled(uuid, *enabled);
                }
                for (uuid, available) in &gauges.available {
                    m.set_executor_available(uuid, *available);
                }
            }
        });
    }

    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_service_status("", ServingStatus::Serving)
        .await;
    health_reporter
        .set_service_status(ptxd_proto::SERVICE_NAME, ServingStatus::Serving)
        .await;
    let mut availability = front.availability();
    let reporter = health_reporter.clone();
    tokio::spawn(async move {
        loop {
            let status = if *availability.borrow_and_update() {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            reporter
                .set_service_status(ptxd_proto::SERVICE_NAME, status)
                .await;
            if availability.changed().await.is_err() {
                break;
            }
        }
    });

    let router = router(&front, observer.clone(), &config, health_service)?;
    // An activated socket belongs to systemd: ptxd neither binds nor
    // removes it.
    let owns_socket = activated.is_none();
    let bind_fd_socket = |path: &Path| {
        crate::transport::packet::bind_fd_socket(path, config.socket_mode).map_err(|error| {
            ServeError::Bind {
                path: path.display().to_string(),
                error,
            }
        })
    };
    // The fd socket sits beside whichever socket serves gRPC (an activated
    // one included), so that a client finds it from the path it dials. When
    // ptxd binds both, the fd socket listens first: a client that reached
    // the gRPC socket finds the fd socket listening too.
    let (listener, fd_socket_path, fd_listener) = match activated {
        Some(listener) => {
            listener
                .set_nonblocking(true)
                .map_err(|error| ServeError::Bind {
                    path: "LISTEN_FDS".into(),
                    error,
                })?;
            let listener = UnixListener::from_std(listener).map_err(|error| ServeError::Bind {
                path: "LISTEN_FDS".into(),
                error,
            })?;
            let grpc_path = listener
                .local_addr()
                .ok()
                .and_then(|a| a.as_pathname().map(Path::to_path_buf))
                .unwrap_or_else(|| socket_path.clone());
            let fd_socket_path = ptxd_ipc::packet::fd_socket_path(&grpc_path);
            let fd_listener = bind_fd_socket(&fd_socket_path)?;
            (listener, fd_socket_path, fd_listener)
        }
        None => {
            let fd_socket_path = ptxd_ipc::packet::fd_socket_path(&socket_path);
            if let Some(parent) = socket_path.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent).map_err(|error| ServeError::Bind {
                    path: parent.display().to_string(),
                    error,
                })?;
            }
            // Checked again here (bind_unix checks too): the fd socket file
            // is replaced when it binds, and must not be a live daemon's.
            if std::os::unix::net::UnixStream::connect(&socket_path).is_ok() {
                return Err(ServeError::AlreadyRunning(socket_path));
            }
            let fd_listener = bind_fd_socket(&fd_socket_path)?;
            match bind_unix(&socket_path, config.socket_mode) {
                Ok(listener) => (listener, fd_socket_path, fd_listener),
                Err(error) => {
                    let _ = std::fs::remove_file(&fd_socket_path);
                    return Err(error);
                }
            }
        }
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut servers = tokio::task::JoinSet::new();
    // Among the servers the drain waits for: on stop the fd socket takes no
    // more packets and ends once the exchanges it read are answered.
    let fd_socket = crate::transport::packet::serve(
        fd_listener,
        Calls::new(front.clone(), observer),
        front.spinners(),
        fd_socket_limits(&config),
        front.stream_drain_grace(),
        wait_for_stop(stop_rx.clone()),
    );
    // Apart from the gRPC servers: at the drain deadline these are cut
    // off, while the fd socket's connections answer what they read until
    // the executors have stopped (a connection reset under a call it read
    // would tell the client it was never read).
    let mut packets = tokio::task::JoinSet::new();
    packets.spawn(fd_socket);
    if let (Some(listener), Some(metrics)) = (metrics_listener, metrics) {
        tracing::info!(addr = ?listener.local_addr().ok(), "serving metrics");
        let stop = wait_for_stop(stop_rx.clone());
        tokio::spawn(async move {
            if let Err(e) = crate::metrics::serve(listener, metrics, stop).await {
                tracing::error!(error = %e, "metrics endpoint stopped");
            }
        });
    }
    servers.spawn(router.clone().serve_with_incoming_shutdown(
        Incoming::new(listener, connections.clone()),
        wait_for_stop(stop_rx.clone()),
    ));
    if let Some(tcp) = tcp {
        let addr = tcp.local_addr().ok();
        tracing::info!(?addr, "listening on TCP");
        servers.spawn(router.serve_with_incoming_shutdown(
            Incoming::new(tcp, connections.clone()),
            wait_for_stop(stop_rx),
        ));
    }
    tracing::info!(socket = %socket_path.display(), fd_socket = %fd_socket_path.display(), backend = front.backend, boot = %front.boot, "ptxd serving");

    let signal = tokio::select! {
        signal = terminated => signal,
        Some(ended) = servers.join_next() => {
            tracing::error!(?ended, "a listener stopped unexpectedly");
            "listener failure"
        }
        Some(ended) = packets.join_next() => {
            tracing::error!(?ended, "the fd socket stopped unexpectedly");
            "listener failure"
        }
    };
    tracing::info!(signal, timeout = ?config.drain_timeout, "draining");
    front.begin_drain(signal);
    health_reporter
        .set_service_status("", ServingStatus::NotServing)
        .await;
    health_reporter
        .set_service_status(ptxd_proto::SERVICE_NAME, ServingStatus::NotServing)
        .await;
    // Give lease streams a moment to carry the drain notice, then end them
    // so that graceful shutdown is not held open by idle leases.
    tokio::time::sleep(Duration::from_millis(50)).await;
    front.end_leases();
    let _ = stop_tx.send(true);
    let drained = tokio::time::timeout(config.drain_timeout, async {
        while servers.join_next().await.is_some() {}
        while packets.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            "in-flight calls outlived the drain timeout; stopping the executors under them"
        );
    }
    // The executors stop first, with every listener's connections still
    // open: a launch that never started is answered NOT_RUN (the client
    // sees DRAINING), one that was running fails, and each answer can
    // still reach its caller. Cutting the connections first would turn
    // those answers into broken pipes, which tell a client nothing.
    front.shutdown(Duration::from_secs(5)).await;
    // The executors are gone: every call read on any transport has its
    // answer (or its failure); give the connections time to send them
    // (milliseconds when idle; seconds on a loaded machine, and a connection
    // cut here turns a stream's final status into a transport error).
    let answered = tokio::time::timeout(FLUSH_GRACE, async {
        while servers.join_next().await.is_some() {}
        while packets.join_next().await.is_some() {}
    })
    .await;
    if answered.is_err() {
        tracing::warn!(
            grace = ?FLUSH_GRACE,
            "connections still open after the executors stopped; cutting them"
        );
        servers.abort_all();
        packets.abort_all();
    }
    if owns_socket {
        if let Err(e) = std::fs::remove_file(&socket_path) {
            tracing::warn!(error = %e, "cannot remove the socket file");
        }
    }
    if let Err(e) = std::fs::remove_file(&fd_socket_path) {
        tracing::warn!(error = %e, "cannot remove the fd socket file");
    }
    tracing::info!("ptxd stopped");
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stale_socket_is_replaced_and_a_live_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        {
            let _stale = std::os::unix::net::UnixListener::bind(&path).unwrap();
        }
        // The listener is closed: the file is stale.
        let live = bind_unix(&path, 0o660).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o660);
        assert!(matches!(
            bind_unix(&path, 0o660),
            Err(ServeError::AlreadyRunning(_))
        ));
        drop(live);
        let file = dir.path().join("plain");
        std::fs::write(&file, b"x").unwrap();
        assert!(matches!(
            bind_unix(&file, 0o660),
            Err(ServeError::NotASocket(_))
        ));
        assert!(file.exists());
    }
}
