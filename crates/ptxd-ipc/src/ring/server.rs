//! The executor's side of a ring: takes submissions, posts completions.
//!
//! Invariants (all counters wrapping u64):
//! - `released <= next <= head_seen <= released + slots`: submissions
//!   `[released, next)` are in flight (taken, not answered), their tickets
//!   in `tickets[position & mask]`; `head_seen` is the last submission head
//!   validated in `[head_seen, released - (cq_head - cq_published) +
//!   slots]` (the submission tail the client was shown, plus `slots`).
//! - Credit: `(next - released) + (cq_head - cq_tail_seen) <= slots`. A
//!   submission is taken only while the sum is below `slots`, and
//!   `cq_tail_seen` only moves forward (validated in `[cq_tail_seen,
//!   cq_published]`), so answering an in-flight submission always finds a free
//!   completion slot.
//! - `cq_published <= cq_head`: answers `[cq_published, cq_head)` are
//!   posted (slots written, `released` moved past them) but their counters
//!   are not yet stored in the object; [`Server::flush`] publishes them.
//!   The object's submission tail therefore lags `released` by the same
//!   count, so the client never reuses a slot whose answer it cannot see.
//! - The first `orphans` submissions taken after attaching were taken by a
//!   previous server (the object's `claimed` count) that never answered
//!   them: they come out as [`Polled::Orphan`], and `claimed` is published
//!   again only past them.

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::completion::{Completion, CompletionStatus};
use super::descriptor::{Descriptor, DescriptorError, DESCRIPTOR_SIZE};
use super::futex::{self, WaitConfig, WaitStats};
use super::layout::{ControlWord, RingLayout};
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

