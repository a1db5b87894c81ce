//! The SDK's plain data types: what callers pass in (device selectors,
//! artifacts, operands, launches) and what ptxd reports back (daemon info,
//! kernel and buffer listings), each converted from or to the wire once,
//! here.

use std::str::FromStr;

use ptxd_proto::v1 as pb;

use crate::error::Error;

/// Which device to load a kernel for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DeviceSelector {
    /// The device's UUID (`"GPU-…"`, or `"HOST-<n>"` on the host backend).
    /// Preferred across processes: ordinals depend on `CUDA_VISIBLE_DEVICES`.
    Uuid(String),
    /// ptxd's ordinal of the device.
    Ordinal(u32),
}

impl DeviceSelector {
    pub(crate) fn to_proto(&self) -> pb::DeviceSelector {
        use pb::device_selector::Selector;
        pb::DeviceSelector {
            selector: Some(match self {
                DeviceSelector::Uuid(uuid) => Selector::Uuid(uuid.clone()),
                DeviceSelector::Ordinal(ordinal) => Selector::Ordinal(*ordinal),
            }),
        }
    }
}

impl From<u32> for DeviceSelector {
    fn from(ordinal: u32) -> Self {
        DeviceSelector::Ordinal(ordinal)
    }
}

impl From<&str> for DeviceSelector {
    fn from(uuid: &str) -> Self {
        DeviceSelector::Uuid(uuid.to_owned())
    }
}

impl From<String> for DeviceSelector {
    fn from(uuid: String) -> Self {
        DeviceSelector::Uuid(uuid)
    }
}

impl FromStr for DeviceSelector {
    type Err = Error;

    /// All digits: an ordinal; anything else non-empty: a UUID.
    fn from_str(text: &str) -> Result<Self, Error> {
        let text = text.trim();
        if text.is_empty() {
            return Err(Error::InvalidInput("empty device selector".into()));
        }
        if text.bytes().all(|b| b.is_ascii_digit()) {
            return text
                .parse()
                .map(DeviceSelector::Ordinal)
                .map_err(|_| Error::InvalidInput(format!("device ordinal {text} is too large")));
        }
        Ok(DeviceSelector::Uuid(text.to_owned()))
    }
}

impl std::fmt::Display for DeviceSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceSelector::Uuid(uuid) => f.write_str(uuid),
            DeviceSelector::Ordinal(ordinal) => write!(f, "{ordinal}"),
        }
    }
}

/// A kernel artifact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Artifact {
    /// PTX text.
    Ptx(String),
    /// A cubin (ELF) for the device's architecture; needs a declared ABI.
    Cubin(Vec<u8>),
    /// A fatbin; needs a declared ABI.
    Fatbin(Vec<u8>),
}

impl Artifact {
    pub(crate) fn kind(&self) -> pb::ArtifactKind {
        match self {
            Artifact::Ptx(_) => pb::ArtifactKind::Ptx,
            Artifact::Cubin(_) => pb::ArtifactKind::Cubin,
            Artifact::Fatbin(_) => pb::ArtifactKind::Fatbin,
        }
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Artifact::Ptx(text) => text.as_bytes(),
            Artifact::Cubin(bytes) | Artifact::Fatbin(bytes) => bytes,
        }
    }
}

/// The ABI a caller expects a kernel to have; ptxd checks it against what it
/// verified (PTX) or takes it as the kernel's signature (cubin, fatbin).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeclaredAbi {
    /// Number of input pointers.
    pub inputs: u32,
    /// Number of trailing f32 scalar params.
    pub scalar_params: u32,
    /// Element size in bytes of every operand (cubin/fatbin only; 0 = unknown).
    pub element_size: u32,
}

impl DeclaredAbi {
    pub(crate) fn to_proto(self) -> pb::DeclaredAbi {
        pb::DeclaredAbi {
            inputs: self.inputs,
            scalar_params: self.scalar_params,
            element_size: self.element_size,
        }
    }
}

