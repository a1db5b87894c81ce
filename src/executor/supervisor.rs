//! The front's side of the executors: spawning a child process per device,
//! the request/reply link to it, and noticing its death.
//!
//! Invariants:
//! - Every call on a link gets an answer: its reply, or [`LinkError::Down`]
//!   once the executor's channel closes. A call made after the link closed
//!   fails at once; none waits on a dead process.
//! - A link reports its death exactly once, on the channel it was spawned
//!   with, after every pending call has been failed.
//! - The child's only channel is one socket on its stdin/stdout; when the
//!   front dies, the child reads end-of-stream and exits.
//! - Frames are written whole and in order. A call writes its own frame,
//!   without waiting, when nothing is queued for the writer task (the
//!   common case: one syscall, no task hop); whatever it could not write
//!   goes to the writer task, which writes it, and every frame queued after
//!   it, before a caller writes again. Nothing awaits between a frame's
//!   first and last byte on the caller's side, so a caller that is
//!   cancelled mid-call (a client hanging up) can never leave half a frame
//!   on the channel, and its pending entry is removed when it goes.
//! - Replies are read through a buffer: one read brings in every reply
//!   that has arrived (one syscall per reply instead of two).
//! - Whoever holds the inbox lock reads the channel, without blocking, and
//!   hands every reply read to its caller, in order: the reader task when
//!   the reactor says the channel is readable, and a call that spins for
//!   its reply (`--front-spin`) with its own `recv`s on the descriptor,
//!   which then sees the reply before any thread has been woken to report
//!   it and needs no woken task to hand it over. A call that ends the stream (end of file, a bad frame) records
//!   why and tells the reader task, which fails the waiters.
//! - An executor that does not answer a call within the executor timeout is
//!   pinged; if the ping is not answered within the timeout either (a hung
//!   driver, a request loop stuck in a drain), it is killed and the
//!   supervisor starts a new generation. A call that merely waits its turn
//!   behind its own session's long launches (each bounded by the per-launch
//!   budget, which the executor enforces) kills nothing.
//! - A `KernelTimeout` message is counted against its session
//!   ([`KernelTimeouts`]) before the next frame is read, so before the reply
//!   to the launch that timed out.
//! - A `Fault` report ends the link at once, as its channel's close would:
//!   no frame after it is read (nothing the executor says after its context
//!   is poisoned is trusted) and every pending call fails. For a sticky
//!   fault the process is then killed (it can launch nothing more, from any
//!   thread) and its death reported before it is reaped: a faulted CUDA
//!   context's exit takes tens of milliseconds the promotion of a spare need
//!   not wait for, and nothing of it runs on the device any more. A kernel
//!   timeout's report is the exception: its kernel may still be running, so
//!   its death is reported once the process is reaped (its context gone).
//! - The recovery path logs its steps with [`unix_micros`] timestamps at
//!   debug on the `ptxd::recovery` target (`recovery_mark!`), comparable
//!   across the front, its executors and a test on the same machine.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, TryLockError};
use std::time::{Duration, Instant};

use ptxd_proto::executor::{
    executor_message::Body, reply, request::Op, ExecutorMessage, Fault, Hello, Ping, Request,
    Shutdown,
};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, oneshot, Notify};

use super::child::{ExecutorArgs, EXIT_FAULT};
use super::fd_inbox::{self, FdOutbox};
use super::kernel_timeouts::KernelTimeouts;
use super::protocol::{encode_frame, read_frame_async, FrameBuffer, ProtocolError};
use crate::config::ServeConfig;
use crate::handles::DeviceGeneration;
use crate::spin::Spinners;

/// The reply reader's buffer: replies are a few bytes; a LoadModule reply
/// with its log is larger and is read in several goes.
const REPLY_BUFFER: usize = 64 << 10;

/// Microseconds since the Unix epoch: the recovery path's timestamps,
/// comparable across processes on one machine (0 before 1970).
pub fn unix_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Logs one step of the recovery path (`phase`, a literal) at debug on the
/// `ptxd::recovery` target with its [`unix_micros`] timestamp and any
/// further fields: `RUST_LOG=ptxd::recovery=debug` gives the per-phase
/// breakdown of a fault's recovery (`tests/gpu/recovery.rs` prints it).
macro_rules! recovery_mark {
    ($phase:literal $(, $($field:tt)*)?) => {
        tracing::debug!(
            target: "ptxd::recovery",
            phase = $phase,
            at_us = $crate::executor::supervisor::unix_micros()
            $(, $($field)*)?
        )
    };
}
pub(crate) use recovery_mark;

/// How long an executor may take to say Hello (CUDA context creation is
/// ~0.5 s on an H200; a hung driver must not hang the daemon).
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(60);

/// Why an executor is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DownCause {
    /// It reported a sticky device fault and exited.
    Fault { error_name: String, message: String },
    /// It exited or its channel broke without a fault report.
    Exited { detail: String },
    /// It did not answer within the executor timeout and was killed.
    Unresponsive { after: Duration },
    /// The front asked it to stop.
    Stopped,
}

impl std::fmt::Display for DownCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DownCause::Fault {
                error_name,
                message,
            } => write!(f, "device fault {error_name}: {message}"),
            DownCause::Exited { detail } => write!(f, "executor exited: {detail}"),
            DownCause::Unresponsive { after } => {
                write!(f, "executor did not answer within {after:?} and was killed")
            }
            DownCause::Stopped => f.write_str("executor stopped"),
        }
    }
}

