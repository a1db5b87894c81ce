//! Serving a session's launch ring inside the executor: the fast path that
//! bypasses gRPC and the front.
//!
//! One thread per ring takes descriptors from the session's shared memory
//! ([`ptxd_ipc::ring::Server`]), checks each against the session's
//! capability table with the same launch checks as the gRPC path
//! ([`crate::launch::check_with_args`], with the descriptor's typed args),
//! hands the checked launch to the backend, and
//! posts a completion with the outcome: `Ok`, or the refusal's proto reason.
//!
//! Invariants:
//! - A kernel is checked against its signature only when the front found
//!   that the signature checks its whole contract (or all of it but a count
//!   limit, which the ring holds it to); any other kernel is granted with
//!   its whole contract, decoded once at grant time
//!   ([`crate::ring_check`]), and every launch of it is checked against
//!   that contract bound to the executor's block. A contract that does not
//!   decode is not granted.
//! - A descriptor names only what the front granted this session's ring
//!   (the [`RingTable`]); an index it was not granted is refused like a
//!   handle another session holds.
//! - The table is changed only by the request loop, under its lock. The
//!   ring thread holds the lock only while it checks a descriptor and takes
//!   what the launch needs (clones of the backend's handles), and the
//!   backend releases it ([`TableHold`]) before anything that can wait on
//!   client-controlled state (a semaphore, a stream synchronize): the
//!   request loop never waits behind a ring. On the host a launch's clones
//!   keep its mappings alive past a revoke; on CUDA the lock is kept until
//!   the launch is enqueued, so after a revoke returns no enqueue can still
//!   name the object, and a close drains the device first.
//! - The request loop never joins a ring thread: a ring is stopped by a
//!   flag, and a ring that replaces another waits for the old thread itself,
//!   on its own thread, before it attaches to the object.
//! - A ring launch that times out (its kernel or its semaphore wait) is
//!   reported to the front (`KernelTimeout`) and counted against the
//!   session's allowance ([`TimeoutAllowance`]); once the allowance is
//!   spent, every further ring launch is refused `LIMIT_EXCEEDED`, as on
//!   gRPC.
//! - Every spin of the thread takes a permit of the daemon-wide spin bound
//!   ([`crate::spin`]); without one it sleeps at once.
//! - A wake-up drains the ring: the thread takes every submission
//!   published before it looks for more, posts each answer, and publishes
//!   the answers together (one store of each counter, at most one wake)
//!   when nothing more is ready, every [`FLUSH_EVERY`] answers or
//!   [`FLUSH_AFTER`] after the oldest, before a
//!   launch that may wait, and when it stops.
//! - Every submission taken is answered, in order, even a malformed one or
//!   one a dead executor left behind (an orphan, completed `Failed`), save
//!   one abandoned because the ring is stopping ([`abandoned`]): it stays
//!   taken and unanswered, an orphan for the next server, whose signal the
//!   SDK or that server releases.
//! - A ring whose client breaks the protocol (a counter out of range) is
//!   dropped; the executor and every other ring go on.
//! - A client that shrinks its ring object costs it the ring, not the
//!   executor: the mapping is watched by the SIGBUS handler, which maps
//!   zero pages over it, and the ring is dropped at its next step.
//! - The thread never sleeps unbounded: it checks its stop flag at least
//!   every [`POLL_SLICE`], and a stop wakes its futex sleep at once (the
//!   server's [`Waker`]); a host semaphore wait checks it between its
//!   naps; only a running kernel (bounded by the budget) or, on CUDA, a
//!   sync launch's stream synchronize delays a stop.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use super::kernel_timeouts::TimeoutAllowance;

use ptxd_ipc::ring::{
    CompletionStatus, Descriptor, OperandRef, Polled, SemaphoreOp, Server, TypedArg, Waker,
};
use ptxd_proto::executor::{FailureKind, RingGrant};
use ptxd_proto::v1::Reason;

use crate::error::Error;
use crate::executor::ExecutorError;
use crate::handles::DeviceGeneration;
use crate::launch::{self, BufferCap, Capabilities, CheckedLaunch, EventCap, KernelCap, Placement};
use crate::ptx::host::exec::LaunchControl;
use crate::ptx::{LaunchContract, Signature};

// One operand cap, two layers: a descriptor holds exactly as many inputs
// and scalars as the verifier lets a kernel declare, so every kernel that
// loads can be launched through the ring and no descriptor names more
// operands than a kernel can take.
const _: () = assert!(
    crate::ptx::MAX_INPUTS == ptxd_ipc::ring::MAX_INPUTS,
    "the ring's descriptor and the verifier disagree on a kernel's inputs"
);
const _: () = assert!(
    crate::ptx::MAX_SCALAR_PARAMS == ptxd_ipc::ring::MAX_SCALARS,
    "the ring's descriptor and the verifier disagree on a kernel's scalars"
);

/// Opens the ring object an `OpenRing` names: the memfd the front sent on
/// the fd inbox (`fd_tag`), or the shared-memory name. Either way the
/// session's uid must own it. The error is the refusal's message.
pub fn open_server(
    open: &ptxd_proto::executor::OpenRing,
    inbox: Option<&mut crate::executor::fd_inbox::FdInbox>,
) -> Result<Server, String> {
    if open.fd_tag == 0 {
        return Server::open(&open.shm_name, open.owner_uid)
            .map_err(|e| format!("cannot open the ring {}: {e}", open.shm_name));
    }
    let fd = inbox
        .ok_or_else(|| "this executor has no fd inbox".to_owned())?
        .take(open.fd_tag)?;
    Server::from_fd(fd, open.owner_uid)
        .map_err(|e| format!("cannot open the ring passed by descriptor: {e}"))
}

/// The longest the ring thread sleeps before it looks at its stop flag.
pub const POLL_SLICE: Duration = Duration::from_millis(20);

/// Every object in one executor lives in its one generation: the launch
/// checks' placement test is then trivially met, and is kept for the shared
/// code path.
const HERE: Placement = Placement {
    device_index: 0,
    generation: DeviceGeneration(0),
};

/// A kernel a ring may launch: the backend's handle and its verified
/// signature.
#[derive(Debug)]
pub struct RingKernel<K> {
    pub kernel: K,
    pub module_id: u64,
    pub signature: Signature,
    /// The largest count a launch may have, the precondition that breaks
    /// past it and its text (a contract with preconditions beyond the
    /// signature's; the front computed it at the executor's block size).
    pub limit: Option<CountLimit>,
    /// The whole contract and the block it is bound to, for a kernel the
    /// signature does not check (decoded once, at grant time); launches
    /// of it are checked against it, not the signature.
    pub contract: Option<(Box<LaunchContract>, u32)>,
}

/// A launch count the ring holds a kernel to (see [`RingKernel::limit`]).
#[derive(Debug, Clone)]
pub struct CountLimit {
    pub max_count: u64,
    pub precondition: &'static str,
    pub condition: String,
    /// The whole contract and its block, when the grant carries it: a
    /// launch past `max_count` is then refused with the unary path's
    /// words (the precondition that fails first, its condition and the
    /// values it reads), not the limit's.
    pub terms: Option<Arc<(LaunchContract, u32)>>,
}