/// Options of a kernel load.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// A label for ptxd's listings and logs.
    pub label: String,
    /// The ABI the caller expects; `None` accepts what ptxd verifies (PTX).
    pub declared: Option<DeclaredAbi>,
}

/// The scalar-ABI signature ptxd verified for a kernel.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KernelSignature {
    /// Number of input pointers.
    pub inputs: u32,
    /// Element size in bytes of each operand: the inputs, then the output.
    pub element_sizes: Vec<u32>,
    /// Number of trailing f32 scalar params.
    pub scalar_params: u32,
    /// The block size ptxd launches with.
    pub block_size: u32,
    /// `.reqntid`, 0 when absent.
    pub reqntid: u32,
    /// `.maxntid`, 0 when absent.
    pub maxntid: u32,
    /// The launch contract ptxd checks every launch against, as one line
    /// (params, geometry, footprints, preconditions); empty from a daemon
    /// older than contracts.
    pub contract: String,
    /// Whether ptxd grants the kernel to launch rings (false from a daemon
    /// older than the field): decide ring eligibility from this, never
    /// from the contract's text.
    pub ring_launchable: bool,
}

impl From<pb::KernelSignature> for KernelSignature {
    fn from(s: pb::KernelSignature) -> Self {
        KernelSignature {
            inputs: s.inputs,
            element_sizes: s.element_sizes,
            scalar_params: s.scalar_params,
            block_size: s.block_size,
            reqntid: s.reqntid,
            maxntid: s.maxntid,
            contract: s.contract,
            ring_launchable: s.ring_launchable,
        }
    }
}

/// A buffer registered with a session. The registration lasts until
/// [`Session::release_buffer`](crate::Session::release_buffer) or the end of
/// the session; dropping this value releases nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Buffer {
    /// ptxd's opaque buffer handle.
    pub handle: String,
    /// The registered size in bytes; launches are bounds-checked against it.
    pub size: u64,
    /// The device the buffer is registered on.
    pub device_uuid: String,
    /// The device generation its mapping is open in.
    pub generation: u64,
    /// How the session's launch ring names it.
    pub ring_index: u32,
}

impl Buffer {
    /// An operand of this buffer starting at byte `offset`.
    pub fn at(&self, offset: u64) -> Operand {
        Operand {
            buffer: self.handle.clone(),
            offset,
        }
    }

    /// An operand of this buffer from its start.
    pub fn operand(&self) -> Operand {
        self.at(0)
    }
}

/// A launch operand: a registered buffer and a byte offset into it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operand {
    /// The buffer handle.
    pub buffer: String,
    /// Byte offset of the operand's first element.
    pub offset: u64,
}

impl Operand {
    pub(crate) fn to_proto(&self) -> pb::Operand {
        pb::Operand {
            buffer: self.buffer.clone(),
            offset: self.offset,
        }
    }
}

impl From<&Buffer> for Operand {
    fn from(buffer: &Buffer) -> Self {
        buffer.operand()
    }
}

/// A CUDA IPC event registered with a session, for ordering launches against
/// the session's own streams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// ptxd's opaque event handle.
    pub handle: String,
}

/// A typed by-value scalar argument of a launch ([`Launch::args`]). Its
/// type must be exactly the kernel's param type (`.s32` takes `I32`,
/// `.u32`/`.b32` `U32`, `.s64` `I64`, `.u64`/`.b64` `U64`, `.f32` `F32`,
/// `.f64` `F64`): ptxd converts nothing and refuses a mismatch
/// `SCALAR_ARGS_MISMATCH` naming the param, the expected and given types.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg {
    /// For an `.s32` param.
    I32(i32),
    /// For a `.u32` or `.b32` param.
    U32(u32),
    /// For an `.s64` param.
    I64(i64),
    /// For a `.u64` or `.b64` param.
    U64(u64),
    /// For an `.f32` param.
    F32(f32),
    /// For an `.f64` param.
    F64(f64),
}

