//! The SDK against an in-process fake ptxd served over a Unix socket: the
//! connection, the session lease (open, events, drop ends it, the daemon
//! ending it), refusal decoding end to end, launch streams, and the
//! stale-kernel automatic reload.
//!
//! The fake implements only what the SDK's behaviour depends on; every
//! request it sees is recorded so the tests can assert what went on the wire.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ptxd_client::{Client, Error, Launch, LoadOptions, Refusal, SessionEvent, SessionOptions};
use ptxd_proto::v1 as pb;
use ptxd_proto::v1::ptxd_server::{Ptxd, PtxdServer};
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic::{Request, Response, Status};
use tonic_types::{ErrorDetails, StatusExt};

const WAIT: Duration = Duration::from_secs(5);

fn refusal(code: tonic::Code, reason: &str, message: &str, metadata: &[(&str, &str)]) -> Status {
    let metadata: HashMap<String, String> = metadata
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Status::with_error_details(
        code,
        message,
        ErrorDetails::with_error_info(reason, "ptxd", metadata),
    )
}

#[derive(Default)]
struct State {
    next_id: u64,
    /// Open sessions and the sender of their lease stream.
    leases: HashMap<String, mpsc::Sender<Result<pb::SessionEvent, Status>>>,
    /// Sessions whose lease stream the fake saw end, with how it ended.
    ended: Vec<String>,
    closed: Vec<String>,
    loads: Vec<pb::LoadKernelRequest>,
    /// Kernel handles that launches refuse as STALE_KERNEL.
    stale: HashSet<String>,
    /// Refuse kernel loads after this many (as SLOT_BANK_FULL).
    max_loads: Option<usize>,
    /// Kernel handles of every unary launch, in order.
    launches: Vec<String>,
    registrations: Vec<pb::RegisterBufferRequest>,
}

#[derive(Clone, Default)]
struct Fake {
    state: Arc<Mutex<State>>,
    lease_ended: Arc<tokio::sync::Notify>,
    daemon_ends: Arc<tokio::sync::Notify>,
}

impl Fake {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    fn check_session(&self, session: &str) -> Result<(), Status> {
        if self.state().leases.contains_key(session) {
            Ok(())
        } else {
            Err(refusal(
                tonic::Code::NotFound,
                "UNKNOWN_SESSION",
                "no open session with that id",
                &[],
            ))
        }
    }

    fn fresh(&self, prefix: &str) -> String {
        let mut state = self.state();
        state.next_id += 1;
        format!("{prefix}-{}", state.next_id)
    }

    fn launch_outcome(&self, request: &pb::LaunchRequest) -> Result<(), Status> {
        self.check_session(&request.session)?;
        if self.state().stale.contains(&request.kernel) {
            return Err(refusal(
                tonic::Code::FailedPrecondition,
                "STALE_KERNEL",
                "the kernel's device generation is dead; reload it",
                &[("kernel", &request.kernel)],
            ));
        }
        Ok(())
    }

    /// Sends `event` on every open lease.
    async fn broadcast(&self, event: pb::session_event::Event) {
        let leases: Vec<_> = self.state().leases.values().cloned().collect();
        for lease in leases {
            let message = pb::SessionEvent {
                event: Some(event.clone()),
            };
            lease.send(Ok(message)).await.unwrap();
        }
    }

    /// Ends every lease from the daemon's side.
    fn end_all_leases(&self) {
        self.state().leases.clear();
        self.daemon_ends.notify_waiters();
    }
}

type EventStream = ReceiverStream<Result<pb::SessionEvent, Status>>;
type LaunchReplies = ReceiverStream<Result<pb::LaunchResponse, Status>>;

#[tonic::async_trait]
impl Ptxd for Fake {
    async fn get_info(
        &self,
        _: Request<pb::GetInfoRequest>,
    ) -> Result<Response<pb::GetInfoResponse>, Status> {
        Ok(Response::new(pb::GetInfoResponse {
            version: "9.9.9-fake".into(),
            backend: "host".into(),
            devices: vec![pb::Device {
                uuid: "HOST-0".into(),
                name: "fake".into(),
                generation: 7,
                available: true,
                ..Default::default()
            }],
            slots_used: 3,
            limits: Some(pb::Limits {
                slots: 64,
                ..Default::default()
            }),
            sessions: self.state().leases.len() as u32,
            boot_id: "b007".into(),
            ..Default::default()
        }))
    }

    type OpenSessionStream = EventStream;

