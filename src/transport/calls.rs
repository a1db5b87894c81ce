//! The calls more than one transport carries, each run one way: a unary
//! `Launch` and a `LoadKernel` arrive over gRPC and over the packet socket,
//! and a registration by descriptor is answered on the packet socket with
//! the message the RPC would have returned. Here the wire message becomes
//! the front's request, the front runs it, its metrics are observed, and
//! the answer becomes the wire message again.
//!
//! Invariants:
//! - A call is converted and observed the same whichever transport carried
//!   it: the same front verb, the same launch and load metrics, the same
//!   answer message. A refusal is returned, not recorded: the transport
//!   that sends it records it ([`super::refusals`]).
//! - Nothing here knows a transport: no tonic, no sockets.

use std::sync::Arc;
use std::time::Instant;

use ptxd_proto::v1 as api;

use crate::error::Error;
use crate::front::{
    ArtifactKind, DeclaredArtifactAbi, DeviceChoice, Front, LaunchRequest, LoadRequest,
    LoadedKernelInfo, OpenedRing, OperandRef, RegisteredBuffer,
};
use crate::launch::ScalarArg;
use crate::observe::Observer;
use crate::ptx::contract::LaunchContract;
use crate::ptx::Signature;
use crate::sessions::Caller;

/// The front and the observer, as every transport calls them.
#[derive(Debug, Clone)]
pub struct Calls {
    front: Arc<Front>,
    observer: Observer,
}

impl Calls {
    pub fn new(front: Arc<Front>, observer: Observer) -> Self {
        Calls { front, observer }
    }

    /// The front, for the verbs only one transport carries.
    pub fn front(&self) -> &Arc<Front> {
        &self.front
    }

    /// The observer, for the refusals a transport records.
    pub fn observer(&self) -> &Observer {
        &self.observer
    }

    /// A unary launch of `caller`: checked and run by the front; a launch
    /// that ran is observed with its latency.
    pub async fn launch(
        &self,
        caller: Caller,
        request: api::LaunchRequest,
    ) -> Result<api::LaunchResponse, Error> {
        let tag = request.tag;
        let request = launch_request(request)?;
        let started = Instant::now();
        let took = self.front.launch(&request, caller).await?;
        self.observer.launch(request.sync, started.elapsed());
        Ok(api::LaunchResponse {
            tag,
            micros: took.as_micros() as u64,
            error: None,
        })
    }

    /// A kernel load of `caller`; a load that succeeded is observed with
    /// its latency and whether the cache held it.
    pub async fn load(
        &self,
        caller: Caller,
        request: api::LoadKernelRequest,
    ) -> Result<api::LoadKernelResponse, Error> {
        let started = Instant::now();
        let loaded = self
            .front
            .load_kernel(load_request(request), caller)
            .await?;
        self.observer.load(loaded.cache_hit, started.elapsed());
        Ok(load_response(loaded))
    }
}

/// The device a request names.
pub fn device_choice(selector: Option<api::DeviceSelector>) -> DeviceChoice {
    use api::device_selector::Selector;
    match selector.and_then(|s| s.selector) {
        None => DeviceChoice::First,
        Some(Selector::Uuid(uuid)) => DeviceChoice::Uuid(uuid),
        Some(Selector::Ordinal(ordinal)) => DeviceChoice::Ordinal(ordinal),
    }
}

fn load_request(request: api::LoadKernelRequest) -> LoadRequest {
    let kind = match api::ArtifactKind::try_from(request.kind) {
        Ok(api::ArtifactKind::Ptx) => ArtifactKind::Ptx,
        Ok(api::ArtifactKind::Cubin) => ArtifactKind::Cubin,
        Ok(api::ArtifactKind::Fatbin) => ArtifactKind::Fatbin,
        Ok(api::ArtifactKind::Unspecified) | Err(_) => ArtifactKind::Unspecified,
    };
    LoadRequest {
        session: request.session,
        artifact: request.artifact,
        kind,
        symbol: request.symbol,
        label: request.label,
        declared: request.declared.map(|d| DeclaredArtifactAbi {
            inputs: d.inputs,
            scalar_params: d.scalar_params,
            element_size: d.element_size,
        }),
        device: device_choice(request.device),
    }
}

