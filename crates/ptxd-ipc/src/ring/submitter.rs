//! The client's side of a ring: publishes submissions, consumes completions.
//!
//! Invariants (all positions wrapping u64):
//! - `head` is the next submission position; submissions `[0, head)` are
//!   published, each by the Release store of its slot's publication word
//!   (the counts and the sequence word `submission_sequence(p)`), after the
//!   rest of the slot. `head - sq_tail_seen <= slots`, and a slot is
//!   written only when `head - sq_tail_seen < slots` for a tail validated
//!   in `[sq_tail_seen, head]`. `sq_tail_seen` is a cached gating sequence
//!   (the Disruptor's): the server's tail line is read only when the ring
//!   looks full.
//! - `cq_tail` is the completion tail this side published; completion slot
//!   `cq_tail` is copied only after its sequence word, loaded with Acquire,
//!   read `completion_sequence(cq_tail)` (`cq_ready`), and each of its
//!   other words is read once, by the copy.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::completion::{Completion, COMPLETION_SIZE};
use super::descriptor::{Descriptor, DESCRIPTOR_SIZE};
use super::futex::{self, WaitConfig, WaitStats};
use super::layout::{
    completion_sequence, submission_sequence, with_sequence, ControlWord, RingLayout,
    SUBMISSION_WORD,
};
use super::region::{CreateError, Region};
use super::{check_counter, Counter, RingError};

/// Why a submission was not published.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SubmitError {
    /// `slots` launches are outstanding: wait for a completion (each one
    /// also frees a submission slot) and try again.
    #[error("the submission ring is full")]
    Full,
    /// The ring is unusable (now or earlier, it is sticky): drop it.
    #[error(transparent)]
    Ring(#[from] RingError),
}

/// The client's end of a ring. Owns the shared-memory object: dropping it
/// unmaps and unlinks the object (the server's own mapping stays valid).
pub struct Submitter {
    region: Arc<Region>,
    layout: RingLayout,
    slots: u64,
    head: u64,
    sq_tail_seen: u64,
    cq_tail: u64,
    /// Completion slot `cq_tail` was found published and not yet copied.
    cq_ready: bool,
    scratch: Box<[u8; DESCRIPTOR_SIZE]>,
    /// What this side last wrote in each submission slot (the slots are
    /// this side's to write; the server only reads them): a submission
    /// stores only the words that changed.
    shadow: Box<[[u8; DESCRIPTOR_SIZE]]>,
    config: WaitConfig,
    stats: WaitStats,
    poisoned: Option<RingError>,
}

impl std::fmt::Debug for Submitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Submitter")
            .field("name", &self.name())
            .field("slots", &self.slots)
            .field("head", &self.head)
            .field("cq_tail", &self.cq_tail)
            .field("poisoned", &self.poisoned)
            .finish()
    }
}

impl Submitter {
    /// Creates a ring object of `slots` slots per ring (a power of two, at
    /// most [`MAX_SLOTS`](super::MAX_SLOTS)). Hand [`name`](Self::name) to
    /// the daemon.
    pub fn create(slots: u32) -> Result<Self, CreateError> {
        let layout = RingLayout::new(slots)?;
        Ok(Self::over(Arc::new(Region::create(layout)?)))
    }

    /// Creates the ring object in a memfd sealed against shrinking and
    /// growing, with no name: hand [`memfd`](Self::memfd) to the daemon by
    /// descriptor (it needs no shared `/dev/shm`).
    pub fn create_memfd(slots: u32) -> Result<Self, CreateError> {
        let layout = RingLayout::new(slots)?;
        Ok(Self::over(Arc::new(Region::create_memfd(layout)?)))
    }

