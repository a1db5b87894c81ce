//! The host (CPU) executor backend: runs verified scalar kernels with the PTX
//! host engine over POSIX shared-memory buffers that sessions create and
//! register by name.
//!
//! Invariants:
//! - A buffer is mapped once, at registration, `MAP_SHARED`, so results land
//!   in the client's memory without copies; it is unmapped when it is closed
//!   and no queued or running launch still uses it (an `Arc` each).
//! - A mapping is never smaller than the size the front bounds-checks
//!   launches against: registration refuses an object shorter than claimed,
//!   each access re-checks the object's size first, and a shrink during an
//!   access is caught by the SIGBUS handler ([`super::sigbus`]), which stops
//!   that launch only; its mapping is then restored from the object.
//! - Client memory is reached only through `memory` (a launch's operands,
//!   a ring's semaphore words): a mapping's address never leaves it, so no
//!   executor thread can touch a buffer unchecked or unwatched.
//! - A launch only ever touches `[base + offset, base + size)` of each
//!   operand; the front checked `offset + n × element size <= size`, and the
//!   engine's checked mode re-checks every access.
//! - Launches run on one worker thread per session stream, in the order the
//!   session sent them; the request loop never runs a kernel, so one
//!   session's long launch never delays another session's requests.
//! - No launch runs longer than the budget (`--max-kernel-time`): the engine
//!   polls the deadline, the launch is refused `KERNEL_TIMEOUT`, and the
//!   executor goes on serving.

mod launch_ring;
mod memory;

use std::collections::HashMap;
use std::collections::VecDeque;
use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nix::fcntl::{fcntl, FcntlArg, OFlag, SealFlag};
use nix::sys::mman::shm_open;
use nix::sys::stat::{fstat, Mode};
use ptxd_proto::executor::{
    open_buffer::Source, reply, ArtifactKind, DeviceDesc, FailureKind, Hello, Launch, LoadModule,
    LoadModuleOk, OpenBuffer, OpenBufferOk, OpenEvent, OpenRing,
};

use super::child::{Backend, Replier};
use super::fd_inbox::FdInbox;
use super::kernel_timeouts::TimeoutAllowance;
use super::ring::RingHandle;
use super::sigbus;
use crate::ptx::host::exec::{LaunchControl, StopReason};
use crate::ptx::{HostKernel, HostLaunch, PtxError};
use memory::Mapping;

/// The UUID of host device `index`.
pub fn host_device_uuid(index: u32) -> String {
    format!("HOST-{index}")
}

