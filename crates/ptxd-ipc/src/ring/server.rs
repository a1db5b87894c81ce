//! The executor's side of a ring: takes submissions, posts completions.
//!
//! Invariants (all positions wrapping u64):
//! - `released <= next`, `next - released <= slots`: submissions
//!   `[released, next)` are in flight (taken, not answered), their tickets
//!   in `tickets[position & mask]`. The answer to submission `p` is
//!   completion `p`, so `released` is also the completion head (answers
//!   posted).
//! - Slot `next` is read only when the credit rule below allows a take and
//!   its sequence word (loaded with Acquire) is `submission_sequence(next)`;
//!   that loaded publication word is kept in `pending` until the slot is
//!   copied, so the word is read once. Every other word of the slot is
//!   read once, by the copy; then `next` moves past it and the slot is not
//!   read again this lap.
//! - Credit: `(next - released) + (released - cq_tail_seen) <= slots`. A
//!   submission is taken only while the sum is below `slots`, and
//!   `cq_tail_seen` only moves forward (validated in `[cq_tail_seen,
//!   cq_published]`), so answering an in-flight submission always finds a
//!   free completion slot. It also keeps `next` below the submission tail
//!   the client was shown plus `slots`: the server never reads a slot the
//!   client may be rewriting.
//! - `cq_published <= released`: answers `[cq_published, released)` are
//!   posted (bodies written) but their sequence words are not yet stored;
//!   [`Server::flush`] stores them in order, then the submission tail
//!   (`tail_stored` is its last stored value), then wakes the client.
//! - The first `orphans` submissions taken after attaching were taken by a
//!   previous server (the object's `claimed` count) that never answered
//!   them: they come out as [`Polled::Orphan`], and `claimed` is published
//!   again only past them. Answers a previous server published (sequence
//!   words stored) but whose tail store it did not reach are found at
//!   attach by their sequence words and count as answered, not orphans.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::completion::{Completion, CompletionStatus};
use super::descriptor::{Descriptor, DescriptorError, DESCRIPTOR_SIZE};
use super::futex::{self, WaitConfig, WaitStats};
use super::layout::{
    completion_sequence, sequence_of, submission_sequence, ControlWord, RingLayout,
};
use super::region::{OpenError, Region};
use super::{check_counter, Counter, RingError};

/// One submission taken from the ring. Each must be answered, in the order
/// taken, by one [`Server::complete`].
// Returned by value once per poll and never stored in bulk: boxing the
// descriptor would put an allocation on the hot path.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Polled {
    /// A well-formed launch request: run the launch checks, launch or refuse.
    Launch(Descriptor),
    /// A well-formed request that a previous server of this ring took and
    /// never answered (it died). Do not launch it: complete it `Failed`, and
    /// release its semaphore signal, if any, so the client's stream does not
    /// wait forever.
    Orphan(Descriptor),
    /// Malformed bytes: complete it `Refused`. `ticket` is the raw ticket
    /// field, which the client reads back to match the refusal.
    Malformed {
        /// The ticket field of the raw slot, to complete the refusal under.
        ticket: u64,
        /// The first malformed field found.
        error: DescriptorError,
    },
}

/// Why a completion was not posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CompleteError {
    /// No submission is in flight: every one taken has been answered (a bug
    /// in the caller).
    #[error("no submission is in flight to complete")]
    NothingInFlight,
    /// The completion ring has no room. The credit rule rules this out; it
    /// is reported rather than overwriting an unread completion.
    #[error("the completion ring is full")]
    CompletionRingFull,
    /// The ring is unusable (now or earlier, it is sticky): drop it.
    #[error(transparent)]
    Ring(#[from] RingError),
}

/// What a [`Waker`] shares with the servers of one ring (the one it came
/// from and those that reattach in its place).
#[derive(Debug, Default)]
struct Kick {
    /// Set by [`Waker::wake`], taken by the next [`Server::wait`] (or the
    /// one in progress), which then returns at once.
    kicked: AtomicBool,
    /// Servers of the ring alive now. A waker touches the mapping only
    /// while one is (under this lock, which a server's drop takes): a
    /// process that guards the mapping against a shrinking client (the
    /// daemon's SIGBUS watch) guards it exactly while its server lives.
    servers: Mutex<usize>,
}