    async fn open_session(
        &self,
        request: Request<pb::OpenSessionRequest>,
    ) -> Result<Response<EventStream>, Status> {
        let session = self.fresh(&format!("session-{}", request.into_inner().label));
        let (tx, rx) = mpsc::channel(8);
        let opened = pb::session_event::Event::Opened(pb::SessionOpened {
            session: session.clone(),
            boot_id: "b007".into(),
        });
        tx.send(Ok(pb::SessionEvent {
            event: Some(opened),
        }))
        .await
        .unwrap();
        self.state().leases.insert(session.clone(), tx.clone());
        let fake = self.clone();
        let daemon_ends = self.daemon_ends.clone();
        tokio::spawn(async move {
            tokio::select! {
                // Resolves when the client cancels the stream or the
                // connection drops: the server then drops the receiving side.
                _ = tx.closed() => {
                    fake.state().ended.push(session.clone());
                    fake.state().leases.remove(&session);
                    fake.lease_ended.notify_waiters();
                }
                // The daemon ends the lease: every sender must go.
                _ = daemon_ends.notified() => {}
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn close_session(
        &self,
        request: Request<pb::CloseSessionRequest>,
    ) -> Result<Response<pb::CloseSessionResponse>, Status> {
        let session = request.into_inner().session;
        self.check_session(&session)?;
        let mut state = self.state();
        state.closed.push(session.clone());
        state.leases.remove(&session);
        let kernels = state.loads.iter().filter(|l| l.session == session).count();
        let buffers = state
            .registrations
            .iter()
            .filter(|r| r.session == session)
            .count();
        Ok(Response::new(pb::CloseSessionResponse {
            buffers_released: buffers as u32,
            kernels_released: kernels as u32,
            events_released: 0,
        }))
    }

    async fn load_kernel(
        &self,
        request: Request<pb::LoadKernelRequest>,
    ) -> Result<Response<pb::LoadKernelResponse>, Status> {
        let request = request.into_inner();
        self.check_session(&request.session)?;
        if request.symbol == "from_the_future" {
            return Err(refusal(tonic::Code::Internal, "FROM_THE_FUTURE", "?", &[]));
        }
        let loads_so_far = self.state().loads.len();
        if self
            .state()
            .max_loads
            .is_some_and(|max| loads_so_far >= max)
        {
            return Err(refusal(
                tonic::Code::ResourceExhausted,
                "SLOT_BANK_FULL",
                "every slot is held",
                &[("capacity", "1")],
            ));
        }
        let kernel = self.fresh("kernel");
        let cache_hit = self
            .state()
            .loads
            .iter()
            .any(|l| l.artifact == request.artifact);
        self.state().loads.push(request);
        Ok(Response::new(pb::LoadKernelResponse {
            kernel,
            signature: Some(pb::KernelSignature {
                inputs: 2,
                element_sizes: vec![4, 4, 4],
                scalar_params: 0,
                block_size: 256,
                reqntid: 0,
                maxntid: 0,
                contract: String::new(),
                ring_launchable: true,
            }),
            cache_hit,
            load_micros: 1234,
            device_uuid: "HOST-0".into(),
            generation: 7,
            ring_index: 1,
        }))
    }

    async fn unload_kernel(
        &self,
        _: Request<pb::UnloadKernelRequest>,
    ) -> Result<Response<pb::UnloadKernelResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }

    async fn list_kernels(
        &self,
        request: Request<pb::ListKernelsRequest>,
    ) -> Result<Response<pb::ListKernelsResponse>, Status> {
        self.check_session(&request.into_inner().session)?;
        Ok(Response::new(pb::ListKernelsResponse { kernels: vec![] }))
    }

    async fn register_buffer(
        &self,
        request: Request<pb::RegisterBufferRequest>,
    ) -> Result<Response<pb::RegisterBufferResponse>, Status> {
        let request = request.into_inner();
        self.check_session(&request.session)?;
        let buffer = self.fresh("buffer");
        self.state().registrations.push(request);
        Ok(Response::new(pb::RegisterBufferResponse {
            buffer,
            device_uuid: "HOST-0".into(),
            generation: 7,
            ring_index: 1,
            ..Default::default()
        }))
    }

    async fn release_buffer(
        &self,
        _: Request<pb::ReleaseBufferRequest>,
    ) -> Result<Response<pb::ReleaseBufferResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }

    async fn list_buffers(
        &self,
        _: Request<pb::ListBuffersRequest>,
    ) -> Result<Response<pb::ListBuffersResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }

    async fn register_event(
        &self,
        _: Request<pb::RegisterEventRequest>,
    ) -> Result<Response<pb::RegisterEventResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }

