//! `ptxd device-plugin` against a fake kubelet that speaks the vendored
//! kubelet device-plugin API (`v1beta1`) over Unix sockets, as the real one
//! does: it serves `Registration` on `kubelet.sock`, then dials the plugin's
//! endpoint for `GetDevicePluginOptions`, `ListAndWatch`, `Allocate` and
//! `GetPreferredAllocation`; it restarts as the kubelet does (its socket
//! re-created, the plugins' sockets removed) and sees the plugin register
//! again.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ptxd_proto::deviceplugin::v1beta1 as api;
use rand::seq::SliceRandom;
use rand::Rng;
use tokio::sync::mpsc;
use tonic::transport::{Endpoint, Server, Uri};
use tonic::{Request, Response, Status};

use api::device_plugin_client::DevicePluginClient;
use api::registration_server::{Registration, RegistrationServer};

use crate::support::Daemon;
use crate::PTXD;

/// The kubelet's side of registration: hands every request to the test.
struct FakeKubelet {
    registered: mpsc::UnboundedSender<api::RegisterRequest>,
}

#[tonic::async_trait]
impl Registration for FakeKubelet {
    async fn register(
        &self,
        request: Request<api::RegisterRequest>,
    ) -> Result<Response<api::Empty>, Status> {
        let request = request.into_inner();
        if request.version != api::VERSION {
            return Err(Status::invalid_argument("unsupported version"));
        }
        let _ = self.registered.send(request);
        Ok(Response::new(api::Empty {}))
    }
}

/// A running fake kubelet: its registration socket and what it received.
struct Kubelet {
    registered: mpsc::UnboundedReceiver<api::RegisterRequest>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<()>,
}

impl Kubelet {
    fn start(dir: &Path) -> Kubelet {
        let listener = tokio::net::UnixListener::bind(dir.join(api::KUBELET_SOCKET)).unwrap();
        let (tx, registered) = mpsc::unbounded_channel();
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            Server::builder()
                .add_service(RegistrationServer::new(FakeKubelet { registered: tx }))
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::UnixListenerStream::new(listener),
                    async {
                        let _ = stop_rx.await;
                    },
                )
                .await
                .unwrap();
        });
        Kubelet {
            registered,
            stop: Some(stop),
            server,
        }
    }

    async fn next_registration(&mut self) -> api::RegisterRequest {
        tokio::time::timeout(Duration::from_secs(20), self.registered.recv())
            .await
            .expect("the plugin did not register within 20 s")
            .unwrap()
    }

    /// Stops as a kubelet restart does: its socket and the plugins' go.
    async fn stop(mut self, dir: &Path) {
        let _ = self.stop.take().unwrap().send(());
        self.server.await.unwrap();
        for entry in std::fs::read_dir(dir).unwrap() {
            std::fs::remove_file(entry.unwrap().path()).unwrap();
        }
    }
}

/// Dials the plugin's endpoint, as the kubelet does after a `Register`.
async fn dial(path: PathBuf) -> DevicePluginClient<tonic::transport::Channel> {
    let channel = Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
        .unwrap();
    DevicePluginClient::new(channel)
}