/// A failed open, as the executor replies it: kind, message, metadata.
type OpenFailure = (FailureKind, String, Vec<(&'static str, String)>);

fn map_shm(name: &str, size: u64, owner_uid: Option<u32>) -> Result<Mapping, OpenFailure> {
    let invalid = |what: &str, err: nix::Error| {
        (
            FailureKind::InvalidHandle,
            format!("shared memory {name:?}: {what}: {err}"),
            vec![("os_error", format!("{err:?}"))],
        )
    };
    let cname = CString::new(name).map_err(|_| {
        (
            FailureKind::InvalidHandle,
            format!("shared memory name {name:?} contains a NUL byte"),
            vec![("os_error", "EINVAL".into())],
        )
    })?;
    let fd = shm_open(cname.as_c_str(), OFlag::O_RDWR, Mode::empty())
        .map_err(|e| invalid("shm_open", e))?;
    let stat = fstat(fd.as_fd()).map_err(|e| invalid("fstat", e))?;
    // The daemon may be able to open objects its clients cannot: a session
    // maps only objects its own uid owns (root may map any).
    if let Some(uid) = owner_uid {
        if uid != 0 && stat.st_uid != uid {
            return Err((
                FailureKind::InvalidHandle,
                // The owner's uid is another tenant's fact: not named.
                format!("shared memory {name:?} is not owned by the session's user"),
                vec![("os_error", "EACCES".into())],
            ));
        }
    }
    Mapping::map(fd, 0, size, &format!("shared memory {name:?}"))
}

/// A memfd a client passed by descriptor. Only a file that carries
/// `F_SEAL_SHRINK` is mapped: its size can never drop under a launch, so
/// no launch on it can hit SIGBUS. Files that cannot be sealed at all
/// (anything but a memfd) are refused the same way.
fn map_memfd(fd: OwnedFd, offset: u64, size: u64) -> Result<Mapping, OpenFailure> {
    let seals = match fcntl(&fd, FcntlArg::F_GET_SEALS) {
        Ok(bits) => SealFlag::from_bits_truncate(bits),
        Err(e) => {
            return Err((
                FailureKind::FdNotSealed,
                format!("the descriptor is not a sealable memfd ({e}): pass a memfd sealed with F_SEAL_SHRINK"),
                vec![("os_error", format!("{e:?}"))],
            ))
        }
    };
    if !seals.contains(SealFlag::F_SEAL_SHRINK) {
        return Err((
            FailureKind::FdNotSealed,
            format!(
                "the memfd carries seals {:#x} but not F_SEAL_SHRINK: its owner could shrink it under a launch; seal it with fcntl(F_ADD_SEALS, F_SEAL_SHRINK)",
                seals.bits()
            ),
            vec![("seals", format!("{:#x}", seals.bits()))],
        ));
    }
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|p| u64::try_from(p).ok())
        .unwrap_or(4096);
    if !offset.is_multiple_of(page) {
        return Err((
            FailureKind::InvalidHandle,
            format!("a memfd buffer starts at a multiple of the page size ({page} bytes), not at {offset}"),
            vec![("os_error", "EINVAL".into())],
        ));
    }
    Mapping::map(fd, offset, size, "the memfd")
}

/// One launch, handed from the request loop to its session's worker.
struct Job {
    kernel: Arc<HostKernel>,
    /// (operand name, mapping, byte offset): inputs, then the output.
    operands: Vec<(String, Arc<Mapping>, usize)>,
    n: u64,
    /// The f32 params, and the typed scalar args as bits zero-extended to
    /// 64 (empty: the scalars are the params).
    scalars: Box<(Vec<f32>, Vec<u64>)>,
    stream: u64,
    /// The session's ring allowance, if it has a ring here.
    timeouts: Option<Arc<TimeoutAllowance>>,
    reply: Replier,
}

/// What every worker needs to run a job.
#[derive(Debug, Clone, Copy)]
struct RunConfig {
    threads: usize,
    checked: bool,
    budget: Option<Duration>,
}

/// A session stream's worker: runs its launches in order, one at a time.
///
/// Its queue is shared with the request loop rather than owned by the
/// worker's thread, so a stop can answer what waits in it (`NOT_RUN`) while
/// the worker is busy with a long launch. Dropping the worker closes its
/// queue: the thread runs what is queued, then exits.
struct StreamWorker {
    queue: Arc<JobQueue>,
}

/// A stream's launches not yet started, and whether more may come.
#[derive(Default)]
struct JobQueue {
    state: Mutex<QueueState>,
    ready: Condvar,
}

#[derive(Default)]
struct QueueState {
    jobs: VecDeque<Job>,
    closed: bool,
}

impl JobQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `job`, or gives it back when the queue is closed.
    fn push(&self, job: Job) -> Result<(), Job> {
        let mut state = self.lock();
        if state.closed {
            return Err(job);
        }
        state.jobs.push_back(job);
        self.ready.notify_one();
        Ok(())
    }

    /// The next job, waiting for one; `None` once closed and empty.
    fn next(&self) -> Option<Job> {
        let mut state = self.lock();
        loop {
            if let Some(job) = state.jobs.pop_front() {
                return Some(job);
            }
            if state.closed {
                return None;
            }
            state = self.ready.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Closes the queue; with `take`, also removes what waits in it and
    /// returns it (those launches never start).
    fn close(&self, take: bool) -> Vec<Job> {
        let mut state = self.lock();
        state.closed = true;
        self.ready.notify_all();
        if take {
            state.jobs.drain(..).collect()
        } else {
            Vec::new()
        }
    }
}

impl Drop for StreamWorker {
    fn drop(&mut self) {
        self.queue.close(false);
    }
}

/// A session ring served by the host backend.
type HostRingHandle = RingHandle<Arc<HostKernel>, Arc<Mapping>>;

/// The host backend for one host device.
pub struct HostBackend {
    index: u32,
    run: RunConfig,
    kernels: HashMap<u64, Arc<HostKernel>>,
    buffers: HashMap<u64, Arc<Mapping>>,
    streams: HashMap<u64, StreamWorker>,
    /// Session rings by stream.
    rings: HashMap<u64, HostRingHandle>,
    /// The timeout allowance of each session with a ring, shared with the
    /// ring's thread: a gRPC launch's timeout here counts against it too.
    timeouts: HashMap<u64, Arc<TimeoutAllowance>>,
    /// Descriptors the front passed for fd buffers.
    fd_inbox: Option<FdInbox>,
}

impl std::fmt::Debug for HostBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBackend")
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}

impl HostBackend {
    /// A backend whose launches use `threads` CPU threads each and stop
    /// after `max_kernel_time` (none: never). Installs the SIGBUS handler
    /// (see [`sigbus`]); without it a client that shrinks its object could
    /// kill the executor, so this fails if it cannot be installed.
    pub fn new(
        index: u32,
        threads: usize,
        checked: bool,
        max_kernel_time: Option<Duration>,
        fd_inbox: Option<FdInbox>,
    ) -> Result<Self, nix::Error> {
        sigbus::install()?;
        Ok(HostBackend {
            index,
            run: RunConfig {
                threads: threads.max(1),
                checked,
                budget: max_kernel_time,
            },
            kernels: HashMap::new(),
            buffers: HashMap::new(),
            streams: HashMap::new(),
            rings: HashMap::new(),
            timeouts: HashMap::new(),
            fd_inbox,
        })
    }

    /// Opens a buffer: a named object or a memfd from the fd inbox.
    fn open_mapping(
        &mut self,
        open: &ptxd_proto::executor::OpenBuffer,
    ) -> Result<Mapping, OpenFailure> {
        match &open.source {
            Some(Source::ShmName(name)) => map_shm(name, open.size, open.owner_uid),
            Some(Source::FdTag(tag)) => {
                let fd = self
                    .fd_inbox
                    .as_mut()
                    .ok_or_else(|| "this executor has no fd inbox".to_owned())
                    .and_then(|inbox| inbox.take(*tag))
                    .map_err(|e| (FailureKind::Internal, e, Vec::new()))?;
                map_memfd(fd, open.offset, open.size)
            }
            Some(Source::CudaIpc(_)) => Err((
                FailureKind::UnsupportedOnHost,
                "the host backend cannot open CUDA IPC handles; register POSIX shared memory or a memfd".into(),
                Vec::new(),
            )),
            None => Err((FailureKind::InvalidHandle, "buffer without a source".into(), Vec::new())),
        }
    }

    fn load(&mut self, load: ptxd_proto::executor::LoadModule, reply: Replier) {
        if load.kind != ArtifactKind::Ptx as i32 {
            return reply.fail(
                FailureKind::UnsupportedArtifact,
                "the host backend runs PTX only; cubin and fatbin need the CUDA backend",
                &[],
            );
        }
        // The engine takes its params from its own contract; a layout the
        // front sent that does not even match the module is a bug, refused
        // as the CUDA executor refuses it.
        if let Err(message) = crate::executor::layout::decode(&load) {
            return reply.fail(FailureKind::AbiMismatch, message, &[]);
        }
        let text = match std::str::from_utf8(&load.artifact) {
            Ok(t) => t,
            Err(e) => {
                return reply.fail(
                    FailureKind::InvalidArtifact,
                    format!("PTX is not UTF-8: {e}"),
                    &[],
                )
            }
        };
        match HostKernel::compile(text, &load.symbol) {
            Ok(kernel) => {
                // The block the engine runs with (`.reqntid`, else `.maxntid`
                // capped at the default), so LoadKernel reports the truth.
                let block_size = kernel.block_size();
                self.kernels.insert(load.module_id, Arc::new(kernel));
                reply.send(reply::Result::LoadModule(LoadModuleOk {
                    block_size,
                    info_log: String::new(),
                }))
            }
            Err(e) => {
                let kind = match &e {
                    PtxError::Parse { .. } => FailureKind::InvalidArtifact,
                    PtxError::SymbolNotFound { .. } => FailureKind::SymbolNotFound,
                    PtxError::NonScalarAbi { .. } => FailureKind::NonScalarAbi,
                    PtxError::AbiMismatch { .. } => FailureKind::AbiMismatch,
                    PtxError::UnsupportedOnHost { .. } => FailureKind::UnsupportedOnHost,
                };
                let metadata: Vec<(&str, String)> = e
                    .metadata()
                    .into_iter()
                    .map(|(k, v)| (leak_key(&k), v))
                    .collect();
                reply.fail(kind, e.to_string(), &metadata)
            }
        }
    }

    /// Resolves the launch's objects here, in request order (a close that
    /// follows it cannot overtake it), and queues it on its session's
    /// worker, so a long launch never holds up another session's requests.
    fn launch_on_worker(&mut self, launch: ptxd_proto::executor::Launch, reply: Replier) {
        let Some(kernel) = self.kernels.get(&launch.module_id).cloned() else {
            return reply.fail(
                FailureKind::UnknownObject,
                format!("module {} is not loaded", launch.module_id),
                &[("object", "module".into())],
            );
        };
        let Some(output) = launch.output.as_ref() else {
            return reply.fail(FailureKind::Internal, "launch without an output", &[]);
        };
        let named = launch
            .inputs
            .iter()
            .enumerate()
            .map(|(i, o)| (format!("input {i}"), o))
            .chain([("output".to_string(), output)]);
        let mut operands = Vec::with_capacity(launch.inputs.len() + 1);
        for (name, operand) in named {
            let Some(mapping) = self.buffers.get(&operand.buffer_id) else {
                return reply.fail(
                    FailureKind::UnknownObject,
                    format!("buffer {} is not open", operand.buffer_id),
                    &[("object", "buffer".into())],
                );
            };
            let Some(offset) = usize::try_from(operand.offset)
                .ok()
                .filter(|o| *o <= mapping.len())
            else {
                return reply.fail(
                    FailureKind::OutOfBounds,
                    format!(
                        "{name}: offset {} is past the end of buffer {} ({} bytes)",
                        operand.offset,
                        operand.buffer_id,
                        mapping.len()
                    ),
                    &[("operand", name)],
                );
            };
            operands.push((name, mapping.clone(), offset));
        }
        let job = Job {
            kernel,
            operands,
            n: launch.n,
            scalars: Box::new((launch.params, launch.args)),
            stream: launch.stream,
            timeouts: self.timeouts.get(&launch.stream).cloned(),
            reply,
        };
        let job = match self.worker(launch.stream) {
            Ok(worker) => match worker.queue.push(job) {
                Ok(()) => return,
                Err(job) => job,
            },
            Err(e) => {
                return job.reply.fail(
                    FailureKind::Internal,
                    format!("cannot start a launch worker: {e}"),
                    &[],
                )
            }
        };
        self.streams.remove(&launch.stream);
        job.reply
            .fail(FailureKind::Internal, "the launch worker is gone", &[]);
    }

    fn worker(&mut self, stream: u64) -> std::io::Result<&StreamWorker> {
        if !self.streams.contains_key(&stream) {
            let queue = Arc::new(JobQueue::default());
            let run = self.run;
            let jobs = queue.clone();
            std::thread::Builder::new()
                .name(format!("ptxd-host-{stream}"))
                .spawn(move || {
                    while let Some(job) = jobs.next() {
                        run_job(job, run);
                    }
                })?;
            self.streams.insert(stream, StreamWorker { queue });
        }
        self.streams
            .get(&stream)
            .ok_or_else(|| std::io::Error::other("the worker vanished"))
    }
}

/// Why a host launch failed: the executor's typed failure.
struct HostFailure {
    kind: FailureKind,
    message: String,
    metadata: Vec<(&'static str, String)>,
}

impl HostFailure {
    fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        HostFailure {
            kind,
            message: message.into(),
            metadata: Vec::new(),
        }
    }

    fn with(mut self, key: &'static str, value: String) -> Self {
        self.metadata.push((key, value));
        self
    }
}

/// Runs one launch on the calling worker thread and replies.
fn run_job(job: Job, run: RunConfig) {
    let Job {
        kernel,
        operands,
        n,
        scalars,
        stream,
        timeouts,
        reply,
    } = job;
    let (params, args) = &*scalars;
    match execute(&kernel, &operands, n, (params, args), run) {
        Ok(()) => reply.ok(),
        Err(failure) => {
            if failure.kind == FailureKind::KernelTimeout {
                reply.channel().kernel_timeout(stream);
                if let Some(timeouts) = timeouts {
                    timeouts.record();
                }
            }
            reply.fail(failure.kind, failure.message, &failure.metadata)
        }
    }
}

/// Runs one launch on the calling thread: `operands` are (name, mapping,
/// byte offset), inputs then the output, each offset inside its mapping.
fn execute(
    kernel: &HostKernel,
    operands: &[(String, Arc<Mapping>, usize)],
    n: u64,
    (params, args): (&[f32], &[u64]),
    run: RunConfig,
) -> Result<(), HostFailure> {
    let control = LaunchControl::new(run.budget.map(|b| Instant::now() + b));
    // Checked against the object's size and run under the SIGBUS watch
    // (see `memory`): a client that shrank its object loses this launch.
    let result = memory::run_watched(operands, &control, |spans| {
        let Some((output, inputs)) = spans.split_last() else {
            return Err(None);
        };
        let host_launch = HostLaunch {
            inputs,
            args,
            output: *output,
            n,
            params,
            threads: run.threads,
            checked: run.checked,
            control: Some(&control),
        };
        // SAFETY: every span lies inside a live MAP_SHARED mapping that
        // `operands` keeps mapped (an Arc each) until the launch returns;
        // pages that vanish because the client shrank its object are
        // replaced by zero pages by the SIGBUS handler, which `run_watched`
        // arms for exactly these ranges.
        unsafe { kernel.launch(&host_launch) }.map_err(Some)
    });
    let result = match result {
        Ok(Err(None)) => {
            return Err(HostFailure::new(
                FailureKind::Internal,
                "launch without operands",
            ))
        }
        Ok(result) => result,
        Err((name, fault)) => {
            let failure = HostFailure::new(fault.kind, fault.message).with("why", fault.why.into());
            return Err(if name.is_empty() {
                failure
            } else {
                failure.with("operand", name)
            });
        }
    };
    match (result, control.stopped(), run.budget) {
        (Err(_), Some(StopReason::Deadline), Some(budget)) => Err(HostFailure::new(
            FailureKind::KernelTimeout,
            format!(
                "the launch ran past the {budget:?} budget (--max-kernel-time) and was stopped; its output is undefined"
            ),
        )
        .with("max_kernel_time_ms", budget.as_millis().to_string())),
        (Ok(()), _, _) => Ok(()),
        (Err(None), _, _) => Err(HostFailure::new(FailureKind::Internal, "launch without operands")),
        (Err(Some(fault)), _, _) => Err(HostFailure::new(FailureKind::KernelFault, fault.to_string())
            .with("line", fault.line.to_string())),
    }
}

/// Metadata keys of a PTX error come from a small closed set; map them to
/// static strings without leaking memory.
fn leak_key(key: &str) -> &'static str {
    match key {
        "line" => "line",
        "column" => "column",
        "symbol" => "symbol",
        "entries" => "entries",
        "sub_reason" => "sub_reason",
        "param" => "param",
        "explanation" => "explanation",
        "what" => "what",
        "expected" => "expected",
        "found" => "found",
        "opcode" => "opcode",
        _ => "detail",
    }
}

