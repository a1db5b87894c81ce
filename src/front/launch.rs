//! Launch over gRPC: resolve the session's kernel, run the launch checks
//! ([`crate::launch::check`]) against the session's registry entries, and
//! hand the checked launch to the kernel's executor.
//!
//! Invariants:
//! - A launch reaches an executor only after the launch checks passed it,
//!   under the state lock, against the same state the launch is sent from.
//! - A launch holds its session's `inflight` guard from its check until its
//!   reply, so the session's executor stream is closed only after it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ptxd_proto::executor as exec;

use super::kernels::stale_kernel;
use super::{parse_session, Front, State};
use crate::error::Error;
use crate::executor::supervisor::ExecutorLink;
use crate::executor::ExecutorError;
use crate::handles::{BufferHandle, EventHandle, KernelRef, SessionId};
use crate::launch::{
    self, BufferCap, Capabilities, EventCap, KernelCap, LaunchShape, Placement, ScalarArg,
};
use crate::sessions::{Caller, SessionError};
use crate::slots::SlotError;

/// One operand of a launch: a buffer handle and a byte offset into it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperandRef {
    pub buffer: String,
    pub offset: u64,
}

/// Launch.
#[derive(Debug, Clone, Default)]
pub struct LaunchRequest {
    pub session: String,
    pub kernel: String,
    pub inputs: Vec<OperandRef>,
    pub output: Option<OperandRef>,
    pub n: u64,
    /// The kernel's scalars, narrowed to f32 for the scalar ABI.
    pub params: Vec<f64>,
    /// The kernel's typed scalar args (empty when it passes `params`).
    pub args: Vec<ScalarArg>,
    /// Empty: none.
    pub wait_event: String,
    /// Empty: none.
    pub signal_event: String,
    /// Answer only once the kernel finished.
    pub sync: bool,
}

/// Held by a launch from its check until its reply (see `Session::inflight`).
type InflightLaunch = tokio::sync::OwnedRwLockReadGuard<()>;

/// A session's view of its registry entries, for the launch checks.
struct SessionView<'a> {
    state: &'a State,
    session: &'a SessionId,
}

impl Capabilities for SessionView<'_> {
    type Operand = OperandRef;
    type Event = str;
    type Error = Error;

    fn operand(&self, operand: &OperandRef) -> Result<(BufferCap, u64), Error> {
        let handle = BufferHandle::parse(&operand.buffer)?;
        let entry = self
            .state
            .registry
            .buffer_for_launch(self.session, handle, &operand.buffer)?;
        // `buffer_for_launch` passes only open mappings.
        let generation = entry.open_in.ok_or_else(|| Error::Internal {
            message: "a live buffer without a generation".into(),
        })?;
        let cap = BufferCap {
            id: entry.id.0,
            size: entry.size,
            placement: Placement {
                device_index: entry.device_index,
                generation,
            },
        };
        Ok((cap, operand.offset))
    }

    fn event(&self, text: &str) -> Result<EventCap, Error> {
        let handle = EventHandle::parse(text)?;
        let entry = self
            .state
            .registry
            .event_for_launch(self.session, handle, text)?;
        let generation = entry.open_in.ok_or_else(|| Error::Internal {
            message: "a live event without a generation".into(),
        })?;
        Ok(EventCap {
            id: entry.id.0,
            placement: Placement {
                device_index: entry.device_index,
                generation,
            },
        })
    }

    fn describe(&self, placement: Placement) -> String {
        match self.state.devices.get(placement.device_index) {
            Some(device) => device.at_generation(placement.generation),
            None => format!("device {}@{}", placement.device_index, placement.generation),
        }
    }
}

impl Front {
    /// Launch: checks every operand, then hands the launch to the executor.
    /// Returns how long the daemon took.
    pub async fn launch(&self, request: &LaunchRequest, peer: Caller) -> Result<Duration, Error> {
        let started = Instant::now();
        let (link, launch, _inflight) = self.check_launch(request, peer)?;
        link.launch(launch).await?;
        Ok(started.elapsed())
    }