    /// The descriptor of a ring made by [`create_memfd`](Self::create_memfd).
    pub fn memfd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.region.memfd()
    }

    /// A fresh ring whose counters all start at `start` (to cross the u64
    /// wrap in tests). Each slot holds the sequence word of the lap before
    /// the first, as a ring that came this far would.
    #[cfg(test)]
    pub(crate) fn create_starting_at(slots: u32, start: u64) -> Result<Self, CreateError> {
        let mut submitter = Self::create(slots)?;
        for word in [
            ControlWord::SubmissionTail,
            ControlWord::SubmissionClaimed,
            ControlWord::CompletionTail,
        ] {
            submitter
                .region
                .counter(word)
                .store(start, Ordering::Relaxed);
        }
        for slot in 0..u64::from(slots) {
            let before = start.wrapping_add(slot).wrapping_sub(u64::from(slots));
            submitter.region.submission_word(before).store(
                with_sequence(0, submission_sequence(before)),
                Ordering::Relaxed,
            );
            submitter
                .region
                .completion_word(before)
                .store(completion_sequence(before), Ordering::Relaxed);
        }
        submitter.head = start;
        submitter.sq_tail_seen = start;
        submitter.cq_tail = start;
        Ok(submitter)
    }

    pub(crate) fn over(region: Arc<Region>) -> Self {
        let layout = region.layout();
        // At most MAX_SLOTS slots: as large as the slots of the mapping.
        let mut shadow = vec![[0u8; DESCRIPTOR_SIZE]; layout.slots() as usize].into_boxed_slice();
        for (position, slot) in shadow.iter_mut().enumerate() {
            region.load_submission(position as u64, slot);
        }
        Submitter {
            shadow,
            region,
            layout,
            slots: u64::from(layout.slots()),
            head: 0,
            sq_tail_seen: 0,
            cq_tail: 0,
            cq_ready: false,
            scratch: Box::new([0; DESCRIPTOR_SIZE]),
            config: WaitConfig::default(),
            stats: WaitStats::default(),
            poisoned: None,
        }
    }

    /// Sets how [`wait_completion`](Self::wait_completion) spins and sleeps.
    pub fn with_wait_config(mut self, config: WaitConfig) -> Self {
        self.config = config;
        self
    }

    /// The shared-memory object's name, for the daemon's `shm_open` (empty
    /// for a ring in a memfd).
    pub fn name(&self) -> &str {
        self.region.name().unwrap_or_default()
    }

    /// The layout this side created the object with.
    pub fn layout(&self) -> RingLayout {
        self.layout
    }

    /// Submissions published and not yet answered by a completion this side
    /// consumed.
    pub fn outstanding(&self) -> u64 {
        self.head.wrapping_sub(self.cq_tail)
    }

    /// Whether the server has announced a sleep on its futex word (it is
    /// asleep, or about to be, until a submission or its own timeout):
    /// for tests and diagnostics. The word is shared, so this is only as
    /// true as the last store the server made.
    pub fn server_asleep(&self) -> bool {
        self.region
            .waiter(ControlWord::ServerWaiter)
            .load(Ordering::Relaxed)
            == futex::SLEEPING
    }

    /// Futex sleeps and wakes this client has made so far.
    pub fn stats(&self) -> WaitStats {
        self.stats
    }

    #[cfg(test)]
    pub(crate) fn region(&self) -> &Arc<Region> {
        &self.region
    }

    fn poison<T>(&mut self, result: Result<T, RingError>) -> Result<T, RingError> {
        if let Err(error) = &result {
            self.poisoned = Some(*error);
        }
        result
    }

    /// Publishes `descriptor`, or says the ring is full. Wakes the server
    /// if it announced a sleep.
    pub fn try_submit(&mut self, descriptor: &Descriptor) -> Result<(), SubmitError> {
        if let Some(error) = self.poisoned {
            return Err(error.into());
        }
        if self.head.wrapping_sub(self.free_from()) >= self.slots {
            let tail = self
                .region
                .counter(ControlWord::SubmissionTail)
                .load(Ordering::Acquire);
            let tail = check_counter(Counter::SubmissionTail, tail, self.sq_tail_seen, self.head);
            self.sq_tail_seen = self.poison(tail)?;
            if self.head.wrapping_sub(self.free_from()) >= self.slots {
                return Err(SubmitError::Full);
            }
        }
        descriptor.encode_into(&mut self.scratch);
        let slot = &mut self.shadow[self.layout.index(self.head)];
        // The body first (the words that changed), then the publication
        // word, Release: a server that loads this lap's sequence word with
        // Acquire sees the whole body.
        self.region
            .store_submission_changed(self.head, &self.scratch, slot);
        let mut counts = [0u8; 8];
        counts.copy_from_slice(&self.scratch[SUBMISSION_WORD..SUBMISSION_WORD + 8]);
        let publication = with_sequence(u64::from_ne_bytes(counts), submission_sequence(self.head));
        self.region
            .submission_word(self.head)
            .store(publication, Ordering::Release);
        self.head = self.head.wrapping_add(1);
        self.wake_server();
        Ok(())
    }

    /// The oldest submission whose slot may still be in use: the server's
    /// tail as last read, or past it the completions this side consumed.
    /// An answer is posted only after its submission was copied out, and
    /// the server publishes its answers before its tail (so that a server
    /// attaching after a death finds them): a client that read answer `p`
    /// may reuse slot `p` before the tail word says so.
    fn free_from(&self) -> u64 {
        let read = self.cq_tail.wrapping_sub(self.sq_tail_seen);
        if read <= self.head.wrapping_sub(self.sq_tail_seen) {
            self.cq_tail
        } else {
            self.sq_tail_seen
        }
    }

    fn wake_server(&mut self) {
        let waiter = self.region.waiter(ControlWord::ServerWaiter);
        if let Err(errno) = futex::wake_if_sleeping(waiter, &mut self.stats) {
            // The server's sleep is bounded: it finds the work on its next
            // slice. Nothing to undo here.
            tracing::warn!(%errno, "waking the ring's server failed");
        }
    }

    /// The next completion, if one is published.
    pub fn poll_completion(&mut self) -> Result<Option<Completion>, RingError> {
        if let Some(error) = self.poisoned {
            return Err(error);
        }
        if !self.completion_ready()? {
            return Ok(None);
        }
        let mut bytes = [0u8; COMPLETION_SIZE];
        self.region
            .load_completion_published(self.cq_tail, &mut bytes);
        self.cq_ready = false;
        self.cq_tail = self.cq_tail.wrapping_add(1);
        self.region
            .counter(ControlWord::CompletionTail)
            .store(self.cq_tail, Ordering::Release);
        // The server may be waiting for completion room.
        self.wake_server();
        let completion = Completion::decode(&bytes).map_err(RingError::from);
        self.poison(completion).map(Some)
    }

    /// Whether completion slot `cq_tail` is published: its sequence word,
    /// loaded with Acquire, is this lap's. Anything else (an older lap's
    /// word, a word the server has not stored yet) is not, and nor is any
    /// word while no launch is outstanding: completion `p` answers
    /// submission `p`, so one for a launch this side never submitted is
    /// forged (taking it would move `cq_tail` past `head`, and the
    /// outstanding count would wrap to 2^64 - 1).
    fn completion_ready(&mut self) -> Result<bool, RingError> {
        if self.cq_ready {
            return Ok(true);
        }
        if self.cq_tail == self.head {
            return Ok(false);
        }
        let sequence = self
            .region
            .completion_word(self.cq_tail)
            .load(Ordering::Acquire);
        self.cq_ready = sequence == completion_sequence(self.cq_tail);
        Ok(self.cq_ready)
    }

    /// The next completion, waiting up to `timeout` for one (spinning, then
    /// sleeping on the client's futex word). `Ok(None)`: timed out.
    pub fn wait_completion(&mut self, timeout: Duration) -> Result<Option<Completion>, RingError> {
        if let Some(error) = self.poisoned {
            return Err(error);
        }
        let region = Arc::clone(&self.region);
        let config = self.config;
        let mut stats = self.stats;
        let ready = futex::wait_until(
            region.waiter(ControlWord::ClientWaiter),
            &config,
            &mut stats,
            timeout,
            || self.completion_ready(),
            RingError::Futex,
        );
        self.stats = stats;
        if !self.poison(ready)? {
            return Ok(None);
        }
        self.poll_completion()
    }
}