impl Backend for HostBackend {
    type RingKernel = Arc<HostKernel>;
    type RingBuffer = Arc<Mapping>;

    fn hello(&self) -> Hello {
        Hello {
            backend: "host".into(),
            devices: vec![DeviceDesc {
                ordinal: self.index,
                uuid: host_device_uuid(self.index),
                name: format!("host CPU ({} threads)", self.run.threads),
                compute_major: 0,
                compute_minor: 0,
                total_memory: 0,
                mps_enabled: false,
            }],
            pid: std::process::id(),
        }
    }

    fn load_module(&mut self, load: LoadModule, reply: Replier) {
        self.load(load, reply)
    }

    fn unload_module(&mut self, module_id: u64, reply: Replier) {
        for ring in self.rings.values() {
            ring.table().forget_module(module_id);
        }
        self.kernels.remove(&module_id);
        reply.ok()
    }

    fn open_buffer(&mut self, open: OpenBuffer, reply: Replier) {
        match self.open_mapping(&open) {
            Ok(mapping) => {
                self.buffers.insert(open.buffer_id, Arc::new(mapping));
                reply.send(reply::Result::OpenBuffer(OpenBufferOk {
                    device_uuid: host_device_uuid(self.index),
                }))
            }
            Err((kind, message, metadata)) => reply.fail(kind, message, &metadata),
        }
    }

