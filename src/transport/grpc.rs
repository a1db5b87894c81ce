//! The gRPC transport: every `ptxd.v1.Ptxd` RPC over HTTP/2. Decode, call
//! the front, map the result. Nothing here decides anything; every rule
//! lives in the front and its modules, and every error becomes a status in
//! `error.rs` alone. The calls the packet socket carries too run through
//! [`super::calls`]. A refused call is recorded by the layer in
//! [`super::refusals`], from the status it returns; only a
//! `LaunchStream`'s per-request refusals, which travel inside OK messages,
//! are recorded here, through the same function.

pub mod requests;

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::{Stream, StreamExt};
use ptxd_proto::v1::{self as api, ptxd_server::Ptxd};
use tonic::transport::server::{TcpConnectInfo, UdsConnectInfo};
use tonic::{Request, Response, Status, Streaming};

use crate::config::{CacheScope, Limits};
use crate::error::Error;
use crate::front::{
    BufferListing, BufferOrigin, BufferRequest, EventRequest, Front, Info, KernelListing,
    Registration, RingOpening, RingRequest,
};
use crate::handles::SessionId;
use crate::observe::Observer;
use crate::sessions::{Caller, LeaseEvent, Peer};

use super::calls::{device_choice, opened_ring, registered_buffer, signature_proto, Calls};
use super::refusals::{self, Carrier};

/// How many launches of one `LaunchStream` may be in flight at once.
/// Responses still come back in request order.
pub const LAUNCH_STREAM_WINDOW: usize = 64;

/// A `LaunchStream` request as decoded: the request, or why it did not
/// decode and the tag to answer it with. ([`requests`]' codec produces
/// it.)
pub type DecodedLaunch = Result<api::LaunchRequest, (Error, u64)>;

/// The `ptxd.v1.Ptxd` service.
#[derive(Debug, Clone)]
pub struct PtxdService {
    front: Arc<Front>,
    calls: Calls,
}

impl PtxdService {
    pub fn new(front: Arc<Front>, observer: Observer) -> Self {
        PtxdService {
            calls: Calls::new(front.clone(), observer),
            front,
        }
    }
}

/// A handler's answer: the response, or the error as its status.
fn reply<T>(result: Result<T, Error>) -> Result<Response<T>, Status> {
    result.map(Response::new).map_err(|error| error.to_status())
}

/// Runs a state-changing verb to completion even if the client hangs up:
/// tonic drops a handler's future when its call is cancelled, and a verb
/// dropped between its executor call and its bookkeeping would leak what the
/// executor opened.
async fn detached<T: Send + 'static>(
    verb: impl std::future::Future<Output = Result<T, Error>> + Send + 'static,
) -> Result<T, Error> {
    tokio::spawn(verb).await.unwrap_or_else(|e| {
        Err(Error::Internal {
            message: format!("request task failed: {e}"),
        })
    })
}

/// Who is calling: a Unix-socket peer with its credentials, or a caller
/// without any (TCP), known only by its connection.
pub(crate) fn peer<T>(request: &Request<T>) -> Caller {
    let extensions = request.extensions();
    if let Some(cred) = extensions
        .get::<UdsConnectInfo>()
        .and_then(|info| info.peer_cred)
    {
        return Caller::Local(Peer {
            uid: cred.uid(),
            gid: cred.gid(),
            pid: cred.pid(),
        });
    }
    Caller::Remote {
        connection: extensions
            .get::<TcpConnectInfo>()
            .and_then(|info| info.remote_addr()),
    }
}

/// The lease stream of a session: ends the session when dropped, which
/// happens when the client cancels it, disconnects or dies.
struct LeaseStream {
    events: crate::lease::LeaseReceiver,
    lease: Option<(Arc<Front>, SessionId)>,
}

impl Stream for LeaseStream {
    type Item = Result<api::SessionEvent, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.events)
            .poll_next(cx)
            .map(|event| event.map(|e| Ok(lease_event(e))))
    }
}

