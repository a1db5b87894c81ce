//! What an fd token was issued for: a request that passed its checks and
//! waits for its descriptor on the fd socket.
//!
//! Below `buffers`, `ring` and `fds`: the two verbs that issue a token and
//! the fd socket's half that redeems it share these records, and none of
//! the three needs another to name them.
//!
//! Invariant: a record holds only what the verb checked before issuing the
//! token; the descriptor's half checks it all again (`fds`).

use super::DeviceChoice;
use crate::sessions::Caller;

/// What a token was issued for.
#[derive(Debug)]
pub enum Awaiting {
    Buffer(AwaitingFd),
    Ring(AwaitingRing),
}

/// A posix_fd registration waiting for its descriptor.
#[derive(Debug)]
pub struct AwaitingFd {
    pub(super) caller: Caller,
    pub(super) label: String,
    pub(super) size: u64,
    pub(super) offset: u64,
    pub(super) allocation_size: u64,
    pub(super) device_uuid: Option<String>,
}

/// An OpenRing (by_fd) waiting for its memfd.
#[derive(Debug)]
pub struct AwaitingRing {
    pub(super) caller: Caller,
    pub(super) device: DeviceChoice,
}