    fn close_buffer(&mut self, buffer_id: u64, reply: Replier) {
        self.buffers.remove(&buffer_id);
        reply.ok()
    }

    fn open_event(&mut self, _: OpenEvent, reply: Replier) {
        reply.fail(
            FailureKind::UnsupportedOnHost,
            "the host backend has no IPC events",
            &[],
        )
    }

    fn close_event(&mut self, _: u64, reply: Replier) {
        reply.ok()
    }

    fn launch(&mut self, launch: Launch, reply: Replier) {
        self.launch_on_worker(launch, reply)
    }

    fn close_stream(&mut self, stream: u64, reply: Replier) {
        // The worker ends once its queue is empty (the front sends this
        // after the session's last launch was answered).
        self.streams.remove(&stream);
        // Stops the ring's thread once its current step is done (not
        // waited for).
        self.rings.remove(&stream);
        self.timeouts.remove(&stream);
        reply.ok()
    }

    fn open_ring(&mut self, open: OpenRing, reply: Replier) {
        self.start_ring(open, reply)
    }

    fn rings(&self) -> &HashMap<u64, HostRingHandle> {
        &self.rings
    }

    fn rings_mut(&mut self) -> &mut HashMap<u64, HostRingHandle> {
        &mut self.rings
    }

    fn ring_kernel(&self, module_id: u64) -> Option<Arc<HostKernel>> {
        self.kernels.get(&module_id).cloned()
    }

