//! Releasing a launch ring's waiters when the ring's executor is lost.
//!
//! A ring launch may carry a signal: "after the kernel, write b to this
//! semaphore word". A stream of the session's own (`cuStreamWaitValue32`)
//! or a host thread polling a shared-memory word may wait on it. The
//! executor writes the signal whatever becomes of the launch (run, refused,
//! failed), but not once it is dead: if the executor dies, or the daemon
//! exits, the launches it had not run never signal. So the SDK keeps, per
//! ring, a [`SignalLedger`] of the signals that may not have been written
//! yet, and when the session's lease says the ring's executor is gone (an
//! `ExecutorRestarted` naming the ring's generation) or ends (the daemon
//! exited, the connection broke, the session was closed or dropped), it
//! writes them itself, from this process, into its own memory of each word
//! ([`SemaphoreMemory`]), and marks the ring orphaned ([`Orphaned`]).
//!
//! Invariants:
//! - Every signal a ring submits names a word inside memory the caller
//!   bound to the ring ([`LaunchRing::bind_semaphores`]): a signal the SDK
//!   could not release is refused before anything is written to the ring.
//! - The ledger holds, per word, the value of the last signal submitted
//!   for it. An entry leaves the ledger only when a completion proves the
//!   word was written: the executor writes a ring's signals on one stream,
//!   in submission order, and completes a `sync` launch only after
//!   synchronizing that stream, so an `Ok` completion of a `sync` launch
//!   proves every earlier signal written. Any other completion proves
//!   nothing: an async `Ok` means "enqueued", and on CUDA the enqueued
//!   write dies with the executor (a kernel that faults kills the executor
//!   after its launch completed `Ok`); a refusal's release is enqueued too.
//! - The release writes each pending word once, with the value of its last
//!   signal: what the executor's stream would have left there. Writing a
//!   value the executor had already written changes nothing for a waiter
//!   (waits are `>=`).
//! - Submitting and orphaning hold the ring's one lock: a submission
//!   either precedes the orphaning (its signal is released) or is refused
//!   with [`Error::RingOrphaned`]. An orphaned ring stays orphaned.
//! - The lease task releases before it forwards the event to
//!   [`Session::events`](crate::Session::events): a caller that reacts to
//!   the restart by resetting its words and opening a new ring cannot have
//!   its resets overwritten by the old ring's release.
//! - A ring registered after its generation died, or after the lease
//!   ended, is orphaned at registration (the [`RingRegistry`] remembers
//!   both), so no notice is lost to a race with `open_ring`.
//!
//! [`LaunchRing::bind_semaphores`]: crate::LaunchRing::bind_semaphores

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use crate::ring::{SemaphoreOp, SemaphoreWidth};
use crate::{Error, HostShm};

/// What [`SemaphoreMemory::write_word`] fails with.
pub type WordWriteError = Box<dyn std::error::Error + Send + Sync>;

/// This process's own view of a registered buffer that holds launch-ring
/// semaphore words, so that the SDK can write a word itself when the ring's
/// executor is lost. Implemented for [`HostShm`] (an atomic store into this
/// process's mapping) and, with the `cuda` feature, for
/// [`cuda::DeviceAllocation`](crate::cuda::DeviceAllocation) and
/// [`cuda::ExportableAllocation`](crate::cuda::ExportableAllocation) (a
/// `cuStreamWriteValue` on a private stream of this process's context).
pub trait SemaphoreMemory: Send + Sync + std::fmt::Debug {
    /// Bytes of the memory; a signal's word must lie inside them.
    fn byte_len(&self) -> u64;

    /// Writes `value` to the word of `width` at byte `offset` (inside
    /// [`byte_len`](Self::byte_len), aligned to the width), and returns
    /// once a waiter on the word can see it.
    fn write_word(
        &self,
        offset: u64,
        width: SemaphoreWidth,
        value: u64,
    ) -> Result<(), WordWriteError>;
}

fn word_offset(offset: u64) -> Result<usize, WordWriteError> {
    usize::try_from(offset).map_err(|_| format!("offset {offset} does not fit in usize").into())
}