impl Arg {
    pub(crate) fn to_proto(self) -> pb::ScalarArg {
        use pb::scalar_arg::Value;
        let value = match self {
            Arg::I32(v) => Value::I32(v),
            Arg::U32(v) => Value::U32(v),
            Arg::I64(v) => Value::I64(v),
            Arg::U64(v) => Value::U64(v),
            Arg::F32(v) => Value::F32(v),
            Arg::F64(v) => Value::F64(v),
        };
        pb::ScalarArg { value: Some(value) }
    }

    /// The argument a wire `ScalarArg` carries (`None`: it carries none).
    pub fn from_proto(arg: &pb::ScalarArg) -> Option<Arg> {
        use pb::scalar_arg::Value;
        Some(match arg.value? {
            Value::I32(v) => Arg::I32(v),
            Value::U32(v) => Arg::U32(v),
            Value::I64(v) => Arg::I64(v),
            Value::U64(v) => Arg::U64(v),
            Value::F32(v) => Arg::F32(v),
            Value::F64(v) => Arg::F64(v),
        })
    }
}

impl From<i32> for Arg {
    fn from(v: i32) -> Self {
        Arg::I32(v)
    }
}

impl From<u32> for Arg {
    fn from(v: u32) -> Self {
        Arg::U32(v)
    }
}

impl From<i64> for Arg {
    fn from(v: i64) -> Self {
        Arg::I64(v)
    }
}

impl From<u64> for Arg {
    fn from(v: u64) -> Self {
        Arg::U64(v)
    }
}

impl From<f32> for Arg {
    fn from(v: f32) -> Self {
        Arg::F32(v)
    }
}

impl From<f64> for Arg {
    fn from(v: f64) -> Self {
        Arg::F64(v)
    }
}

/// One launch: operands, element count, params and options.
///
/// Launches are **synchronous by default** (the reply comes after the kernel
/// completed, and reports its own failure), so results can be read as soon
/// as the call returns; `.sync(false)` replies once the launch is enqueued.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    /// One operand per kernel input, in order.
    pub inputs: Vec<Operand>,
    /// The output operand.
    pub output: Operand,
    /// Element count.
    pub n: u64,
    /// The kernel's f32 params (narrowed from f64 by ptxd).
    pub params: Vec<f64>,
    /// The kernel's typed scalar args, in param order (instead of
    /// `params`; a launch with both is refused).
    pub args: Vec<Arg>,
    /// Reply after completion (true) or once enqueued (false).
    pub sync: bool,
    /// An event to wait on before the kernel runs.
    pub wait_event: Option<String>,
    /// An event to record after the kernel.
    pub signal_event: Option<String>,
}

impl Launch {
    /// A synchronous launch over `n` elements without params.
    pub fn new(inputs: impl IntoIterator<Item = Operand>, output: Operand, n: u64) -> Self {
        Launch {
            inputs: inputs.into_iter().collect(),
            output,
            n,
            params: Vec::new(),
            args: Vec::new(),
            sync: true,
            wait_event: None,
            signal_event: None,
        }
    }

    /// Sets the kernel's scalar params.
    pub fn params(mut self, params: impl IntoIterator<Item = f64>) -> Self {
        self.params = params.into_iter().collect();
        self
    }

    /// Sets the kernel's typed scalar args, one per by-value scalar param
    /// in param order, each of exactly its param's type (see [`Arg`]);
    /// for a scalar-ABI kernel, `F32` args are the same as
    /// [`params`](Self::params). Set one or the other.
    pub fn args(mut self, args: impl IntoIterator<Item = Arg>) -> Self {
        self.args = args.into_iter().collect();
        self
    }

    /// Reply after completion (`true`, the default) or once enqueued.
    pub fn sync(mut self, sync: bool) -> Self {
        self.sync = sync;
        self
    }

    /// Waits on `event` before the kernel runs.
    pub fn wait_event(mut self, event: &Event) -> Self {
        self.wait_event = Some(event.handle.clone());
        self
    }

