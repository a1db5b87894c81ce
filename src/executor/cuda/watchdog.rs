//! The per-launch budget on a CUDA device, where a running kernel cannot be
//! stopped.
//!
//! Every launch with a kernel is tracked by an event recorded after it (and,
//! when it waits on a client's event, one recorded after the wait). A
//! session's launches run in order on its stream, so only the head of each
//! stream's queue can be running: its clock starts when the launch before it
//! on the stream was seen complete (or when it was enqueued on an idle
//! stream, or when its wait was seen satisfied). The watchdog thread polls
//! the heads; the first one that stays incomplete for longer than the
//! budget is the culprit.
//!
//! On a culprit the executor cannot recover the device: it tells the front
//! (`KernelTimeout`, so the session's count goes up before anyone hears of
//! it), answers the culprit's sync launch `KERNEL_TIMEOUT`, reports a
//! `KERNEL_TIMEOUT` fault and exits at once. The front restarts the device
//! with a new generation; every other call in flight on this executor is
//! answered `EXECUTOR_UNAVAILABLE`, and every session's kernels on this
//! device go stale.
//!
//! The watchdog is also where an async launch's fault is met when no
//! request follows it: a marker query that returns a sticky error (see
//! [`ptxd_cuda::is_sticky_error`]) ends the process within one poll
//! interval (budget/20, at most 50 ms), after a short grace in which a
//! stream waiter may answer its sync launch with the fault it met.
//!
//! The budget counts from when a launch could start on its stream, so time
//! spent waiting for SMs held by other sessions' kernels counts too; the
//! earliest-started overdue launch is blamed, which on a device busy with
//! one endless kernel is that kernel's launch.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ptxd_cuda::{DriverError, Event, PrimaryContext};
use ptxd_proto::executor::FailureKind;

use crate::executor::child::{Channel, Replier};

/// The reply of a sync launch: taken by the stream's waiter when the stream
/// is synchronized, or by the watchdog when the launch is the culprit.
pub type SharedReply = Arc<Mutex<Option<Replier>>>;

/// Takes the reply out of a shared slot, if nobody took it yet.
pub fn take_reply(reply: &SharedReply) -> Option<Replier> {
    reply.lock().unwrap_or_else(|p| p.into_inner()).take()
}

/// Marker events kept for reuse at most, per stream: more than a ring at
/// full speed (about 15,000 groups a second) retires between two polls
/// (50 ms apart with the default budget), so a busy ring creates and
/// destroys none.
const SPARE_EVENTS: usize = 1024;

/// One tracked launch.
pub struct Watched {
    /// Recorded after the launch's wait on a client event, if it has one.
    pub started: Option<Event>,
    /// A ring semaphore wait (behind `started`) that has not fired by this
    /// instant is blamed like a kernel that ran past the budget (none: a
    /// wait on a client event, which may take as long as it likes).
    pub wait_deadline: Option<Instant>,
    /// Recorded after the kernel (after the last kernel of a group).
    pub done: Event,
    /// The reply of a sync launch.
    pub reply: Option<SharedReply>,
    /// How many kernels `done` closes: 1 for a gRPC launch; a ring groups
    /// up to [`RING_GROUP`] under one marker. The group may run for the
    /// budget times its size, so a group of kernels each within the budget
    /// is never blamed, and a kernel that never ends is caught within that
    /// many budgets.
    pub launches: u32,
}

/// The most ring launches one marker closes: a marker per launch (an event
/// record each) cut the throughput of 16 rings on an H200 from 558k to 54k
/// launches/s, measured.
pub const RING_GROUP: u32 = 16;

/// One session stream's watched launches, in stream order. Each stream has
/// its own lock, so launches on different streams (gRPC launches, and the
/// rings' threads) never wait for each other here, and the poller holds one
/// stream's lock at a time.
#[derive(Default)]
pub struct StreamQueue {
    inner: Mutex<QueueState>,
}

#[derive(Default)]
struct QueueState {
    /// When the head launch could start running (`None`: it waits on a
    /// client event or semaphore that has not fired yet, or the queue is
    /// empty).
    head_since: Option<Instant>,
    launches: VecDeque<Watched>,
    /// Marker events of completed launches, for reuse.
    spare: Vec<Event>,
}

