//! The per-launch budget on a CUDA device, where a running kernel cannot be
//! stopped.
//!
//! Every launch with a kernel is tracked by a marker after it: an event
//! recorded after a gRPC launch (and, when it waits on a client's event, one
//! recorded after the wait); for a ring, the next number of the stream's
//! sequence, written by the stream (`cuStreamWriteValue64`) into a word of
//! pinned host memory after a group of up to [`RING_GROUP`] launches, which
//! the watchdog reads without a driver call ([`RingWatch`]). A session's
//! launches run in order on its stream, so only the head of each
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
//! request follows it: a marker query, or the query of a ring's stream
//! (one `cuStreamQuery` a poll), that returns a sticky error (see
//! [`ptxd_cuda::is_sticky_error`]) ends the process within one poll
//! interval (budget/20, at most 50 ms), after a short grace in which a
//! stream waiter may answer its sync launch with the fault it met.
//!
//! Invariants of the ring's markers:
//! - Every ring launch with a kernel is in exactly one group, and a group
//!   is closed (its sequence number written after its last launch) before
//!   the ring's thread can sleep: when it is full, before a launch that
//!   waits on a semaphore, after a launch that waits or syncs, and when the
//!   ring goes idle. So a kernel that never ends holds up a marker the
//!   watchdog sees, within `RING_GROUP` budgets of its group's start.
//! - A stream's sequence numbers grow in its stream order (one ring at a
//!   time enqueues on a session's stream, and numbers are taken under the
//!   queue's lock right before the write is enqueued), so the word's value
//!   is the newest group completed: every group at or below it is done.
//!
//! The budget counts from when a launch could start on its stream, so time
//! spent waiting for SMs held by other sessions' kernels counts too; the
//! earliest-started overdue launch is blamed, which on a device busy with
//! one endless kernel is that kernel's launch.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use ptxd_cuda::{DriverError, Event, HostWord, PrimaryContext, Stream};
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
    /// After the launch's wait (on a client event: an event recorded
    /// after it; on a ring semaphore: a sequence number written after it),
    /// if it has one: its clock starts once this is done.
    pub started: Option<Marker>,
    /// A ring semaphore wait (behind `started`) that has not fired by this
    /// instant is blamed like a kernel that ran past the budget (none: a
    /// wait on a client event, which may take as long as it likes).
    pub wait_deadline: Option<Instant>,
    /// After the kernel (after the last kernel of a group).
    pub done: Marker,
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

/// What tells the watchdog a watched launch (or group) is done.
#[derive(Debug)]
pub enum Marker {
    /// An event recorded after it (a gRPC launch).
    Event(Event),
    /// A sequence number its stream writes into the queue's progress word
    /// after it (a ring's group): done once the word reached it.
    Sequence(u64),
}

/// A stream's progress word, as the watchdog reads it: the newest
/// sequence number the stream wrote (see [`Marker::Sequence`]).
pub trait Progress: Send + Sync {
    /// The newest sequence number written (0 before the first).
    fn completed(&self) -> u64;
    /// The word's device address, for the stream's writes.
    fn device_ptr(&self) -> u64;
}

impl Progress for HostWord {
    fn completed(&self) -> u64 {
        self.load()
    }

    fn device_ptr(&self) -> u64 {
        HostWord::device_ptr(self)
    }
}

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
    /// The ring's progress word (once a ring attached): its groups'
    /// sequence numbers are written there.
    progress: Option<Arc<dyn Progress>>,
    /// The last sequence number taken.
    sequence: u64,
    /// The ring's stream (once a ring attached), queried once a poll: its
    /// sequence markers need no driver call, so a fault is met here.
    stream: Weak<Stream>,
}

/// Whether `marker`'s launches are done: an event's query, or the stream's
/// progress word at or past the sequence number (a sequence marker with no
/// word never completes, and is blamed once overdue).
fn marker_done(progress: Option<&dyn Progress>, marker: &Marker) -> Result<bool, DriverError> {
    match marker {
        Marker::Event(event) => event.query(),
        Marker::Sequence(sequence) => {
            Ok(progress.is_some_and(|word| word.completed() >= *sequence))
        }
    }
}