    /// Records `event` after the kernel.
    pub fn signal_event(mut self, event: &Event) -> Self {
        self.signal_event = Some(event.handle.clone());
        self
    }

    /// The wire request of this launch in `session` of the kernel with
    /// handle `kernel`, tagged `tag` (what the SDK sends; for a caller that
    /// speaks to the daemon itself, e.g. over the fd socket or `raw()`).
    pub fn to_proto(&self, session: &str, kernel: String, tag: u64) -> pb::LaunchRequest {
        pb::LaunchRequest {
            session: session.to_owned(),
            kernel,
            inputs: self.inputs.iter().map(Operand::to_proto).collect(),
            output: Some(self.output.to_proto()),
            n: self.n,
            params: self.params.clone(),
            args: self.args.iter().map(|a| a.to_proto()).collect(),
            wait_event: self.wait_event.clone().unwrap_or_default(),
            signal_event: self.signal_event.clone().unwrap_or_default(),
            sync: self.sync,
            tag,
        }
    }
}

/// What a successful launch reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launched {
    /// The launch's tag (on a launch stream, the one `send` returned).
    pub tag: u64,
    /// Time inside ptxd in microseconds (to completion when sync).
    pub micros: u64,
    /// True when the kernel was reloaded after a STALE_KERNEL refusal and the
    /// launch retried (only with automatic reload on).
    pub reloaded: bool,
}

/// What closing a session released.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CloseReport {
    /// Buffers the session still had registered (their mappings are closed).
    pub buffers_released: u32,
    /// Kernel references the session still held (a slot is freed when no
    /// other session holds it).
    pub kernels_released: u32,
    /// IPC events the session still had registered.
    pub events_released: u32,
}

/// A device ptxd can launch on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The ordinal inside ptxd; under `CUDA_VISIBLE_DEVICES` it can differ
    /// from this process's, so name devices by UUID across processes.
    pub ordinal: u32,
    /// The UUID (`GPU-…`; host devices are `HOST-<n>`), which
    /// [`DeviceSelector`] and buffer registration use.
    pub uuid: String,
    /// The marketing name, e.g. `NVIDIA H200`.
    pub name: String,
    /// Compute capability, major part (0 on the host backend).
    pub compute_major: u32,
    /// Compute capability, minor part (0 on the host backend).
    pub compute_minor: u32,
    /// The current device generation (bumped on every executor start).
    pub generation: u64,
    /// Device memory in bytes (0 on the host backend).
    pub total_memory: u64,
    /// True while the device's executor is up.
    pub available: bool,
    /// How often the device's executor has been restarted (after a fault,
    /// a timeout or an exit); each restart makes its kernels stale.
    pub restarts: u64,
    /// Whether the device's executor runs as a CUDA MPS client (false on
    /// the host backend).
    pub mps_enabled: bool,
}

impl From<pb::Device> for DeviceInfo {
    fn from(d: pb::Device) -> Self {
        DeviceInfo {
            ordinal: d.ordinal,
            uuid: d.uuid,
            name: d.name,
            compute_major: d.compute_major,
            compute_minor: d.compute_minor,
            generation: d.generation,
            total_memory: d.total_memory,
            available: d.available,
            restarts: d.restarts,
            mps_enabled: d.mps_enabled,
        }
    }
}

