//! The executor child process: the loop that reads requests from the front,
//! hands each to its [`Backend`]'s typed operation ([`dispatch`]), and
//! writes replies back.
//!
//! The child's stdin and stdout are the two ends of one socket to the front
//! (see `supervisor`), so nothing else may ever write to stdout here; logs go
//! to stderr. When the front goes away, stdin reaches end of stream and the
//! child releases everything and exits.
//!
//! Invariants:
//! - Every request gets exactly one reply (a [`Replier`] is consumed by
//!   replying, and a dropped one replies INTERNAL).
//! - After a sticky device fault the process exits ([`Channel::fatal`]); it
//!   never serves another request in a poisoned context.
//! - [`dispatch`] is the one match from a request to an operation; what every
//!   backend does alike (a ring's close and grants, a closed buffer leaving
//!   every ring's table first) is done there, so backends cannot drift.

use std::collections::HashMap;
use std::io::{BufReader, Write};
use std::os::fd::AsFd;

use ptxd_proto::executor::{
    executor_message::Body, reply, request::Op, Empty, Failure, FailureKind, Hello, Launch,
    LoadModule, OpenBuffer, OpenEvent, OpenRing, Reply, Request,
};

pub use super::channel::{Channel, EXIT_FAULT};
use super::protocol::{read_frame, ProtocolError};
use super::ring::RingHandle;

/// A device backend inside an executor process: one method per executor
/// operation, each replying through its [`Replier`], now or later (from
/// another thread, e.g. after a stream synchronization). What every backend
/// does alike (Ping, Shutdown, a ring's close and grants, the unmapped
/// buffer's removal from every ring's table) is [`dispatch`]'s, once.
pub trait Backend {
    /// What a ring's capability table holds for a granted kernel.
    type RingKernel: Send + 'static;
    /// What a ring's capability table holds for a granted buffer.
    type RingBuffer: Send + 'static;

    /// What the executor tells the front first: its backend and devices.
    fn hello(&self) -> Hello;

    /// Compiles or loads a module.
    fn load_module(&mut self, load: LoadModule, reply: Replier);
    /// Unloads a module (and forgets it in every ring's table).
    fn unload_module(&mut self, module_id: u64, reply: Replier);
    /// Maps a client's buffer.
    fn open_buffer(&mut self, open: OpenBuffer, reply: Replier);
    /// Unmaps a buffer, already gone from every ring's table.
    fn close_buffer(&mut self, buffer_id: u64, reply: Replier);
    /// Opens a client's IPC event.
    fn open_event(&mut self, open: OpenEvent, reply: Replier);
    /// Closes an event.
    fn close_event(&mut self, event_id: u64, reply: Replier);
    /// Runs a launch the front checked.
    fn launch(&mut self, launch: Launch, reply: Replier);
    /// Ends a session's stream (and its ring) once its queued work is done.
    fn close_stream(&mut self, stream: u64, reply: Replier);
    /// Starts serving a session's launch ring.
    fn open_ring(&mut self, open: OpenRing, reply: Replier);

    /// The session rings this backend serves, by stream.
    fn rings(&self) -> &HashMap<u64, RingHandle<Self::RingKernel, Self::RingBuffer>>;
    fn rings_mut(&mut self) -> &mut HashMap<u64, RingHandle<Self::RingKernel, Self::RingBuffer>>;
    /// A loaded module as a ring's table holds it.
    fn ring_kernel(&self, module_id: u64) -> Option<Self::RingKernel>;
    /// An open buffer as a ring's table holds it.
    fn ring_buffer(&self, buffer_id: u64) -> Option<Self::RingBuffer>;

    /// Releases every mapping, module and stream, before the process exits.
    fn shutdown(&mut self);
}