fn servers(kick: &Kick) -> std::sync::MutexGuard<'_, usize> {
    kick.servers.lock().unwrap_or_else(|p| p.into_inner())
}

/// Wakes a [`Server`]'s sleep from another thread of the server's process:
/// the sleep in progress (or the next one, if none is) returns at once
/// instead of at the end of its slice. For a thread that sleeps in the
/// server and must notice a condition outside the ring (a stop) without
/// polling for it. Once every server of the ring is dropped, a wake does
/// nothing.
#[derive(Clone)]
pub struct Waker {
    region: Weak<Region>,
    kick: Arc<Kick>,
}

impl std::fmt::Debug for Waker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waker").finish_non_exhaustive()
    }
}

impl Waker {
    /// Ends the server's sleep now (see `futex::kick` for why no wake is
    /// lost between the server's last check and its sleep).
    pub fn wake(&self) {
        self.kick.kicked.store(true, Ordering::Relaxed);
        let alive = servers(&self.kick);
        if *alive == 0 {
            return;
        }
        // A live server holds the region, so this upgrade succeeds; it
        // cannot be dropped while the lock is held.
        let Some(region) = self.region.upgrade() else {
            return;
        };
        if let Err(errno) = futex::kick(region.waiter(ControlWord::ServerWaiter)) {
            // The sleep is bounded: it ends at its slice.
            tracing::warn!(%errno, "waking the ring's server failed");
        }
        drop(alive);
    }
}

/// The executor's end of a ring. Owns its own mapping of the client's
/// object.
pub struct Server {
    region: Arc<Region>,
    layout: RingLayout,
    slots: u64,
    next: u64,
    released: u64,
    /// The publication word of slot `next`, loaded (Acquire) and found
    /// published by [`ready`](Self::ready), not yet copied.
    pending: Option<u64>,
    orphans: u64,
    /// Answers whose sequence words are stored (`released` less the
    /// answers posted since the last flush).
    cq_published: u64,
    /// The submission tail last stored in the object.
    tail_stored: u64,
    cq_tail_seen: u64,
    tickets: Box<[u64]>,
    scratch: Box<[u8; DESCRIPTOR_SIZE]>,
    config: WaitConfig,
    stats: WaitStats,
    kick: Arc<Kick>,
    poisoned: Option<RingError>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("region", &self.region)
            .field("next", &self.next)
            .field("released", &self.released)
            .field("orphans", &self.orphans)
            .field("cq_published", &self.cq_published)
            .field("poisoned", &self.poisoned)
            .finish()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Waits for a wake in progress: after this, no waker touches the
        // mapping on this server's behalf.
        let mut alive = servers(&self.kick);
        *alive = alive.saturating_sub(1);
    }
}

impl Server {
    /// Opens the client's ring object by name. `owner_uid`: the session's
    /// uid, which must own the object (None: no check; uid 0 may open any).
    pub fn open(name: &str, owner_uid: Option<u32>) -> Result<Self, OpenError> {
        Self::attach(Arc::new(Region::open(name, owner_uid)?))
    }

    /// Maps a ring object passed as a file descriptor (a shm object or a
    /// memfd), with the same checks as [`open`](Self::open).
    pub fn from_fd(fd: OwnedFd, owner_uid: Option<u32>) -> Result<Self, OpenError> {
        Self::attach(Arc::new(Region::from_fd(fd, owner_uid)?))
    }

    /// Adopts the counters in the object: a fresh ring starts at zero; a
    /// ring whose previous server died resumes where it stopped, its taken
    /// but unanswered submissions coming out first as orphans.
    pub(crate) fn attach(region: Arc<Region>) -> Result<Self, OpenError> {
        Self::attach_with(region, Arc::default())
    }