/// ptxd's configured limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    /// Slots in the kernel bank: distinct loaded kernels, over all sessions
    /// (sessions loading the same artifact share one).
    pub slots: u32,
    /// The largest artifact (PTX, cubin, fatbin) a load may carry, in bytes.
    pub max_artifact_bytes: u64,
    /// The largest gRPC request message, in bytes.
    pub max_request_bytes: u64,
    /// Open sessions at most.
    pub max_sessions: u32,
    /// Registered buffers per session at most.
    pub max_buffers_per_session: u32,
    /// Kernels held per session at most.
    pub max_kernels_per_session: u32,
    /// Registered buffer bytes per session at most.
    pub max_buffer_bytes_per_session: u64,
    /// Registered events per session at most.
    pub max_events_per_session: u32,
    /// Per-tenant quotas (a tenant is a peer uid; all TCP callers are one):
    /// open sessions.
    pub max_sessions_per_uid: u32,
    /// Distinct slots a tenant's sessions may hold.
    pub max_slots_per_uid: u32,
    /// Registered buffers of a tenant's sessions.
    pub max_buffers_per_uid: u32,
    /// Loaded artifact bytes in total (what the executors hold for compiled
    /// kernels; a shared kernel counts in full for each holder in the
    /// per-tenant and per-session limits).
    pub max_loaded_bytes: u64,
    /// Loaded artifact bytes per tenant.
    pub max_loaded_bytes_per_uid: u64,
    /// Loaded artifact bytes per session.
    pub max_loaded_bytes_per_session: u64,
}

/// What the caller's tenant holds against its quotas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Open sessions.
    pub sessions: u32,
    /// Distinct slots its sessions hold.
    pub slots: u32,
    /// Registered buffers.
    pub buffers: u32,
    /// Artifact bytes of those slots.
    pub loaded_bytes: u64,
}

impl From<pb::Usage> for Usage {
    fn from(u: pb::Usage) -> Self {
        Usage {
            sessions: u.sessions,
            slots: u.slots,
            buffers: u.buffers,
            loaded_bytes: u.loaded_bytes,
        }
    }
}

impl From<pb::Limits> for Limits {
    fn from(l: pb::Limits) -> Self {
        Limits {
            slots: l.slots,
            max_artifact_bytes: l.max_artifact_bytes,
            max_request_bytes: l.max_request_bytes,
            max_sessions: l.max_sessions,
            max_buffers_per_session: l.max_buffers_per_session,
            max_kernels_per_session: l.max_kernels_per_session,
            max_buffer_bytes_per_session: l.max_buffer_bytes_per_session,
            max_events_per_session: l.max_events_per_session,
            max_sessions_per_uid: l.max_sessions_per_uid,
            max_slots_per_uid: l.max_slots_per_uid,
            max_buffers_per_uid: l.max_buffers_per_uid,
            max_loaded_bytes: l.max_loaded_bytes,
            max_loaded_bytes_per_uid: l.max_loaded_bytes_per_uid,
            max_loaded_bytes_per_session: l.max_loaded_bytes_per_session,
        }
    }
}

/// What `GetInfo` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonInfo {
    /// The daemon's version (its Cargo package version).
    pub version: String,
    /// `"cuda"` or `"host"`.
    pub backend: String,
    /// Every device the daemon serves.
    pub devices: Vec<DeviceInfo>,
    /// Slots in use, including slots of dead generations not yet reclaimed.
    pub slots_used: u32,
    /// The configured limits (all zero from a daemon that sent none).
    pub limits: Limits,
    /// Open sessions, over all tenants.
    pub sessions: u32,
    /// This daemon boot's id (hex): handles from another boot are stale.
    pub boot_id: String,
    /// Artifact bytes loaded in all executors.
    pub loaded_bytes: u64,
    /// What the caller's tenant holds.
    pub caller_usage: Usage,
    /// `"node"` or `"uid"`: who shares a compiled kernel.
    pub kernel_cache_scope: String,
}

impl From<pb::GetInfoResponse> for DaemonInfo {
    fn from(r: pb::GetInfoResponse) -> Self {
        DaemonInfo {
            version: r.version,
            backend: r.backend,
            devices: r.devices.into_iter().map(DeviceInfo::from).collect(),
            slots_used: r.slots_used,
            limits: r.limits.map(Limits::from).unwrap_or_default(),
            sessions: r.sessions,
            boot_id: r.boot_id,
            loaded_bytes: r.loaded_bytes,
            caller_usage: r.caller_usage.map(Usage::from).unwrap_or_default(),
            kernel_cache_scope: r.kernel_cache_scope,
        }
    }
}

