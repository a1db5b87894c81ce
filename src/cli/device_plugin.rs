//! `ptxd device-plugin`: a Kubernetes device plugin (kubelet device-plugin
//! API `v1beta1`, vendored in `proto/k8s/deviceplugin/v1beta1/api.proto`)
//! that hands ptxd's socket directory to the pods that request the extended
//! resource (`ptxd.dev/session` by default), so that they need no `hostPath`
//! volume and can run under Pod Security `restricted`.
//!
//! - It serves `DevicePlugin` on a Unix socket in the kubelet's
//!   device-plugin directory and `Register`s it with the kubelet's
//!   `kubelet.sock` there.
//! - It advertises `--count` identical devices; every one is `Healthy` while
//!   ptxd's gRPC health service reports `ptxd.v1.Ptxd` `SERVING`, and
//!   `Unhealthy` while ptxd is down, draining or has a device without an
//!   executor. `ListAndWatch` sends the list again on every change.
//! - `Allocate` answers, per container, a read-only mount of the node's
//!   socket directory and `PTXD_SOCKET` pointing at ptxd's socket in it.
//! - When the kubelet restarts it re-creates `kubelet.sock` and removes the
//!   plugins' sockets; the plugin notices either (polling every
//!   `--interval-ms`), serves on a fresh socket and registers again.

use std::collections::{BTreeSet, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::ExitCode;
use std::time::Duration;

use futures_util::Stream;
use ptxd_proto::deviceplugin::v1beta1 as api;
use tokio::sync::watch;
use tonic::transport::{Endpoint, Server, Uri};
use tonic::{Request, Response, Status};

use api::device_plugin_server::{DevicePlugin, DevicePluginServer};
use api::registration_client::RegistrationClient;

/// The file name of the plugin's own socket in the device-plugin directory.
pub const PLUGIN_SOCKET: &str = "ptxd-device-plugin.sock";

/// Arguments of `ptxd device-plugin`.
#[derive(Debug, Clone, clap::Args)]
pub struct DevicePluginArgs {
    /// ptxd's socket as this process sees it: its health is the devices'.
    #[arg(long, env = "PTXD_SOCKET", default_value = "/run/ptxd/ptxd.sock")]
    pub socket: PathBuf,
    /// The node's directory holding ptxd's sockets, which Allocate mounts
    /// (read-only) into each container that requests the resource.
    #[arg(long, default_value = "/run/ptxd")]
    pub host_socket_dir: PathBuf,
    /// Where containers see that directory; their PTXD_SOCKET is this
    /// directory joined with the file name of --socket.
    #[arg(long, default_value = "/run/ptxd")]
    pub container_socket_dir: PathBuf,
    /// The kubelet's device-plugin directory (its kubelet.sock, and where the
    /// plugin serves ptxd-device-plugin.sock).
    #[arg(long, default_value = api::DEVICE_PLUGIN_PATH)]
    pub plugin_dir: PathBuf,
    /// The extended resource pods request.
    #[arg(long, default_value = "ptxd.dev/session")]
    pub resource: String,
    /// How many devices to advertise: at most this many containers on the
    /// node hold the resource at once.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub count: u32,
    /// How often ptxd's health and the kubelet's socket are checked, in
    /// milliseconds.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    pub interval_ms: u64,
}

impl DevicePluginArgs {
    fn interval(&self) -> Duration {
        Duration::from_millis(self.interval_ms)
    }

    /// The ID of device `index`.
    fn device_id(index: u32) -> String {
        format!("ptxd-{index}")
    }

    /// PTXD_SOCKET inside a container.
    fn container_socket(&self) -> PathBuf {
        let name = self
            .socket
            .file_name()
            .map_or_else(|| "ptxd.sock".into(), ToOwned::to_owned);
        self.container_socket_dir.join(name)
    }
}

/// Runs the plugin until SIGTERM or SIGINT; prints one line per event to
/// stderr.
pub async fn run(args: DevicePluginArgs) -> ExitCode {
    if args.resource.split_once('/').is_none_or(|(domain, name)| {
        domain.is_empty() || name.is_empty() || domain.starts_with("kubernetes.io")
    }) {
        eprintln!(
            "USAGE: --resource {:?} must be an extended resource name, <domain>/<name>, outside kubernetes.io",
            args.resource
        );
        return ExitCode::FAILURE;
    }
    let (health_tx, health_rx) = watch::channel(false);
    tokio::spawn(watch_health(
        args.socket.clone(),
        args.interval(),
        health_tx,
    ));
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(e) => {
                eprintln!("IO: cannot handle SIGTERM: {e}");
                return ExitCode::FAILURE;
            }
        };
    let result = tokio::select! {
        result = serve_and_register(&args, health_rx) => result,
        _ = terminate.recv() => Ok(()),
        _ = tokio::signal::ctrl_c() => Ok(()),
    };
    // The kubelet sees the devices go with the socket.
    let _ = std::fs::remove_file(args.plugin_dir.join(PLUGIN_SOCKET));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// What identifies one incarnation of a socket file: a new file has a new
/// inode or at least a new change time.
type FileIdentity = (u64, u64, i64, i64);

fn identity(path: &Path) -> Option<FileIdentity> {
    std::fs::metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
}

/// Serves the plugin socket and registers it, again after every kubelet
/// restart. Returns only on an error that retrying cannot fix.
async fn serve_and_register(
    args: &DevicePluginArgs,
    health: watch::Receiver<bool>,
) -> Result<(), String> {
    let own_socket = args.plugin_dir.join(PLUGIN_SOCKET);
    let kubelet_socket = args.plugin_dir.join(api::KUBELET_SOCKET);
    loop {
        // A socket left by an earlier run (or one the kubelet has not yet
        // removed) would fail the bind.
        match std::fs::remove_file(&own_socket) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("IO: {}: {e}", own_socket.display())),
        }
        let listener = tokio::net::UnixListener::bind(&own_socket)
            .map_err(|e| format!("IO: bind {}: {e}", own_socket.display()))?;
        let plugin = Plugin {
            args: args.clone(),
            health: health.clone(),
        };
        let server = tokio::spawn(
            Server::builder()
                .add_service(DevicePluginServer::new(plugin))
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
        );
        let own_identity = identity(&own_socket);

        // Register, retrying while the kubelet is not there yet.
        let kubelet_identity = loop {
            let before = identity(&kubelet_socket);
            match register(args, &kubelet_socket).await {
                Ok(()) => {
                    eprintln!(
                        "registered {} ({} devices) with {}",
                        args.resource,
                        args.count,
                        kubelet_socket.display()
                    );
                    break before;
                }
                Err(e) => eprintln!("TRANSPORT: register with {}: {e}", kubelet_socket.display()),
            }
            tokio::time::sleep(args.interval()).await;
        };

        // Watch for a kubelet restart: a new kubelet.sock, or our socket gone.
        loop {
            tokio::time::sleep(args.interval()).await;
            let kubelet_now = identity(&kubelet_socket);
            if kubelet_now.is_some() && kubelet_now != kubelet_identity {
                eprintln!("kubelet.sock was re-created: the kubelet restarted; registering again");
                break;
            }
            if identity(&own_socket) != own_identity {
                eprintln!("{PLUGIN_SOCKET} was removed: registering again");
                break;
            }
        }
        // Not a graceful stop: it would wait for the old kubelet's
        // ListAndWatch streams, which end only with their connections.
        server.abort();
        let _ = server.await;
    }
}

