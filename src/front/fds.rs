//! The fd socket's half of what a client passes by descriptor: a buffer
//! (RegisterBuffer, source posix_fd) or a launch ring's memory (OpenRing,
//! by_fd).
//!
//! Invariants:
//! - A token is issued only after the request passed every check that does
//!   not need the descriptor (session, caller, limits, device), and it is
//!   spent by the first descriptor that comes with it, whatever the answer
//!   (`crate::fd_tokens`).
//! - The descriptor then takes the same path as a request that named its
//!   memory: the same checks again, the same open and commit.

use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use super::awaiting::Awaiting;
use super::{Front, OpenedRing, RegisteredBuffer};
use crate::error::Error;
use crate::handles::SessionId;
use crate::sessions::Caller;

/// What a descriptor completed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attached {
    Buffer(RegisteredBuffer),
    Ring(OpenedRing),
}

impl Front {
    /// Issues the token for a request whose descriptor follows, once the
    /// caller (who must have credentials) is the session's.
    pub(super) fn issue_fd_token(
        &self,
        session_id: &SessionId,
        peer: Caller,
        awaiting: Awaiting,
    ) -> Result<(String, Duration), Error> {
        let Some(credentials) = peer.credentials() else {
            return Err(Error::IdentityRequired {
                resource: "posix_fd",
            });
        };
        let mut state = self.lock();
        state.refuse_if_draining()?;
        state.session(session_id, peer)?;
        let ttl = state.fd_tokens.ttl();
        let token = state
            .fd_tokens
            .issue(session_id, credentials.uid, awaiting, Instant::now())?;
        Ok((token, ttl))
    }

    /// The fd socket's half: `fd` came with `token` from a peer of uid
    /// `peer_uid`. Completes what the token was issued for, or refuses it
    /// (the token is spent either way).
    pub async fn attach_fd(
        &self,
        token: &str,
        fd: OwnedFd,
        peer_uid: u32,
    ) -> Result<Attached, Error> {
        let redeemed = self
            .lock()
            .fd_tokens
            .redeem(token, peer_uid, Instant::now())?;
        match redeemed.registration {
            Awaiting::Buffer(awaiting) => self
                .attach_buffer(&redeemed.session, awaiting, fd)
                .await
                .map(Attached::Buffer),
            Awaiting::Ring(awaiting) => self
                .attach_ring(&redeemed.session, awaiting, fd)
                .await
                .map(Attached::Ring),
        }
    }
}