/// Kills the plugin when the test ends, however it ends.
struct Plugin(Child);

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Reads lists until one has every device at `health`; returns it.
async fn until_all(
    stream: &mut tonic::Streaming<api::ListAndWatchResponse>,
    health: &str,
) -> Vec<api::Device> {
    loop {
        let list = tokio::time::timeout(Duration::from_secs(20), stream.message())
            .await
            .unwrap_or_else(|_| panic!("no list with every device {health} within 20 s"))
            .unwrap()
            .expect("ListAndWatch ended");
        if list.devices.iter().all(|d| d.health == health) {
            return list.devices;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fake_kubelet_registers_lists_allocates_and_sees_re_registration() {
    let mut rng = rand::rng();
    let mut daemon = Daemon::start(&[]);
    let plugin_dir = tempfile::tempdir().unwrap();
    let count: u32 = rng.random_range(1..200);
    let host_dir = format!("/run/ptxd-{}", rng.random::<u32>());
    let container_dir = format!("/var/run/ptxd-{}", rng.random::<u32>());

    let mut kubelet = Kubelet::start(plugin_dir.path());
    let _plugin = Plugin(
        Command::new(PTXD)
            .arg("device-plugin")
            .arg("--socket")
            .arg(&daemon.socket)
            .args(["--host-socket-dir", &host_dir])
            .args(["--container-socket-dir", &container_dir])
            .arg("--plugin-dir")
            .arg(plugin_dir.path())
            .args(["--count", &count.to_string(), "--interval-ms", "50"])
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );

    let registration = kubelet.next_registration().await;
    assert_eq!(registration.version, "v1beta1");
    assert_eq!(registration.resource_name, "ptxd.dev/session");
    assert_eq!(registration.endpoint, "ptxd-device-plugin.sock");
    let options = registration.options.unwrap();
    assert!(!options.pre_start_required);
    assert!(options.get_preferred_allocation_available);

    let mut plugin = dial(plugin_dir.path().join(&registration.endpoint)).await;
    assert_eq!(
        plugin
            .get_device_plugin_options(api::Empty {})
            .await
            .unwrap()
            .into_inner(),
        options
    );
    let mut lists = plugin
        .list_and_watch(api::Empty {})
        .await
        .unwrap()
        .into_inner();
    let devices = until_all(&mut lists, "Healthy").await;
    let mut ids: Vec<String> = devices.iter().map(|d| d.id.clone()).collect();
    assert_eq!(ids.len(), count as usize);
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), count as usize, "device IDs repeat");

    // Allocate: per container, the socket directory mounted read-only and
    // PTXD_SOCKET inside it.
    ids.shuffle(&mut rng);
    let containers = rng.random_range(1..4usize);
    let requests: Vec<api::ContainerAllocateRequest> = (0..containers)
        .map(|_| api::ContainerAllocateRequest {
            devices_ids: ids[..rng.random_range(1..=ids.len())].to_vec(),
        })
        .collect();
    let allocated = plugin
        .allocate(api::AllocateRequest {
            container_requests: requests,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(allocated.container_responses.len(), containers);
    for response in &allocated.container_responses {
        assert_eq!(
            response.envs.get("PTXD_SOCKET").map(String::as_str),
            Some(format!("{container_dir}/ptxd.sock").as_str())
        );
        assert_eq!(response.envs.len(), 1);
        assert_eq!(
            response.mounts,
            [api::Mount {
                container_path: container_dir.clone(),
                host_path: host_dir.clone(),
                read_only: true,
            }]
        );
        assert!(response.devices.is_empty() && response.cdi_devices.is_empty());
    }
    // A device the plugin never advertised is refused.
    for unknown in [
        format!("ptxd-{count}"),
        "ptxd-00".to_owned(),
        "gpu-0".to_owned(),
    ] {
        let status = plugin
            .allocate(api::AllocateRequest {
                container_requests: vec![api::ContainerAllocateRequest {
                    devices_ids: vec![ids[0].clone(), unknown.clone()],
                }],
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{unknown}");
        assert!(status.message().contains(&unknown), "{status:?}");
    }

    // Preferred allocation: what must be included, then the available ones.
    let size = rng.random_range(1..=ids.len());
    let must = ids[..rng.random_range(0..=size)].to_vec();
    let preferred = plugin
        .get_preferred_allocation(api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: ids.iter().rev().cloned().collect(),
                must_include_device_i_ds: must.clone(),
                allocation_size: i32::try_from(size).unwrap(),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    let chosen = &preferred.container_responses[0].device_i_ds;
    assert_eq!(chosen.len(), size);
    assert_eq!(chosen[..must.len()], must[..]);
    let mut unique = chosen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), size);
    plugin
        .pre_start_container(api::PreStartContainerRequest {
            devices_ids: vec![ids[0].clone()],
        })
        .await
        .unwrap();

    // ptxd goes down: every device turns Unhealthy on the open stream.
    daemon.terminate();
    until_all(&mut lists, "Unhealthy").await;

    // The kubelet restarts: the plugin serves a fresh socket and registers
    // again; the new kubelet lists the devices (still Unhealthy).
    kubelet.stop(plugin_dir.path()).await;
    let mut kubelet = Kubelet::start(plugin_dir.path());
    let again = kubelet.next_registration().await;
    assert_eq!(again, registration);
    let mut plugin = dial(plugin_dir.path().join(&again.endpoint)).await;
    let mut lists = plugin
        .list_and_watch(api::Empty {})
        .await
        .unwrap()
        .into_inner();
    let devices = until_all(&mut lists, "Unhealthy").await;
    assert_eq!(devices.len(), count as usize);
}

/// A resource name the kubelet would refuse is refused before anything
/// starts.
#[test]
fn the_plugin_refuses_a_resource_name_the_kubelet_would() {
    for bad in ["session", "/session", "ptxd.dev/", "kubernetes.io/session"] {
        let output = Command::new(PTXD)
            .args([
                "device-plugin",
                "--resource",
                bad,
                "--plugin-dir",
                "/nonexistent",
            ])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(!output.status.success(), "{bad}");
        assert!(
            String::from_utf8_lossy(&output.stderr).starts_with("USAGE: --resource"),
            "{bad}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