/// A kernel a session holds, as `ListKernels` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelListing {
    /// The kernel handle, as [`Kernel`](crate::Kernel) holds it.
    pub handle: String,
    /// The entry point's name in the artifact.
    pub symbol: String,
    /// The label given at load ([`LoadOptions`]).
    pub label: String,
    /// The device it was loaded on.
    pub device_uuid: String,
    /// The device generation it was loaded in.
    pub generation: u64,
    /// The ABI ptxd derived from the artifact at load.
    pub signature: KernelSignature,
    /// False once the kernel's generation is dead.
    pub live: bool,
    /// The artifact's content hash (blake3, hex).
    pub artifact_hash: String,
    /// Sessions sharing the slot.
    pub references: u32,
}

impl From<pb::KernelInfo> for KernelListing {
    fn from(k: pb::KernelInfo) -> Self {
        KernelListing {
            handle: k.kernel,
            symbol: k.symbol,
            label: k.label,
            device_uuid: k.device_uuid,
            generation: k.generation,
            signature: k.signature.map(KernelSignature::from).unwrap_or_default(),
            live: k.live,
            artifact_hash: k.artifact_hash,
            references: k.references,
        }
    }
}

/// A buffer a session registered, as `ListBuffers` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferListing {
    /// The buffer handle, as [`Buffer`] holds it.
    pub handle: String,
    /// The label given at registration.
    pub label: String,
    /// `"cuda_ipc"` or `"host_shm"`.
    pub kind: String,
    /// The device whose executor maps it.
    pub device_uuid: String,
    /// The registered size in bytes (launches are bounds-checked against it).
    pub size: u64,
    /// The device generation the mapping is open in.
    pub generation: u64,
    /// False if it could not be re-opened after an executor restart.
    pub live: bool,
}

impl From<pb::BufferInfo> for BufferListing {
    fn from(b: pb::BufferInfo) -> Self {
        BufferListing {
            handle: b.buffer,
            label: b.label,
            kind: b.kind,
            device_uuid: b.device_uuid,
            size: b.size,
            generation: b.generation,
            live: b.live,
        }
    }
}