/// A failed call on a link.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    #[error("executor down: {0}")]
    Down(DownCause),
}

/// Why an executor could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("cannot spawn the executor process: {0}")]
    Io(#[from] std::io::Error),
    #[error("the executor did not greet: {0}")]
    Protocol(#[from] ProtocolError),
    #[error("the executor did not greet within {0:?}")]
    Timeout(Duration),
    #[error("the executor greeted with something other than Hello")]
    NoHello,
    #[error("the executor drives no device")]
    NoDevice,
}

/// What every executor link is started with.
#[derive(Debug, Clone)]
pub struct LinkConfig {
    /// How long a call may go unanswered before the executor is pinged,
    /// and how long the ping may then take before the executor is killed.
    pub timeout: Duration,
    /// The per-launch budget executors enforce (none: no budget).
    pub max_kernel_time: Option<Duration>,
    /// Kernel timeouts per session, shared by every link of the daemon.
    pub kernel_timeouts: Arc<KernelTimeouts>,
    /// How long an executor polls its channel before it sleeps.
    pub channel_spin: Duration,
    /// How long a call polls for its reply before its task sleeps, and
    /// how many may at once (shared with the fd socket's connections).
    pub spinners: Arc<Spinners>,
    /// The persistent compiled-kernel cache CUDA executors keep (its
    /// directory and size bound); none: none.
    pub kernel_cache: Option<(std::path::PathBuf, u64)>,
    /// Whether each device keeps a hot spare executor started, promoted
    /// when the serving one dies (`--spare-executor`).
    pub spare: bool,
}

impl LinkConfig {
    pub fn from_config(config: &ServeConfig) -> LinkConfig {
        LinkConfig {
            timeout: config.executor_timeout,
            max_kernel_time: (!config.max_kernel_time.is_zero()).then_some(config.max_kernel_time),
            kernel_timeouts: Arc::new(KernelTimeouts::new(config.max_kernel_timeouts_per_session)),
            channel_spin: config.executor_spin,
            spinners: Spinners::for_this_machine(config.front_spin),
            kernel_cache: config
                .kernel_cache_dir
                .clone()
                .map(|dir| (dir, config.kernel_cache_max_bytes)),
            spare: config.spare_executor,
        }
    }
}

/// Which executor child to start; [`ExecutorArgs`] is its command line.
#[derive(Debug, Clone)]
pub enum ExecutorCommand {
    Host {
        index: u32,
        threads: usize,
        checked: bool,
    },
    Cuda {
        uuid: String,
    },
    CudaProbe,
}

impl ExecutorCommand {
    /// The child's command line, with the per-launch budget and the
    /// channel spin (never given to the probe, which launches nothing).
    fn executor_args(
        &self,
        max_kernel_time: Option<Duration>,
        spin: Duration,
        kernel_cache: Option<&(std::path::PathBuf, u64)>,
    ) -> ExecutorArgs {
        let args = match self {
            ExecutorCommand::Host {
                index,
                threads,
                checked,
            } => {
                ExecutorArgs::host(*index, *threads, *checked).with_max_kernel_time(max_kernel_time)
            }
            // The host backend's "compiled" form is its decoded program,
            // which takes less to make again than to read back.
            ExecutorCommand::Cuda { uuid } => ExecutorArgs::cuda(uuid)
                .with_max_kernel_time(max_kernel_time)
                .with_kernel_cache(kernel_cache.cloned()),
            ExecutorCommand::CudaProbe => return ExecutorArgs::cuda_probe(),
        };
        args.with_channel_spin(spin)
    }
}

type ReplySender = oneshot::Sender<Result<reply::Result, LinkError>>;
type ReplyReceiver = oneshot::Receiver<Result<reply::Result, LinkError>>;

#[derive(Default)]
struct Pending {
    waiting: HashMap<u64, ReplySender>,
    closed: Option<DownCause>,
}

/// A live executor process and the channel to it.
pub struct ExecutorLink {
    /// The device index this executor serves.
    pub index: usize,
    /// Its lane in the front's spin page ([`crate::spin::executor_slot`]):
    /// the device index, or the device's second lane for a hot spare, so
    /// that a spare's start or death never clears the permits of the
    /// executor serving beside it.
    pub spin_index: usize,
    pub generation: DeviceGeneration,
    pub hello: Hello,
    /// Where requests are written.
    outbox: Outbox,
    /// Where replies are read.
    inbox: Inbox,
    /// How long a call polls for its reply before its task sleeps.
    spinners: Arc<Spinners>,
    timeout: Duration,
    kernel_timeouts: Arc<KernelTimeouts>,
    pending: Mutex<Pending>,
    next_id: AtomicU64,
    child: Mutex<Option<tokio::process::Child>>,
    /// Where descriptors for `OpenBuffer` (fd_tag) go first.
    fd_outbox: FdOutbox,
}

impl std::fmt::Debug for ExecutorLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecutorLink")
            .field("index", &self.index)
            .field("generation", &self.generation)
            .field("pid", &self.hello.pid)
            .finish()
    }
}

/// Removes a call's pending entry when the call ends, however it ends.
struct PendingEntry<'a> {
    link: &'a ExecutorLink,
    id: u64,
}