    async fn release_event(
        &self,
        _: Request<pb::ReleaseEventRequest>,
    ) -> Result<Response<pb::ReleaseEventResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }

    async fn launch(
        &self,
        request: Request<pb::LaunchRequest>,
    ) -> Result<Response<pb::LaunchResponse>, Status> {
        let request = request.into_inner();
        self.state().launches.push(request.kernel.clone());
        self.launch_outcome(&request)?;
        Ok(Response::new(pb::LaunchResponse {
            tag: request.tag,
            micros: request.n,
            error: None,
        }))
    }

    async fn open_ring(
        &self,
        _: Request<pb::OpenRingRequest>,
    ) -> Result<Response<pb::OpenRingResponse>, Status> {
        Err(Status::unimplemented("the fake daemon has no launch ring"))
    }

    type LaunchStreamStream = LaunchReplies;

    async fn launch_stream(
        &self,
        request: Request<tonic::Streaming<pb::LaunchRequest>>,
    ) -> Result<Response<LaunchReplies>, Status> {
        let mut requests = request.into_inner();
        let (tx, rx) = mpsc::channel(8);
        let fake = self.clone();
        tokio::spawn(async move {
            while let Ok(Some(request)) = requests.message().await {
                let error = fake.launch_outcome(&request).err().map(|status| {
                    let info = status.get_details_error_info().unwrap();
                    pb::LaunchError {
                        code: status.code() as i32,
                        reason: info.reason,
                        message: status.message().to_owned(),
                        metadata: info.metadata,
                    }
                });
                let reply = pb::LaunchResponse {
                    tag: request.tag,
                    micros: request.n,
                    error,
                };
                if tx.send(Ok(reply)).await.is_err() {
                    break;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

struct Harness {
    fake: Fake,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

async fn serve() -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ptxd.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let fake = Fake::default();
    let service = PtxdServer::new(fake.clone());
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(UnixListenerStream::new(listener))
            .await
            .unwrap();
    });
    Harness {
        fake,
        socket,
        _dir: dir,
    }
}

impl Harness {
    async fn client(&self) -> Client {
        Client::connect_unix(&self.socket).await.unwrap()
    }
}

const PTX: &str = ".version 8.0\n.target sm_90\n// add_f32_scalar stand-in";

#[tokio::test]
async fn connects_over_a_unix_socket_and_reads_info() {
    let harness = serve().await;
    for target in [
        format!("unix:{}", harness.socket.display()),
        harness.socket.display().to_string(),
    ] {
        let client = Client::connect(&target).await.unwrap();
        let info = client.info().await.unwrap();
        assert_eq!(info.version, "9.9.9-fake");
        assert_eq!(info.backend, "host");
        assert_eq!(info.devices.len(), 1);
        assert_eq!(info.devices[0].uuid, "HOST-0");
        assert_eq!(info.devices[0].generation, 7);
        assert_eq!(info.slots_used, 3);
        assert_eq!(info.limits.slots, 64);
        assert_eq!(info.boot_id, "b007");
    }
}

#[tokio::test]
async fn dropping_a_session_ends_its_lease_on_the_daemon() {
    let harness = serve().await;
    let client = harness.client().await;
    let session = client.open_session("drop").await.unwrap();
    let id = session.id().to_owned();
    assert!(id.starts_with("session-drop-"), "{id}");
    assert_eq!(session.boot_id(), "b007");
    assert!(session.is_open());
    assert!(
        !format!("{session:?}").contains(&id),
        "Debug leaks the session id"
    );
    assert!(harness.fake.state().leases.contains_key(&id));
    assert!(harness.fake.state().ended.is_empty());

    let ended = harness.fake.lease_ended.notified();
    drop(session);
    tokio::time::timeout(WAIT, ended)
        .await
        .expect("the fake never saw the lease end");
    assert_eq!(harness.fake.state().ended, vec![id.clone()]);
    assert!(
        harness.fake.state().closed.is_empty(),
        "drop must not need CloseSession"
    );
    // The connection outlives the session.
    client.info().await.unwrap();
}

#[tokio::test]
async fn close_sends_the_session_id_and_reports_releases() {
    let harness = serve().await;
    let client = harness.client().await;
    let session = client.open_session("close").await.unwrap();
    let id = session.id().to_owned();
    session
        .load_ptx(0, PTX, "add_f32_scalar", LoadOptions::default())
        .await
        .unwrap();
    session
        .register_host_shm("/some-tensor", 4096, Some("HOST-0"))
        .await
        .unwrap();
    let report = session.close().await.unwrap();
    assert_eq!(report.kernels_released, 1);
    assert_eq!(report.buffers_released, 1);
    assert_eq!(harness.fake.state().closed, vec![id.clone()]);

    let registration = harness.fake.state().registrations[0].clone();
    assert_eq!(registration.session, id);
    assert_eq!(registration.size, 4096);
    match registration.source {
        Some(pb::register_buffer_request::Source::HostShm(shm)) => {
            assert_eq!(shm.name, "/some-tensor");
            assert_eq!(shm.device_uuid, "HOST-0");
        }
        other => panic!("wrong source {other:?}"),
    }
}

#[tokio::test]
async fn lease_events_reach_the_session_and_a_daemon_side_end_closes_it() {
    let harness = serve().await;
    let client = harness.client().await;
    let session = client.open_session("events").await.unwrap();
    let mut events = session.events();

    harness
        .fake
        .broadcast(pb::session_event::Event::ExecutorRestarted(
            pb::ExecutorRestarted {
                device_uuid: "HOST-0".into(),
                old_generation: 7,
                new_generation: 8,
                cause: "KERNEL_FAULT".into(),
            },
        ))
        .await;
    let event = tokio::time::timeout(WAIT, events.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        event,
        SessionEvent::ExecutorRestarted {
            device_uuid: "HOST-0".into(),
            old_generation: 7,
            new_generation: 8,
            cause: "KERNEL_FAULT".into(),
        }
    );
    harness
        .fake
        .broadcast(pb::session_event::Event::Draining(pb::Draining {
            reason: "shutdown".into(),
        }))
        .await;
    let event = tokio::time::timeout(WAIT, events.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        event,
        SessionEvent::Draining {
            reason: "shutdown".into()
        }
    );

    harness.fake.end_all_leases();
    tokio::time::timeout(WAIT, session.closed()).await.unwrap();
    assert!(!session.is_open());
    let event = tokio::time::timeout(WAIT, events.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(event, SessionEvent::Ended { .. }), "{event:?}");
    let error = session
        .load_ptx(0, PTX, "add_f32_scalar", LoadOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(error, Error::SessionClosed), "{error:?}");
}

async fn loaded(
    harness: &Harness,
    auto_reload: bool,
) -> (ptxd_client::Session, ptxd_client::Kernel, Launch) {
    let client = harness.client().await;
    let options = SessionOptions::new("stale").auto_reload_stale(auto_reload);
    let session = client.open_session_with(options).await.unwrap();
    let load_options = LoadOptions {
        label: "adder".into(),
        declared: Some(ptxd_client::DeclaredAbi {
            inputs: 2,
            scalar_params: 0,
            element_size: 0,
        }),
    };
    let kernel = session
        .load_ptx("HOST-0", PTX, "add_f32_scalar", load_options)
        .await
        .unwrap();
    let a = session.register_host_shm("/a", 64, None).await.unwrap();
    let out = session.register_host_shm("/out", 64, None).await.unwrap();
    let launch = Launch::new([a.operand(), a.at(4)], out.operand(), 15);
    (session, kernel, launch)
}

#[tokio::test]
async fn a_stale_kernel_is_reloaded_and_the_launch_retried_with_the_new_handle() {
    let harness = serve().await;
    let (session, kernel, launch) = loaded(&harness, true).await;
    let first = kernel.handle();
    assert_eq!(kernel.state().load_micros, 1234);
    assert!(!kernel.state().cache_hit);
    harness.fake.state().stale.insert(first.clone());

    let launched = session.launch(&kernel, &launch).await.unwrap();
    assert!(launched.reloaded);
    assert_eq!(launched.micros, 15);

    let second = kernel.handle();
    assert_ne!(second, first);
    assert_eq!(kernel.reloads(), 1);
    assert!(
        kernel.state().cache_hit,
        "the fake saw the same artifact again"
    );
    assert_eq!(harness.fake.state().launches, vec![first, second.clone()]);
    let loads = harness.fake.state().loads.clone();
    assert_eq!(loads.len(), 2);
    assert_eq!(
        loads[0], loads[1],
        "the reload must repeat the original load exactly"
    );
    assert_eq!(loads[1].symbol, "add_f32_scalar");
    assert_eq!(loads[1].label, "adder");
    assert_eq!(loads[1].artifact, PTX.as_bytes());
    assert_eq!(loads[1].kind, pb::ArtifactKind::Ptx as i32);
    assert_eq!(
        loads[1].device.clone().unwrap().selector,
        Some(pb::device_selector::Selector::Uuid("HOST-0".into()))
    );
    assert_eq!(loads[1].declared.unwrap().inputs, 2);

    // A fresh handle launches without a reload.
    let launched = session.launch(&kernel, &launch).await.unwrap();
    assert!(!launched.reloaded);
    assert_eq!(kernel.reloads(), 1);
    assert_eq!(harness.fake.state().launches.last(), Some(&second));
}

#[tokio::test]
async fn concurrent_stale_launches_reload_once() {
    let harness = serve().await;
    let (session, kernel, launch) = loaded(&harness, true).await;
    harness.fake.state().stale.insert(kernel.handle());
    let (a, b, c) = tokio::join!(
        session.launch(&kernel, &launch),
        session.launch(&kernel, &launch),
        session.launch(&kernel, &launch),
    );
    for result in [a, b, c] {
        result.unwrap();
    }
    assert_eq!(kernel.reloads(), 1);
    assert_eq!(harness.fake.state().loads.len(), 2);
}

#[tokio::test]
async fn without_auto_reload_a_stale_kernel_is_a_typed_refusal() {
    let harness = serve().await;
    let (session, kernel, launch) = loaded(&harness, false).await;
    let first = kernel.handle();
    harness.fake.state().stale.insert(first.clone());
    let error = session.launch(&kernel, &launch).await.unwrap_err();
    let Error::Refused(Refusal::StaleKernel(details)) = &error else {
        panic!("expected a stale-kernel refusal, got {error:?}");
    };
    assert_eq!(details.code, tonic::Code::FailedPrecondition);
    assert_eq!(details.metadata.get("kernel"), Some(&first));
    assert_eq!(error.reason_name(), "STALE_KERNEL");
    assert_eq!(harness.fake.state().launches, vec![first.clone()]);
    assert_eq!(harness.fake.state().loads.len(), 1);

    // An explicit reload swaps the handle.
    session.reload(&kernel).await.unwrap();
    assert_ne!(kernel.handle(), first);
    session.launch(&kernel, &launch).await.unwrap();
}

#[tokio::test]
async fn a_failed_reload_is_returned_and_not_retried() {
    let harness = serve().await;
    let (session, kernel, launch) = loaded(&harness, true).await;
    let first = kernel.handle();
    {
        let mut state = harness.fake.state();
        state.stale.insert(first.clone());
        state.max_loads = Some(1);
    }
    let error = session.launch(&kernel, &launch).await.unwrap_err();
    assert!(
        matches!(&error, Error::Refused(Refusal::SlotBankFull(d)) if d.metadata["capacity"] == "1"),
        "{error:?}"
    );
    assert_eq!(
        kernel.handle(),
        first,
        "a failed reload keeps the old handle"
    );
    assert_eq!(kernel.reloads(), 0);
    assert_eq!(harness.fake.state().launches, vec![first]);
}

#[tokio::test]
async fn an_unknown_reason_stays_a_status() {
    let harness = serve().await;
    let session = harness.client().await.open_session("future").await.unwrap();
    let error = session
        .load_ptx(0, PTX, "from_the_future", LoadOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&error, Error::Status(s) if s.code() == tonic::Code::Internal),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_launch_stream_answers_in_order_and_survives_a_refusal() {
    let harness = serve().await;
    let (session, kernel, launch) = loaded(&harness, false).await;
    let stale = session
        .load_ptx(0, "other", "add_f32_scalar", LoadOptions::default())
        .await
        .unwrap();
    harness.fake.state().stale.insert(stale.handle());

    let mut stream = session.launch_stream().await.unwrap();
    let mut sent = Vec::new();
    for (i, k) in [&kernel, &stale, &kernel].into_iter().enumerate() {
        let mut launch = launch.clone();
        launch.n = 100 + i as u64;
        sent.push(stream.send(k, &launch).await.unwrap());
    }
    assert_eq!(sent, vec![1, 2, 3]);
    let mut replies = Vec::new();
    for _ in 0..3 {
        replies.push(
            tokio::time::timeout(WAIT, stream.next())
                .await
                .unwrap()
                .unwrap()
                .unwrap(),
        );
    }
    assert_eq!(replies.iter().map(|r| r.tag).collect::<Vec<_>>(), sent);
    assert_eq!(replies[0].outcome.as_ref().unwrap().micros, 100);
    assert!(matches!(
        &replies[1].outcome,
        Err(Error::Refused(Refusal::StaleKernel(d))) if d.code == tonic::Code::FailedPrecondition
    ));
    assert_eq!(replies[2].outcome.as_ref().unwrap().micros, 102);

    // Closing the sending half ends the stream cleanly.
    let (sender, mut receiver) = stream.split();
    drop(sender);
    let end = tokio::time::timeout(WAIT, receiver.next())
        .await
        .unwrap()
        .unwrap();
    assert!(end.is_none());
}