/// One `Register` call on the kubelet's socket.
async fn register(args: &DevicePluginArgs, kubelet_socket: &Path) -> Result<(), String> {
    let path = kubelet_socket.to_owned();
    let channel = Endpoint::from_static("http://localhost")
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
        .map_err(|e| match std::error::Error::source(&e) {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        })?;
    RegistrationClient::new(channel)
        .register(api::RegisterRequest {
            version: api::VERSION.to_owned(),
            endpoint: PLUGIN_SOCKET.to_owned(),
            resource_name: args.resource.clone(),
            options: Some(options()),
        })
        .await
        .map_err(|status| format!("{:?}: {}", status.code(), status.message()))?;
    Ok(())
}

fn options() -> api::DevicePluginOptions {
    api::DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

/// Whether ptxd answers `ptxd.v1.Ptxd` `SERVING` on its health service.
async fn ptxd_serving(socket: &Path, timeout: Duration) -> bool {
    use tonic_health::pb::{
        health_check_response::ServingStatus, health_client::HealthClient, HealthCheckRequest,
    };
    let path = socket.to_owned();
    let check = async move {
        let channel = Endpoint::from_static("http://localhost")
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(path).await?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                }
            }))
            .await
            .ok()?;
        let response = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: "ptxd.v1.Ptxd".to_owned(),
            })
            .await
            .ok()?;
        Some(response.into_inner().status == ServingStatus::Serving as i32)
    };
    matches!(tokio::time::timeout(timeout, check).await, Ok(Some(true)))
}