impl Drop for PendingEntry<'_> {
    fn drop(&mut self) {
        self.link.lock_pending().waiting.remove(&self.id);
    }
}

/// The write side of the channel: callers write here directly while the
/// writer task has nothing queued; the rest goes to the writer task.
/// Dropping it (with the link) ends the writer task, which then drops the
/// last handle of the write half: the executor reads end of stream.
struct Outbox {
    half: Arc<OwnedWriteHalf>,
    /// Frames (or frame tails) handed to the writer task and not yet
    /// written whole. While it is not zero, callers queue behind them.
    queued: Arc<Mutex<usize>>,
    frames: mpsc::UnboundedSender<Vec<u8>>,
}

impl Outbox {
    /// Writes `frame` now if nothing is queued, else queues it (or the part
    /// that did not fit) for the writer task. Err when the channel closed.
    fn send(&self, frame: Vec<u8>) -> Result<(), ()> {
        // A poisoned count is still a count: a panic cannot leave it half
        // updated.
        let mut queued = self.queued.lock().unwrap_or_else(|p| p.into_inner());
        let rest = if *queued == 0 {
            match self.half.try_write(&frame) {
                Ok(n) if n == frame.len() => return Ok(()),
                Ok(n) => frame[n..].to_vec(),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => frame,
                Err(_) => return Err(()),
            }
        } else {
            frame
        };
        *queued += 1;
        self.frames.send(rest).map_err(|_| ())
    }
}

/// How [`ExecutorLink::pump`] reads the channel.
#[derive(Debug, Clone, Copy)]
enum Read {
    /// Through the reactor's readiness (the reader task): a read that finds
    /// nothing clears it, so the task sleeps until the next reply.
    Reactor,
    /// A non-blocking `recv` on the descriptor itself (a spinning call):
    /// it sees a reply as soon as the kernel has it, before the reactor's
    /// thread has woken to report it. The reader task's readiness is left
    /// as it is; its next read finds what is left, or nothing.
    Direct,
}

/// The read side of the channel (see the module docs).
struct Inbox {
    half: OwnedReadHalf,
    state: Mutex<InboxState>,
    /// Rung by a call that ended the stream, for the reader task.
    ended: Notify,
}

struct InboxState {
    frames: FrameBuffer,
    /// A `Fault` the executor sent before its channel closed.
    fault: Option<Fault>,
    /// Why the stream ended, once it has.
    ended: Option<DownCause>,
}

/// An executor that exited with [`EXIT_FAULT`] met a sticky device fault,
/// even when its `Fault` report was lost with the channel: it restarts as a
/// fault does (at once, with the fault counted), not as an exit.
fn fault_by_status(cause: DownCause, code: Option<i32>) -> DownCause {
    match cause {
        DownCause::Exited { detail } if code == Some(EXIT_FAULT) => DownCause::Fault {
            error_name: "UNREPORTED_FAULT".into(),
            message: format!("the executor exited with the fault status {EXIT_FAULT} ({detail})"),
        },
        cause => cause,
    }
}

/// The fault name the CUDA watchdog reports for a kernel past its budget
/// (`cuda::watchdog`): unlike a sticky fault, that kernel may still run.
const KERNEL_TIMEOUT_FAULT: &str = "KERNEL_TIMEOUT";

/// True for a reported fault after which nothing of the executor runs on
/// the device (a sticky error stopped its context's work): its successor
/// may serve before the process is gone.
fn nothing_runs_after(cause: &DownCause) -> bool {
    matches!(cause, DownCause::Fault { error_name, .. } if error_name != KERNEL_TIMEOUT_FAULT)
}

/// A death notice: device index, the generation that died, and why.
pub type DeathNotice = (usize, DeviceGeneration, DownCause);