    fn ring_buffer(&self, buffer_id: u64) -> Option<Arc<Mapping>> {
        self.buffers.get(&buffer_id).cloned()
    }

    fn shutdown(&mut self) {
        // What waits in a queue never starts: it is answered NOT_RUN here,
        // before the Shutdown reply (the front answers the client DRAINING,
        // whose promise is that the call did not run). A launch a worker
        // already started is not waited for: the process exits after the
        // reply, and the front answers it EXECUTOR_UNAVAILABLE (it may have
        // run in part).
        for worker in self.streams.values() {
            for job in worker.queue.close(true) {
                job.reply.fail(
                    FailureKind::NotRun,
                    "the executor stopped (drain deadline) before this launch started; it did not run",
                    &[],
                );
            }
        }
        self.streams.clear();
        self.rings.clear();
        self.timeouts.clear();
        self.kernels.clear();
        self.buffers.clear();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::ptx::HostSpan;

    #[test]
    fn a_loop_that_never_ends_stops_at_the_deadline() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/corpus/spin_f32.ptx"
        ))
        .unwrap();
        let kernel = HostKernel::compile(&text, "spin_f32").unwrap();
        let mut x = vec![0f32; 300];
        let mut y = vec![f32::NAN; 300];
        let span = |v: &mut Vec<f32>| HostSpan {
            ptr: v.as_mut_ptr().cast(),
            len: v.len() * 4,
        };
        let inputs = [span(&mut x)];
        // Timed from before the deadline is set: the launch cannot stop
        // sooner than 200 ms after this (timed after it, a test preempted
        // between the two lines saw the stop early).
        let started = Instant::now();
        let control = LaunchControl::new(Some(started + Duration::from_millis(200)));
        let launch = HostLaunch {
            inputs: &inputs,
            args: &[],
            output: span(&mut y),
            n: 300,
            params: &[],
            threads: 2,
            checked: true,
            control: Some(&control),
        };
        // SAFETY: the spans cover the two vectors, alive for the call.
        let result = unsafe { kernel.launch(&launch) };
        assert!(result.is_err());
        assert_eq!(control.stopped(), Some(StopReason::Deadline));
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(200) && took < Duration::from_secs(2),
            "{took:?}"
        );
    }
}