/// Keeps a retired launch's events for reuse.
fn retire_events(watched: Watched, retired: &mut Vec<Event>) {
    for marker in watched.started.into_iter().chain([watched.done]) {
        if let Marker::Event(event) = marker {
            retired.push(event);
        }
    }
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

    /// Attaches a ring to this queue: its stream (queried once a poll for
    /// faults) and the progress word its groups' sequence numbers go to,
    /// made by `word` on first use and kept for every later ring of the
    /// stream (their numbers continue the sequence).
    pub fn attach_ring(
        &self,
        stream: Weak<Stream>,
        word: impl FnOnce() -> Result<Arc<dyn Progress>, DriverError>,
    ) -> Result<Arc<dyn Progress>, DriverError> {
        let mut queue = self.lock();
        let progress = match &queue.progress {
            Some(progress) => progress.clone(),
            None => {
                let progress = word()?;
                queue.progress = Some(progress.clone());
                progress
            }
        };
        queue.stream = stream;
        Ok(progress)
    }

    /// The next sequence number, for a group about to be closed.
    fn next_sequence(&self) -> u64 {
        let mut queue = self.lock();
        queue.sequence += 1;
        queue.sequence
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
        // A ring's stream is asked once a poll, outside the lock: a sticky
        // error (an async launch faulted) is met here, and a drained stream
        // retires every launch queued before the question.
        let (stream, queued) = {
            let queue = self.lock();
            (queue.stream.upgrade(), queue.launches.len())
        };
        let drained = match stream.as_ref().filter(|_| queued > 0).map(|s| s.query()) {
            Some(Ok(drained)) => drained,
            Some(Err(e)) => {
                sticky(e)?;
                false
            }
            None => false,
        };
        drop(stream);
        let mut retired: Vec<Event> = Vec::new();
        let overdue = {
            let mut queue = self.lock();
            if drained {
                // Only this poller takes launches off the queue: the first
                // `queued` are the ones enqueued before the query.
                let known = queued.min(queue.launches.len());
                let done: Vec<Watched> = queue.launches.drain(..known).collect();
                for watched in done {
                    retire_events(watched, &mut retired);
                }
                queue.head_since = None;
            }
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
            progress,
            ..
        } = queue;
        let done = |marker: &Marker| marker_done(progress.as_deref(), marker);
        // Markers complete in stream order, so when the newest is done every
        // launch before it is: one query retires a whole queue (a busy ring
        // queues hundreds of groups between two polls, and querying each
        // took the driver's locks from under the ring's launches).
        if launches.len() > 1 {
            let newest_done = match launches.back().map(|newest| done(&newest.done)) {
                Some(Ok(done)) => done,
                Some(Err(e)) => return sticky(e).map(|()| None),
                None => false,
            };
            if newest_done {
                for done in launches.drain(..) {
                    retire_events(done, retired);
                }
                *head_since = None;
                return Ok(None);
            }
        }
        while let Some(head) = launches.front() {
            if head_since.is_none() {
                match head.started.as_ref().map(done) {
                    None | Some(Ok(true)) => *head_since = Some(now),
                    // A ring semaphore that never fired: its stream (and
                    // every drain of the device) would wait forever.
                    Some(Ok(false)) => {
                        return Ok(head.wait_deadline.filter(|deadline| now >= *deadline))
                    }
                    Some(Err(e)) => return sticky(e).map(|()| None),
                }
            }
            match done(&head.done) {
                Ok(true) => {
                    if let Some(done) = launches.pop_front() {
                        retire_events(done, retired);
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

/// A ring's side of the watchdog: groups the kernels it enqueues, and closes
/// each group with the next sequence number of its stream, written after
/// the group's last launch (see the module's invariants). The writing is
/// the caller's (`write(address, value)`, a stream memory operation on the
/// CUDA ring), so the grouping is the same code on the device and in the
/// tests.
pub struct RingWatch {
    queue: Arc<StreamQueue>,
    progress: Arc<dyn Progress>,
    /// Kernels enqueued since the last marker.
    unwatched: u32,
}

impl std::fmt::Debug for RingWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingWatch")
            .field("unwatched", &self.unwatched)
            .finish_non_exhaustive()
    }
}

impl RingWatch {
    /// Watches a ring's launches on `queue`: attaches the ring's stream
    /// and its progress word (made by `word` for the stream's first ring,
    /// see [`StreamQueue::attach_ring`]).
    pub fn attach(
        queue: Arc<StreamQueue>,
        stream: Weak<Stream>,
        word: impl FnOnce() -> Result<Arc<dyn Progress>, DriverError>,
    ) -> Result<Self, DriverError> {
        let progress = queue.attach_ring(stream, word)?;
        Ok(RingWatch {
            queue,
            progress,
            unwatched: 0,
        })
    }

    /// The device address of the progress word the ring's markers are
    /// written to.
    pub fn progress_address(&self) -> u64 {
        self.progress.device_ptr()
    }

    /// A sequence number for a start marker: written after a semaphore
    /// wait, it starts the clock of the group closed after that wait's
    /// kernel (a launch waiting for its client is not running).
    pub fn start_marker(&self) -> u64 {
        self.queue.next_sequence()
    }

    /// Counts a kernel just enqueued.
    pub fn count(&mut self) {
        self.unwatched += 1;
    }

    /// For a kernel about to be enqueued: the sequence number that closes
    /// its group with it, when the group must close with it (it fills the
    /// group, or `close_now`: it waited on a semaphore, or is a sync
    /// launch). The caller writes it after the kernel (in the kernel's own
    /// submission, where it can), then [`count`](Self::count)s the kernel
    /// and [`commit`](Self::commit)s the number; a number taken for a
    /// kernel that then failed to enqueue is a gap, as in
    /// [`closing`](Self::closing).
    pub fn closing_with_next(&self, close_now: bool) -> Option<u64> {
        (close_now || self.unwatched.saturating_add(1) >= RING_GROUP)
            .then(|| self.queue.next_sequence())
    }

    /// Whether the group must close now: it is full, or `close_now` (the
    /// launch waited on a semaphore, or is a sync launch).
    #[cfg(test)]
    pub fn must_close(&self, close_now: bool) -> bool {
        self.unwatched > 0 && (close_now || self.unwatched >= RING_GROUP)
    }

    /// The sequence number that closes the kernels enqueued since the last
    /// marker (none: no kernel since), for the caller to write after them;
    /// [`commit`](Self::commit) it once the write is enqueued. A number
    /// taken and never committed (the write failed) leaves a gap, which
    /// the progress word's comparisons skip.
    pub fn closing(&self) -> Option<u64> {
        (self.unwatched > 0).then(|| self.queue.next_sequence())
    }

    /// Hands the group closed by `sequence` (written after it) to the
    /// watchdog. `started`: the marker after the group's semaphore wait,
    /// whose clock starts there; `wait_deadline`: when that wait is
    /// overdue.
    pub fn commit(
        &mut self,
        sequence: u64,
        started: Option<Marker>,
        wait_deadline: Option<Instant>,
    ) {
        // The ring and the request loop both push onto the session
        // stream's queue; each pushes right after it enqueued, so the queue
        // follows the stream's order up to that instant.
        self.queue.push(Watched {
            started,
            wait_deadline,
            done: Marker::Sequence(sequence),
            reply: None,
            launches: self.unwatched,
        });
        self.unwatched = 0;
    }

    /// Closes the group of kernels enqueued since the last marker, if any:
    /// enqueues the write of its sequence number (`write`), then hands it
    /// to the watchdog.
    pub fn close(
        &mut self,
        write: impl FnOnce(u64, u64) -> Result<(), DriverError>,
    ) -> Result<(), DriverError> {
        let Some(sequence) = self.closing() else {
            return Ok(());
        };
        write(self.progress.device_ptr(), sequence)?;
        self.commit(sequence, None, None);
        Ok(())
    }

    /// Counts a kernel just enqueued, and closes its group when it is full
    /// or must close now (a sync launch).
    #[cfg(test)]
    pub fn launched(
        &mut self,
        close_now: bool,
        write: impl FnOnce(u64, u64) -> Result<(), DriverError>,
    ) -> Result<(), DriverError> {
        self.count();
        if self.must_close(close_now) {
            return self.close(write);
        }
        Ok(())
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A progress word the test's "device" advances.
    #[derive(Default)]
    struct FakeWord(AtomicU64);

    impl Progress for FakeWord {
        fn completed(&self) -> u64 {
            self.0.load(Ordering::Acquire)
        }
        fn device_ptr(&self) -> u64 {
            0x7f00_dead_0000
        }
    }

    /// What the ring enqueued on its stream, in stream order.
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Op {
        Launch(usize),
        Mark(u64),
    }

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// Enqueues `launches` ring launches through the ring's grouping (a
    /// sync launch now and then, an idle spin now and then, and the idle
    /// spin after the burst that every ring makes before it sleeps);
    /// returns the stream's ops.
    fn burst(watch: &mut RingWatch, rng: &mut Rng, launches: usize) -> Vec<Op> {
        let mut ops = Vec::new();
        for i in 0..launches {
            ops.push(Op::Launch(i));
            let sync = rng.below(23) == 0;
            watch
                .launched(sync, |address, sequence| {
                    assert_eq!(address, 0x7f00_dead_0000);
                    ops.push(Op::Mark(sequence));
                    Ok(())
                })
                .unwrap();
            if rng.below(37) == 0 {
                watch
                    .close(|_, sequence| {
                        ops.push(Op::Mark(sequence));
                        Ok(())
                    })
                    .unwrap();
            }
        }
        watch
            .close(|_, sequence| {
                ops.push(Op::Mark(sequence));
                Ok(())
            })
            .unwrap();
        ops
    }

    /// A ring launch whose kernel never ends is blamed, whichever launch of
    /// a burst it is: the stream stops at it, so the progress word stays
    /// at the marker before it; the watchdog retires every group before,
    /// finds the stuck launch's group at the head, lets it run for its
    /// allowance (the budget per launch in it, at most `RING_GROUP`
    /// budgets) and blames it then, not a moment before. A launch left out
    /// of every group (a marker skipped, or written before its group's
    /// last launch) is never blamed, and fails here.
    #[test]
    fn a_stuck_ring_launch_is_blamed_within_its_groups_allowance() {
        let budget = Duration::from_secs(1);
        for seed in 1..=200u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let queue = Arc::new(StreamQueue::default());
            let word = Arc::new(FakeWord::default());
            let progress: Arc<dyn Progress> = word.clone();
            let mut watch = RingWatch::attach(queue.clone(), Weak::new(), || Ok(progress)).unwrap();
            let launches = 1 + rng.below(120) as usize;
            let ops = burst(&mut watch, &mut rng, launches);

            // Every launch in exactly one group, the numbers rising.
            let marks: Vec<u64> = ops
                .iter()
                .filter_map(|op| match op {
                    Op::Mark(s) => Some(*s),
                    Op::Launch(_) => None,
                })
                .collect();
            assert!(marks.windows(2).all(|w| w[0] < w[1]), "seed {seed}");
            let grouped: u32 = queue.lock().launches.iter().map(|w| w.launches).sum();
            assert_eq!(grouped as usize, launches, "seed {seed}: launches watched");

            // The device runs the stream up to the stuck launch.
            let stuck = rng.below(launches as u64) as usize;
            let at = ops.iter().position(|op| *op == Op::Launch(stuck)).unwrap();
            let reached = ops[..at]
                .iter()
                .filter_map(|op| match op {
                    Op::Mark(s) => Some(*s),
                    Op::Launch(_) => None,
                })
                .max()
                .unwrap_or(0);
            word.0.store(reached, Ordering::Release);
            // The stuck launch's group: the launches between the markers
            // around it.
            let group_end = ops[at..]
                .iter()
                .position(|op| matches!(op, Op::Mark(_)))
                .unwrap_or_else(|| panic!("seed {seed}: launch {stuck} is in no group"));
            let group_start = ops[..at]
                .iter()
                .rposition(|op| matches!(op, Op::Mark(_)))
                .map_or(0, |i| i + 1);
            let size = (group_start..at + group_end)
                .filter(|i| matches!(ops[*i], Op::Launch(_)))
                .count() as u32;
            assert!(
                (1..=RING_GROUP).contains(&size),
                "seed {seed}: group of {size}"
            );

            let now = Instant::now();
            assert_eq!(queue.poll(now, budget).unwrap(), None, "seed {seed}");
            {
                let state = queue.lock();
                let head = state.launches.front().expect("the stuck group stays");
                assert_eq!(
                    head.launches, size,
                    "seed {seed}: the head is the stuck group"
                );
                assert!(matches!(head.done, Marker::Sequence(s) if s > reached));
            }
            let allowance = budget * size;
            let early = now + allowance - Duration::from_millis(10);
            assert_eq!(
                queue.poll(early, budget).unwrap(),
                None,
                "seed {seed}: blamed early"
            );
            let since = queue.poll(now + allowance, budget).unwrap();
            assert!(since.is_some_and(|s| s <= now), "seed {seed}: not blamed");

            // Once the kernel ends, everything retires.
            word.0.store(*marks.last().unwrap(), Ordering::Release);
            assert_eq!(queue.poll(now + allowance, budget).unwrap(), None);
            assert!(queue.lock().launches.is_empty(), "seed {seed}");
        }
    }

    /// A ring that replaces another on the same stream goes on with its
    /// sequence, so the word (which the old ring's groups advanced) never
    /// makes a new group look done before it ran.
    #[test]
    fn a_later_ring_of_the_stream_continues_the_sequence() {
        let queue = Arc::new(StreamQueue::default());
        let word = Arc::new(FakeWord::default());
        let mut marks = Vec::new();
        for _ring in 0..3 {
            let progress: Arc<dyn Progress> = word.clone();
            let mut watch = RingWatch::attach(queue.clone(), Weak::new(), || Ok(progress)).unwrap();
            for _ in 0..RING_GROUP {
                watch
                    .launched(false, |_, s| {
                        marks.push(s);
                        Ok(())
                    })
                    .unwrap();
            }
        }
        assert_eq!(marks, vec![1, 2, 3]);
        word.0.store(2, Ordering::Release);
        let now = Instant::now();
        assert_eq!(queue.poll(now, Duration::from_secs(1)).unwrap(), None);
        let state = queue.lock();
        assert_eq!(state.launches.len(), 1);
        assert!(matches!(state.launches[0].done, Marker::Sequence(3)));
    }

    /// The ring decides a group's marker before its kernel is enqueued
    /// (`closing_with_next`, so the marker can ride in the kernel's graph);
    /// over random runs of plain, waiting and sync launches it closes
    /// exactly the groups the decision after the kernel (`count`, then
    /// `must_close`) closes: the same launches in each, the same sequence
    /// numbers, never more than RING_GROUP kernels under one marker.
    #[test]
    fn deciding_the_marker_before_the_kernel_groups_as_deciding_after() {
        let mut rng = 0x2545_F491_4F6C_DD1Du64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for _run in 0..200 {
            let launches: Vec<bool> = (0..1 + next() % 100).map(|_| next() % 7 == 0).collect();
            // After: count the kernel, then close if it must.
            let after_queue = Arc::new(StreamQueue::default());
            let word: Arc<dyn Progress> = Arc::new(FakeWord::default());
            let mut after =
                RingWatch::attach(after_queue.clone(), Weak::new(), || Ok(word.clone())).unwrap();
            // Before: the number taken first, the kernel counted, then the
            // number committed.
            let before_queue = Arc::new(StreamQueue::default());
            let word: Arc<dyn Progress> = Arc::new(FakeWord::default());
            let mut before =
                RingWatch::attach(before_queue.clone(), Weak::new(), || Ok(word.clone())).unwrap();
            for &close_now in &launches {
                after.count();
                if after.must_close(close_now) {
                    let sequence = after.closing().unwrap();
                    after.commit(sequence, None, None);
                }
                let closing = before.closing_with_next(close_now);
                before.count();
                if let Some(sequence) = closing {
                    before.commit(sequence, None, None);
                }
            }
            let groups = |queue: &StreamQueue| {
                queue
                    .lock()
                    .launches
                    .iter()
                    .map(|w| match w.done {
                        Marker::Sequence(s) => (s, w.launches),
                        Marker::Event(_) => (0, 0),
                    })
                    .collect::<Vec<_>>()
            };
            let (want, got) = (groups(&after_queue), groups(&before_queue));
            assert_eq!(got, want, "launches {launches:?}");
            assert!(got.iter().all(|&(_, n)| (1..=RING_GROUP).contains(&n)));
            assert_eq!(after.unwatched, before.unwatched);
        }
    }

    /// A ring launch that waits on a semaphore is watched from the start
    /// marker its stream writes after the wait: while the word is below
    /// it, the launch is waiting for its client (blamed only once the wait
    /// is overdue, at its deadline); once the word reaches it, the clock
    /// starts there and the kernel gets the budget from then.
    #[test]
    fn a_waiting_ring_launch_is_timed_from_its_start_marker() {
        let budget = Duration::from_secs(1);
        for fires in [false, true] {
            let queue = Arc::new(StreamQueue::default());
            let word = Arc::new(FakeWord::default());
            let progress: Arc<dyn Progress> = word.clone();
            let mut watch = RingWatch::attach(queue.clone(), Weak::new(), || Ok(progress)).unwrap();
            let start = watch.start_marker();
            watch.count();
            assert!(watch.must_close(true));
            let done = watch.closing().unwrap();
            assert!(start < done);
            let now = Instant::now();
            let deadline = now + 3 * budget;
            watch.commit(done, Some(Marker::Sequence(start)), Some(deadline));
            assert_eq!(queue.poll(now + 2 * budget, budget).unwrap(), None);
            if !fires {
                assert_eq!(queue.poll(deadline, budget).unwrap(), Some(deadline));
                continue;
            }
            // The wait fires late: the kernel's clock starts when the word
            // is seen at the start marker, not at the launch.
            word.0.store(start, Ordering::Release);
            let seen = now + 2 * budget;
            assert_eq!(queue.poll(seen, budget).unwrap(), None);
            let early = seen + budget - Duration::from_millis(10);
            assert_eq!(queue.poll(early, budget).unwrap(), None);
            assert_eq!(queue.poll(seen + budget, budget).unwrap(), Some(seen));
            word.0.store(done, Ordering::Release);
            assert_eq!(queue.poll(seen + budget, budget).unwrap(), None);
            assert!(queue.lock().launches.is_empty());
        }
    }
}