/// Host shared memory, named or a memfd: the host executor polls its
/// semaphore words and nothing sleeps on them in a futex, so a store is all
/// a waiter needs.
macro_rules! host_semaphore_memory {
    ($($host:ty),+) => {$(
        impl SemaphoreMemory for $host {
            fn byte_len(&self) -> u64 {
                self.size()
            }

            fn write_word(
                &self,
                offset: u64,
                width: SemaphoreWidth,
                value: u64,
            ) -> Result<(), WordWriteError> {
                Ok(self.store_word(word_offset(offset)?, width, value)?)
            }
        }
    )+};
}

host_semaphore_memory!(HostShm, crate::HostMemfd);

impl<T: SemaphoreMemory + ?Sized> SemaphoreMemory for Arc<T> {
    fn byte_len(&self) -> u64 {
        (**self).byte_len()
    }

    fn write_word(
        &self,
        offset: u64,
        width: SemaphoreWidth,
        value: u64,
    ) -> Result<(), WordWriteError> {
        (**self).write_word(offset, width, value)
    }
}

/// CUDA device memory (by IPC handle or by descriptor): a stream write the
/// SDK waits for (see [`crate::cuda::DeviceWords::store_word`]).
#[cfg(feature = "cuda")]
macro_rules! device_semaphore_memory {
    ($($device:ty),+) => {$(
        impl SemaphoreMemory for $device {
            fn byte_len(&self) -> u64 {
                self.size() as u64
            }

            fn write_word(
                &self,
                offset: u64,
                width: SemaphoreWidth,
                value: u64,
            ) -> Result<(), WordWriteError> {
                let offset = word_offset(offset)?;
                // This runs on the lease task's thread, which may be one the
                // application also drives CUDA from: leave its current
                // context as it was.
                crate::cuda::preserving_current_context(|| self.store_word(offset, width, value))?;
                Ok(())
            }
        }
    )+};
}

#[cfg(feature = "cuda")]
device_semaphore_memory!(
    crate::cuda::DeviceAllocation,
    crate::cuda::ExportableAllocation
);

/// Why a launch ring was orphaned.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum OrphanCause {
    /// The executor serving the ring died and the daemon replaced it: the
    /// ring lived in the old generation. Open a new ring (and reload the
    /// kernels, which are stale too).
    ExecutorRestarted {
        /// The ring's device.
        device_uuid: String,
        /// The generation that died: the ring's.
        old_generation: u64,
        /// The generation now serving the device.
        new_generation: u64,
        /// Why it restarted, e.g. `KERNEL_FAULT …` or `exited`.
        cause: String,
    },
    /// The executor serving the ring died and its restarts fail: the
    /// device has no executor for now (an `ExecutorDown` lease event). A
    /// later `ExecutorRestarted` event says when a new ring can be opened.
    ExecutorDown {
        /// The ring's device.
        device_uuid: String,
        /// The generation that died: the ring's.
        generation: u64,
        /// Why it died, e.g. `exited`.
        cause: String,
        /// Why the last restart failed.
        restart_error: String,
    },
    /// The session's lease ended: the daemon exited or the connection
    /// broke, or the session was closed or dropped. Open a new session.
    SessionEnded {
        /// What ended it.
        why: String,
    },
}

impl std::fmt::Display for OrphanCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OrphanCause::ExecutorRestarted {
                device_uuid,
                old_generation,
                new_generation,
                cause,
            } => write!(
                f,
                "the executor of {device_uuid} restarted ({cause}): generation {old_generation} \
                 is gone, {new_generation} serves the device; open a new ring"
            ),
            OrphanCause::ExecutorDown {
                device_uuid,
                generation,
                cause,
                restart_error,
            } => write!(
                f,
                "the executor of {device_uuid} died ({cause}) and cannot be restarted \
                 ({restart_error}): generation {generation} is gone; open a new ring once \
                 the device is back"
            ),
            OrphanCause::SessionEnded { why } => {
                write!(f, "the session ended ({why}); open a new session")
            }
        }
    }
}

/// One semaphore word the SDK wrote when it orphaned a ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleasedWord {
    /// The ring index of the buffer holding the word.
    pub buffer: u32,
    /// The word's byte offset in the buffer.
    pub offset: u64,
    /// The word's width.
    pub width: SemaphoreWidth,
    /// The value written: that of the last signal submitted for the word.
    pub value: u64,
    /// Whether the write succeeded (the error's text if not).
    pub written: Result<(), String>,
}

