//! The shared-memory launch ring: the fast path from a session to its
//! device's executor, beside gRPC.
//!
//! # Design
//!
//! One POSIX shared-memory object per session ring, created by the client
//! ([`Submitter::create`], in a [`HostShm`](crate::shm::HostShm)) and
//! opened by the executor ([`Server::open`] by name, or [`Server::from_fd`]).
//! The layout lives in this crate so that the SDK and the daemon share one
//! definition ([`RingLayout`] has the byte table): a versioned header, five
//! control words each on its own 128-byte block, `slots` submission slots
//! of [`DESCRIPTOR_SIZE`] bytes, then `slots` completion slots of
//! [`COMPLETION_SIZE`] bytes.
//!
//! Two single-producer single-consumer rings, each slot published by a
//! sequence word inside it (as the LMAX Disruptor's `availableBuffer` and
//! iceoryx2 do), not by a separate head counter, so a hand-over moves the
//! slot's own cache lines between the cores and no counter line:
//!
//! - **Submissions**, client → server. The client writes slot `p & (slots-1)`
//!   (the words that changed), then stores the slot's publication word (its
//!   descriptor counts and the sequence word `p + 1`, low 32 bits) with a
//!   Release store. The server polls the next slot's publication word with
//!   Acquire; once it reads this lap's sequence, it copies the rest of the
//!   slot into a local buffer and decodes the copy with the word it
//!   already loaded: it reads each shared byte of a slot once. It also
//!   publishes `claimed` (how many it has taken). A slot is handed back
//!   (`tail`, Release) only when its completion is published, so the client
//!   has at most `slots` launches outstanding and a server that attaches
//!   after another one died finds the dead one's unanswered submissions
//!   still in place. The client reads `tail` only when the ring looks full
//!   (a cached gating sequence).
//! - **Completions**, server → client, the same way round: the server writes
//!   the slot's body, then its sequence word (`p + 1`, Release); the client
//!   polls the sequence word of completion `tail` (Acquire), copies the
//!   rest of the slot, then publishes its `tail` (Release). The answer to
//!   submission `p` is completion `p`. The server answers submissions in
//!   the order it took them ([`Server::complete`] always answers the oldest
//!   one), may post several answers and publish them together ([`Server::post`]
//!   writes bodies, [`Server::flush`] stores the sequence words, then the
//!   submission tail, and wakes the client once), and takes a submission
//!   only while `in flight + unread completions < slots`, so a completion
//!   always has room: the server never buffers or blocks on a client that
//!   stops reading completions; it stops taking its launches.
//!
//! A sequence word tells this lap from the last one: a slot that held
//! position `p - slots` holds that position's word, which differs from
//! `p`'s, and a fresh object's zero-filled slots are not published for
//! the first lap's positions (`1..=slots`).
//!
//! Memory ordering: each slot's body is written before the Release store of
//! its sequence word and read after the Acquire load that observes it, so
//! the reader sees the whole slot. Each slot is read (copied out) before the
//! Release store that hands it back (`tail`), and the writer reuses it only
//! after an Acquire load of that store, so a writer never overwrites a slot
//! its reader is still copying. Sleep and wake use a Dekker pattern over
//! SeqCst fences, with the next slot's sequence word as the published
//! condition (see `futex::wait_until`); a [`Waker`] ends a server's sleep
//! from its own process (a stop).
//!
//! # Trust
//!
//! The client is hostile: it may write any byte of the object at any time.
//! Hence:
//!
//! - Every access to the mapping is an atomic operation (control words as
//!   `AtomicU64`/`AtomicU32`, slots copied word by word with relaxed atomic
//!   loads or stores); no `&`/`&mut` reference to shared bytes exists, so a
//!   concurrent write is a torn value to validate, not undefined behavior.
//! - The header is read once, with `pread`, before mapping; sizes come from
//!   the validated [`RingLayout`] only. Slot addresses are `counter & mask`,
//!   inside the mapping whatever the counter.
//! - Each side keeps its own counters locally and never reads them back
//!   from the object (except once, when attaching). A peer's tail must stay
//!   inside a window (`[last seen, own head]`); one that moves backwards or
//!   too far ahead is a [`RingError::CounterOutOfRange`], after which the
//!   side is poisoned (every call returns the same error) and the executor
//!   drops the ring.
//! - A sequence word is compared with one value, this lap's, for the one
//!   slot a side expects next: any other value (garbage, a past or future
//!   lap, a word written before its body) is "not yet", so a peer that
//!   writes sequence words can stall its own ring or hand over a slot it
//!   had not finished (decoded and checked like any other bytes), never
//!   make a side take a slot twice or read one it did not expect: each
//!   side moves past a position once, and reads that position's slot once.
//! - A malformed descriptor is not a ring error: [`Server::poll`] returns it
//!   as [`Polled::Malformed`] with its raw ticket, and the server refuses it
//!   through [`Server::complete`] like any other refusal.
//! - The client stores only the words of a submission slot that differ
//!   from what it last wrote there (a local shadow of its slots), so the
//!   lines a launch does not change stay cached on the server's core. The
//!   slots are the client's alone to write: another process of its uid that
//!   scribbles on one can spoil the client's later descriptors in that
//!   slot, which the server decodes and checks like any other bytes.
//! - Every sleep is bounded ([`WaitConfig::max_sleep`] and the caller's
//!   timeout): a peer that never wakes us costs latency, never a hang.
//!
//! # Sleeping
//!
//! A consumer spins for [`WaitConfig::spin`], then sleeps on a shared futex
//! word (one for the server, one for the client), announcing the sleep in
//! the word itself so that a producer issues `FUTEX_WAKE` only when somebody
//! sleeps. The server sleeps until the client submits or frees completion
//! room; the client sleeps until a completion arrives (which also frees a
//! submission slot). A thread of the server's process ends the server's
//! sleep at once with a [`Waker`] (the daemon's ring stop), rather than
//! leaving it to the end of the sleep's slice.
//!
//! # Not here
//!
//! Launch checks (kernel and buffer indices, bounds, the semaphore's buffer)
//! belong to the daemon's launch-check module: a [`Descriptor`] that decodes
//! is only well formed, not authorized.