impl CountLimit {
    fn from_grant(k: &ptxd_proto::executor::RingKernel) -> Option<CountLimit> {
        use crate::ptx::contract::{COUNT_FITS_I32, COUNT_FITS_I64, INDEX_FITS_I32};
        let precondition = match k.limit_precondition.as_str() {
            INDEX_FITS_I32 => INDEX_FITS_I32,
            COUNT_FITS_I32 => COUNT_FITS_I32,
            COUNT_FITS_I64 => COUNT_FITS_I64,
            _ => "launch_precondition",
        };
        let terms = match k.contract.as_ref().map(crate::ring_check::decode) {
            Some(Ok(contract)) => Some(Arc::new((contract, k.block))),
            // The limit alone checks the launch; only a refusal's words
            // are then the limit's.
            Some(Err(error)) => {
                tracing::warn!(%error, index = k.ring_index, "a ring kernel's contract cannot word its refusals");
                None
            }
            None => None,
        };
        k.max_count.map(|max_count| CountLimit {
            max_count,
            precondition,
            condition: k.limit_condition.clone(),
            terms,
        })
    }
}

/// A buffer a ring may name: the backend's handle and the size the front
/// checks launches against.
#[derive(Debug)]
pub struct RingBuffer<B> {
    pub buffer: B,
    pub buffer_id: u64,
    pub size: u64,
}

/// Hashes a ring index with one multiply. The table's keys are indices the
/// front assigns, never a client's choice (a descriptor only looks them
/// up), so SipHash's resistance to chosen keys buys nothing on a path
/// taken once per launch.
#[derive(Debug, Default, Clone, Copy)]
pub struct IndexHasher(u64);

impl std::hash::Hasher for IndexHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*byte)).wrapping_mul(GOLDEN);
        }
    }

    fn write_u32(&mut self, index: u32) {
        self.0 = (self.0 ^ u64::from(index)).wrapping_mul(GOLDEN);
    }
}

/// 2^64 divided by the golden ratio (odd: the multiply is a bijection).
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// A map from ring index.
type ByIndex<V> = HashMap<u32, V, std::hash::BuildHasherDefault<IndexHasher>>;

/// A session ring's capability table, indexed by ring index.
#[derive(Debug)]
pub struct RingTable<K, B> {
    kernels: ByIndex<RingKernel<K>>,
    buffers: ByIndex<RingBuffer<B>>,
}

impl<K, B> Default for RingTable<K, B> {
    fn default() -> Self {
        RingTable {
            kernels: ByIndex::default(),
            buffers: ByIndex::default(),
        }
    }
}

impl<K, B> RingTable<K, B> {
    /// Applies a grant from the front: revokes first, then grants, with
    /// `kernel`/`buffer` resolving the executor's ids to backend handles
    /// (an id the executor does not hold is skipped: the front granted an
    /// object that was closed meanwhile, which no descriptor may use).
    pub fn apply(
        &mut self,
        grant: &RingGrant,
        mut kernel: impl FnMut(u64) -> Option<K>,
        mut buffer: impl FnMut(u64) -> Option<B>,
    ) {
        for index in &grant.revoke_kernels {
            self.kernels.remove(index);
        }
        for index in &grant.revoke_buffers {
            self.buffers.remove(index);
        }
        for k in &grant.kernels {
            // A contract the ring cannot evaluate is not granted: a launch
            // of it is refused as a kernel the ring does not hold.
            // A kernel held to a count limit is checked against its
            // signature and the limit; its contract only words refusals.
            let whole = k.contract.as_ref().filter(|_| k.max_count.is_none());
            let contract = match whole.map(crate::ring_check::decode) {
                None => None,
                Some(Ok(contract)) => Some((Box::new(contract), k.block)),
                Some(Err(error)) => {
                    tracing::warn!(%error, index = k.ring_index, "a ring kernel's contract cannot be checked; not granted");
                    self.kernels.remove(&k.ring_index);
                    continue;
                }
            };
            if let Some(handle) = kernel(k.module_id) {
                self.kernels.insert(
                    k.ring_index,
                    RingKernel {
                        kernel: handle,
                        module_id: k.module_id,
                        signature: Signature {
                            inputs: k.inputs,
                            element_sizes: k.element_sizes.clone(),
                            scalar_params: k.scalar_params,
                            reqntid: None,
                            maxntid: None,
                        },
                        limit: CountLimit::from_grant(k),
                        contract,
                    },
                );
            }
        }
        for b in &grant.buffers {
            if let Some(handle) = buffer(b.buffer_id) {
                self.buffers.insert(
                    b.ring_index,
                    RingBuffer {
                        buffer: handle,
                        buffer_id: b.buffer_id,
                        size: b.size,
                    },
                );
            }
        }
    }

    /// Forgets every object of module `module_id` / buffer `buffer_id`
    /// (the executor closes it).
    pub fn forget_module(&mut self, module_id: u64) {
        self.kernels.retain(|_, k| k.module_id != module_id);
    }

    pub fn forget_buffer(&mut self, buffer_id: u64) {
        self.buffers.retain(|_, b| b.buffer_id != buffer_id);
    }
}

/// The refusal for a kernel index the session's ring was not granted: the
/// same as for a kernel handle it does not hold.
fn kernel_not_granted(index: u32) -> Error {
    crate::slots::SlotError::Stale {
        handle: format!("ring kernel {index}"),
        why: crate::slots::StaleWhy::UnknownToSession,
    }
    .into()
}

/// The refusal for a buffer index the ring was not granted: the same as for
/// a buffer handle the session does not hold.
fn buffer_not_granted(index: u32) -> Error {
    crate::buffers::RegistryError::Unknown {
        kind: crate::buffers::ObjectKind::Buffer,
        handle: format!("ring buffer {index}"),
    }
    .into()
}

impl<K, B> Capabilities for RingTable<K, B> {
    type Operand = OperandRef;
    /// A ring has no events (it orders with semaphores).
    type Event = ();
    type Error = Error;

    fn operand(&self, operand: &OperandRef) -> Result<(BufferCap, u64), Error> {
        let buffer = self
            .buffers
            .get(&operand.buffer)
            .ok_or_else(|| buffer_not_granted(operand.buffer))?;
        Ok((
            BufferCap {
                id: buffer.buffer_id,
                size: buffer.size,
                placement: HERE,
            },
            operand.offset,
        ))
    }

    fn event(&self, _: &()) -> Result<EventCap, Error> {
        Err(Error::InvalidArgument {
            field: "event",
            message: "a ring launch orders with semaphores, not events".into(),
        })
    }

    fn describe(&self, _: Placement) -> String {
        "this executor".into()
    }
}

/// A semaphore operation whose word lies inside a granted buffer (the
/// buffer's registered size; the backend's accessor checks it again).
#[derive(Debug)]
pub struct CheckedSemaphore<B> {
    pub buffer: B,
    pub op: SemaphoreOp,
}

/// A ring launch that passed the checks, in the backend's terms: clones of
/// the handles it uses, so it needs the table no longer than the backend
/// says ([`TableHold`]).
#[derive(Debug)]
pub struct RingLaunch<K, B> {
    pub kernel: K,
    /// Inputs, then the output: (buffer, byte offset).
    pub operands: Vec<(B, u64)>,
    pub n: u64,
    pub scalars: Vec<f32>,
    /// The typed args' bits (empty when the launch passes f32 `scalars`).
    pub args: Vec<u64>,
    pub sync: bool,
    pub wait: Option<CheckedSemaphore<B>>,
    pub signal: Option<CheckedSemaphore<B>>,
}

/// The ring's table lock, held from a descriptor's check until the backend
/// no longer needs the table to keep the launch's objects alive. The
/// backend must [`release`](TableHold::release) it before anything that
/// waits on what a client controls; dropping it releases it too.
pub struct TableHold<'a, K, B>(Option<MutexGuard<'a, RingTable<K, B>>>);