/// What became of an orphaned ring: why, and the words the SDK released.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphaned {
    /// Why the ring was orphaned.
    pub cause: OrphanCause,
    /// The words written, ordered by buffer and offset. A word whose last
    /// signal was proven written (see [`LaunchRing`](crate::LaunchRing))
    /// is not among them.
    pub released: Vec<ReleasedWord>,
}

/// A semaphore word: a buffer's ring index and a byte offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct WordKey {
    buffer: u32,
    offset: u64,
}

/// The last signal submitted for a word that is not proven written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PendingSignal {
    width: SemaphoreWidth,
    value: u64,
    /// The submission's sequence number (0 for the ring's first).
    sequence: u64,
}

/// The signals of one ring that may not have been written yet (see the
/// module docs for when an entry leaves).
#[derive(Debug, Default)]
pub(crate) struct SignalLedger {
    /// Sequence number the next submission gets.
    next_sequence: u64,
    /// For each submission not yet answered by a completion this side read,
    /// oldest first: whether it was a `sync` launch. Completions come back
    /// in submission order, so the front one answers the oldest.
    unanswered: VecDeque<bool>,
    pending: HashMap<WordKey, PendingSignal>,
}

impl SignalLedger {
    /// Records a submission that was published to the ring.
    pub(crate) fn submitted(&mut self, sync: bool, signal: Option<SemaphoreOp>) {
        let sequence = self.next_sequence;
        // A u64 of submissions does not wrap.
        self.next_sequence += 1;
        self.unanswered.push_back(sync);
        if let Some(op) = signal {
            let key = WordKey {
                buffer: op.buffer,
                offset: op.offset,
            };
            self.pending.insert(
                key,
                PendingSignal {
                    width: op.width,
                    value: op.value,
                    sequence,
                },
            );
        }
    }

    /// Records the completion of the oldest unanswered submission; `ok`:
    /// it completed `Ok`.
    pub(crate) fn completed(&mut self, ok: bool) {
        let sequence = self.next_sequence - self.unanswered.len() as u64;
        let Some(sync) = self.unanswered.pop_front() else {
            // A completion this ledger never saw submitted: the ring's
            // own checks reject more completions than submissions.
            return;
        };
        if ok && sync {
            // Every signal up to this one has been written on the
            // executor's stream.
            self.pending.retain(|_, p| p.sequence > sequence);
        }
    }

    /// Takes every pending signal, ordered by word.
    fn take_pending(&mut self) -> Vec<(WordKey, PendingSignal)> {
        let mut pending: Vec<_> = self.pending.drain().collect();
        pending.sort_by_key(|(key, _)| *key);
        pending
    }

    #[cfg(test)]
    fn pending_values(&self) -> Vec<(u32, u64, u64)> {
        let mut values: Vec<_> = self
            .pending
            .iter()
            .map(|(k, p)| (k.buffer, k.offset, p.value))
            .collect();
        values.sort();
        values
    }
}

/// A ring's state that the lease task shares with the [`LaunchRing`]: the
/// bound semaphore memories, the ledger and, once orphaned, what happened.
///
/// [`LaunchRing`]: crate::LaunchRing
#[derive(Debug)]
pub(crate) struct RingState {
    memories: HashMap<u32, Arc<dyn SemaphoreMemory>>,
    pub(crate) ledger: SignalLedger,
    pub(crate) orphaned: Option<Orphaned>,
}

impl RingState {
    /// Binds `memory` as this process's view of ring buffer `buffer`.
    pub(crate) fn bind(&mut self, buffer: u32, memory: Arc<dyn SemaphoreMemory>) {
        self.memories.insert(buffer, memory);
    }

    /// Refuses a submission the SDK could not release later, or one made
    /// after the ring was orphaned.
    pub(crate) fn admit(&self, signal: Option<SemaphoreOp>) -> Result<(), Error> {
        if let Some(orphaned) = &self.orphaned {
            return Err(Error::RingOrphaned(orphaned.cause.clone()));
        }
        let Some(op) = signal else {
            return Ok(());
        };
        let memory = self.memories.get(&op.buffer).ok_or_else(|| {
            Error::InvalidInput(format!(
                "the signal's word is in ring buffer {}, whose memory is not bound to the ring: \
                 call LaunchRing::bind_semaphores first, so that the SDK can release the word \
                 if the executor is lost",
                op.buffer
            ))
        })?;
        let end = u128::from(op.offset) + u128::from(op.width.bytes());
        if end > u128::from(memory.byte_len()) {
            return Err(Error::InvalidInput(format!(
                "the signal's word at offset {} ends past the {} bytes of its memory",
                op.offset,
                memory.byte_len()
            )));
        }
        Ok(())
    }
}