/// The executor's end of a ring. Owns its own mapping of the client's
/// object.
pub struct Server {
    region: Arc<Region>,
    layout: RingLayout,
    slots: u64,
    next: u64,
    released: u64,
    head_seen: u64,
    orphans: u64,
    cq_head: u64,
    /// The completion head last published (`cq_head` less the answers
    /// posted since the last flush).
    cq_published: u64,
    cq_tail_seen: u64,
    tickets: Box<[u64]>,
    scratch: Box<[u8; DESCRIPTOR_SIZE]>,
    config: WaitConfig,
    stats: WaitStats,
    poisoned: Option<RingError>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("region", &self.region)
            .field("next", &self.next)
            .field("released", &self.released)
            .field("orphans", &self.orphans)
            .field("cq_head", &self.cq_head)
            .field("poisoned", &self.poisoned)
            .finish()
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
        let layout = region.layout();
        let slots = u64::from(layout.slots());
        let load = |word| region.counter(word).load(Ordering::Acquire);
        let released = load(ControlWord::SubmissionTail);
        let head = check_counter(
            Counter::SubmissionHead,
            load(ControlWord::SubmissionHead),
            released,
            released.wrapping_add(slots),
        )?;
        let claimed = check_counter(
            Counter::SubmissionClaimed,
            load(ControlWord::SubmissionClaimed),
            released,
            head,
        )?;
        let cq_head = load(ControlWord::CompletionHead);
        let cq_tail = check_counter(
            Counter::CompletionTail,
            load(ControlWord::CompletionTail),
            cq_head.wrapping_sub(slots),
            cq_head,
        )?;
        Ok(Server {
            region,
            layout,
            slots,
            next: released,
            released,
            head_seen: head,
            orphans: claimed.wrapping_sub(released),
            cq_head,
            cq_published: cq_head,
            cq_tail_seen: cq_tail,
            // At most MAX_SLOTS entries: bounded by the validated layout.
            tickets: vec![0; layout.slots() as usize].into_boxed_slice(),
            scratch: Box::new([0; DESCRIPTOR_SIZE]),
            config: WaitConfig::default(),
            stats: WaitStats::default(),
            poisoned: None,
        })
    }

    /// The same object, its counters read again: for a server whose
    /// predecessor on the object may have answered submissions since this
    /// one was opened (it waited for that one to stop first).
    pub fn reattach(self) -> Result<Self, OpenError> {
        Self::attach(self.region).map(|server| Server {
            config: self.config,
            ..server
        })
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

    fn unread_completions(&self) -> u64 {
        self.cq_head.wrapping_sub(self.cq_tail_seen)
    }

    /// Whether a submission can be taken now: one is published and the
    /// credit rule allows it.
    fn ready(&mut self) -> Result<bool, RingError> {
        if let Some(error) = self.poisoned {
            return Err(error);
        }
        if self.in_flight() + self.unread_completions() >= self.slots {
            self.refresh_completion_tail()?;
            if self.in_flight() + self.unread_completions() >= self.slots {
                return Ok(false);
            }
        }
        if self.head_seen != self.next {
            return Ok(true);
        }
        let head = self
            .region
            .counter(ControlWord::SubmissionHead)
            .load(Ordering::Acquire);
        let head = check_counter(
            Counter::SubmissionHead,
            head,
            self.head_seen,
            // The slots the client may write: those of the submission tail
            // it was shown, which lags `released` by the unpublished answers.
            self.released
                .wrapping_sub(self.unpublished())
                .wrapping_add(self.slots),
        );
        self.head_seen = self.poison(head)?;
        Ok(self.head_seen != self.next)
    }

    /// Takes the next submission: copies its slot out, then decodes the
    /// copy. `Ok(None)`: nothing published, or no completion room until the
    /// client reads its completions. `Err`: drop the ring.
    pub fn poll(&mut self) -> Result<Option<Polled>, RingError> {
        if !self.ready()? {
            return Ok(None);
        }
        let position = self.next;
        self.region.load_submission(position, &mut self.scratch);
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
    /// publishing the answer: the completion slot is written and this
    /// side's counters move, but the client sees nothing until the next
    /// [`flush`](Self::flush). A server that drains several submissions
    /// per wake-up posts each and flushes once, so the client's two
    /// counter lines and its futex word are touched once per batch, not
    /// once per launch. The credit rule holds over posted answers too (they
    /// count as unread completions), so posting never overwrites a
    /// completion the client has not read.
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
            .store_completion(self.cq_head, &completion.encode());
        self.cq_head = self.cq_head.wrapping_add(1);
        self.released = self.released.wrapping_add(1);
        Ok(completion)
    }

    /// Answers posted and not yet published.
    pub fn unpublished(&self) -> u64 {
        self.cq_head.wrapping_sub(self.cq_published)
    }

    /// Publishes every posted answer: the completion head and the
    /// submission tail (Release, after the slots were written), then wakes
    /// the client if it sleeps. Nothing to publish: no store, no wake.
    pub fn flush(&mut self) {
        if self.cq_head == self.cq_published {
            return;
        }
        self.region
            .counter(ControlWord::CompletionHead)
            .store(self.cq_head, Ordering::Release);
        self.region
            .counter(ControlWord::SubmissionTail)
            .store(self.released, Ordering::Release);
        self.cq_published = self.cq_head;
        let waiter = self.region.waiter(ControlWord::ClientWaiter);
        if let Err(errno) = futex::wake_if_sleeping(waiter, &mut self.stats) {
            // The client's sleep is bounded; it finds the completion on its
            // next slice.
            tracing::warn!(%errno, "waking the ring's client failed");
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
    /// timed out.
    pub fn wait(&mut self, timeout: Duration) -> Result<bool, RingError> {
        let region = Arc::clone(&self.region);
        let config = self.config;
        let mut stats = self.stats;
        let ready = futex::wait_until(
            region.waiter(ControlWord::ServerWaiter),
            &config,
            &mut stats,
            timeout,
            || self.ready(),
            RingError::Futex,
        );
        self.stats = stats;
        self.poison(ready)
    }
}