    fn attach_with(region: Arc<Region>, kick: Arc<Kick>) -> Result<Self, OpenError> {
        let layout = region.layout();
        let slots = u64::from(layout.slots());
        let load = |word| region.counter(word).load(Ordering::Acquire);
        let tail = load(ControlWord::SubmissionTail);
        let claimed = check_counter(
            Counter::SubmissionClaimed,
            load(ControlWord::SubmissionClaimed),
            tail,
            tail.wrapping_add(slots),
        )?;
        // Answers a previous server published before it died, short of its
        // tail store: answered, not orphans (at most `slots` words, each
        // read once; a client that forges one only loses that answer).
        let mut released = tail;
        while released != claimed
            && region.completion_word(released).load(Ordering::Acquire)
                == completion_sequence(released)
        {
            released = released.wrapping_add(1);
        }
        let cq_tail = check_counter(
            Counter::CompletionTail,
            load(ControlWord::CompletionTail),
            released.wrapping_sub(slots),
            released,
        )?;
        *servers(&kick) += 1;
        Ok(Server {
            region,
            layout,
            slots,
            next: released,
            released,
            pending: None,
            orphans: claimed.wrapping_sub(released),
            cq_published: released,
            tail_stored: tail,
            cq_tail_seen: cq_tail,
            // At most MAX_SLOTS entries: bounded by the validated layout.
            tickets: vec![0; layout.slots() as usize].into_boxed_slice(),
            scratch: Box::new([0; DESCRIPTOR_SIZE]),
            config: WaitConfig::default(),
            stats: WaitStats::default(),
            kick,
            poisoned: None,
        })
    }

    /// The same object, its counters read again: for a server whose
    /// predecessor on the object may have answered submissions since this
    /// one was opened (it waited for that one to stop first). Its wait
    /// configuration and its [`Waker`]s carry over.
    pub fn reattach(self) -> Result<Self, OpenError> {
        let mut server = Self::attach_with(Arc::clone(&self.region), Arc::clone(&self.kick))?;
        server.config = self.config;
        Ok(server)
    }

    /// A handle that ends this server's sleeps from another thread (see
    /// [`Waker`]).
    pub fn waker(&self) -> Waker {
        Waker {
            region: Arc::downgrade(&self.region),
            kick: Arc::clone(&self.kick),
        }
    }

    /// Sets how [`wait`](Self::wait) spins and sleeps.
    pub fn with_wait_config(mut self, config: WaitConfig) -> Self {
        self.config = config;
        self
    }

    /// The address and length of this server's mapping of the object. The
    /// client can shrink the object under it, and the next access then
    /// raises SIGBUS: a server in a process that must survive that guards
    /// this range (the daemon's executor maps zero pages over it, after
    /// which the ring reads as broken and is dropped).
    pub fn mapping(&self) -> (usize, usize) {
        self.region.range()
    }

    /// The layout validated from the header when attaching; the only sizes
    /// this side uses.
    pub fn layout(&self) -> RingLayout {
        self.layout
    }

    /// Whether the object is a memfd sealed against shrinking. If not, the
    /// client can truncate it and the next access to the mapping raises
    /// SIGBUS in this process.
    pub fn shrink_sealed(&self) -> bool {
        self.region.shrink_sealed()
    }

    /// Submissions taken and not yet completed.
    pub fn in_flight(&self) -> u64 {
        self.next.wrapping_sub(self.released)
    }

    /// Orphans (see [`Polled::Orphan`]) not yet taken.
    pub fn orphans_pending(&self) -> u64 {
        self.orphans
    }

    /// Futex sleeps and wakes this server has made so far.
    pub fn stats(&self) -> WaitStats {
        self.stats
    }

    fn poison<T>(&mut self, result: Result<T, RingError>) -> Result<T, RingError> {
        if let Err(error) = &result {
            self.poisoned = Some(*error);
        }
        result
    }

    /// Re-reads the client's completion tail: the completion slots it
    /// consumed are free again.
    fn refresh_completion_tail(&mut self) -> Result<(), RingError> {
        let tail = self
            .region
            .counter(ControlWord::CompletionTail)
            .load(Ordering::Acquire);
        let tail = check_counter(
            Counter::CompletionTail,
            tail,
            self.cq_tail_seen,
            // The client cannot have read an answer not yet published.
            self.cq_published,
        );
        self.cq_tail_seen = self.poison(tail)?;
        Ok(())
    }