/// One ring's shared half (see [`RingState`]).
#[derive(Debug)]
pub(crate) struct RingShared {
    device_uuid: String,
    generation: u64,
    state: Mutex<RingState>,
}

impl RingShared {
    pub(crate) fn new(device_uuid: String, generation: u64) -> Arc<Self> {
        Arc::new(RingShared {
            device_uuid,
            generation,
            state: Mutex::new(RingState {
                memories: HashMap::new(),
                ledger: SignalLedger::default(),
                orphaned: None,
            }),
        })
    }

    /// The ring's device.
    pub(crate) fn device_uuid(&self) -> &str {
        &self.device_uuid
    }

    /// The executor generation the ring lives in.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, RingState> {
        // Every statement that changes the state leaves it consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Orphans the ring: writes every pending signal's word from this
    /// process, then refuses further submissions. Once only.
    pub(crate) fn orphan(&self, cause: OrphanCause) {
        let mut state = self.lock();
        if state.orphaned.is_some() {
            return;
        }
        let mut released = Vec::new();
        for (key, signal) in state.ledger.take_pending() {
            let written = match state.memories.get(&key.buffer) {
                Some(memory) => memory
                    .write_word(key.offset, signal.width, signal.value)
                    .map_err(|e| e.to_string()),
                // `admit` lets no signal through without its memory, and
                // memories are never unbound.
                None => Err("no memory is bound for the word's buffer".to_owned()),
            };
            if let Err(error) = &written {
                tracing::warn!(
                    buffer = key.buffer,
                    offset = key.offset,
                    %error,
                    "cannot release a semaphore word of an orphaned ring"
                );
            }
            released.push(ReleasedWord {
                buffer: key.buffer,
                offset: key.offset,
                width: signal.width,
                value: signal.value,
                written,
            });
        }
        tracing::info!(%cause, words = released.len(), "launch ring orphaned; its waiters were released");
        state.orphaned = Some(Orphaned { cause, released });
    }
}

#[derive(Debug, Default)]
struct Registry {
    rings: Vec<Weak<RingShared>>,
    /// What the lease reported dead: a device's generations from an old
    /// one up to (not including) a new one, and why. One event may span
    /// several restarts (the daemon merges the restarts of a device that
    /// its client has not read yet).
    dead: Vec<(String, std::ops::Range<u64>, OrphanCause)>,
    /// Set once the lease ended.
    ended: Option<String>,
}

/// A session's rings, for its lease task to orphan.
#[derive(Debug, Clone, Default)]
pub(crate) struct RingRegistry(Arc<Mutex<Registry>>);

impl RingRegistry {
    fn lock(&self) -> MutexGuard<'_, Registry> {
        // Each change is a single push, insert or assignment.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a ring; orphans it at once if its generation already died or
    /// the lease already ended.
    pub(crate) fn register(&self, ring: &Arc<RingShared>) {
        let cause = {
            let mut registry = self.lock();
            registry.rings.retain(|r| r.strong_count() > 0);
            registry.rings.push(Arc::downgrade(ring));
            if let Some(why) = &registry.ended {
                Some(OrphanCause::SessionEnded { why: why.clone() })
            } else {
                registry
                    .dead
                    .iter()
                    .find(|(device, died, _)| {
                        *device == ring.device_uuid && died.contains(&ring.generation)
                    })
                    .map(|(_, _, cause)| cause.clone())
            }
        };
        if let Some(cause) = cause {
            ring.orphan(cause);
        }
    }

    fn live(&self) -> Vec<Arc<RingShared>> {
        self.lock().rings.iter().filter_map(Weak::upgrade).collect()
    }

    /// The executors of `device_uuid` from `old_generation` up to (not
    /// including) `new_generation` died: orphans the rings they served.
    pub(crate) fn executor_restarted(
        &self,
        device_uuid: &str,
        old_generation: u64,
        new_generation: u64,
        cause: &str,
    ) {
        let orphan_cause = OrphanCause::ExecutorRestarted {
            device_uuid: device_uuid.to_owned(),
            old_generation,
            new_generation,
            cause: cause.to_owned(),
        };
        let died = old_generation..new_generation.max(old_generation.saturating_add(1));
        self.generations_died(device_uuid, died, orphan_cause);
    }