impl StreamQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        // Plain queues: a panic while holding the lock cannot leave them
        // inconsistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A marker event, reused when one is spare.
    pub fn marker(&self) -> Result<Event, DriverError> {
        match self.lock().spare.pop() {
            Some(event) => Ok(event),
            None => Event::marker(),
        }
    }

    /// Tracks a launch just enqueued on this stream.
    pub fn push(&self, watched: Watched) {
        let mut queue = self.lock();
        if queue.launches.is_empty() {
            queue.head_since = watched.started.is_none().then(Instant::now);
        }
        queue.launches.push_back(watched);
    }

    /// Drops the completed heads; returns since when the head has been
    /// running, if it is overdue at `now`. Marker events beyond the spare
    /// ones are destroyed after the lock is released, so the stream's
    /// launches (which take the lock to push) never wait on the driver's
    /// event teardown.
    ///
    /// A sticky error from a marker's query (the device faulted) is
    /// returned as it is.
    fn poll(&self, now: Instant, budget: Duration) -> Result<Option<Instant>, DriverError> {
        let mut retired: Vec<Event> = Vec::new();
        let overdue = {
            let mut queue = self.lock();
            let overdue = Self::retire(&mut queue, now, budget, &mut retired);
            let room = SPARE_EVENTS.saturating_sub(queue.spare.len());
            let kept = retired.len().min(room);
            queue.spare.extend(retired.drain(..kept));
            overdue
        };
        drop(retired);
        overdue
    }

    fn retire(
        queue: &mut QueueState,
        now: Instant,
        budget: Duration,
        retired: &mut Vec<Event>,
    ) -> Result<Option<Instant>, DriverError> {
        let QueueState {
            head_since,
            launches,
            ..
        } = queue;
        // Markers complete in stream order, so when the newest is done every
        // launch before it is: one query retires a whole queue (a busy ring
        // queues hundreds of groups between two polls, and querying each
        // took the driver's locks from under the ring's launches).
        if launches.len() > 1 {
            let newest_done = match launches.back().map(|newest| newest.done.query()) {
                Some(Ok(done)) => done,
                Some(Err(e)) => return sticky(e).map(|()| None),
                None => false,
            };
            if newest_done {
                for done in launches.drain(..) {
                    retired.extend(done.started);
                    retired.push(done.done);
                }
                *head_since = None;
                return Ok(None);
            }
        }
        while let Some(head) = launches.front() {
            if head_since.is_none() {
                match head.started.as_ref().map(Event::query) {
                    None | Some(Ok(true)) => *head_since = Some(now),
                    // A ring semaphore that never fired: its stream (and
                    // every drain of the device) would wait forever.
                    Some(Ok(false)) => {
                        return Ok(head.wait_deadline.filter(|deadline| now >= *deadline))
                    }
                    Some(Err(e)) => return sticky(e).map(|()| None),
                }
            }
            match head.done.query() {
                Ok(true) => {
                    if let Some(done) = launches.pop_front() {
                        retired.extend(done.started);
                        retired.push(done.done);
                    }
                    *head_since = None;
                }
                Ok(false) => {
                    let Some(since) = *head_since else {
                        return Ok(None);
                    };
                    let allowance = budget.saturating_mul(head.launches.max(1));
                    return Ok((now.saturating_duration_since(since) >= allowance).then_some(since));
                }
                Err(e) => return sticky(e).map(|()| None),
            }
        }
        Ok(None)
    }

    /// The reply of the head launch, for the culprit's answer.
    fn take_head_reply(&self) -> Option<SharedReply> {
        self.lock()
            .launches
            .front_mut()
            .and_then(|head| head.reply.take())
    }
}

/// A marker query's failure: a sticky error (the device faulted, perhaps in
/// an async launch nobody waits for) is returned, for the watchdog to end
/// the process at once; any other is left to the next call that touches
/// the device (`Ok`).
fn sticky(error: DriverError) -> Result<(), DriverError> {
    if error.is_sticky() {
        return Err(error);
    }
    tracing::debug!(error = %error, "a watchdog marker's query failed");
    Ok(())
}