    /// Answers posted (published or not) that the client has not been
    /// seen to read: each holds a completion slot.
    fn unread_completions(&self) -> u64 {
        self.released.wrapping_sub(self.cq_tail_seen)
    }

    /// Whether a submission can be taken now: the credit rule allows it and
    /// slot `next` is published (its sequence word, loaded with Acquire, is
    /// this lap's). The loaded publication word is kept for the copy.
    fn ready(&mut self) -> Result<bool, RingError> {
        if let Some(error) = self.poisoned {
            return Err(error);
        }
        if self.pending.is_some() {
            return Ok(true);
        }
        if self.in_flight() + self.unread_completions() >= self.slots {
            self.refresh_completion_tail()?;
            if self.in_flight() + self.unread_completions() >= self.slots {
                return Ok(false);
            }
        }
        let publication = self
            .region
            .submission_word(self.next)
            .load(Ordering::Acquire);
        if sequence_of(publication) != submission_sequence(self.next) {
            // Not yet published, or a word the client scribbled: either
            // way nothing to take (a future or stale word is not this
            // lap's).
            return Ok(false);
        }
        self.pending = Some(publication);
        Ok(true)
    }

    /// Takes the next submission: copies its slot out, then decodes the
    /// copy. `Ok(None)`: nothing published, or no completion room until the
    /// client reads its completions. `Err`: drop the ring.
    pub fn poll(&mut self) -> Result<Option<Polled>, RingError> {
        if !self.ready()? {
            return Ok(None);
        }
        let Some(publication) = self.pending.take() else {
            // `ready` returned true only with the word kept.
            return Ok(None);
        };
        let position = self.next;
        self.region
            .load_submission_published(position, publication, &mut self.scratch);
        self.next = position.wrapping_add(1);
        let ticket = Descriptor::ticket_of(&self.scratch);
        self.tickets[self.layout.index(position)] = ticket;
        let orphan = self.orphans > 0;
        if orphan {
            self.orphans -= 1;
        } else {
            // Only a server that attaches after this one dies reads it.
            self.region
                .counter(ControlWord::SubmissionClaimed)
                .store(self.next, Ordering::Release);
        }
        Ok(Some(match Descriptor::decode(&self.scratch) {
            Ok(descriptor) if orphan => Polled::Orphan(descriptor),
            Ok(descriptor) => Polled::Launch(descriptor),
            Err(error) => Polled::Malformed { ticket, error },
        }))
    }

    /// Answers the oldest in-flight submission (under its ticket), frees
    /// its submission slot, and wakes the client if it sleeps: a
    /// [`post`](Self::post) and a [`flush`](Self::flush).
    pub fn complete(
        &mut self,
        status: CompletionStatus,
        detail: u64,
    ) -> Result<Completion, CompleteError> {
        let completion = self.post(status, detail)?;
        self.flush();
        Ok(completion)
    }

    /// Answers the oldest in-flight submission (under its ticket) without
    /// publishing the answer: the completion slot's body is written and
    /// this side's counters move, but the client sees nothing until the
    /// next [`flush`](Self::flush) stores the sequence words. A server that
    /// drains several submissions per wake-up posts each and flushes once,
    /// so the client's tail line and its futex word are touched once per
    /// batch, not once per launch. The credit rule holds over posted
    /// answers too (they count as unread completions), so posting never
    /// overwrites a completion the client has not read.
    pub fn post(
        &mut self,
        status: CompletionStatus,
        detail: u64,
    ) -> Result<Completion, CompleteError> {
        if let Some(error) = self.poisoned {
            return Err(error.into());
        }
        if self.in_flight() == 0 {
            return Err(CompleteError::NothingInFlight);
        }
        if self.unread_completions() >= self.slots {
            self.refresh_completion_tail()?;
            if self.unread_completions() >= self.slots {
                return Err(CompleteError::CompletionRingFull);
            }
        }
        let completion = Completion {
            ticket: self.tickets[self.layout.index(self.released)],
            status,
            detail,
        };
        self.region
            .store_completion(self.released, &completion.encode());
        self.released = self.released.wrapping_add(1);
        Ok(completion)
    }