    /// The executor of `device_uuid` at `generation` died and its restarts
    /// fail: orphans the rings it served, now (a restart may never come).
    pub(crate) fn executor_down(
        &self,
        device_uuid: &str,
        generation: u64,
        cause: &str,
        restart_error: &str,
    ) {
        let orphan_cause = OrphanCause::ExecutorDown {
            device_uuid: device_uuid.to_owned(),
            generation,
            cause: cause.to_owned(),
            restart_error: restart_error.to_owned(),
        };
        self.generations_died(
            device_uuid,
            generation..generation.saturating_add(1),
            orphan_cause,
        );
    }

    /// Orphans, with `orphan_cause`, every ring of `device_uuid` served by a
    /// generation in `died`, and any such ring opened later.
    fn generations_died(
        &self,
        device_uuid: &str,
        died: std::ops::Range<u64>,
        orphan_cause: OrphanCause,
    ) {
        self.lock()
            .dead
            .push((device_uuid.to_owned(), died.clone(), orphan_cause.clone()));
        for ring in self.live() {
            if ring.device_uuid == device_uuid && died.contains(&ring.generation) {
                ring.orphan(orphan_cause.clone());
            }
        }
    }

    /// The lease ended: orphans every ring.
    pub(crate) fn session_ended(&self, why: &str) {
        self.lock().ended.get_or_insert_with(|| why.to_owned());
        for ring in self.live() {
            ring.orphan(OrphanCause::SessionEnded {
                why: why.to_owned(),
            });
        }
    }
}

/// Orphans a session's rings when dropped: held by the lease task, so that
/// every way the task ends (the stream ends or breaks, or the task is
/// aborted because the [`Session`](crate::Session) was dropped) releases.
#[derive(Debug)]
pub(crate) struct ReleaseOnEnd {
    pub(crate) registry: RingRegistry,
    pub(crate) why: String,
}