/// How long the watchdog lets a stream waiter answer its sync launch with
/// the fault it met, before it ends the process itself (the waiter's
/// answer names the fault to the launch that caused it; the watchdog's
/// exit answers every call `EXECUTOR_UNAVAILABLE`).
const FAULT_GRACE: Duration = Duration::from_millis(10);

/// The launches in flight on one device, against the budget.
pub struct Watchdog {
    budget: Duration,
    streams: Mutex<HashMap<u64, Arc<StreamQueue>>>,
}

impl std::fmt::Debug for Watchdog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watchdog")
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

/// A launch that ran past the budget.
struct Culprit {
    stream: u64,
    reply: Option<SharedReply>,
}

impl Watchdog {
    /// Starts the watchdog thread for a device whose launches may run for
    /// `budget` each; it reports on `channel`.
    pub fn start(
        budget: Duration,
        context: Arc<PrimaryContext>,
        channel: Channel,
    ) -> std::io::Result<Arc<Watchdog>> {
        let watchdog = Arc::new(Watchdog {
            budget,
            streams: Mutex::new(HashMap::new()),
        });
        let watching = watchdog.clone();
        std::thread::Builder::new()
            .name("ptxd-watchdog".into())
            .spawn(move || watching.run(&context, &channel))?;
        Ok(watchdog)
    }

    fn streams(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<StreamQueue>>> {
        self.streams.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The queue of session stream `stream`; a ring keeps it, so that its
    /// launches take no device-wide lock.
    pub fn queue(&self, stream: u64) -> Arc<StreamQueue> {
        self.streams().entry(stream).or_default().clone()
    }

    /// Drops the completed heads; returns the culprit, if a head is overdue
    /// (the one overdue for longest).
    ///
    /// A sticky error from any stream's markers is returned at once.
    fn poll(&self) -> Result<Option<Culprit>, DriverError> {
        let now = Instant::now();
        let queues: Vec<(u64, Arc<StreamQueue>)> = {
            let mut streams = self.streams();
            // A queue nobody else holds and that is empty is forgotten; a
            // ring's queue stays while the ring holds it.
            streams.retain(|_, queue| {
                Arc::strong_count(queue) > 1 || !queue.lock().launches.is_empty()
            });
            streams.iter().map(|(id, q)| (*id, q.clone())).collect()
        };
        let mut overdue: Option<(Instant, u64, Arc<StreamQueue>)> = None;
        for (id, queue) in queues {
            if let Some(since) = queue.poll(now, self.budget)? {
                if overdue.as_ref().is_none_or(|(first, _, _)| since < *first) {
                    overdue = Some((since, id, queue));
                }
            }
        }
        let Some((_, stream, queue)) = overdue else {
            return Ok(None);
        };
        Ok(Some(Culprit {
            stream,
            reply: queue.take_head_reply(),
        }))
    }

    fn run(&self, context: &PrimaryContext, channel: &Channel) {
        if let Err(e) = context.set_current() {
            tracing::error!(error = %e, "the watchdog cannot use the device's context");
        }
        let interval =
            (self.budget / 20).clamp(Duration::from_millis(1), Duration::from_millis(50));
        loop {
            std::thread::sleep(interval);
            let culprit = match self.poll() {
                Ok(Some(culprit)) => culprit,
                Ok(None) => continue,
                Err(fault) => {
                    // The context is poisoned: nothing more may be served
                    // from it, whether or not a request would meet the
                    // fault soon.
                    std::thread::sleep(FAULT_GRACE);
                    channel.fatal_now(
                        &fault.name,
                        &format!(
                            "the device faulted ({fault}, seen by the watchdog); the executor restarts"
                        ),
                    );
                }
            };
            let message = format!(
                "a kernel ran past the {:?} budget (--max-kernel-time); a running CUDA kernel cannot be stopped, so the device's executor restarts",
                self.budget
            );
            channel.kernel_timeout(culprit.stream);
            if let Some(reply) = culprit.reply.as_ref().and_then(take_reply) {
                reply.fail(
                    FailureKind::KernelTimeout,
                    message.clone(),
                    &[("max_kernel_time_ms", self.budget.as_millis().to_string())],
                );
            }
            channel.fatal_now("KERNEL_TIMEOUT", &message);
        }
    }
}