/// The one dispatch of a request to its backend's typed operation.
pub fn dispatch<B: Backend + ?Sized>(backend: &mut B, op: Op, reply: Replier) {
    match op {
        Op::LoadModule(load) => backend.load_module(load, reply),
        Op::UnloadModule(unload) => backend.unload_module(unload.module_id, reply),
        Op::OpenBuffer(open) => backend.open_buffer(open, reply),
        Op::CloseBuffer(close) => {
            for ring in backend.rings().values() {
                ring.table().forget_buffer(close.buffer_id);
            }
            backend.close_buffer(close.buffer_id, reply)
        }
        Op::OpenEvent(open) => backend.open_event(open, reply),
        Op::CloseEvent(close) => backend.close_event(close.event_id, reply),
        Op::Launch(launch) => backend.launch(launch, reply),
        Op::CloseStream(close) => backend.close_stream(close.stream, reply),
        Op::OpenRing(open) => backend.open_ring(open, reply),
        Op::CloseRing(close) => {
            backend.rings_mut().remove(&close.stream);
            reply.ok()
        }
        Op::RingGrant(grant) => match backend.rings().get(&grant.stream) {
            Some(ring) => {
                ring.table().apply(
                    &grant,
                    |id| backend.ring_kernel(id),
                    |id| backend.ring_buffer(id),
                );
                reply.ok()
            }
            None => reply.fail(
                FailureKind::UnknownObject,
                format!("stream {} has no ring", grant.stream),
                &[("object", "ring".into())],
            ),
        },
        Op::Shutdown(_) | Op::Ping(_) => reply.ok(),
    }
}

/// The one reply owed to one request.
#[derive(Debug)]
pub struct Replier {
    id: u64,
    channel: Channel,
    sent: bool,
}

impl Replier {
    /// Sends `result` as the reply.
    pub fn send(mut self, result: reply::Result) {
        self.sent = true;
        if let Err(e) = self.channel.send(Body::Reply(Reply {
            id: self.id,
            result: Some(result),
        })) {
            tracing::warn!(error = %e, "cannot reply to the front");
        }
    }

    /// Replies success with no payload.
    pub fn ok(self) {
        self.send(reply::Result::Ok(Empty {}))
    }

    /// Replies with a typed failure.
    pub fn fail(self, kind: FailureKind, message: impl Into<String>, metadata: &[(&str, String)]) {
        let failure = Failure {
            kind: kind as i32,
            message: message.into(),
            metadata: metadata
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        };
        self.send(reply::Result::Failure(failure))
    }

    /// The channel, e.g. to report a fatal fault after replying.
    pub fn channel(&self) -> &Channel {
        &self.channel
    }
}

impl Drop for Replier {
    fn drop(&mut self) {
        if !self.sent {
            let failure = Failure {
                kind: FailureKind::Internal as i32,
                message: "the executor dropped the request without replying".into(),
                metadata: Default::default(),
            };
            let _ = self.channel.send(Body::Reply(Reply {
                id: self.id,
                result: Some(reply::Result::Failure(failure)),
            }));
        }
    }
}

/// Makes the executor ignore SIGTERM and SIGINT. The front stops its
/// executors itself (Shutdown, or end of stream when it dies); a signal sent
/// to the whole process group or cgroup (Ctrl-C, `kill -- -PGID`, systemd's
/// stop) must not kill an executor under a draining front, which would
/// answer the drain's last launches EXECUTOR_UNAVAILABLE.
pub fn ignore_termination_signals() {
    use nix::sys::signal::{signal, SigHandler, Signal};
    for sig in [Signal::SIGTERM, Signal::SIGINT] {
        // SAFETY: SIG_IGN installs no handler code; it is set before any
        // other thread of this process exists.
        if let Err(e) = unsafe { signal(sig, SigHandler::SigIgn) } {
            tracing::warn!(signal = %sig, error = %e, "cannot ignore a termination signal");
        }
    }
}