impl Drop for ReleaseOnEnd {
    fn drop(&mut self) {
        self.registry.session_ended(&self.why);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    fn op(buffer: u32, offset: u64, value: u64) -> Option<SemaphoreOp> {
        Some(SemaphoreOp {
            buffer,
            offset,
            value,
            width: SemaphoreWidth::Bits32,
        })
    }

    #[test]
    fn only_an_ok_sync_completion_settles_and_it_settles_everything_before_it() {
        let mut ledger = SignalLedger::default();
        ledger.submitted(false, op(1, 0, 1));
        ledger.submitted(false, op(1, 4, 1));
        ledger.submitted(false, op(1, 0, 2));
        assert_eq!(ledger.pending_values(), [(1, 0, 2), (1, 4, 1)]);
        // Async Ok completions prove nothing.
        ledger.completed(true);
        ledger.completed(true);
        ledger.completed(true);
        assert_eq!(ledger.pending_values(), [(1, 0, 2), (1, 4, 1)]);
        // A refused sync launch proves nothing either.
        ledger.submitted(true, op(2, 0, 9));
        ledger.completed(false);
        assert_eq!(ledger.pending_values(), [(1, 0, 2), (1, 4, 1), (2, 0, 9)]);
        // An Ok sync launch settles itself and everything before it, not
        // what was submitted after it.
        ledger.submitted(true, op(1, 8, 3));
        ledger.submitted(false, op(1, 4, 5));
        ledger.completed(true);
        assert_eq!(ledger.pending_values(), [(1, 4, 5)]);
        ledger.completed(true);
        assert_eq!(ledger.pending_values(), [(1, 4, 5)]);
        // More completions than submissions are ignored.
        ledger.completed(true);
        assert_eq!(ledger.pending_values(), [(1, 4, 5)]);
    }

    #[derive(Debug, Default)]
    struct Recorder(Mutex<Vec<(u64, u64)>>, AtomicU64);

    impl SemaphoreMemory for Recorder {
        fn byte_len(&self) -> u64 {
            64
        }

        fn write_word(
            &self,
            offset: u64,
            _: SemaphoreWidth,
            value: u64,
        ) -> Result<(), WordWriteError> {
            self.1.fetch_add(1, Ordering::Relaxed);
            if offset == 60 {
                return Err("refused".into());
            }
            self.0.lock().unwrap().push((offset, value));
            Ok(())
        }
    }

    /// The daemon merges a device's unread restarts into one event from
    /// the oldest generation to the newest: every ring of a generation in
    /// between is orphaned too, whether it registered before the event or
    /// after it.
    #[test]
    fn a_merged_restart_orphans_the_rings_of_every_generation_it_spans() {
        let registry = RingRegistry::default();
        let before = RingShared::new("HOST-0".into(), 4);
        let last_alive = RingShared::new("HOST-0".into(), 9);
        registry.register(&before);
        registry.register(&last_alive);
        registry.executor_restarted("HOST-0", 2, 9, "exited (merged)");
        assert!(matches!(
            before.lock().orphaned.as_ref().map(|o| &o.cause),
            Some(OrphanCause::ExecutorRestarted {
                old_generation: 2,
                new_generation: 9,
                ..
            })
        ));
        assert!(last_alive.lock().orphaned.is_none(), "generation 9 lives");
        for (generation, dead) in [(1, false), (2, true), (8, true), (9, false)] {
            let late = RingShared::new("HOST-0".into(), generation);
            registry.register(&late);
            assert_eq!(
                late.lock().orphaned.is_some(),
                dead,
                "generation {generation}"
            );
        }
        let other = RingShared::new("HOST-1".into(), 5);
        registry.register(&other);
        assert!(other.lock().orphaned.is_none(), "another device");
    }

    #[test]
    fn orphaning_writes_each_pending_word_once_and_refuses_later_submissions() {
        let memory = Arc::new(Recorder::default());
        let ring = RingShared::new("HOST-0".into(), 7);
        {
            let mut state = ring.lock();
            assert!(matches!(
                state.admit(op(3, 0, 1)),
                Err(Error::InvalidInput(_))
            ));
            state.bind(3, memory.clone());
            assert!(matches!(
                state.admit(op(3, 64, 1)),
                Err(Error::InvalidInput(_))
            ));
            for (offset, value) in [(8, 1), (0, 4), (8, 2), (60, 5)] {
                state.admit(op(3, offset, value)).unwrap();
                state.ledger.submitted(false, op(3, offset, value));
            }
        }
        let registry = RingRegistry::default();
        registry.register(&ring);
        registry.executor_restarted("HOST-0", 6, 7, "exited");
        assert!(ring.lock().orphaned.is_none(), "another generation died");
        registry.executor_restarted("HOST-1", 7, 8, "exited");
        assert!(ring.lock().orphaned.is_none(), "another device's died");
        registry.executor_restarted("HOST-0", 7, 8, "exited");
        registry.session_ended("later");
        let orphaned = ring.lock().orphaned.clone().unwrap();
        assert!(matches!(
            orphaned.cause,
            OrphanCause::ExecutorRestarted {
                old_generation: 7,
                new_generation: 8,
                ..
            }
        ));
        let released: Vec<_> = orphaned
            .released
            .iter()
            .map(|w| (w.offset, w.value, w.written.is_ok()))
            .collect();
        assert_eq!(
            released,
            [(0, 4, true), (8, 2, true), (60, 5, false)],
            "the last value per word, once each"
        );
        assert_eq!(*memory.0.lock().unwrap(), [(0, 4), (8, 2)]);
        assert_eq!(memory.1.load(Ordering::Relaxed), 3);
        assert!(matches!(
            ring.lock().admit(None),
            Err(Error::RingOrphaned(OrphanCause::ExecutorRestarted { .. }))
        ));
    }

    #[test]
    fn a_ring_registered_after_its_end_is_orphaned_at_once() {
        let registry = RingRegistry::default();
        registry.executor_restarted("HOST-0", 7, 8, "exited");
        let late = RingShared::new("HOST-0".into(), 7);
        registry.register(&late);
        assert!(late.lock().orphaned.is_some());
        let current = RingShared::new("HOST-0".into(), 8);
        registry.register(&current);
        assert!(current.lock().orphaned.is_none());
        drop(ReleaseOnEnd {
            registry: registry.clone(),
            why: "dropped".into(),
        });
        assert_eq!(
            current.lock().orphaned.clone().unwrap().cause,
            OrphanCause::SessionEnded {
                why: "dropped".into()
            }
        );
        let after = RingShared::new("HOST-0".into(), 8);
        registry.register(&after);
        assert!(after.lock().orphaned.is_some());
    }
}