/// An event on a session's lease stream.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SessionEvent {
    /// A device's executor restarted: kernels loaded on it are stale.
    ExecutorRestarted {
        /// The device.
        device_uuid: String,
        /// The generation that died (its kernels and mappings are stale).
        old_generation: u64,
        /// The generation now running.
        new_generation: u64,
        /// Why it restarted, e.g. `KERNEL_FAULT` or `exited`.
        cause: String,
    },
    /// A device has no executor: its executor died (the rings and kernels
    /// of `generation` are gone) and restarting it has failed so far.
    /// Launches on the device are refused `EXECUTOR_UNAVAILABLE` until an
    /// [`SessionEvent::ExecutorRestarted`] says it serves again.
    ExecutorDown {
        /// The device.
        device_uuid: String,
        /// The generation that died.
        generation: u64,
        /// Why it died, as in `ExecutorRestarted`.
        cause: String,
        /// Restart attempts that failed so far.
        failed_restarts: u32,
        /// Why the last attempt failed.
        restart_error: String,
        /// How long until the daemon tries again.
        retry_in: std::time::Duration,
    },
    /// The daemon is draining; reconnect elsewhere.
    Draining {
        /// The daemon's reason, for logs.
        reason: String,
    },
    /// The lease stream ended: the session is over.
    Ended {
        /// What ended it (the daemon closed the lease, or the stream broke).
        why: String,
    },
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn device_selectors_parse_digits_as_ordinals_and_the_rest_as_uuids() {
        assert_eq!(
            "0".parse::<DeviceSelector>().unwrap(),
            DeviceSelector::Ordinal(0)
        );
        assert_eq!(
            " 17 ".parse::<DeviceSelector>().unwrap(),
            DeviceSelector::Ordinal(17)
        );
        assert_eq!(
            "HOST-0".parse::<DeviceSelector>().unwrap(),
            DeviceSelector::Uuid("HOST-0".into())
        );
        assert_eq!(
            "GPU-8f0c1a".parse::<DeviceSelector>().unwrap(),
            DeviceSelector::Uuid("GPU-8f0c1a".into())
        );
        assert!(matches!(
            "".parse::<DeviceSelector>(),
            Err(Error::InvalidInput(_))
        ));
        assert!(matches!(
            "99999999999".parse::<DeviceSelector>(),
            Err(Error::InvalidInput(_))
        ));
    }

    #[test]
    fn launch_builds_the_request_it_describes() {
        let a = Buffer {
            handle: "buf-a".into(),
            size: 64,
            device_uuid: "HOST-0".into(),
            generation: 3,
            ring_index: 1,
        };
        let out = Buffer {
            handle: "buf-out".into(),
            ..a.clone()
        };
        let event = Event {
            handle: "ev-1".into(),
        };
        let launch = Launch::new([a.at(8), a.operand()], out.at(4), 3)
            .params([1.5, -2.0])
            .sync(false)
            .signal_event(&event);
        let request = launch.to_proto("sess", "kern".into(), 42);
        assert_eq!(request.session, "sess");
        assert_eq!(request.kernel, "kern");
        assert_eq!(request.tag, 42);
        assert_eq!(request.n, 3);
        assert!(!request.sync);
        assert_eq!(request.params, vec![1.5, -2.0]);
        assert_eq!(request.signal_event, "ev-1");
        assert_eq!(request.wait_event, "");
        let inputs: Vec<(&str, u64)> = request
            .inputs
            .iter()
            .map(|o| (o.buffer.as_str(), o.offset))
            .collect();
        assert_eq!(inputs, vec![("buf-a", 8), ("buf-a", 0)]);
        let output = request.output.unwrap();
        assert_eq!((output.buffer.as_str(), output.offset), ("buf-out", 4));
        assert!(
            Launch::new([], out.operand(), 0).sync,
            "launches default to sync"
        );
    }
    /// Typed args go on the wire in order, each as its own oneof case, and
    /// come back as the same `Arg` through an encoded message.
    #[test]
    fn typed_args_round_trip_through_the_wire() {
        use prost::Message;
        let out = Buffer {
            handle: "buf-out".into(),
            device_uuid: "HOST-0".into(),
            generation: 1,
            size: 64,
            ring_index: 0,
        };
        let args = [
            Arg::I32(-5),
            Arg::U32(u32::MAX),
            Arg::I64(i64::MIN),
            Arg::U64(u64::MAX),
            Arg::F32(-0.0),
            Arg::F64(f64::MIN_POSITIVE),
            Arg::from(7u32),
            Arg::from(0.5f32),
        ];
        let launch = Launch::new([], out.operand(), 3).args(args);
        let request = launch.to_proto("sess", "kern".into(), 1);
        assert!(request.params.is_empty());
        let decoded = pb::LaunchRequest::decode(request.encode_to_vec().as_slice()).unwrap();
        let back: Vec<Arg> = decoded
            .args
            .iter()
            .map(|a| Arg::from_proto(a).unwrap())
            .collect();
        assert_eq!(back.len(), args.len());
        for (got, want) in back.iter().zip(&args) {
            // Bitwise for the floats (-0.0 stays negative).
            match (got, want) {
                (Arg::F32(g), Arg::F32(w)) => assert_eq!(g.to_bits(), w.to_bits()),
                (Arg::F64(g), Arg::F64(w)) => assert_eq!(g.to_bits(), w.to_bits()),
                _ => assert_eq!(got, want),
            }
        }
        assert_eq!(back[6], Arg::U32(7));
        assert_eq!(back[7], Arg::F32(0.5));
        assert_eq!(Arg::from_proto(&pb::ScalarArg { value: None }), None);
    }
}