/// Serves the front on stdin/stdout until it says Shutdown or goes away.
/// Returns the process exit code.
/// The request loop polls its channel for up to `spin` before it sleeps
/// ([`super::spin_input`]).
pub fn serve_stdio<B: Backend>(backend: &mut B, spin: std::time::Duration) -> i32 {
    // The channel is read through a duplicate of fd 0 as a plain file, not
    // through `Stdin`: its own buffer would hold bytes that the spin's
    // non-blocking `recv`s on the descriptor cannot see.
    let channel = match std::io::stdin().as_fd().try_clone_to_owned() {
        Ok(fd) => std::fs::File::from(fd),
        Err(e) => {
            tracing::error!(error = %e, "cannot duplicate the executor's channel");
            return 1;
        }
    };
    // Spins only under the daemon-wide bound (see `crate::spin`): the
    // front's page, installed from the command line at start.
    let spinners = crate::spin::executor_spinners().filter(|_| !spin.is_zero());
    let input = BufReader::new(super::spin_input::SpinInput::new(channel, spinners));
    serve(backend, input, Box::new(std::io::stdout()))
}

/// Serves requests read from `input`, replying on `output`.
pub fn serve<B: Backend>(
    backend: &mut B,
    mut input: impl std::io::Read,
    output: Box<dyn Write + Send>,
) -> i32 {
    let channel = Channel::new(output);
    if let Err(e) = channel.send(Body::Hello(backend.hello())) {
        tracing::error!(error = %e, "cannot greet the front");
        return 1;
    }
    loop {
        let request: Request = match read_frame(&mut input) {
            Ok(r) => r,
            Err(ProtocolError::Closed) => break,
            Err(e) => {
                tracing::error!(error = %e, "executor channel broken");
                break;
            }
        };
        let replier = Replier {
            id: request.id,
            channel: channel.clone(),
            sent: false,
        };
        match request.op {
            Some(Op::Shutdown(_)) => {
                backend.shutdown();
                replier.ok();
                return 0;
            }
            Some(Op::Ping(_)) => replier.ok(),
            Some(op) => dispatch(backend, op, replier),
            None => replier.fail(FailureKind::Internal, "request without an operation", &[]),
        }
    }
    backend.shutdown();
    0
}

/// The backend an executor process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExecutorBackend {
    Host,
    Cuda,
}

/// The executor's command line, `ptxd executor ...`: the one definition of
/// its flags. The front builds a value and spawns the child with
/// [`ExecutorArgs::to_args`]; the binary parses the child's command line
/// back into this struct, so the two cannot disagree (a unit test checks
/// that every value comes back as it was sent).
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct ExecutorArgs {
    #[arg(long, value_enum)]
    pub backend: ExecutorBackend,
    /// Host device index.
    #[arg(long, default_value_t = 0)]
    pub index: u32,
    /// Host threads per launch.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Host checked mode.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub checked: bool,
    /// CUDA device UUID.
    #[arg(long)]
    pub device: Option<String>,
    /// Report every CUDA device in a Hello frame and exit.
    #[arg(long)]
    pub probe: bool,
    /// Per-launch time budget in milliseconds (0: none).
    #[arg(long, default_value_t = 0)]
    pub max_kernel_time_ms: u64,
    /// The front installed the fd inbox (see `fd_inbox`) as fd 3.
    #[arg(long)]
    pub fd_inbox: bool,
    /// How long the request loop polls its channel before it sleeps, in
    /// microseconds (0: it sleeps at once).
    #[arg(long, default_value_t = 0)]
    pub channel_spin_us: u64,
    /// This executor's slot in the front's spin page, inherited as fd 4
    /// (see `crate::spin`); none: it never spins.
    #[arg(long)]
    pub spin_slot: Option<u32>,
    /// The persistent compiled-kernel cache's directory (see
    /// `kernel_cache`); none: no cache.
    #[arg(long)]
    pub kernel_cache_dir: Option<std::path::PathBuf>,
    /// The kernel cache's size bound in bytes.
    #[arg(long, default_value_t = 0)]
    pub kernel_cache_max_bytes: u64,
}

impl ExecutorArgs {
    /// The subcommand of the `ptxd` binary that runs an executor.
    pub const SUBCOMMAND: &'static str = "executor";