impl<K, B> std::fmt::Debug for TableHold<'_, K, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("TableHold").field(&self.0.is_some()).finish()
    }
}

impl<K, B> TableHold<'_, K, B> {
    /// Lets the request loop change the table (grant, revoke) again.
    pub fn release(&mut self) {
        self.0 = None;
    }
}

/// What a backend does with ring launches.
pub trait RingBackend: Send + 'static {
    type Kernel: Clone + Send + 'static;
    type Buffer: Clone + Send + 'static;
    /// Launches (an async launch: enqueues) and returns the outcome.
    /// `stop` is set when the ring is closed: a wait in here ends early.
    fn launch(
        &mut self,
        launch: RingLaunch<Self::Kernel, Self::Buffer>,
        hold: TableHold<'_, Self::Kernel, Self::Buffer>,
        stop: &AtomicBool,
    ) -> Result<(), Error>;
    /// Releases the signal of a launch that did not run (refused, or an
    /// orphan), so a stream waiting on it is not blocked forever.
    fn release_signal(
        &mut self,
        signal: CheckedSemaphore<Self::Buffer>,
        hold: TableHold<'_, Self::Kernel, Self::Buffer>,
    );
    /// Called when the ring's spin found no submission, before the thread
    /// sleeps (not after each launch: a ring launching back to back is
    /// not idle).
    fn idle(&mut self) {}
    /// The backend's own checks of a launch that passed the ring's (on
    /// CUDA: the grid limit), run before it is answered; a refusal here is
    /// the launch's refusal.
    fn admit(&self, _launch: &RingLaunch<Self::Kernel, Self::Buffer>) -> Result<(), Error> {
        Ok(())
    }
    /// Whether an async launch that passed every check is answered `Ok`
    /// before it is enqueued (see the ring loop, `drain`): true where an async launch's
    /// answer means "in the stream, in order" (CUDA), false where it means
    /// "ran" (the host engine runs it on the ring's thread).
    fn answers_on_acceptance(&self) -> bool {
        false
    }
}

type Shared<K, B> = Arc<Mutex<RingTable<K, B>>>;

fn lock<K, B>(table: &Shared<K, B>) -> MutexGuard<'_, RingTable<K, B>> {
    // The table is consistent after every statement that changes it.
    table.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a ring thread reports to, and counts against: the session's
/// stream, the channel to the front, the session's timeout allowance.
#[derive(Debug, Clone)]
pub struct RingSession {
    pub stream: u64,
    pub channel: super::channel::Channel,
    pub timeouts: Arc<TimeoutAllowance>,
}

/// A ring being served. Dropping it stops the thread without waiting for
/// it (the thread ends after its current step; a ring that replaces it
/// waits for it on its own thread).
pub struct RingHandle<K, B> {
    table: Shared<K, B>,
    stop: Arc<AtomicBool>,
    /// Ends the thread's futex sleep when the ring stops, so a stop takes
    /// effect at once rather than at the end of a [`POLL_SLICE`].
    waker: Waker,
    thread: Option<JoinHandle<()>>,
}

impl<K, B> std::fmt::Debug for RingHandle<K, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingHandle").finish_non_exhaustive()
    }
}

impl<K: Send + 'static, B: Send + 'static> RingHandle<K, B> {
    /// Starts serving `server` with `backend` on a thread of its own.
    /// `previous` (the ring it replaces, if any) is stopped now and waited
    /// for on the new thread, before it takes its first submission.
    pub fn spawn<R>(
        server: Server,
        backend: R,
        name: String,
        session: RingSession,
        previous: Option<RingHandle<K, B>>,
    ) -> std::io::Result<Self>
    where
        R: RingBackend<Kernel = K, Buffer = B>,
    {
        // The client may shrink its object under the mapping: the SIGBUS
        // that follows must cost it its ring, not the executor.
        super::sigbus::install().map_err(std::io::Error::other)?;
        let control = Box::new(LaunchControl::new(None));
        let guard =
            super::sigbus::watch(&[server.mapping()], &control).map_err(std::io::Error::other)?;
        let previous = previous.and_then(RingHandle::stop);
        let waker = server.waker();
        let table: Shared<K, B> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (t, s) = (table.clone(), stop.clone());
        let thread = std::thread::Builder::new().name(name).spawn(move || {
            // The old thread may still be answering; its last completion
            // must be in the object before this server reads the counters.
            if let Some(previous) = previous {
                let _ = previous.join();
            }
            match server.reattach() {
                Ok(mut server) => {
                    let shrunk = || guard.faulted().first().copied().unwrap_or(false);
                    serve(&mut server, backend, t, &s, shrunk, &session);
                }
                Err(e) => tracing::warn!(error = %e, "the ring's object changed before it was served; the ring is dropped"),
            }
            // Unwatch the mapping before it is unmapped (the server went
            // above), and free the control the watch points to last.
            drop(guard);
            drop(control);
        })?;
        Ok(RingHandle {
            table,
            stop,
            waker,
            thread: Some(thread),
        })
    }

    /// The table, for the request loop's grants and revokes.
    pub fn table(&self) -> MutexGuard<'_, RingTable<K, B>> {
        lock(&self.table)
    }
}

impl<K, B> RingHandle<K, B> {
    /// Tells the thread to stop, waking it if it sleeps; returns it, to be
    /// joined off the request loop.
    fn stop(mut self) -> Option<JoinHandle<()>> {
        self.signal_stop();
        self.thread.take()
    }

    /// Sets the stop flag, then wakes the thread's sleep (the flag first:
    /// the woken thread checks it before it sleeps again). A wake does not
    /// touch the ring's mapping once the thread's server is gone.
    fn signal_stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.waker.wake();
    }
}

impl<K, B> Drop for RingHandle<K, B> {
    fn drop(&mut self) {
        // Not joined: the request loop must never wait on a ring. The
        // thread holds what it uses (its server, the table's Arc, the
        // launch's clones) and drops it when it ends.
        self.signal_stop();
    }
}

/// The proto reason number a completion carries for `error`.
fn reason_of(error: &Error) -> u32 {
    error.refusal().reason as u32
}

fn dropped(e: &dyn std::fmt::Display) {
    tracing::warn!(error = %e, "the ring's client broke its protocol; the ring is dropped");
}

fn serve<R: RingBackend>(
    server: &mut Server,
    backend: R,
    table: Shared<R::Kernel, R::Buffer>,
    stop: &AtomicBool,
    shrunk: impl Fn() -> bool,
    session: &RingSession,
) {
    drain(server, backend, table, stop, shrunk, session);
    // Whatever ended the loop, the answers it posted reach the client (a
    // poisoned ring's client reads them or not; a stopping ring's
    // successor must not take them for orphans).
    server.flush();
}

/// The most answers posted before they are published, when submissions
/// keep coming: bounds how long the first answer of a long burst waits.
pub const FLUSH_EVERY: u64 = 32;

/// The longest an answer stays posted and unpublished while submissions
/// keep coming (checked after each launch, so a slow launch, such as a
/// host kernel, publishes the answers before it once it ends).
pub const FLUSH_AFTER: Duration = Duration::from_micros(20);