mod completion;
mod descriptor;
mod futex;
mod layout;
mod region;
mod server;
mod submitter;
#[cfg(test)]
mod tests;

use nix::errno::Errno;

pub use completion::{Completion, CompletionError, CompletionStatus, COMPLETION_SIZE};
pub use descriptor::{
    Descriptor, DescriptorError, OperandRef, SemaphoreOp, SemaphoreRole, SemaphoreWidth, TypedArg,
    DESCRIPTOR_SIZE, MAX_ARGS, MAX_INPUTS, MAX_SCALARS,
};
pub use futex::{WaitConfig, WaitStats};
pub use layout::{
    LayoutError, RingLayout, CONTROL_BLOCK, CONTROL_LEN, HEADER_LEN, LAYOUT_VERSION, MAGIC,
    MAX_SLOTS,
};
pub use region::{CreateError, OpenError};
pub use server::{CompleteError, Polled, Server, Waker};
pub use submitter::{SubmitError, Submitter};

/// A counter the peer publishes. (Layout 2 has no head counters: each
/// slot's sequence word publishes it.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Counter {
    /// Submissions answered (their slots free again); written by the server,
    /// checked by the client against `[last seen, its own head]`.
    SubmissionTail,
    /// Submissions taken by a server; written by the server, checked only by
    /// a server that attaches after another one, against `[tail, tail +
    /// slots]`.
    SubmissionClaimed,
    /// Completions consumed (their slots free again); written by the client,
    /// checked by the server against `[last seen, the completions it
    /// published]`.
    CompletionTail,
}

impl std::fmt::Display for Counter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Counter::SubmissionTail => "submission tail",
            Counter::SubmissionClaimed => "submission claimed count",
            Counter::CompletionTail => "completion tail",
        })
    }
}

/// The ring as a whole is unusable: drop it. Sticky: once a side returned
/// one, every later call returns the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RingError {
    /// The peer moved a counter backwards or past what this side allows
    /// (bounds in wrapping u64 arithmetic).
    #[error("the peer set the {counter} to {value}, outside [{low}, {high}]")]
    CounterOutOfRange {
        /// Which counter the peer wrote.
        counter: Counter,
        /// The value this side loaded from the object.
        value: u64,
        /// The window's inclusive lower bound: normally the last value this
        /// side accepted, since a counter never moves backwards.
        low: u64,
        /// The window's inclusive upper bound, from this side's own
        /// counters; may be numerically below `low` when the window wraps.
        high: u64,
    },
    /// The server wrote a completion record this client cannot read.
    #[error("malformed completion: {0}")]
    MalformedCompletion(#[from] CompletionError),
    /// FUTEX_WAIT failed with an error other than a timeout, a changed word
    /// or a signal (a kernel without futexes, a seccomp filter).
    #[error("futex wait failed: {0}")]
    Futex(Errno),
}

/// `value` if it lies in `[low, high]` (wrapping: the window may straddle
/// `u64::MAX`), else the typed error.
fn check_counter(counter: Counter, value: u64, low: u64, high: u64) -> Result<u64, RingError> {
    if value.wrapping_sub(low) <= high.wrapping_sub(low) {
        Ok(value)
    } else {
        Err(RingError::CounterOutOfRange {
            counter,
            value,
            low,
            high,
        })
    }
}