    /// A host executor for host device `index`.
    pub fn host(index: u32, threads: usize, checked: bool) -> Self {
        ExecutorArgs {
            backend: ExecutorBackend::Host,
            index,
            threads,
            checked,
            device: None,
            probe: false,
            max_kernel_time_ms: 0,
            fd_inbox: false,
            channel_spin_us: 0,
            spin_slot: None,
            kernel_cache_dir: None,
            kernel_cache_max_bytes: 0,
        }
    }

    /// A CUDA executor for the device with this UUID.
    pub fn cuda(uuid: &str) -> Self {
        ExecutorArgs {
            backend: ExecutorBackend::Cuda,
            device: Some(uuid.to_owned()),
            ..Self::host(0, 1, true)
        }
    }

    /// The CUDA probe: lists every CUDA device in its Hello and exits.
    pub fn cuda_probe() -> Self {
        ExecutorArgs {
            backend: ExecutorBackend::Cuda,
            probe: true,
            ..Self::host(0, 1, true)
        }
    }

    /// The same executor with a per-launch time budget (`None`: none). A
    /// budget under a millisecond becomes one, not none.
    pub fn with_max_kernel_time(self, budget: Option<std::time::Duration>) -> Self {
        let max_kernel_time_ms = budget.map_or(0, |budget| {
            u64::try_from(budget.as_millis().max(1)).unwrap_or(u64::MAX)
        });
        ExecutorArgs {
            max_kernel_time_ms,
            ..self
        }
    }

    /// The same executor, polling its channel for `spin` before it sleeps
    /// (whole microseconds; anything under one is none).
    pub fn with_channel_spin(self, spin: std::time::Duration) -> Self {
        ExecutorArgs {
            channel_spin_us: u64::try_from(spin.as_micros()).unwrap_or(u64::MAX),
            ..self
        }
    }

    /// The channel spin as a duration.
    pub fn channel_spin(&self) -> std::time::Duration {
        std::time::Duration::from_micros(self.channel_spin_us)
    }

    /// The same executor, told that fd 4 is the front's spin page and
    /// which slot in it is its own.
    pub fn with_spin_slot(self, slot: Option<u32>) -> Self {
        ExecutorArgs {
            spin_slot: slot,
            ..self
        }
    }

    /// Installs this executor's share of the daemon-wide spin bound (call
    /// once, at start, before serving).
    pub fn install_spin_bound(&self) {
        crate::spin::install_inherited(self.spin_slot, self.channel_spin());
    }

    /// The same executor, keeping compiled kernels in `cache` (a directory
    /// and its size bound; none: no cache).
    pub fn with_kernel_cache(self, cache: Option<(std::path::PathBuf, u64)>) -> Self {
        let (kernel_cache_dir, kernel_cache_max_bytes) = match cache {
            Some((dir, max_bytes)) => (Some(dir), max_bytes),
            None => (None, 0),
        };
        ExecutorArgs {
            kernel_cache_dir,
            kernel_cache_max_bytes,
            ..self
        }
    }

    /// The kernel cache this executor was given, opened; none when it was
    /// given none or the directory cannot be used (logged: the executor
    /// then compiles every kernel, as without a cache).
    pub fn kernel_cache(&self) -> Option<super::kernel_cache::KernelCache> {
        let dir = self.kernel_cache_dir.as_ref()?;
        match super::kernel_cache::KernelCache::open(dir, self.kernel_cache_max_bytes) {
            Ok(cache) => Some(cache),
            Err(e) => {
                tracing::warn!(error = %e, "the kernel cache is not used");
                None
            }
        }
    }

    /// The same executor, told that fd 3 is its fd inbox.
    pub fn with_fd_inbox(self) -> Self {
        ExecutorArgs {
            fd_inbox: true,
            ..self
        }
    }