/// The ring thread's loop: every submission published is taken and run in
/// turn (a wake-up drains the ring, not one slot), each answer is posted,
/// and the answers are published together once the ring has nothing more
/// ready, every [`FLUSH_EVERY`] answers or [`FLUSH_AFTER`] after the
/// oldest, and before a launch that may wait (a sync launch, a semaphore
/// wait).
fn drain<R: RingBackend>(
    server: &mut Server,
    mut backend: R,
    table: Shared<R::Kernel, R::Buffer>,
    stop: &AtomicBool,
    shrunk: impl Fn() -> bool,
    session: &RingSession,
) {
    let spinners = crate::spin::executor_spinners().map(|s| s.with_spin(RING_SPIN));
    // When the oldest unpublished answer was posted.
    let mut oldest: Option<Instant> = None;
    // Whether the ring was found idle after a spin and the thread has slept
    // since: a wake-up that then finds nothing (a sleep slice ending, a
    // spurious wake) sleeps again at once. Spinning after every slice cost
    // an idle ring a spin every `POLL_SLICE` (30 µs in 20 ms: 0.15 % of a
    // core per idle ring).
    let mut asleep = false;
    // A launch answered on acceptance whose enqueue then failed.
    let mut broken: Option<Broken> = None;
    while !stop.load(Ordering::Acquire) {
        if shrunk() {
            tracing::warn!(
                "the ring's client shrank its object under the mapping; the ring is dropped"
            );
            return;
        }
        let polled = match server.poll() {
            Ok(Some(polled)) => polled,
            Ok(None) => {
                // Drained: the client sees every answer before this thread
                // spins or sleeps.
                server.flush();
                oldest = None;
                // A ring launching back to back is polled first, so its
                // launches share markers; the backend hears the ring is idle
                // only once the spin found nothing, before it may sleep.
                // The spin takes a permit of the daemon-wide bound.
                if !asleep {
                    let (spin, permit) = spinners
                        .as_ref()
                        .map_or((Duration::ZERO, None), |s| s.take());
                    let spun = server.spin_for(spin);
                    drop(permit);
                    match spun {
                        Ok(true) => continue,
                        Ok(false) => {}
                        Err(e) => return dropped(&e),
                    }
                }
                backend.idle();
                asleep = true;
                if let Err(e) = server.sleep(POLL_SLICE) {
                    return dropped(&e);
                }
                continue;
            }
            Err(e) => return dropped(&e),
        };
        asleep = false;
        let (status, detail) = match polled {
            Polled::Launch(descriptor) => {
                if let Some(broken) = &broken {
                    // An earlier launch failed after its answer: the
                    // stream no longer holds what the client was told.
                    release(&table, &mut backend, &descriptor);
                    (
                        CompletionStatus::Failed {
                            reason: broken.reason,
                        },
                        broken.ticket,
                    )
                } else {
                    if descriptor.sync || descriptor.wait().is_some() {
                        // It may wait on the stream or on the client: what
                        // is answered already is published first.
                        server.flush();
                        oldest = None;
                    }
                    match launch(&table, &mut backend, &descriptor, stop, session, server) {
                        Ran::Answer(status) => (status, 0),
                        Ran::Answered => {
                            oldest = None;
                            continue;
                        }
                        Ran::FailedAfterAnswer(reason) => {
                            tracing::warn!(
                                ticket = descriptor.ticket,
                                reason,
                                "a ring launch answered on acceptance failed to enqueue; \
                                 every later launch of the ring fails"
                            );
                            broken = Some(Broken {
                                reason,
                                ticket: descriptor.ticket,
                            });
                            oldest = None;
                            continue;
                        }
                        Ran::Stopping => return,
                        Ran::Dropped => return,
                    }
                }
            }
            Polled::Orphan(descriptor) => {
                release(&table, &mut backend, &descriptor);
                (
                    CompletionStatus::Failed {
                        reason: Reason::ExecutorUnavailable as u32,
                    },
                    0,
                )
            }
            Polled::Malformed { .. } => (
                CompletionStatus::Refused {
                    reason: Reason::InvalidArgument as u32,
                },
                0,
            ),
        };
        if let Err(e) = server.post(status, detail) {
            tracing::warn!(error = %e, "cannot complete a ring submission; the ring is dropped");
            return;
        }
        let now = Instant::now();
        let since = *oldest.get_or_insert(now);
        if server.unpublished() >= FLUSH_EVERY || now.duration_since(since) >= FLUSH_AFTER {
            server.flush();
            oldest = None;
        }
    }
}

/// How long a ring thread spins for its next submission (under a permit)
/// before it sleeps on its futex.
pub const RING_SPIN: Duration = Duration::from_micros(30);

/// A launch answered on acceptance that then failed to enqueue: every
/// later launch of the ring is answered `Failed` with its reason, the
/// completion's detail naming its ticket.
#[derive(Debug, Clone, Copy)]
struct Broken {
    reason: u32,
    ticket: u64,
}

/// What became of one descriptor.
enum Ran {
    /// Its completion, to post.
    Answer(CompletionStatus),
    /// Answered `Ok` on acceptance (posted and published) and enqueued.
    Answered,
    /// Answered `Ok` on acceptance, then its enqueue failed (this reason).
    FailedAfterAnswer(u32),
    /// The ring is stopping: abandoned unanswered (for the next server or
    /// the SDK).
    Stopping,
    /// The completion could not be written: the ring is dropped.
    Dropped,
}

/// Checks and runs one descriptor.
///
/// An async launch that passed every check is answered `Ok` before it is
/// enqueued when the backend says so ([`RingBackend::answers_on_acceptance`]):
/// a refusal comes from the checks, so it is still the launch's own
/// answer, and the client's next submission overlaps the driver's enqueue
/// instead of waiting for it. An enqueue that then fails (a driver error
/// the checks cannot foresee; a sticky one ends the executor, whose loss
/// the SDK handles) breaks the ring: every later launch is answered
/// `Failed` with that reason, naming the ticket in the completion's
/// detail.
fn launch<R: RingBackend>(
    table: &Shared<R::Kernel, R::Buffer>,
    backend: &mut R,
    descriptor: &Descriptor,
    stop: &AtomicBool,
    session: &RingSession,
    server: &mut Server,
) -> Ran {
    let guard = lock(table);
    let checked = session
        .timeouts
        .check()
        .and_then(|()| checked_launch(&guard, descriptor))
        .and_then(|launch| backend.admit(&launch).map(|()| launch));
    let launch = match checked {
        Ok(launch) => launch,
        Err(e) => {
            // The signal of a refused launch is still written.
            if let Ok(Some(signal)) = semaphore(&guard, descriptor.signal()) {
                backend.release_signal(signal, TableHold(Some(guard)));
            }
            return Ran::Answer(CompletionStatus::Refused {
                reason: reason_of(&e),
            });
        }
    };
    let early = !descriptor.sync && backend.answers_on_acceptance();
    if early {
        if let Err(e) = server.post(CompletionStatus::Ok, 0) {
            tracing::warn!(error = %e, "cannot complete a ring submission; the ring is dropped");
            return Ran::Dropped;
        }
        server.flush();
    }
    match backend.launch(launch, TableHold(Some(guard)), stop) {
        Ok(()) if early => Ran::Answered,
        Ok(()) => Ran::Answer(CompletionStatus::Ok),
        Err(_) if stop.load(Ordering::Acquire) && !early => Ran::Stopping,
        Err(e) => {
            let reason = reason_of(&e);
            if reason == Reason::KernelTimeout as u32 {
                // Counted like a gRPC launch's timeout: by the front (for
                // gRPC and later rings) and here (for this ring).
                session.channel.kernel_timeout(session.stream);
                session.timeouts.record();
            }
            if early {
                Ran::FailedAfterAnswer(reason)
            } else {
                Ran::Answer(CompletionStatus::Failed { reason })
            }
        }
    }
}