impl Drop for LeaseStream {
    fn drop(&mut self) {
        if let Some((front, session)) = self.lease.take() {
            // Drop runs inside the server's runtime (the stream lives in a
            // tonic task); if the runtime is already gone, so is every
            // executor, and nothing is left to release.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let counts = front.release_session(&session).await;
                    tracing::debug!(%session, ?counts, "lease ended");
                });
            }
        }
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl Ptxd for PtxdService {
    async fn get_info(
        &self,
        request: Request<api::GetInfoRequest>,
    ) -> Result<Response<api::GetInfoResponse>, Status> {
        let info = self.front.info(peer(&request));
        Ok(Response::new(info_response(info)))
    }

    type OpenSessionStream = BoxStream<api::SessionEvent>;

    async fn open_session(
        &self,
        request: Request<api::OpenSessionRequest>,
    ) -> Result<Response<Self::OpenSessionStream>, Status> {
        let peer = peer(&request);
        let label = request.into_inner().label;
        match self.front.open_session(&label, peer) {
            Ok((id, events)) => {
                tracing::debug!(rpc = "OpenSession", session = %id, ?peer, "ok");
                let stream = LeaseStream {
                    events,
                    lease: Some((self.front.clone(), id)),
                };
                Ok(Response::new(Box::pin(stream)))
            }
            Err(e) => Err(e.to_status()),
        }
    }

    async fn close_session(
        &self,
        request: Request<api::CloseSessionRequest>,
    ) -> Result<Response<api::CloseSessionResponse>, Status> {
        let peer = peer(&request);
        let session = request.into_inner().session;
        let result = match SessionId::parse(&session) {
            Ok(id) => {
                let front = self.front.clone();
                detached(async move { front.close_session(&id, peer).await })
                    .await
                    .map(|c| api::CloseSessionResponse {
                        buffers_released: c.buffers,
                        kernels_released: c.kernels,
                        events_released: c.events,
                    })
            }
            Err(e) => Err(e.into()),
        };
        reply(result)
    }

    async fn load_kernel(
        &self,
        request: Request<api::LoadKernelRequest>,
    ) -> Result<Response<api::LoadKernelResponse>, Status> {
        let peer = peer(&request);
        let calls = self.calls.clone();
        let request = request.into_inner();
        reply(detached(async move { calls.load(peer, request).await }).await)
    }

    async fn unload_kernel(
        &self,
        request: Request<api::UnloadKernelRequest>,
    ) -> Result<Response<api::UnloadKernelResponse>, Status> {
        let peer = peer(&request);
        let request = request.into_inner();
        let front = self.front.clone();
        let result = detached(async move {
            front
                .unload_kernel(&request.session, &request.kernel, peer)
                .await
        })
        .await;
        reply(result.map(|slot_freed| api::UnloadKernelResponse { slot_freed }))
    }

    async fn list_kernels(
        &self,
        request: Request<api::ListKernelsRequest>,
    ) -> Result<Response<api::ListKernelsResponse>, Status> {
        let peer = peer(&request);
        reply(
            self.front
                .list_kernels(&request.into_inner().session, peer)
                .map(|kernels| api::ListKernelsResponse {
                    kernels: kernels.into_iter().map(kernel_info).collect(),
                }),
        )
    }

    async fn register_buffer(
        &self,
        request: Request<api::RegisterBufferRequest>,
    ) -> Result<Response<api::RegisterBufferResponse>, Status> {
        let peer = peer(&request);
        let front = self.front.clone();
        let request = buffer_request(request.into_inner());
        let result = detached(async move { front.register_buffer(request, peer).await }).await;
        reply(result.map(register_buffer_response))
    }

    async fn release_buffer(
        &self,
        request: Request<api::ReleaseBufferRequest>,
    ) -> Result<Response<api::ReleaseBufferResponse>, Status> {
        let peer = peer(&request);
        let request = request.into_inner();
        let front = self.front.clone();
        let result = detached(async move {
            front
                .release_buffer(&request.session, &request.buffer, peer)
                .await
        })
        .await;
        reply(result.map(|()| api::ReleaseBufferResponse {}))
    }

    async fn list_buffers(
        &self,
        request: Request<api::ListBuffersRequest>,
    ) -> Result<Response<api::ListBuffersResponse>, Status> {
        let peer = peer(&request);
        reply(
            self.front
                .list_buffers(&request.into_inner().session, peer)
                .map(|buffers| api::ListBuffersResponse {
                    buffers: buffers.into_iter().map(buffer_info).collect(),
                }),
        )
    }

    async fn register_event(
        &self,
        request: Request<api::RegisterEventRequest>,
    ) -> Result<Response<api::RegisterEventResponse>, Status> {
        let peer = peer(&request);
        let front = self.front.clone();
        let request = event_request(request.into_inner());
        let result = detached(async move { front.register_event(request, peer).await }).await;
        reply(result.map(|event| api::RegisterEventResponse { event }))
    }

    async fn release_event(
        &self,
        request: Request<api::ReleaseEventRequest>,
    ) -> Result<Response<api::ReleaseEventResponse>, Status> {
        let peer = peer(&request);
        let request = request.into_inner();
        let front = self.front.clone();
        let result = detached(async move {
            front
                .release_event(&request.session, &request.event, peer)
                .await
        })
        .await;
        reply(result.map(|()| api::ReleaseEventResponse {}))
    }

    async fn launch(
        &self,
        request: Request<api::LaunchRequest>,
    ) -> Result<Response<api::LaunchResponse>, Status> {
        let peer = peer(&request);
        reply(self.calls.launch(peer, request.into_inner()).await)
    }

    async fn open_ring(
        &self,
        request: Request<api::OpenRingRequest>,
    ) -> Result<Response<api::OpenRingResponse>, Status> {
        let peer = peer(&request);
        let request = request.into_inner();
        let request = RingRequest {
            session: request.session,
            shm_name: request.shm_name,
            device: device_choice(request.device),
            by_fd: request.by_fd,
        };
        let front = self.front.clone();
        let result = detached(async move { front.open_ring(request, peer).await }).await;
        reply(result.map(|opening| match opening {
            RingOpening::Opened(ring) => opened_ring(ring),
            RingOpening::AwaitingFd { token, ttl } => api::OpenRingResponse {
                fd_token: token,
                fd_token_ttl_ms: u32::try_from(ttl.as_millis()).unwrap_or(u32::MAX),
                ..Default::default()
            },
        }))
    }

    type LaunchStreamStream = BoxStream<api::LaunchResponse>;

    async fn launch_stream(
        &self,
        request: Request<Streaming<api::LaunchRequest>>,
    ) -> Result<Response<Self::LaunchStreamStream>, Status> {
        // Served by `requests::PtxdRoutes` with a codec that lets a message
        // that does not decode fail alone; this path is the generated one.
        let peer = peer(&request);
        let requests = request.into_inner().map(|item| item.map(Ok));
        Ok(Response::new(self.answer_launches(peer, requests)))
    }
}