/// Checks ptxd's health every `interval` and publishes changes.
async fn watch_health(socket: PathBuf, interval: Duration, health: watch::Sender<bool>) {
    let mut last = None;
    loop {
        let serving = ptxd_serving(&socket, interval.max(Duration::from_secs(1))).await;
        if last != Some(serving) {
            eprintln!(
                "ptxd at {} is {}: devices {}",
                socket.display(),
                if serving { "SERVING" } else { "not serving" },
                if serving {
                    api::HEALTHY
                } else {
                    api::UNHEALTHY
                }
            );
            last = Some(serving);
        }
        health.send_if_modified(|current| std::mem::replace(current, serving) != serving);
        if health.is_closed() {
            return;
        }
        tokio::time::sleep(interval).await;
    }
}

/// The `DevicePlugin` service.
#[derive(Debug)]
struct Plugin {
    args: DevicePluginArgs,
    health: watch::Receiver<bool>,
}

impl Plugin {
    fn devices(&self, healthy: bool) -> api::ListAndWatchResponse {
        let health = if healthy {
            api::HEALTHY
        } else {
            api::UNHEALTHY
        };
        api::ListAndWatchResponse {
            devices: (0..self.args.count)
                .map(|index| api::Device {
                    id: DevicePluginArgs::device_id(index),
                    health: health.to_owned(),
                    topology: None,
                })
                .collect(),
        }
    }

    fn check_ids<'a>(&self, ids: impl IntoIterator<Item = &'a String>) -> Result<(), Status> {
        for id in ids {
            let known = id
                .strip_prefix("ptxd-")
                .and_then(|index| index.parse::<u32>().ok())
                .is_some_and(|index| index < self.args.count && Self::canonical(id, index));
            if !known {
                return Err(Status::invalid_argument(format!(
                    "unknown device {id:?}: this plugin advertises ptxd-0 .. ptxd-{}",
                    self.args.count - 1
                )));
            }
        }
        Ok(())
    }

    /// `id` is exactly the ID of `index` (not `ptxd-007`).
    fn canonical(id: &str, index: u32) -> bool {
        id == DevicePluginArgs::device_id(index)
    }
}

type DeviceListStream =
    Pin<Box<dyn Stream<Item = Result<api::ListAndWatchResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl DevicePlugin for Plugin {
    async fn get_device_plugin_options(
        &self,
        _request: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream = DeviceListStream;

    async fn list_and_watch(
        &self,
        _request: Request<api::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let plugin = Plugin {
            args: self.args.clone(),
            health: self.health.clone(),
        };
        // The current list first, then one after every change of health.
        let stream =
            futures_util::stream::unfold((plugin, true), |(mut plugin, first)| async move {
                if !first && plugin.health.changed().await.is_err() {
                    return None;
                }
                let healthy = *plugin.health.borrow_and_update();
                Some((Ok(plugin.devices(healthy)), (plugin, false)))
            });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        let mut container_responses = Vec::new();
        for container in request.into_inner().container_requests {
            self.check_ids(&container.available_device_i_ds)?;
            self.check_ids(&container.must_include_device_i_ds)?;
            let size = usize::try_from(container.allocation_size).unwrap_or(0);
            // The devices are interchangeable: the ones that must be in, then
            // the available ones in order.
            let mut chosen: Vec<String> = Vec::new();
            let mut seen = BTreeSet::new();
            for id in container
                .must_include_device_i_ds
                .iter()
                .chain(&container.available_device_i_ds)
            {
                if chosen.len() >= size {
                    break;
                }
                if seen.insert(id) {
                    chosen.push(id.clone());
                }
            }
            container_responses.push(api::ContainerPreferredAllocationResponse {
                device_i_ds: chosen,
            });
        }
        Ok(Response::new(api::PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let mut container_responses = Vec::new();
        let socket = self.args.container_socket();
        for container in request.into_inner().container_requests {
            self.check_ids(&container.devices_ids)?;
            container_responses.push(api::ContainerAllocateResponse {
                envs: HashMap::from([("PTXD_SOCKET".to_owned(), socket.display().to_string())]),
                // Read-only suffices: connecting to a Unix socket is not a
                // write to its file system.
                mounts: vec![api::Mount {
                    container_path: self.args.container_socket_dir.display().to_string(),
                    host_path: self.args.host_socket_dir.display().to_string(),
                    read_only: true,
                }],
                devices: Vec::new(),
                annotations: HashMap::new(),
                cdi_devices: Vec::new(),
            });
        }
        Ok(Response::new(api::AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _request: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}