/// Checks a semaphore word against the table: a granted buffer, the word
/// inside it.
fn semaphore<K, B: Clone>(
    table: &RingTable<K, B>,
    op: Option<SemaphoreOp>,
) -> Result<Option<CheckedSemaphore<B>>, Error> {
    let Some(op) = op else {
        return Ok(None);
    };
    let buffer = table
        .buffers
        .get(&op.buffer)
        .ok_or_else(|| buffer_not_granted(op.buffer))?;
    let end = u128::from(op.offset) + u128::from(op.width.bytes());
    if end > u128::from(buffer.size) {
        return Err(Error::BufferTooSmall {
            operand: "semaphore".into(),
            needed_bytes: end,
            buffer_bytes: buffer.size,
        });
    }
    Ok(Some(CheckedSemaphore {
        buffer: buffer.buffer.clone(),
        op,
    }))
}

/// Runs the launch checks on `descriptor` and takes what the launch needs.
fn checked_launch<K: Clone, B: Clone>(
    table: &RingTable<K, B>,
    descriptor: &Descriptor,
) -> Result<RingLaunch<K, B>, Error> {
    let kernel = table
        .kernels
        .get(&descriptor.kernel)
        .ok_or_else(|| kernel_not_granted(descriptor.kernel))?;
    if let Some(limit) = &kernel.limit {
        if descriptor.n > limit.max_count {
            if let Some(terms) = &limit.terms {
                let bound = launch::BoundContract {
                    contract: &terms.0,
                    block: terms.1,
                };
                if let Err(refusal) = launch::LaunchTerms::values(&bound, descriptor.n, &[]) {
                    return Err(refusal.into());
                }
            }
            return Err(Error::LaunchPrecondition {
                precondition: limit.precondition,
                condition: format!(
                    "{} (n <= {} at this kernel's block)",
                    limit.condition, limit.max_count
                ),
                values: format!("n={}", descriptor.n),
            });
        }
    }
    let shape = launch::LaunchShape {
        inputs: descriptor.inputs(),
        output: Some(&descriptor.output),
        n: descriptor.n,
        scalars: descriptor.scalar_bits().len(),
        wait: None,
        signal: None,
    };
    // The typed args, checked against the kernel's scalars by the one
    // launch check and packed by the backend's one packer.
    let args: Vec<launch::ScalarArg> = descriptor.args().map(scalar_arg).collect();
    let checked: CheckedLaunch = match &kernel.contract {
        Some((contract, block)) => {
            let terms = launch::BoundContract {
                contract,
                block: *block,
            };
            let cap = KernelCap {
                signature: &terms,
                placement: HERE,
            };
            launch::check_with_args(table, cap, &shape, &args)?
        }
        None => {
            let cap = KernelCap {
                signature: &kernel.signature,
                placement: HERE,
            };
            launch::check_with_args(table, cap, &shape, &args)?
        }
    };
    let wait = semaphore(table, descriptor.wait())?;
    let signal = semaphore(table, descriptor.signal())?;
    // The checks passed, so each operand's index is granted; the offsets
    // are the checked ones.
    let mut operands = Vec::with_capacity(checked.inputs.len() + 1);
    let named = descriptor.inputs().iter().chain([&descriptor.output]);
    for (operand, checked) in named.zip(checked.inputs.iter().chain([&checked.output])) {
        let buffer = table
            .buffers
            .get(&operand.buffer)
            .filter(|b| b.buffer_id == checked.buffer_id)
            .ok_or_else(|| Error::Internal {
                message: "a checked ring operand is not in the table".into(),
            })?;
        operands.push((buffer.buffer.clone(), checked.offset));
    }
    Ok(RingLaunch {
        kernel: kernel.kernel.clone(),
        operands,
        n: descriptor.n,
        scalars: descriptor.scalars().collect(),
        args: args.iter().map(|a| a.bits()).collect(),
        sync: descriptor.sync,
        wait,
        signal,
    })
}

/// A descriptor's typed arg as the launch check reads it.
fn scalar_arg(arg: TypedArg) -> launch::ScalarArg {
    match arg {
        TypedArg::I32(v) => launch::ScalarArg::I32(v),
        TypedArg::U32(v) => launch::ScalarArg::U32(v),
        TypedArg::I64(v) => launch::ScalarArg::I64(v),
        TypedArg::U64(v) => launch::ScalarArg::U64(v),
        TypedArg::F32(v) => launch::ScalarArg::F32(v),
        TypedArg::F64(v) => launch::ScalarArg::F64(v),
    }
}

/// Releases the signal of a launch that will not run, if its word is one the
/// ring may write.
fn release<R: RingBackend>(
    table: &Shared<R::Kernel, R::Buffer>,
    backend: &mut R,
    descriptor: &Descriptor,
) {
    let guard = lock(table);
    if let Ok(Some(signal)) = semaphore(&guard, descriptor.signal()) {
        backend.release_signal(signal, TableHold(Some(guard)));
    }
}

/// What a backend returns for a launch it gave up because the ring is
/// stopping: the submission is left unanswered (an orphan for the next
/// server, released by the SDK if the executor goes away).
pub fn abandoned() -> Error {
    failure(
        FailureKind::Internal,
        "the ring was closed while the launch waited",
    )
}