    /// The command line after the program name: the subcommand, then every
    /// field as `--flag=value` (so that a value starting with `-` stays a
    /// value).
    pub fn to_args(&self) -> Vec<String> {
        // Destructured, so that a new field does not compile until it is
        // written here too.
        let ExecutorArgs {
            backend,
            index,
            threads,
            checked,
            device,
            probe,
            max_kernel_time_ms,
            fd_inbox,
            channel_spin_us,
            spin_slot,
            kernel_cache_dir,
            kernel_cache_max_bytes,
        } = self;
        let mut args = vec![Self::SUBCOMMAND.to_owned()];
        // Every variant has a value (none is `#[value(skip)]`).
        if let Some(backend) = clap::ValueEnum::to_possible_value(backend) {
            args.push(format!("--backend={}", backend.get_name()));
        }
        args.push(format!("--index={index}"));
        args.push(format!("--threads={threads}"));
        args.push(format!("--checked={checked}"));
        if let Some(device) = device {
            args.push(format!("--device={device}"));
        }
        if *probe {
            args.push("--probe".to_owned());
        }
        args.push(format!("--max-kernel-time-ms={max_kernel_time_ms}"));
        if *fd_inbox {
            args.push("--fd-inbox".to_owned());
        }
        args.push(format!("--channel-spin-us={channel_spin_us}"));
        if let Some(slot) = spin_slot {
            args.push(format!("--spin-slot={slot}"));
        }
        if let Some(dir) = kernel_cache_dir {
            // A path is not always UTF-8: as an OsString argument it would
            // be exact, but the command line here is strings; a lossy one
            // names another directory, so such a cache is not passed.
            match dir.to_str() {
                Some(dir) => args.push(format!("--kernel-cache-dir={dir}")),
                None => {
                    tracing::warn!(dir = %dir.display(), "a kernel cache directory that is not UTF-8 is not used")
                }
            }
        }
        args.push(format!("--kernel-cache-max-bytes={kernel_cache_max_bytes}"));
        args
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use clap::Parser;
    use rand::Rng;

    use super::*;
    use crate::executor::protocol::write_frame;
    use ptxd_proto::executor::ExecutorMessage;
    use std::sync::{Arc, Mutex};

    /// The shape of the `ptxd` binary's command line, reduced to the
    /// executor subcommand (the binary's own test parses with its real one).
    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    #[derive(Debug, clap::Subcommand)]
    enum Command {
        #[command(name = ExecutorArgs::SUBCOMMAND)]
        Executor(ExecutorArgs),
    }

    fn round_trip(args: &ExecutorArgs) -> ExecutorArgs {
        let argv = std::iter::once("ptxd".to_owned()).chain(args.to_args());
        let Command::Executor(parsed) = Cli::try_parse_from(argv).unwrap().command;
        parsed
    }

    #[test]
    fn every_command_line_parses_back_to_its_value() {
        let mut rng = rand::rng();
        let mut samples = vec![
            ExecutorArgs::host(0, 1, true),
            ExecutorArgs::host(u32::MAX, usize::MAX, false),
            ExecutorArgs::cuda("GPU-8d3f0c7e-1b2a-4c5d-9e8f-0a1b2c3d4e5f"),
            // A value that looks like a flag, and one with a space and `=`.
            ExecutorArgs::cuda("--probe"),
            ExecutorArgs::cuda("GPU a=b"),
            ExecutorArgs::cuda_probe(),
            ExecutorArgs::cuda_probe().with_max_kernel_time(Some(std::time::Duration::MAX)),
            ExecutorArgs::host(2, 4, true).with_fd_inbox(),
            ExecutorArgs::host(2, 4, true).with_spin_slot(Some(7)),
            ExecutorArgs::host(1, 1, true).with_channel_spin(std::time::Duration::MAX),
            ExecutorArgs::cuda("GPU-x")
                .with_kernel_cache(Some(("/var/cache/ptxd kernels".into(), u64::MAX))),
            ExecutorArgs::cuda("GPU-x").with_kernel_cache(Some(("--probe".into(), 1))),
        ];
        for _ in 0..64 {
            let budget = rng
                .random_bool(0.5)
                .then(|| std::time::Duration::from_micros(rng.random_range(1..10_000_000)));
            let args = if rng.random_bool(0.5) {
                ExecutorArgs::host(rng.random(), rng.random_range(0..=usize::MAX), rng.random())
            } else {
                ExecutorArgs::cuda(&format!("GPU-{:x}", rng.random::<u64>()))
            };
            let args = args.with_max_kernel_time(budget).with_channel_spin(
                std::time::Duration::from_micros(rng.random_range(0..1_000_000)),
            );
            samples.push(if rng.random_bool(0.5) {
                args.with_fd_inbox()
            } else {
                args
            });
        }
        for args in samples {
            assert_eq!(round_trip(&args), args, "{:?}", args.to_args());
        }
    }

    #[test]
    fn a_budget_is_whole_milliseconds_and_never_rounds_to_none() {
        let args = |budget| ExecutorArgs::host(0, 1, true).with_max_kernel_time(budget);
        assert_eq!(args(None).max_kernel_time_ms, 0);
        let sub_ms = Some(std::time::Duration::from_micros(10));
        assert_eq!(args(sub_ms).max_kernel_time_ms, 1);
        let ms = Some(std::time::Duration::from_millis(2500));
        assert_eq!(args(ms).max_kernel_time_ms, 2500);
    }

    /// A backend that records which typed operation each request reached.
    #[derive(Default)]
    struct Recording {
        calls: Vec<String>,
        rings: HashMap<u64, RingHandle<(), ()>>,
    }

    impl Backend for Recording {
        type RingKernel = ();
        type RingBuffer = ();
        fn hello(&self) -> Hello {
            Hello::default()
        }
        fn load_module(&mut self, load: LoadModule, reply: Replier) {
            self.calls.push(format!("load_module {}", load.module_id));
            reply.send(reply::Result::LoadModule(
                ptxd_proto::executor::LoadModuleOk {
                    block_size: load.module_id as u32,
                    info_log: String::new(),
                },
            ))
        }
        fn unload_module(&mut self, module_id: u64, reply: Replier) {
            self.calls.push(format!("unload_module {module_id}"));
            reply.ok()
        }
        fn open_buffer(&mut self, open: OpenBuffer, reply: Replier) {
            self.calls.push(format!("open_buffer {}", open.buffer_id));
            reply.ok()
        }
        fn close_buffer(&mut self, buffer_id: u64, reply: Replier) {
            self.calls.push(format!("close_buffer {buffer_id}"));
            reply.ok()
        }
        fn open_event(&mut self, open: OpenEvent, reply: Replier) {
            self.calls.push(format!("open_event {}", open.event_id));
            reply.ok()
        }
        fn close_event(&mut self, event_id: u64, reply: Replier) {
            self.calls.push(format!("close_event {event_id}"));
            reply.ok()
        }
        fn launch(&mut self, launch: Launch, reply: Replier) {
            self.calls.push(format!("launch {}", launch.module_id));
            reply.ok()
        }
        fn close_stream(&mut self, stream: u64, reply: Replier) {
            self.calls.push(format!("close_stream {stream}"));
            reply.ok()
        }
        fn open_ring(&mut self, open: OpenRing, reply: Replier) {
            self.calls.push(format!("open_ring {}", open.stream));
            reply.ok()
        }
        fn rings(&self) -> &HashMap<u64, RingHandle<(), ()>> {
            &self.rings
        }
        fn rings_mut(&mut self) -> &mut HashMap<u64, RingHandle<(), ()>> {
            &mut self.rings
        }
        fn ring_kernel(&self, _: u64) -> Option<()> {
            None
        }
        fn ring_buffer(&self, _: u64) -> Option<()> {
            None
        }
        fn shutdown(&mut self) {
            self.calls.push("shutdown".into());
        }
    }

    /// What the loop writes, kept for the test to read back.
    #[derive(Clone, Default)]
    struct Written(Arc<Mutex<Vec<u8>>>);

    impl Write for Written {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn each_request_reaches_its_typed_operation_and_gets_one_reply() {
        use ptxd_proto::executor as exec;
        let mut rng = rand::rng();
        let (module, buffer, event, stream): (u64, u64, u64, u64) =
            (rng.random(), rng.random(), rng.random(), rng.random());
        let ops = vec![
            Op::LoadModule(LoadModule {
                module_id: module & 0xffff,
                ..Default::default()
            }),
            Op::UnloadModule(exec::UnloadModule { module_id: module }),
            Op::OpenBuffer(OpenBuffer {
                buffer_id: buffer,
                ..Default::default()
            }),
            Op::CloseBuffer(exec::CloseBuffer { buffer_id: buffer }),
            Op::OpenEvent(OpenEvent {
                event_id: event,
                ..Default::default()
            }),
            Op::CloseEvent(exec::CloseEvent { event_id: event }),
            Op::Launch(Launch {
                module_id: module,
                ..Default::default()
            }),
            Op::CloseStream(exec::CloseStream { stream }),
            Op::OpenRing(OpenRing {
                stream,
                ..Default::default()
            }),
            Op::CloseRing(exec::CloseRing { stream }),
            Op::RingGrant(exec::RingGrant {
                stream,
                ..Default::default()
            }),
            Op::Ping(exec::Ping {}),
            Op::Shutdown(exec::Shutdown {}),
        ];
        let mut input = Vec::new();
        for (id, op) in ops.iter().enumerate() {
            let request = Request {
                id: 1000 + id as u64,
                op: Some(op.clone()),
            };
            write_frame(&mut input, &request).unwrap();
        }
        let mut backend = Recording::default();
        let written = Written::default();
        assert_eq!(
            serve(&mut backend, input.as_slice(), Box::new(written.clone())),
            0
        );
        assert_eq!(
            backend.calls,
            vec![
                format!("load_module {}", module & 0xffff),
                format!("unload_module {module}"),
                format!("open_buffer {buffer}"),
                format!("close_buffer {buffer}"),
                format!("open_event {event}"),
                format!("close_event {event}"),
                format!("launch {module}"),
                format!("close_stream {stream}"),
                format!("open_ring {stream}"),
                "shutdown".to_string(),
            ]
        );
        let bytes = written.0.lock().unwrap().clone();
        let mut out = bytes.as_slice();
        let hello: ExecutorMessage = read_frame(&mut out).unwrap();
        assert!(matches!(hello.body, Some(Body::Hello(_))));
        let mut replies = Vec::new();
        while let Ok(message) = read_frame::<ExecutorMessage>(&mut out) {
            match message.body {
                Some(Body::Reply(reply)) => replies.push(reply),
                other => panic!("not a reply: {other:?}"),
            }
        }
        let ids: Vec<u64> = replies.iter().map(|r| r.id).collect();
        assert_eq!(ids, (1000..1000 + ops.len() as u64).collect::<Vec<_>>());
        assert_eq!(
            replies[0].result,
            Some(reply::Result::LoadModule(
                ptxd_proto::executor::LoadModuleOk {
                    block_size: (module & 0xffff) as u32,
                    info_log: String::new(),
                }
            ))
        );
        // A grant for a stream without a ring is refused by the dispatcher.
        let Some(reply::Result::Failure(refused)) = &replies[10].result else {
            panic!("the grant was not refused: {:?}", replies[10]);
        };
        assert_eq!(refused.kind, FailureKind::UnknownObject as i32);
        assert_eq!(refused.message, format!("stream {stream} has no ring"));
        assert_eq!(
            refused.metadata.get("object").map(String::as_str),
            Some("ring")
        );
        for (index, reply) in replies.iter().enumerate() {
            if index != 0 && index != 10 {
                assert_eq!(reply.result, Some(reply::Result::Ok(Empty {})), "{index}");
            }
        }
    }
}