fn spawn_child(
    command: &ExecutorCommand,
    max_kernel_time: Option<Duration>,
    spin: Duration,
    spin_page: Option<(BorrowedFd<'_>, u32)>,
    kernel_cache: Option<&(std::path::PathBuf, u64)>,
) -> Result<(tokio::process::Child, tokio::net::UnixStream, FdOutbox), SpawnError> {
    let (front_end, child_end) = std::os::unix::net::UnixStream::pair()?;
    let child_out = child_end.try_clone()?;
    let (outbox, inbox) = fd_inbox::pair()?;
    let inbox_raw = inbox.as_raw_fd();
    // The spin page goes to fd 4 (`crate::spin::INHERITED_FD`), with the
    // executor's slot on its command line.
    let page_raw = spin_page.map(|(fd, _)| fd.as_raw_fd());
    let exe = std::env::current_exe()?;
    let mut child = tokio::process::Command::new(exe);
    child
        .args(
            command
                .executor_args(max_kernel_time, spin, kernel_cache)
                .with_fd_inbox()
                .with_spin_slot(spin_page.map(|(_, slot)| slot))
                .to_args(),
        )
        .stdin(Stdio::from(OwnedFd::from(child_end)))
        .stdout(Stdio::from(OwnedFd::from(child_out)))
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    // SAFETY: the closure runs in the forked child before exec and makes only
    // async-signal-safe calls (fcntl, dup2, close) on descriptors that stay
    // open in the parent until spawn returns (`inbox` is dropped after it,
    // the spin page lives in the front's spinners).
    unsafe {
        child.pre_exec(move || {
            // Each source is first copied above the targets, so that
            // installing one cannot close the other.
            let inbox = park(inbox_raw)?;
            let page = page_raw.map(park).transpose()?;
            install(inbox, fd_inbox::INBOX_FD)?;
            if let Some(page) = page {
                install(page, crate::spin::INHERITED_FD)?;
            }
            Ok(())
        });
    }
    let child = child.spawn()?;
    drop(inbox);
    front_end.set_nonblocking(true)?;
    Ok((child, tokio::net::UnixStream::from_std(front_end)?, outbox))
}

/// In a forked child: a copy of `fd` numbered above the fixed descriptors
/// an executor inherits (not close-on-exec; [`install`] closes it).
fn park(fd: std::os::fd::RawFd) -> std::io::Result<std::os::fd::RawFd> {
    // SAFETY: F_DUPFD on integers has no memory effects; an invalid `fd`
    // fails with EBADF.
    let parked = unsafe { nix::libc::fcntl(fd, nix::libc::F_DUPFD, 10) };
    if parked < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(parked)
}

/// In a forked child: moves a parked descriptor to `target` (inherited
/// across exec) and closes the parked copy.
fn install(parked: std::os::fd::RawFd, target: std::os::fd::RawFd) -> std::io::Result<()> {
    if libc_dup2(parked, target) < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: closes the copy `park` made, which nothing else uses.
    unsafe { nix::libc::close(parked) };
    Ok(())
}

/// `dup2(2)`: the new descriptor is not close-on-exec.
fn libc_dup2(old: std::os::fd::RawFd, new: std::os::fd::RawFd) -> i32 {
    // SAFETY: dup2 on integers has no memory effects; an invalid `old`
    // fails with EBADF.
    unsafe { nix::libc::dup2(old, new) }
}

async fn read_hello(stream: &mut tokio::net::unix::OwnedReadHalf) -> Result<Hello, SpawnError> {
    let message: ExecutorMessage = tokio::time::timeout(HELLO_TIMEOUT, read_frame_async(stream))
        .await
        .map_err(|_| SpawnError::Timeout(HELLO_TIMEOUT))??;
    match message.body {
        Some(Body::Hello(hello)) => Ok(hello),
        _ => Err(SpawnError::NoHello),
    }
}

/// Runs the CUDA probe in a child process (so that a driver fault or a
/// missing library can never take the front down) and returns its Hello.
pub async fn probe_cuda() -> Result<Hello, SpawnError> {
    let (mut child, stream, _outbox) = spawn_child(
        &ExecutorCommand::CudaProbe,
        None,
        Duration::ZERO,
        None,
        None,
    )?;
    let (mut read, _write) = stream.into_split();
    let hello = read_hello(&mut read).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
    let _ = child.start_kill();
    let hello = hello?;
    if hello.devices.is_empty() {
        return Err(SpawnError::NoDevice);
    }
    Ok(hello)
}

/// How far a device's second spin lane is from its first: the page's
/// executor slots are split in two halves.
const SECOND_SPIN_LANE: usize = 254;

/// The spin lane a new executor of device `index` takes beside one on
/// `beside` (the lane the other one does not use).
pub fn other_spin_lane(index: usize, beside: usize) -> usize {
    if beside == index {
        index.saturating_add(SECOND_SPIN_LANE)
    } else {
        index
    }
}

impl ExecutorLink {
    /// Starts an executor for device `index` as `generation`. Its death is
    /// reported once on `deaths`.
    pub async fn spawn(
        index: usize,
        generation: DeviceGeneration,
        command: &ExecutorCommand,
        config: &LinkConfig,
        deaths: mpsc::UnboundedSender<DeathNotice>,
    ) -> Result<Arc<ExecutorLink>, SpawnError> {
        Self::spawn_on_lane(index, index, generation, command, config, deaths).await
    }

    /// [`ExecutorLink::spawn`], spinning on lane `spin_index` (see
    /// [`other_spin_lane`]).
    pub async fn spawn_on_lane(
        index: usize,
        spin_index: usize,
        generation: DeviceGeneration,
        command: &ExecutorCommand,
        config: &LinkConfig,
        deaths: mpsc::UnboundedSender<DeathNotice>,
    ) -> Result<Arc<ExecutorLink>, SpawnError> {
        // Every spin of the executor is under the daemon-wide bound: it
        // gets the front's spin page and a slot of its own, cleared now (a
        // previous executor there may have died holding permits) and when
        // it dies.
        let (child, stream, fd_outbox) = spawn_child(
            command,
            config.max_kernel_time,
            config.channel_spin,
            config.spinners.inheritable(spin_index),
            config.kernel_cache.as_ref(),
        )?;
        let (mut read, write) = stream.into_split();
        let hello = read_hello(&mut read).await?;
        if hello.devices.is_empty() {
            return Err(SpawnError::NoDevice);
        }
        let channel = (read, write, fd_outbox);
        Ok(Self::start(
            (index, spin_index, generation),
            hello,
            Some(child),
            channel,
            config,
            deaths,
        ))
    }

    /// The link over an executor's channel once it said `hello`: starts its
    /// writer and reader tasks.
    fn start(
        (index, spin_index, generation): (usize, usize, DeviceGeneration),
        hello: Hello,
        child: Option<tokio::process::Child>,
        (read, write, fd_outbox): (OwnedReadHalf, OwnedWriteHalf, FdOutbox),
        config: &LinkConfig,
        deaths: mpsc::UnboundedSender<DeathNotice>,
    ) -> Arc<ExecutorLink> {
        let (frames, frames_rx) = mpsc::unbounded_channel();
        let outbox = Outbox {
            half: Arc::new(write),
            queued: Arc::new(Mutex::new(0)),
            frames,
        };
        tokio::spawn(Self::write_frames(
            outbox.half.clone(),
            outbox.queued.clone(),
            frames_rx,
        ));
        let inbox = Inbox {
            half: read,
            state: Mutex::new(InboxState {
                frames: FrameBuffer::with_capacity(REPLY_BUFFER),
                fault: None,
                ended: None,
            }),
            ended: Notify::new(),
        };
        let link = Arc::new(ExecutorLink {
            index,
            spin_index,
            generation,
            hello,
            outbox,
            inbox,
            spinners: config.spinners.clone(),
            timeout: config.timeout,
            kernel_timeouts: config.kernel_timeouts.clone(),
            pending: Mutex::new(Pending::default()),
            next_id: AtomicU64::new(1),
            child: Mutex::new(child),
            fd_outbox,
        });
        tokio::spawn(Self::read_replies(link.clone(), deaths));
        link
    }

    /// Writes what callers queued, whole and in order, until the link is
    /// dropped or the channel breaks (the reader then sees the close and
    /// fails every waiter).
    async fn write_frames(
        half: Arc<OwnedWriteHalf>,
        queued: Arc<Mutex<usize>>,
        mut frames: mpsc::UnboundedReceiver<Vec<u8>>,
    ) {
        while let Some(frame) = frames.recv().await {
            let mut written = 0;
            while written < frame.len() {
                if let Err(e) = half.writable().await {
                    tracing::debug!(error = %e, "executor channel write failed");
                    return;
                }
                match half.try_write(&frame[written..]) {
                    Ok(n) => written += n,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => {
                        tracing::debug!(error = %e, "executor channel write failed");
                        return;
                    }
                }
            }
            *queued.lock().unwrap_or_else(|p| p.into_inner()) -= 1;
        }
    }

    /// Sends the executor a duplicate of `fd` for an `OpenBuffer` request
    /// to name by the returned tag; send the request after this returns.
    pub fn send_fd(&self, fd: BorrowedFd<'_>) -> Result<u64, LinkError> {
        self.fd_outbox.send(fd).map_err(|errno| {
            LinkError::Down(DownCause::Exited {
                detail: format!("the executor's fd inbox refused a descriptor: {errno}"),
            })
        })
    }

    /// The executor's process id.
    pub fn pid(&self) -> u32 {
        self.hello.pid
    }

    /// Reads the channel whenever it is readable (or a spinning call ended
    /// it), until it ends; then fails every waiter, reaps the child and
    /// reports the death.
    async fn read_replies(link: Arc<ExecutorLink>, deaths: mpsc::UnboundedSender<DeathNotice>) {
        let cause = loop {
            let readable = tokio::select! {
                readable = link.inbox.half.readable() => readable,
                () = link.inbox.ended.notified() => Ok(()),
            };
            let mut state = link.lock_inbox();
            if let Err(e) = readable {
                break link.end(&mut state, ProtocolError::Io(e));
            }
            if let Some(cause) = link.pump(&mut state, Read::Reactor) {
                break cause;
            }
        };
        let waiting = {
            let mut pending = link.lock_pending();
            pending.closed.get_or_insert(cause.clone());
            std::mem::take(&mut pending.waiting)
        };
        for (_, sender) in waiting {
            let _ = sender.send(Err(LinkError::Down(cause.clone())));
        }
        let mut child = link.child.lock().ok().and_then(|mut c| c.take());
        recovery_mark!("link_ended", device = link.index, generation = %link.generation, %cause);
        if nothing_runs_after(&cause) {
            // A reported fault: the process is fenced off now (killed, so
            // that no thread of it launches again) and its death reported
            // at once; its exit (a faulted context's teardown) and the
            // reaping happen while its successor is promoted.
            if let Some(child) = child.as_mut() {
                let _ = child.start_kill();
            }
            link.spinners.clear_executor(link.spin_index);
            let _ = deaths.send((link.index, link.generation, cause.clone()));
            recovery_mark!("death_reported", device = link.index, generation = %link.generation);
            let status = match child {
                Some(mut child) => {
                    match tokio::time::timeout(Duration::from_secs(5), child.wait()).await {
                        Ok(Ok(status)) => status.to_string(),
                        _ => "not reaped within 5 s of its kill".to_string(),
                    }
                }
                None => "already reaped".to_string(),
            };
            recovery_mark!("faulted_executor_reaped", device = link.index, generation = %link.generation);
            tracing::info!(device = link.index, generation = %link.generation, %cause, status, "executor gone");
            return;
        }
        let mut cause = cause;
        let status = match child {
            Some(mut child) => {
                match tokio::time::timeout(Duration::from_secs(5), child.wait()).await {
                    Ok(Ok(status)) => {
                        cause = fault_by_status(cause, status.code());
                        status.to_string()
                    }
                    _ => {
                        let _ = child.start_kill();
                        "killed after its channel closed".to_string()
                    }
                }
            }
            None => "already reaped".to_string(),
        };
        recovery_mark!("executor_reaped", device = link.index, generation = %link.generation);
        tracing::info!(device = link.index, generation = %link.generation, %cause, status, "executor gone");
        // It holds no spin permits now, whatever its slot says.
        link.spinners.clear_executor(link.spin_index);
        let _ = deaths.send((link.index, link.generation, cause));
        recovery_mark!("death_reported", device = link.index, generation = %link.generation);
    }

    /// Reads every frame that has arrived, without blocking, and hands each
    /// reply to its caller; `Some` once the stream has ended.
    fn pump(&self, state: &mut InboxState, read: Read) -> Option<DownCause> {
        loop {
            if let Some(cause) = &state.ended {
                return Some(cause.clone());
            }
            loop {
                match state.frames.next_frame::<ExecutorMessage>() {
                    Ok(Some(message)) => {
                        self.dispatch(message, &mut state.fault);
                        if state.fault.is_some() {
                            // The first sign of a fault: the executor
                            // serves nothing after it (see the module
                            // docs), so the link ends here, not at the
                            // close its process's exit brings much later.
                            recovery_mark!("fault_report_read", device = self.index, generation = %self.generation);
                            return Some(self.end(state, ProtocolError::Closed));
                        }
                    }
                    Ok(None) => break,
                    Err(e) => return Some(self.end(state, e)),
                }
            }
            let spare = state.frames.spare();
            let got = match read {
                Read::Reactor => self.inbox.half.try_read(spare),
                Read::Direct => {
                    let fd = self.inbox.half.as_ref().as_raw_fd();
                    nix::sys::socket::recv(fd, spare, nix::sys::socket::MsgFlags::MSG_DONTWAIT)
                        .map_err(std::io::Error::from)
                }
            };
            match got {
                Ok(0) => {
                    let e = if state.frames.is_empty() {
                        ProtocolError::Closed
                    } else {
                        ProtocolError::Io(std::io::ErrorKind::UnexpectedEof.into())
                    };
                    return Some(self.end(state, e));
                }
                Ok(n) => state.frames.filled(n),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return None,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Some(self.end(state, ProtocolError::Io(e))),
            }
        }
    }

    /// Records why the stream ended (a `Fault` the executor sent first is
    /// the cause) and tells the reader task.
    fn end(&self, state: &mut InboxState, error: ProtocolError) -> DownCause {
        let cause = match state.fault.take() {
            Some(f) => DownCause::Fault {
                error_name: f.error_name,
                message: f.message,
            },
            None => DownCause::Exited {
                detail: error.to_string(),
            },
        };
        let cause = state.ended.get_or_insert(cause).clone();
        self.inbox.ended.notify_one();
        cause
    }

    /// One message from the executor.
    fn dispatch(&self, message: ExecutorMessage, fault: &mut Option<Fault>) {
        match message.body {
            Some(Body::Reply(reply)) => {
                let sender = self.lock_pending().waiting.remove(&reply.id);
                if let (Some(sender), Some(result)) = (sender, reply.result) {
                    let _ = sender.send(Ok(result));
                }
            }
            Some(Body::Fault(f)) => *fault = Some(f),
            Some(Body::KernelTimeout(timeout)) => {
                let count = self.kernel_timeouts.record(timeout.stream);
                tracing::warn!(device = self.index, generation = %self.generation,
                    stream = timeout.stream, count, "a launch ran past its time budget");
            }
            _ => tracing::warn!(device = self.index, "unexpected message from executor"),
        }
    }

    fn lock_inbox(&self) -> std::sync::MutexGuard<'_, InboxState> {
        // Poisoning: as for `lock_pending`.
        self.inbox.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// [`ExecutorLink::pump`] when no one else holds the inbox; an end is
    /// the reader task's to report.
    fn pump_unless_busy(&self) {
        let state = match self.inbox.state.try_lock() {
            Ok(state) => Some(state),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        };
        if let Some(mut state) = state {
            let _ = self.pump(&mut state, Read::Direct);
        }
    }

    /// Polls for the reply on `rx` for up to the link's reply spin, reading
    /// the channel whenever no one else is; `None` when the spin ended
    /// first.
    async fn spin_for_reply(
        &self,
        rx: &mut ReplyReceiver,
    ) -> Option<Result<reply::Result, LinkError>> {
        // Held until this function returns: while the call spins, not
        // while it then sleeps.
        let (spin, _permit) = self.spinners.take();
        if spin.is_zero() {
            return None;
        }
        let until = Instant::now() + spin;
        loop {
            self.pump_unless_busy();
            match rx.try_recv() {
                Ok(result) => return Some(result),
                Err(oneshot::error::TryRecvError::Closed) => {
                    return Some(Err(LinkError::Down(DownCause::Exited {
                        detail: "reply channel dropped".into(),
                    })))
                }
                Err(oneshot::error::TryRecvError::Empty) => {}
            }
            if Instant::now() >= until {
                return None;
            }
            // The core too, to a thread waiting for one (the executor may
            // be one on a machine with few cores).
            std::thread::yield_now();
            tokio::task::yield_now().await;
        }
    }

    fn lock_pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        // The lock guards plain maps; a panic while holding it cannot leave
        // them inconsistent, so a poisoned lock is still usable.
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// True once the channel closed.
    pub fn is_down(&self) -> bool {
        self.lock_pending().closed.is_some()
    }

    /// Sends one request; returns the receiver of its reply.
    fn send(
        &self,
        op: Op,
    ) -> Result<
        (
            PendingEntry<'_>,
            oneshot::Receiver<Result<reply::Result, LinkError>>,
        ),
        LinkError,
    > {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let frame = encode_frame(&Request { id, op: Some(op) }).map_err(|e| {
            LinkError::Down(DownCause::Exited {
                detail: format!("cannot encode a request: {e}"),
            })
        })?;
        {
            let mut pending = self.lock_pending();
            if let Some(cause) = &pending.closed {
                return Err(LinkError::Down(cause.clone()));
            }
            pending.waiting.insert(id, tx);
        }
        // Removes the pending entry however the call ends (a reply removes
        // it first; cancellation and timeouts leave it to this guard).
        let entry = PendingEntry { link: self, id };
        if self.outbox.send(frame).is_err() {
            return Err(LinkError::Down(DownCause::Exited {
                detail: "executor channel closed".into(),
            }));
        }
        Ok((entry, rx))
    }

    /// True when the executor answers a ping within the timeout: its request
    /// loop is alive, whatever a slow call is waiting for.
    async fn answers_ping(&self) -> bool {
        let Ok((_entry, rx)) = self.send(Op::Ping(Ping {})) else {
            return false;
        };
        matches!(tokio::time::timeout(self.timeout, rx).await, Ok(Ok(Ok(_))))
    }

    /// True when the executor answers a ping within the link's timeout:
    /// its process is alive and serving (e.g. a spare about to be
    /// promoted, which may have died without its death being seen yet).
    pub async fn answers(&self) -> bool {
        self.answers_ping().await
    }

    /// Sends one request and waits for its reply. An executor that answers
    /// neither the call nor, after the timeout, a ping is killed.
    ///
    /// The raw path under the typed calls of [`super::link`], private to
    /// the executor module: the rest of the crate sends only typed
    /// operations ([`super::link::Operation`]).
    pub(super) async fn call(&self, op: Op) -> Result<reply::Result, LinkError> {
        let (_entry, mut rx) = self.send(op)?;
        if let Some(result) = self.spin_for_reply(&mut rx).await {
            return result;
        }
        loop {
            match tokio::time::timeout(self.timeout, &mut rx).await {
                Ok(Ok(result)) => return result,
                Ok(Err(_)) => {
                    return Err(LinkError::Down(DownCause::Exited {
                        detail: "reply channel dropped".into(),
                    }))
                }
                Err(_) if self.answers_ping().await => {
                    tracing::debug!(device = self.index, generation = %self.generation,
                        "a call is slow but the executor answers; waiting on");
                }
                Err(_) => {
                    tracing::error!(device = self.index, generation = %self.generation, timeout = ?self.timeout,
                        "executor did not answer; killing it");
                    self.kill();
                    return Err(LinkError::Down(DownCause::Unresponsive {
                        after: self.timeout,
                    }));
                }
            }
        }
    }

    /// Asks the executor to release everything and exit; kills it if it
    /// does not within `grace`.
    pub async fn shutdown(&self, grace: Duration) {
        let _ = tokio::time::timeout(grace, self.call(Op::Shutdown(Shutdown {}))).await;
        let child = self.child.lock().ok().and_then(|mut c| c.take());
        if let Some(mut child) = child {
            if tokio::time::timeout(grace, child.wait()).await.is_err() {
                let _ = child.start_kill();
                let _ = child.wait().await;
            }
        }
    }

    /// Kills the executor process (tests and fault injection).
    pub fn kill(&self) {
        if let Ok(mut guard) = self.child.lock() {
            if let Some(child) = guard.as_mut() {
                let _ = child.start_kill();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ptxd_proto::executor::{DeviceDesc, Reply};

    /// A link to a fake executor: the test holds the executor's end of the
    /// channel (and `child`, a process standing for it).
    async fn fake_link(
        child: Option<tokio::process::Child>,
    ) -> (
        Arc<ExecutorLink>,
        tokio::net::UnixStream,
        mpsc::UnboundedReceiver<DeathNotice>,
    ) {
        let (front, executor) = tokio::net::UnixStream::pair().unwrap();
        let (fd_outbox, _inbox) = fd_inbox::pair().unwrap();
        let config = LinkConfig {
            timeout: Duration::from_secs(30),
            max_kernel_time: None,
            kernel_timeouts: Arc::new(KernelTimeouts::new(0)),
            channel_spin: Duration::ZERO,
            spinners: Spinners::for_this_machine(Duration::ZERO),
            kernel_cache: None,
            spare: false,
        };
        let hello = Hello {
            backend: "fake".into(),
            devices: vec![DeviceDesc {
                uuid: "GPU-fake".into(),
                ..Default::default()
            }],
            pid: 0,
        };
        let (deaths, deaths_rx) = mpsc::unbounded_channel();
        let (read, write) = front.into_split();
        let link = ExecutorLink::start(
            (0, 0, DeviceGeneration(7)),
            hello,
            child,
            (read, write, fd_outbox),
            &config,
            deaths,
        );
        (link, executor, deaths_rx)
    }

    async fn send_message(executor: &mut tokio::net::UnixStream, body: Body) {
        use tokio::io::AsyncWriteExt;
        let frame = encode_frame(&ExecutorMessage { body: Some(body) }).unwrap();
        executor.write_all(&frame).await.unwrap();
    }

    /// The first sign of a fault is the recovery's start: the death is
    /// reported, the pending call failed and the process killed while the
    /// faulted executor still holds its channel open (its exit, a faulted
    /// context's teardown, can take a hundred milliseconds), and nothing it
    /// says after the report is believed.
    #[tokio::test]
    async fn a_fault_report_is_the_executors_death_before_its_channel_closes() {
        let standing_in = tokio::process::Command::new("sleep")
            .arg("30")
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let pid = standing_in.id().unwrap();
        let (link, mut executor, mut deaths) = fake_link(Some(standing_in)).await;
        let pending = tokio::spawn({
            let link = link.clone();
            async move { link.call(Op::Ping(Ping {})).await }
        });
        // The ping's request reaches the fake executor: read its id.
        let request: Request = read_frame_async(&mut executor).await.unwrap();
        send_message(
            &mut executor,
            Body::Fault(Fault {
                error_name: "CUDA_ERROR_ILLEGAL_ADDRESS".into(),
                message: "an illegal address".into(),
            }),
        )
        .await;
        // A reply after the report (a poisoned context's): not believed.
        send_message(
            &mut executor,
            Body::Reply(Reply {
                id: request.id,
                result: Some(reply::Result::Ok(ptxd_proto::executor::Empty {})),
            }),
        )
        .await;
        let fault = DownCause::Fault {
            error_name: "CUDA_ERROR_ILLEGAL_ADDRESS".into(),
            message: "an illegal address".into(),
        };
        let death = tokio::time::timeout(Duration::from_secs(5), deaths.recv())
            .await
            .expect("the death is reported while the channel is still open")
            .unwrap();
        assert_eq!(death, (0, DeviceGeneration(7), fault.clone()));
        let answered = tokio::time::timeout(Duration::from_secs(5), pending)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(answered, Err(LinkError::Down(fault.clone())));
        assert!(link.is_down());
        assert_eq!(
            link.call(Op::Ping(Ping {})).await,
            Err(LinkError::Down(fault))
        );
        // The process standing for the executor was killed and reaped.
        let gone = Instant::now() + Duration::from_secs(5);
        while std::path::Path::new(&format!("/proc/{pid}")).exists() {
            assert!(Instant::now() < gone, "the faulted executor was not killed");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(executor);
    }

    /// A kernel timeout's report ends the link, but the death waits for the
    /// process to be gone: its kernel may still run on the device.
    #[tokio::test]
    async fn a_kernel_timeout_is_reported_once_its_executor_is_gone() {
        let standing_in = tokio::process::Command::new("sleep")
            .arg("1")
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let pid = standing_in.id().unwrap();
        let (link, mut executor, mut deaths) = fake_link(Some(standing_in)).await;
        send_message(
            &mut executor,
            Body::Fault(Fault {
                error_name: KERNEL_TIMEOUT_FAULT.into(),
                message: "past its budget".into(),
            }),
        )
        .await;
        let death = tokio::time::timeout(Duration::from_secs(10), deaths.recv())
            .await
            .unwrap()
            .unwrap();
        // Gone (exited and reaped) when its death is told, whenever this
        // test got to send the report: not a time since the report, which a
        // test preempted between the spawn and the report would cut short.
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "the death was reported while the process standing for the executor still ran"
        );
        assert!(
            matches!(&death.2, DownCause::Fault { error_name, .. } if error_name == KERNEL_TIMEOUT_FAULT),
            "{death:?}"
        );
        assert!(link.is_down());
    }

    /// An executor whose channel closes without a report is reported once
    /// its process is reaped (its exit status may name a fault), as before.
    #[tokio::test]
    async fn a_closed_channel_without_a_report_is_an_exit() {
        let (_link, executor, mut deaths) = fake_link(None).await;
        drop(executor);
        let death = tokio::time::timeout(Duration::from_secs(5), deaths.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(
            matches!(death, (0, DeviceGeneration(7), DownCause::Exited { .. })),
            "{death:?}"
        );
    }

    #[test]
    fn only_the_fault_status_turns_an_exit_into_a_fault() {
        let exited = || DownCause::Exited {
            detail: "channel closed".into(),
        };
        match fault_by_status(exited(), Some(EXIT_FAULT)) {
            DownCause::Fault {
                error_name,
                message,
            } => {
                assert_eq!(error_name, "UNREPORTED_FAULT");
                assert!(message.contains("channel closed"), "{message}");
            }
            other => panic!("not a fault: {other:?}"),
        }
        for code in [None, Some(0), Some(1), Some(2), Some(EXIT_FAULT + 1)] {
            assert_eq!(fault_by_status(exited(), code), exited(), "{code:?}");
        }
        // A reported fault keeps its own name; a hang stays a hang.
        let reported = DownCause::Fault {
            error_name: "CUDA_ERROR_ILLEGAL_ADDRESS".into(),
            message: "m".into(),
        };
        assert_eq!(
            fault_by_status(reported.clone(), Some(EXIT_FAULT)),
            reported
        );
        let hung = DownCause::Unresponsive {
            after: Duration::from_secs(1),
        };
        assert_eq!(fault_by_status(hung.clone(), Some(EXIT_FAULT)), hung);
    }
}