    fn check_launch(
        &self,
        request: &LaunchRequest,
        peer: Caller,
    ) -> Result<(Arc<ExecutorLink>, exec::Launch, InflightLaunch), Error> {
        let session_id = parse_session(&request.session)?;
        let handle = KernelRef::parse(&request.kernel)?;
        let state = self.lock();
        state.refuse_if_draining()?;
        let session = state.session(&session_id, peer)?;
        self.executor.kernel_timeouts.check(session.stream)?;
        let internal = (handle.boot == self.boot)
            .then(|| session.kernels.get(handle.token))
            .flatten()
            .ok_or_else(|| stale_kernel(&request.kernel, self.boot, &handle))?;
        let kernel = state
            .slots
            .resolve(&internal, &session_id, State::is_live(&state.devices))
            .map_err(|why| SlotError::Stale {
                handle: request.kernel.chars().take(96).collect(),
                why,
            })?;
        let view = SessionView {
            state: &state,
            session: &session_id,
        };
        let shape = LaunchShape {
            inputs: &request.inputs,
            output: request.output.as_ref(),
            n: request.n,
            scalars: request.params.len(),
            wait: (!request.wait_event.is_empty()).then_some(request.wait_event.as_str()),
            signal: (!request.signal_event.is_empty()).then_some(request.signal_event.as_str()),
        };
        let placement = Placement {
            device_index: kernel.device_index,
            generation: kernel.generation,
        };
        let cap = KernelCap {
            signature: &launch::BoundContract {
                contract: &kernel.contract,
                block: kernel.block_size,
            },
            placement,
        };
        let checked = launch::check_with_args(&view, cap, &shape, &request.args)?;
        let device = state
            .devices
            .get(kernel.device_index)
            .ok_or_else(|| Error::Internal {
                message: "kernel names a device the front does not have".into(),
            })?;
        let link = device
            .live_link()
            .filter(|l| l.generation == kernel.generation)
            .cloned()
            .ok_or_else(|| {
                Error::from(ExecutorError::Unavailable {
                    device: device.desc.uuid.clone(),
                    cause: "down".into(),
                })
            })?;
        let operand = |o: launch::CheckedOperand| exec::LaunchOperand {
            buffer_id: o.buffer_id,
            offset: o.offset,
        };
        let (params, args) = executor_scalars(request);
        let launch = exec::Launch {
            module_id: kernel.module_id,
            inputs: checked.inputs.into_iter().map(operand).collect(),
            output: Some(operand(checked.output)),
            n: request.n,
            params,
            args,
            stream: session.stream,
            wait_event: checked.wait_event.unwrap_or(0),
            signal_event: checked.signal_event.unwrap_or(0),
            sync: request.sync,
        };
        let inflight =
            session
                .inflight
                .clone()
                .try_read_owned()
                .map_err(|_| SessionError::Unknown {
                    session: session_id.to_string(),
                })?;
        Ok((link, launch, inflight))
    }
}

/// The launch's scalars as the executor takes them: f32 `params` when every
/// scalar is an f32 (the scalar ABI's path, byte for byte the same whether
/// the client sent `params` or f32 `args`), else each typed arg's bits
/// zero-extended to 64. The checks have matched them to the kernel.
fn executor_scalars(request: &LaunchRequest) -> (Vec<f32>, Vec<u64>) {
    let f32s: Option<Vec<f32>> = request
        .args
        .iter()
        .map(|a| match a {
            ScalarArg::F32(v) => Some(*v),
            _ => None,
        })
        .collect();
    match f32s {
        Some(f32s) if !f32s.is_empty() => (f32s, Vec::new()),
        Some(_) => (
            // The scalar ABI's params are f32; doubles narrow with rounding
            // (out-of-range magnitudes become infinities, as in C).
            request.params.iter().map(|&p| p as f32).collect(),
            Vec::new(),
        ),
        None => (Vec::new(), request.args.iter().map(|a| a.bits()).collect()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn f32_args_reach_the_executor_as_params_and_others_as_bits() {
        let mut request = LaunchRequest {
            params: vec![1.5, 1e300],
            ..Default::default()
        };
        assert_eq!(
            executor_scalars(&request),
            (vec![1.5, f32::INFINITY], vec![])
        );
        request.params.clear();
        request.args = vec![ScalarArg::F32(-2.25), ScalarArg::F32(f32::NAN)];
        let (params, args) = executor_scalars(&request);
        assert!(args.is_empty());
        assert_eq!(params[0], -2.25);
        assert_eq!(params[1].to_bits(), f32::NAN.to_bits());
        request.args = vec![
            ScalarArg::U32(7),
            ScalarArg::F32(-1.0),
            ScalarArg::I32(-1),
            ScalarArg::I64(-2),
            ScalarArg::F64(0.5),
        ];
        assert_eq!(
            executor_scalars(&request),
            (
                vec![],
                vec![
                    7,
                    u64::from((-1.0f32).to_bits()),
                    0xffff_ffff,
                    (-2i64) as u64,
                    0.5f64.to_bits()
                ]
            )
        );
    }
}
