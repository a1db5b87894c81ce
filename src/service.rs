//! The gRPC surface: decode, call the front, map the result. Nothing here
//! decides anything; every rule lives in the front and its modules, and
//! every error becomes a status in `error.rs` alone. A refused call is
//! logged and counted by the layer in `refusals`, from the status it
//! returns; only a `LaunchStream`'s per-request refusals, which travel
//! inside OK messages, are logged and counted here.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use futures_util::{Stream, StreamExt};
use ptxd_proto::v1::{self as api, ptxd_server::Ptxd};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{TcpConnectInfo, UdsConnectInfo};
use tonic::{Request, Response, Status, Streaming};

use crate::error::Error;
use crate::front::Front;
use crate::handles::SessionId;
use crate::observe::Observer;
use crate::sessions::{Caller, Peer};

/// How many launches of one `LaunchStream` may be in flight at once.
/// Responses still come back in request order.
pub const LAUNCH_STREAM_WINDOW: usize = 64;

/// The `ptxd.v1.Ptxd` service.
#[derive(Debug, Clone)]
pub struct PtxdService {
    front: Arc<Front>,
    observer: Observer,
}

impl PtxdService {
    pub fn new(front: Arc<Front>, observer: Observer) -> Self {
        PtxdService { front, observer }
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
    events: ReceiverStream<Result<api::SessionEvent, Status>>,
    lease: Option<(Arc<Front>, SessionId)>,
}

impl Stream for LeaseStream {
    type Item = Result<api::SessionEvent, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.events).poll_next(cx)
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
        Ok(Response::new(self.front.info(peer(&request))))
    }

    type OpenSessionStream = BoxStream<api::SessionEvent>;

    async fn open_session(
        &self,
        request: Request<api::OpenSessionRequest>,
    ) -> Result<Response<Self::OpenSessionStream>, Status> {
        let peer = peer(&request);
        let label = request.into_inner().label;
        match self.front.open_session(label, peer) {
            Ok((id, events)) => {
                tracing::debug!(rpc = "OpenSession", session = %id, ?peer, "ok");
                let stream = LeaseStream {
                    events: ReceiverStream::new(events),
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
        let started = Instant::now();
        let front = self.front.clone();
        let request = request.into_inner();
        let result = detached(async move { front.load_kernel(request, peer).await }).await;
        if let Ok(loaded) = &result {
            self.observer.load(loaded.cache_hit, started.elapsed());
        }
        reply(result)
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
        reply(result)
    }

    async fn list_kernels(
        &self,
        request: Request<api::ListKernelsRequest>,
    ) -> Result<Response<api::ListKernelsResponse>, Status> {
        let peer = peer(&request);
        reply(self.front.list_kernels(&request.into_inner().session, peer))
    }

    async fn register_buffer(
        &self,
        request: Request<api::RegisterBufferRequest>,
    ) -> Result<Response<api::RegisterBufferResponse>, Status> {
        let peer = peer(&request);
        let front = self.front.clone();
        let request = request.into_inner();
        let result = detached(async move { front.register_buffer(request, peer).await }).await;
        reply(result)
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
        reply(self.front.list_buffers(&request.into_inner().session, peer))
    }

    async fn register_event(
        &self,
        request: Request<api::RegisterEventRequest>,
    ) -> Result<Response<api::RegisterEventResponse>, Status> {
        let peer = peer(&request);
        let front = self.front.clone();
        let request = request.into_inner();
        let result = detached(async move { front.register_event(request, peer).await }).await;
        reply(result)
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
        let request = request.into_inner();
        let started = Instant::now();
        let result = self.front.launch(&request, peer).await;
        self.observe_launch(&request, &result, started);
        reply(result)
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
        requests: impl Stream<Item = Result<crate::requests::DecodedLaunch, Status>> + Send + 'static,
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
                        Err((error, tag)) => return Ok(service.stream_refusal(tag, error)),
                    };
                    let started = Instant::now();
                    let result = service.front.launch(&request, peer).await;
                    service.observe_launch(&request, &result, started);
                    Ok(match result {
                        Ok(response) => response,
                        Err(error) => service.stream_refusal(request.tag, error),
                    })
                }
            })
            .buffered(LAUNCH_STREAM_WINDOW)
            .chain(ended);
        Box::pin(responses)
    }

    /// A `LaunchStream` answer that refuses one request.
    fn stream_refusal(&self, tag: u64, error: Error) -> api::LaunchResponse {
        let refusal = error.refusal();
        self.observer.refusal(refusal.reason.wire_name());
        tracing::info!(
            rpc = "LaunchStream",
            reason = refusal.reason.wire_name(),
            message = %refusal.message,
            "refused"
        );
        api::LaunchResponse {
            tag,
            micros: 0,
            error: Some(error.to_launch_error()),
        }
    }

    fn observe_launch(
        &self,
        request: &api::LaunchRequest,
        result: &Result<api::LaunchResponse, Error>,
        started: Instant,
    ) {
        if result.is_ok() {
            self.observer.launch(request.sync, started.elapsed());
        }
    }
}