/// A failure of the backend, as the completion's reason sees it.
pub fn failure(kind: FailureKind, message: impl Into<String>) -> Error {
    ExecutorError::Failed {
        kind,
        message: message.into(),
        metadata: Default::default(),
    }
    .into()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use ptxd_ipc::ring::{SemaphoreWidth, Submitter};

    /// Refused launches whose signal it releases; it watches what the
    /// client sees at each release and stops the ring at the `stop_at`-th.
    struct Watcher {
        client: Arc<Mutex<Submitter>>,
        /// Completions the client could read at each release.
        seen: Arc<Mutex<Vec<u64>>>,
        stop: Arc<AtomicBool>,
        stop_at: usize,
    }

    impl RingBackend for Watcher {
        type Kernel = ();
        type Buffer = u64;
        fn launch(
            &mut self,
            _: RingLaunch<(), u64>,
            _: TableHold<'_, (), u64>,
            _: &AtomicBool,
        ) -> Result<(), Error> {
            panic!("no kernel is granted: every launch is refused");
        }
        fn release_signal(&mut self, _: CheckedSemaphore<u64>, _: TableHold<'_, (), u64>) {
            let mut client = self.client.lock().unwrap();
            let mut visible = 0;
            while client.poll_completion().unwrap().is_some() {
                visible += 1;
            }
            let mut seen = self.seen.lock().unwrap();
            seen.push(visible);
            if seen.len() == self.stop_at {
                self.stop.store(true, Ordering::Release);
            }
        }
    }

    fn session() -> RingSession {
        RingSession {
            stream: 1,
            channel: super::super::channel::Channel::new(Box::new(std::io::sink())),
            timeouts: Arc::new(TimeoutAllowance::new(0, 0)),
        }
    }

    /// A ring stopped in the middle of a drain still publishes every answer
    /// it posted: the client reads exactly the submissions the server took,
    /// in order, each refused under its ticket; the rest stay unanswered
    /// for the next server.
    #[test]
    fn a_stopping_ring_publishes_every_answer_it_posted() {
        for stop_at in [1usize, 3, 7, 20] {
            let client = Submitter::create(64).unwrap();
            let mut server = Server::open(client.name(), None).unwrap();
            let client = Arc::new(Mutex::new(client));
            let signal = SemaphoreOp {
                buffer: 1,
                offset: 0,
                value: 1,
                width: SemaphoreWidth::Bits32,
            };
            for ticket in 0..40u64 {
                let output = OperandRef {
                    buffer: 1,
                    offset: 0,
                };
                let descriptor = Descriptor::new(ticket, 7, &[], output, 16)
                    .unwrap()
                    .with_signal(signal)
                    .unwrap();
                client.lock().unwrap().try_submit(&descriptor).unwrap();
            }
            let table: Shared<(), u64> = Arc::default();
            let grant = RingGrant {
                stream: 1,
                buffers: vec![ptxd_proto::executor::RingBuffer {
                    ring_index: 1,
                    buffer_id: 10,
                    size: 64,
                }],
                ..Default::default()
            };
            lock(&table).apply(&grant, |_| None, Some);
            let stop = Arc::new(AtomicBool::new(false));
            let seen = Arc::new(Mutex::new(Vec::new()));
            let backend = Watcher {
                client: Arc::clone(&client),
                seen: Arc::clone(&seen),
                stop: Arc::clone(&stop),
                stop_at,
            };
            serve(&mut server, backend, table, &stop, || false, &session());
            let seen = seen.lock().unwrap().clone();
            assert_eq!(seen.len(), stop_at);
            let read_during: u64 = seen.iter().sum();
            let mut client = client.lock().unwrap();
            let mut tickets = Vec::new();
            while let Some(completion) = client.poll_completion().unwrap() {
                assert_eq!(
                    completion.status,
                    CompletionStatus::Refused {
                        reason: reason_of(&kernel_not_granted(7))
                    }
                );
                tickets.push(completion.ticket);
            }
            assert_eq!(
                read_during + tickets.len() as u64,
                stop_at as u64,
                "answers published by the stopped ring"
            );
            assert_eq!(
                tickets,
                (read_during..stop_at as u64).collect::<Vec<_>>(),
                "in order, under their tickets"
            );
            assert_eq!(client.outstanding(), 40 - stop_at as u64);
        }
    }

    /// No launches: a ring that stays idle.
    struct Idle;

    impl RingBackend for Idle {
        type Kernel = ();
        type Buffer = u64;
        fn launch(
            &mut self,
            _: RingLaunch<(), u64>,
            _: TableHold<'_, (), u64>,
            _: &AtomicBool,
        ) -> Result<(), Error> {
            panic!("nothing is submitted");
        }
        fn release_signal(&mut self, _: CheckedSemaphore<u64>, _: TableHold<'_, (), u64>) {}
    }

    /// A stop wakes the ring's thread from its futex sleep: the thread
    /// ends well within the [`POLL_SLICE`] it would otherwise sleep out
    /// (stopped just after it fell asleep, it would take most of a slice).
    #[test]
    fn a_stop_wakes_the_sleeping_ring_thread_at_once() {
        let mut took = Vec::new();
        for round in 0..7 {
            let client = Submitter::create(8).unwrap();
            let server = Server::open(client.name(), None).unwrap();
            let handle: RingHandle<(), u64> =
                RingHandle::spawn(server, Idle, format!("ring-stop-{round}"), session(), None)
                    .unwrap();
            // Asleep: past its spin, in a futex sleep of up to a slice.
            let deadline = Instant::now() + Duration::from_secs(10);
            while !client.server_asleep() {
                assert!(Instant::now() < deadline, "the idle ring never slept");
                std::thread::sleep(Duration::from_micros(200));
            }
            let start = Instant::now();
            handle.stop().unwrap().join().unwrap();
            took.push(start.elapsed());
        }
        took.sort();
        println!("a stop ended the sleeping ring thread after {took:?}");
        // The median: this machine's scheduler may delay any one wake-up.
        assert!(took[took.len() / 2] < POLL_SLICE / 4, "{took:?}");
    }

    /// A Strided kernel granted to a ring is checked there with exactly
    /// the unary path's terms: for every corpus Strided contract and
    /// random launches (counts, shapes and strides, negative and huge
    /// args, a divisor 0, buffers one element short), the ring's refusal
    /// has the reason, message and metadata (the precondition's name, its
    /// condition and the values) of `check_with_args` over the verified
    /// contract, and the ring passes what it passes. Every Strided
    /// precondition and a short buffer are each met at least once.
    #[test]
    fn a_strided_launch_is_refused_on_the_ring_as_on_the_unary_path() {
        use crate::ptx::contract::{ARG_NONNEGATIVE, DIVISOR_POSITIVE, STRIDED_INDEX_FITS_I64};
        use rand::Rng;
        let mut rng = rand::rng();
        let mut seen: HashMap<String, usize> = HashMap::new();
        for (file, contract) in crate::ring_check::tests::strided_corpus() {
            let block = contract.geometry.block.host_block();
            let operands = contract.footprints.len() as u32;
            let scalars = contract.scalar_params();
            let mut table: RingTable<(), u64> = RingTable::default();
            table.apply(
                &RingGrant {
                    kernels: vec![ptxd_proto::executor::RingKernel {
                        ring_index: 3,
                        module_id: 9,
                        inputs: operands - 1,
                        scalar_params: scalars as u32,
                        element_sizes: vec![4; operands as usize],
                        contract: Some(crate::ring_check::encode(&contract)),
                        block,
                        ..Default::default()
                    }],
                    buffers: (1..=operands)
                        .map(|i| ptxd_proto::executor::RingBuffer {
                            ring_index: i,
                            buffer_id: 100 + u64::from(i),
                            size: 4 * 4096,
                        })
                        .collect(),
                    ..Default::default()
                },
                |_| Some(()),
                Some,
            );
            let bound = launch::BoundContract {
                contract: &contract,
                block,
            };
            for round in 0..3000 {
                let n = match round % 3 {
                    0 => rng.random_range(0..4096),
                    1 => rng.random_range(0..64),
                    _ => 1 << rng.random_range(0..64),
                };
                let args: Vec<u64> = (0..scalars)
                    .map(|_| crate::ring_check::tests::strided_arg(&mut rng))
                    .collect();
                let typed: Vec<TypedArg> = args.iter().map(|a| TypedArg::U64(*a)).collect();
                let operand = |buffer| OperandRef { buffer, offset: 0 };
                let inputs: Vec<OperandRef> = (1..operands).map(operand).collect();
                let d = Descriptor::new(1, 3, &inputs, operand(operands), n)
                    .unwrap()
                    .with_args(&typed)
                    .unwrap();
                let ring = checked_launch(&table, &d)
                    .map(|l| l.args)
                    .map_err(|e| e.refusal());
                let shape = launch::LaunchShape {
                    inputs: d.inputs(),
                    output: Some(&d.output),
                    n,
                    scalars: 0,
                    wait: None,
                    signal: None,
                };
                let unary_args: Vec<launch::ScalarArg> =
                    args.iter().map(|a| launch::ScalarArg::U64(*a)).collect();
                let cap = KernelCap {
                    signature: &bound,
                    placement: HERE,
                };
                let unary = launch::check_with_args(&table, cap, &shape, &unary_args)
                    .map(|_| args.clone())
                    .map_err(|e: Error| e.refusal());
                assert_eq!(ring, unary, "{file}: n {n}, args {args:?}");
                let what = match &ring {
                    Ok(_) => "ok".to_string(),
                    Err(r) => r
                        .metadata
                        .get("precondition")
                        .cloned()
                        .unwrap_or_else(|| format!("{:?}", r.reason)),
                };
                *seen.entry(what).or_default() += 1;
            }
        }
        for what in [
            "ok",
            DIVISOR_POSITIVE,
            ARG_NONNEGATIVE,
            STRIDED_INDEX_FITS_I64,
            "BufferTooSmall",
        ] {
            assert!(seen.get(what).is_some_and(|k| *k > 0), "{what}: {seen:?}");
        }
    }

    /// A kernel the ring holds to a count limit (a 32-bit index: the
    /// signature's contract but for preconditions on the count), granted
    /// as the front grants it: a launch past the limit is
    /// refused with the unary path's reason, message and metadata (the
    /// precondition that fails first, its condition, the values it reads),
    /// and one within it passes on both.
    #[test]
    fn a_ring_count_limit_refuses_with_the_unary_paths_words() {
        use rand::Rng;
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/jit/nvrtc");
        let mut rng = rand::rng();
        for (file, entry) in [
            ("add_f32_idx32_O3.ptx", "add_f32_idx32"),
            ("add_f32_idx32_G.ptx", "add_f32_idx32"),
            ("add_f32_idx32_fast.ptx", "add_f32_idx32"),
        ] {
            let text = std::fs::read_to_string(dir.join(file)).unwrap();
            let canonical = crate::ptx::canonicalize(&text, entry, None).unwrap();
            let (contract, signature) = (canonical.contract, canonical.signature);
            for block in [64, 256, 1024] {
                let mut kernel = crate::ring_check::grant_terms(&contract, &signature, block)
                    .expect("a ring can check it");
                // The whole contract travels: no separate limit.
                assert!(kernel.max_count.is_none() && kernel.contract.is_some());
                let max = contract.max_count(block).expect("a largest count").0;
                kernel.ring_index = 3;
                kernel.inputs = signature.inputs;
                kernel.element_sizes = signature.element_sizes.clone();
                let mut table: RingTable<(), u64> = RingTable::default();
                table.apply(
                    &RingGrant {
                        kernels: vec![kernel],
                        buffers: (1..=3)
                            .map(|i| ptxd_proto::executor::RingBuffer {
                                ring_index: i,
                                buffer_id: 100 + u64::from(i),
                                size: u64::MAX,
                            })
                            .collect(),
                        ..Default::default()
                    },
                    |_| Some(()),
                    Some,
                );
                let bound = launch::BoundContract {
                    contract: &contract,
                    block,
                };
                let mut refused = 0;
                for n in [max, max + 1, u64::MAX, 1 << 63, i64::MAX as u64]
                    .into_iter()
                    .chain((0..200).map(|_| rng.random_range(max.saturating_sub(1000)..=u64::MAX)))
                {
                    let operand = |buffer| OperandRef { buffer, offset: 0 };
                    let d =
                        Descriptor::new(1, 3, &[operand(1), operand(2)], operand(3), n).unwrap();
                    let ring = checked_launch(&table, &d)
                        .map(|_| ())
                        .map_err(|e| e.refusal());
                    let shape = launch::LaunchShape {
                        inputs: d.inputs(),
                        output: Some(&d.output),
                        n,
                        scalars: 0,
                        wait: None,
                        signal: None,
                    };
                    let cap = KernelCap {
                        signature: &bound,
                        placement: HERE,
                    };
                    let unary = launch::check_with_args(&table, cap, &shape, &[])
                        .map(|_| ())
                        .map_err(|e: Error| e.refusal());
                    assert_eq!(ring, unary, "{file} block {block}: n {n}");
                    refused += usize::from(ring.is_err());
                }
                assert!(refused > 100, "{file} block {block}");
            }
        }
    }

    /// A kernel whose contract the ring cannot decode is not granted (a
    /// launch of it is refused as a kernel the ring does not hold, never
    /// checked against less), and a grant that replaces one with an
    /// undecodable contract drops the old entry; one that decodes is
    /// checked against its whole contract: a footprint one element past
    /// its buffer is refused, the one before it passes.
    #[test]
    fn a_contract_the_ring_cannot_decode_is_not_granted() {
        use crate::ptx::contract::{Expr, Footprint};
        let mut contract = crate::executor::layout::tests_support::triton_like();
        contract.geometry.elements_per_thread = 4;
        for f in &mut contract.footprints {
            *f = Footprint {
                bytes: Expr::product(Expr::RoundUp(Box::new(Expr::Count), 4), Expr::Const(4)),
                ..f.clone()
            };
        }
        let kernel = |wire: ptxd_proto::executor::RingContract| ptxd_proto::executor::RingKernel {
            ring_index: 3,
            module_id: 9,
            inputs: 2,
            scalar_params: 2,
            element_sizes: vec![4, 4, 4],
            contract: Some(wire),
            block: 128,
            ..Default::default()
        };
        let good = crate::ring_check::encode(&contract);
        let mut bad = good.clone();
        bad.footprints[1].bytes.pop();
        let buffers = (1..=3)
            .map(|i| ptxd_proto::executor::RingBuffer {
                ring_index: i,
                buffer_id: 100 + u64::from(i),
                size: 4 * 1024,
            })
            .collect();
        let mut table: RingTable<(), u64> = RingTable::default();
        table.apply(
            &RingGrant {
                kernels: vec![kernel(good)],
                buffers,
                ..Default::default()
            },
            |_| Some(()),
            Some,
        );
        let operand = |buffer| OperandRef { buffer, offset: 0 };
        let launch = |table: &RingTable<(), u64>, n| {
            let d = Descriptor::new(1, 3, &[operand(1), operand(2)], operand(3), n)
                .unwrap()
                .with_args(&[TypedArg::F32(1.0), TypedArg::I64(-1)])
                .unwrap();
            checked_launch(table, &d).map(|l| l.args)
        };
        // roundup(1021, 4) × 4 = 4096 bytes: fits; 1025 rounds up past.
        assert_eq!(
            launch(&table, 1021).unwrap(),
            vec![1f32.to_bits().into(), u64::MAX]
        );
        assert_eq!(launch(&table, 1024).unwrap().len(), 2);
        assert_eq!(
            reason_of(&launch(&table, 1025).unwrap_err()),
            Reason::BufferTooSmall as u32
        );
        table.apply(
            &RingGrant {
                kernels: vec![kernel(bad)],
                ..Default::default()
            },
            |_| Some(()),
            Some,
        );
        assert_eq!(
            reason_of(&launch(&table, 16).unwrap_err()),
            Reason::StaleKernel as u32
        );
    }

    /// A backend that answers on acceptance: what the client can read
    /// while each launch is being enqueued, which launches reached it, and
    /// which signals it released.
    struct Early {
        client: Arc<Mutex<Submitter>>,
        read: Arc<Mutex<Vec<(u64, CompletionStatus, u64)>>>,
        /// (ticket, whether its own answer was readable during its launch)
        launched: Arc<Mutex<Vec<(u64, bool)>>>,
        released: Arc<Mutex<Vec<u64>>>,
        stop: Arc<AtomicBool>,
    }

    /// A launch of n = 13 is refused by the backend's own check; one of
    /// n = 11 passes every check and fails to enqueue.
    const REFUSED_N: u64 = 13;
    const FAILING_N: u64 = 11;

    impl RingBackend for Early {
        type Kernel = ();
        type Buffer = u64;
        fn launch(
            &mut self,
            launch: RingLaunch<(), u64>,
            _: TableHold<'_, (), u64>,
            _: &AtomicBool,
        ) -> Result<(), Error> {
            let ticket = launch.signal.as_ref().map_or(0, |s| s.op.value - 100);
            let mut own = false;
            while let Some(c) = self.client.lock().unwrap().poll_completion().unwrap() {
                own |= c.ticket == ticket;
                self.read
                    .lock()
                    .unwrap()
                    .push((c.ticket, c.status, c.detail));
            }
            self.launched.lock().unwrap().push((ticket, own));
            if launch.n == FAILING_N {
                return Err(failure(FailureKind::Internal, "the driver said no"));
            }
            Ok(())
        }
        fn release_signal(&mut self, signal: CheckedSemaphore<u64>, _: TableHold<'_, (), u64>) {
            self.released.lock().unwrap().push(signal.op.value);
            if signal.op.value == 106 {
                self.stop.store(true, Ordering::Release);
            }
        }
        fn admit(&self, launch: &RingLaunch<(), u64>) -> Result<(), Error> {
            if launch.n == REFUSED_N {
                return Err(failure(FailureKind::OutOfBounds, "too many blocks"));
            }
            Ok(())
        }
        fn answers_on_acceptance(&self) -> bool {
            true
        }
    }

    /// An async launch that passed every check is answered `Ok` before the
    /// backend enqueues it (the client can read the answer during the
    /// enqueue); a sync one only after. A refusal of the backend's own
    /// check is the launch's refusal and never reaches the enqueue. An
    /// enqueue that fails after its answer breaks the ring: every later
    /// launch is answered `Failed` with that reason, the detail naming
    /// the failed ticket, and its signal is released, not launched.
    #[test]
    fn an_accepted_launch_is_answered_before_its_enqueue_and_a_later_failure_breaks_the_ring() {
        let client = Submitter::create(64).unwrap();
        let mut server = Server::open(client.name(), None).unwrap();
        let client = Arc::new(Mutex::new(client));
        // (n, sync) per ticket 0..7.
        let plan = [
            (1, false),
            (2, true),
            (REFUSED_N, false),
            (3, false),
            (FAILING_N, false),
            (4, false),
            (5, false),
        ];
        for (ticket, (n, sync)) in plan.iter().enumerate() {
            let output = OperandRef {
                buffer: 1,
                offset: 0,
            };
            let signal = SemaphoreOp {
                buffer: 1,
                offset: 0,
                value: 100 + ticket as u64,
                width: SemaphoreWidth::Bits32,
            };
            let descriptor = Descriptor::new(ticket as u64, 7, &[], output, *n)
                .unwrap()
                .with_sync(*sync)
                .with_signal(signal)
                .unwrap();
            client.lock().unwrap().try_submit(&descriptor).unwrap();
        }
        let table: Shared<(), u64> = Arc::default();
        let grant = RingGrant {
            stream: 1,
            buffers: vec![ptxd_proto::executor::RingBuffer {
                ring_index: 1,
                buffer_id: 10,
                size: 64,
            }],
            kernels: vec![ptxd_proto::executor::RingKernel {
                ring_index: 7,
                module_id: 1,
                inputs: 0,
                element_sizes: vec![4],
                ..Default::default()
            }],
            ..Default::default()
        };
        lock(&table).apply(&grant, |_| Some(()), Some);
        let stop = Arc::new(AtomicBool::new(false));
        let (read, launched, released) = (Arc::default(), Arc::default(), Arc::default());
        let backend = Early {
            client: Arc::clone(&client),
            read: Arc::clone(&read),
            launched: Arc::clone(&launched),
            released: Arc::clone(&released),
            stop: Arc::clone(&stop),
        };
        serve(&mut server, backend, table, &stop, || false, &session());
        let mut read = read.lock().unwrap().clone();
        while let Some(c) = client.lock().unwrap().poll_completion().unwrap() {
            read.push((c.ticket, c.status, c.detail));
        }
        assert_eq!(
            *launched.lock().unwrap(),
            vec![(0, true), (1, false), (3, true), (4, true)],
            "async launches answered before their enqueue, the sync one after, \
             the refused and broken ones never enqueued"
        );
        let refused = reason_of(&failure(FailureKind::OutOfBounds, ""));
        let failed = reason_of(&failure(FailureKind::Internal, ""));
        assert_eq!(
            read,
            vec![
                (0, CompletionStatus::Ok, 0),
                (1, CompletionStatus::Ok, 0),
                (2, CompletionStatus::Refused { reason: refused }, 0),
                (3, CompletionStatus::Ok, 0),
                (4, CompletionStatus::Ok, 0),
                (5, CompletionStatus::Failed { reason: failed }, 4),
                (6, CompletionStatus::Failed { reason: failed }, 4),
            ]
        );
        assert_eq!(*released.lock().unwrap(), vec![102, 105, 106]);
    }

    /// Not a test: the ring's own instructions per launch, on one thread
    /// (no cache line moves between cores), phase by phase, with a backend
    /// that enqueues nothing. `cargo test --release --lib
    /// executor::ring::tests::ring_path_cost -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn ring_path_cost() {
        struct Noop;
        impl RingBackend for Noop {
            type Kernel = ();
            type Buffer = u64;
            fn launch(
                &mut self,
                launch: RingLaunch<(), u64>,
                _: TableHold<'_, (), u64>,
                _: &AtomicBool,
            ) -> Result<(), Error> {
                std::hint::black_box(&launch);
                Ok(())
            }
            fn release_signal(&mut self, _: CheckedSemaphore<u64>, _: TableHold<'_, (), u64>) {}
        }
        let mut client = Submitter::create(256).unwrap();
        let mut server = Server::open(client.name(), None).unwrap();
        let table: Shared<(), u64> = Arc::default();
        let grant = RingGrant {
            stream: 1,
            buffers: (1..=3)
                .map(|i| ptxd_proto::executor::RingBuffer {
                    ring_index: i,
                    buffer_id: u64::from(i),
                    size: 1 << 20,
                })
                .collect(),
            kernels: vec![ptxd_proto::executor::RingKernel {
                ring_index: 7,
                module_id: 1,
                inputs: 2,
                element_sizes: vec![4, 4, 4],
                ..Default::default()
            }],
            ..Default::default()
        };
        lock(&table).apply(&grant, |_| Some(()), Some);
        let (stop, session) = (AtomicBool::new(false), session());
        let mut backend = Noop;
        let rounds = 200_000u32;
        let mut phases = [Duration::ZERO; 5];
        for ticket in 0..u64::from(rounds) {
            let t0 = Instant::now();
            let inputs = [
                OperandRef {
                    buffer: 1,
                    offset: 0,
                },
                OperandRef {
                    buffer: 2,
                    offset: 0,
                },
            ];
            let output = OperandRef {
                buffer: 3,
                offset: 0,
            };
            let descriptor = Descriptor::new(ticket, 7, &inputs, output, 4096).unwrap();
            client.try_submit(&descriptor).unwrap();
            let t1 = Instant::now();
            let Some(Polled::Launch(polled)) = server.poll().unwrap() else {
                panic!("a launch");
            };
            let t2 = Instant::now();
            let Ran::Answer(status) =
                launch(&table, &mut backend, &polled, &stop, &session, &mut server)
            else {
                panic!("answered after the launch");
            };
            assert_eq!(status, CompletionStatus::Ok);
            let t3 = Instant::now();
            server.post(status, 0).unwrap();
            server.flush();
            let t4 = Instant::now();
            client.poll_completion().unwrap().unwrap();
            let t5 = Instant::now();
            for (phase, (a, b)) in
                phases
                    .iter_mut()
                    .zip([(t0, t1), (t1, t2), (t2, t3), (t3, t4), (t4, t5)])
            {
                *phase += b - a;
            }
        }
        for (name, total) in [
            "submit",
            "poll+decode",
            "check+launch",
            "post+flush",
            "completion",
        ]
        .iter()
        .zip(phases)
        {
            println!(
                "{name:14} {:7.1} ns",
                total.as_nanos() as f64 / f64::from(rounds)
            );
        }
    }
}