impl PtxdService {
    /// Answers a `LaunchStream`, in request order. An item that did not
    /// decode is refused in its place (with its tag when it could be read)
    /// and the stream goes on; a transport error ends the stream with it.
    pub(crate) fn answer_launches(
        &self,
        peer: Caller,
        requests: impl Stream<Item = Result<DecodedLaunch, Status>> + Send + 'static,
    ) -> BoxStream<api::LaunchResponse> {
        let service = self.clone();
        // On drain, requests keep being answered (with DRAINING) for a grace
        // period; then the stream stops reading and ends with a DRAINING
        // status, after answering everything it read. A request without an
        // answer on such a stream was never read and never ran.
        let mut drain = self.front.draining();
        let grace = self.front.stream_drain_grace();
        let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cut_set = cut.clone();
        let drained = async move {
            if drain.wait_for(|d| *d).await.is_err() {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(grace).await;
            cut_set.store(true, std::sync::atomic::Ordering::SeqCst);
        };
        let ended = futures_util::stream::once(async move {
            cut.load(std::sync::atomic::Ordering::SeqCst)
                .then(|| Err(Error::Draining.to_status()))
        })
        .filter_map(std::future::ready);
        let responses = requests
            .take_until(drained)
            .map(move |item| {
                let service = service.clone();
                async move {
                    let request = match item? {
                        Ok(request) => request,
                        Err((error, tag)) => return Ok(service.stream_refusal(peer, tag, error)),
                    };
                    let tag = request.tag;
                    Ok(match service.calls.launch(peer, request).await {
                        Ok(response) => response,
                        Err(error) => service.stream_refusal(peer, tag, error),
                    })
                }
            })
            .buffered(LAUNCH_STREAM_WINDOW)
            .chain(ended);
        Box::pin(responses)
    }

    /// A `LaunchStream` answer that refuses one request, recorded here:
    /// it travels inside an OK message, which the refusal layer does not
    /// read.
    fn stream_refusal(&self, peer: Caller, tag: u64, error: Error) -> api::LaunchResponse {
        let observer = self.calls.observer();
        refusals::record_error(
            observer,
            "LaunchStream",
            Carrier::Http2,
            peer.into(),
            &error,
        );
        api::LaunchResponse {
            tag,
            micros: 0,
            error: Some(error.to_launch_error()),
        }
    }
}

// ----- conversions between the wire and the front's types ------------------

fn limits_proto(limits: &Limits) -> api::Limits {
    api::Limits {
        slots: limits.slots,
        max_artifact_bytes: limits.max_artifact_bytes,
        max_request_bytes: limits.max_request_bytes,
        max_sessions: limits.max_sessions,
        max_buffers_per_session: limits.max_buffers_per_session,
        max_kernels_per_session: limits.max_kernels_per_session,
        max_buffer_bytes_per_session: limits.max_buffer_bytes_per_session,
        max_events_per_session: limits.max_events_per_session,
        max_sessions_per_uid: limits.max_sessions_per_uid,
        max_slots_per_uid: limits.max_slots_per_uid,
        max_buffers_per_uid: limits.max_buffers_per_uid,
        max_loaded_bytes: limits.max_loaded_bytes,
        max_loaded_bytes_per_uid: limits.max_loaded_bytes_per_uid,
        max_loaded_bytes_per_session: limits.max_loaded_bytes_per_session,
    }
}

fn info_response(info: Info) -> api::GetInfoResponse {
    api::GetInfoResponse {
        version: env!("CARGO_PKG_VERSION").to_string(),
        backend: info.backend.to_string(),
        devices: info
            .devices
            .into_iter()
            .map(|d| api::Device {
                ordinal: d.ordinal,
                uuid: d.uuid,
                name: d.name,
                compute_major: d.compute_major,
                compute_minor: d.compute_minor,
                generation: d.generation,
                total_memory: d.total_memory,
                available: d.available,
                restarts: d.restarts,
                executor_pid: d.executor_pid,
                mps_enabled: d.mps_enabled,
            })
            .collect(),
        slots_used: info.slots_used,
        limits: Some(limits_proto(&info.limits)),
        sessions: info.sessions,
        boot_id: info.boot.to_string(),
        loaded_bytes: info.loaded_bytes,
        caller_usage: Some(api::Usage {
            sessions: info.caller_usage.sessions,
            slots: info.caller_usage.slots,
            buffers: info.caller_usage.buffers,
            loaded_bytes: info.caller_usage.loaded_bytes,
        }),
        kernel_cache_scope: match info.kernel_cache_scope {
            CacheScope::Node => "node".into(),
            CacheScope::Uid => "uid".into(),
        },
    }
}

fn lease_event(event: LeaseEvent) -> api::SessionEvent {
    use api::session_event::Event;
    let event = match event {
        LeaseEvent::Opened { session, boot } => Event::Opened(api::SessionOpened {
            session: session.to_string(),
            boot_id: boot.to_string(),
        }),
        LeaseEvent::ExecutorRestarted {
            device_uuid,
            old_generation,
            new_generation,
            cause,
        } => Event::ExecutorRestarted(api::ExecutorRestarted {
            device_uuid,
            old_generation,
            new_generation,
            cause,
        }),
        LeaseEvent::Draining { reason } => Event::Draining(api::Draining { reason }),
        LeaseEvent::ExecutorDown {
            device_uuid,
            generation,
            cause,
            failed_restarts,
            restart_error,
            retry_in,
        } => Event::ExecutorDown(api::ExecutorDown {
            device_uuid,
            generation,
            cause,
            failed_restarts,
            restart_error,
            retry_in_ms: u64::try_from(retry_in.as_millis()).unwrap_or(u64::MAX),
        }),
    };
    api::SessionEvent { event: Some(event) }
}

fn kernel_info(kernel: KernelListing) -> api::KernelInfo {
    api::KernelInfo {
        signature: Some(signature_proto(
            &kernel.signature,
            kernel.block_size,
            &kernel.contract,
        )),
        kernel: kernel.kernel,
        symbol: kernel.symbol,
        label: kernel.label,
        device_uuid: kernel.device_uuid,
        generation: kernel.generation,
        live: kernel.live,
        artifact_hash: kernel
            .artifact_hash
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect(),
        references: kernel.references,
    }
}

fn buffer_request(request: api::RegisterBufferRequest) -> BufferRequest {
    use api::register_buffer_request::Source;
    BufferRequest {
        session: request.session,
        label: request.label,
        size: request.size,
        origin: request.source.map(|source| match source {
            Source::CudaIpc(ipc) => BufferOrigin::CudaIpc {
                handle: ipc.handle,
                device_uuid: ipc.device_uuid,
            },
            Source::HostShm(shm) => BufferOrigin::HostShm {
                name: shm.name,
                device_uuid: shm.device_uuid,
            },
            Source::PosixFd(fd) => BufferOrigin::PosixFd {
                device_uuid: fd.device_uuid,
                offset: fd.offset,
                allocation_size: fd.allocation_size,
            },
        }),
    }
}

fn register_buffer_response(registration: Registration) -> api::RegisterBufferResponse {
    match registration {
        Registration::Registered(buffer) => registered_buffer(buffer),
        Registration::AwaitingFd { token, ttl } => api::RegisterBufferResponse {
            fd_token: token,
            fd_token_ttl_ms: u32::try_from(ttl.as_millis()).unwrap_or(u32::MAX),
            ..Default::default()
        },
    }
}

fn buffer_info(buffer: BufferListing) -> api::BufferInfo {
    api::BufferInfo {
        buffer: buffer.buffer,
        label: buffer.label,
        kind: buffer.kind.to_string(),
        device_uuid: buffer.device_uuid,
        size: buffer.size,
        generation: buffer.generation,
        live: buffer.live,
    }
}

fn event_request(request: api::RegisterEventRequest) -> EventRequest {
    EventRequest {
        session: request.session,
        label: request.label,
        handle: request.handle,
        device_uuid: request.device_uuid,
    }
}