    /// Answers posted and not yet published.
    pub fn unpublished(&self) -> u64 {
        self.released.wrapping_sub(self.cq_published)
    }

    /// Publishes every posted answer: each one's sequence word in order
    /// (Release, after its body), then the submission tail (Release), then
    /// wakes the client if it sleeps. Nothing to publish: no store, no
    /// wake.
    pub fn flush(&mut self) {
        if self.cq_published == self.released && self.tail_stored == self.released {
            return;
        }
        while self.cq_published != self.released {
            let position = self.cq_published;
            self.region
                .completion_word(position)
                .store(completion_sequence(position), Ordering::Release);
            self.cq_published = position.wrapping_add(1);
        }
        self.region
            .counter(ControlWord::SubmissionTail)
            .store(self.released, Ordering::Release);
        self.tail_stored = self.released;
        let waiter = self.region.waiter(ControlWord::ClientWaiter);
        if let Err(errno) = futex::wake_if_sleeping(waiter, &mut self.stats) {
            // The client's sleep is bounded; it finds the completion on its
            // next slice.
            tracing::warn!(%errno, "waking the ring's client failed");
        }
    }

    /// Dies in the middle of a flush: stores the sequence words of the
    /// first `published` posted answers (at most those posted), not the
    /// tail, and drops, as a server killed between the two would.
    #[cfg(test)]
    pub(crate) fn die_mid_flush(mut self, published: u64) {
        for _ in 0..published.min(self.unpublished()) {
            let position = self.cq_published;
            self.region
                .completion_word(position)
                .store(completion_sequence(position), Ordering::Release);
            self.cq_published = position.wrapping_add(1);
        }
    }

    /// Polls until [`poll`](Self::poll) has something, for up to the wait
    /// configuration's spin, never sleeping. `Ok(false)`: nothing came.
    pub fn spin(&mut self) -> Result<bool, RingError> {
        let how_long = self.config.spin;
        let ready = futex::spin(how_long, || self.ready());
        self.poison(ready)
    }

    /// As [`spin`](Self::spin), for `how_long` (a caller that budgets its
    /// spins itself).
    pub fn spin_for(&mut self, how_long: Duration) -> Result<bool, RingError> {
        if how_long.is_zero() {
            return self.ready();
        }
        let ready = futex::spin(how_long, || self.ready());
        self.poison(ready)
    }

    /// As [`wait`](Self::wait), without spinning first: sleeps on the
    /// server's futex word at once.
    pub fn sleep(&mut self, timeout: Duration) -> Result<bool, RingError> {
        let config = self.config;
        self.config.spin = Duration::ZERO;
        let slept = self.wait(timeout);
        self.config = config;
        slept
    }

    /// Waits up to `timeout` until [`poll`](Self::poll) has something
    /// (spinning, then sleeping on the server's futex word). `Ok(false)`:
    /// timed out. `Ok(true)`: poll has something, or a [`Waker`] woke this
    /// wait (or woke the server since its last wait): the caller checks
    /// whatever it was woken for, and polls.
    pub fn wait(&mut self, timeout: Duration) -> Result<bool, RingError> {
        let region = Arc::clone(&self.region);
        let kick = Arc::clone(&self.kick);
        let config = self.config;
        let mut stats = self.stats;
        let ready = futex::wait_until(
            region.waiter(ControlWord::ServerWaiter),
            &config,
            &mut stats,
            timeout,
            // The wake's flag is checked like the ring, after the futex
            // word is set SLEEPING and the fence (see `futex::kick`).
            || {
                if kick.kicked.swap(false, Ordering::Relaxed) {
                    return Ok(true);
                }
                self.ready()
            },
            RingError::Futex,
        );
        self.stats = stats;
        self.poison(ready)
    }
}