/// A kernel's signature, as a load and a listing answer it.
pub fn signature_proto(
    signature: &Signature,
    block_size: u32,
    contract: &LaunchContract,
) -> api::KernelSignature {
    api::KernelSignature {
        inputs: signature.inputs,
        element_sizes: signature.element_sizes.clone(),
        scalar_params: signature.scalar_params,
        block_size,
        reqntid: signature.reqntid.unwrap_or(0),
        maxntid: signature.maxntid.unwrap_or(0),
        contract: contract.to_string(),
        ring_launchable: crate::ring_check::launchable(contract),
    }
}

fn load_response(loaded: LoadedKernelInfo) -> api::LoadKernelResponse {
    api::LoadKernelResponse {
        signature: Some(signature_proto(
            &loaded.signature,
            loaded.block_size,
            &loaded.contract,
        )),
        kernel: loaded.kernel,
        cache_hit: loaded.cache_hit,
        load_micros: loaded.load_micros,
        device_uuid: loaded.device_uuid,
        generation: loaded.generation,
        ring_index: loaded.ring_index,
    }
}

/// A typed scalar argument as the launch checks take it; one without a
/// value is refused (`field=args`).
fn scalar_arg(arg: api::ScalarArg) -> Result<ScalarArg, Error> {
    use api::scalar_arg::Value;
    Ok(match arg.value {
        Some(Value::I32(v)) => ScalarArg::I32(v),
        Some(Value::U32(v)) => ScalarArg::U32(v),
        Some(Value::I64(v)) => ScalarArg::I64(v),
        Some(Value::U64(v)) => ScalarArg::U64(v),
        Some(Value::F32(v)) => ScalarArg::F32(v),
        Some(Value::F64(v)) => ScalarArg::F64(v),
        None => {
            return Err(Error::InvalidArgument {
                field: "args",
                message: "a scalar arg without a value (set one of i32, u32, i64, u64, f32, f64)"
                    .into(),
            })
        }
    })
}

/// A `LaunchRequest` as the front takes it (the one decoding for the
/// unary call, LaunchStream and the packet socket).
pub fn launch_request(request: api::LaunchRequest) -> Result<LaunchRequest, Error> {
    let operand = |o: api::Operand| OperandRef {
        buffer: o.buffer,
        offset: o.offset,
    };
    let args = request
        .args
        .into_iter()
        .map(scalar_arg)
        .collect::<Result<_, _>>()?;
    Ok(LaunchRequest {
        session: request.session,
        kernel: request.kernel,
        inputs: request.inputs.into_iter().map(operand).collect(),
        output: request.output.map(operand),
        n: request.n,
        params: request.params,
        args,
        wait_event: request.wait_event,
        signal_event: request.signal_event,
        sync: request.sync,
    })
}

/// An opened ring, as OpenRing and the packet socket answer it.
pub fn opened_ring(ring: OpenedRing) -> api::OpenRingResponse {
    api::OpenRingResponse {
        device_uuid: ring.device_uuid,
        generation: ring.generation,
        fd_token: String::new(),
        fd_token_ttl_ms: 0,
    }
}

/// A registered buffer, as RegisterBuffer and the packet socket answer it.
pub fn registered_buffer(buffer: RegisteredBuffer) -> api::RegisterBufferResponse {
    api::RegisterBufferResponse {
        buffer: buffer.buffer,
        device_uuid: buffer.device_uuid,
        generation: buffer.generation,
        ring_index: buffer.ring_index,
        fd_token: String::new(),
        fd_token_ttl_ms: 0,
    }
}
