//! Sessions: who holds what.
//!
//! A session is opened by a lease stream and owns every buffer registration,
//! event registration and kernel hold made in it. It ends when the client
//! closes it or its lease stream ends (client killed, connection gone); then
//! everything it holds is released.
//!
//! Invariants:
//! - A session id is a 128-bit random bearer secret; on a Unix socket it is
//!   also bound to the peer uid that opened it, so another user's process
//!   that learned the id still cannot use it.
//! - A session only ever sees and releases what it registered itself.

use std::collections::{BTreeSet, HashSet};
use std::time::Instant;

use ptxd_proto::v1::SessionEvent;
use tokio::sync::mpsc;

use crate::handles::{BufferId, EventId, KernelHandle, SessionId};

/// The peer that opened a session, from SO_PEERCRED on Unix sockets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    pub uid: u32,
    pub pid: Option<i32>,
}

/// Why a session lookup failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    #[error("no open session {session}")]
    Unknown { session: String },
    #[error("session {session} belongs to uid {owner_uid}, not {peer_uid}")]
    WrongPeer {
        session: String,
        owner_uid: u32,
        peer_uid: u32,
    },
}

/// One open session.
#[derive(Debug)]
pub struct Session {
    pub id: SessionId,
    pub label: String,
    pub peer: Option<Peer>,
    pub opened: Instant,
    /// The lease stream's sender: events for the client.
    pub events: mpsc::Sender<Result<SessionEvent, tonic::Status>>,
    /// The executor stream id of this session (one per session and device).
    pub stream: u64,
    pub kernels: HashSet<KernelHandle>,
    pub buffers: BTreeSet<BufferId>,
    pub events_held: BTreeSet<EventId>,
    pub buffer_bytes: u64,
    /// Held shared by every launch between its check and its reply; the
    /// release takes it exclusively, so the session's executor stream is
    /// closed only after its last launch was sent.
    pub inflight: std::sync::Arc<tokio::sync::RwLock<()>>,
}

impl Session {
    /// Checks that `peer` may act in this session.
    pub fn authorize(&self, peer: Option<Peer>) -> Result<(), SessionError> {
        match (self.peer, peer) {
            (Some(owner), Some(caller)) if owner.uid != caller.uid => {
                Err(SessionError::WrongPeer {
                    session: self.id.to_string(),
                    owner_uid: owner.uid,
                    peer_uid: caller.uid,
                })
            }
            // A session opened on the Unix socket is bound to its uid: a TCP
            // caller, which has none, cannot use it.
            (Some(owner), None) => Err(SessionError::WrongPeer {
                session: self.id.to_string(),
                owner_uid: owner.uid,
                peer_uid: u32::MAX,
            }),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_opening_uid_may_use_a_unix_session() {
        let (events, _rx) = mpsc::channel(1);
        let session = Session {
            id: SessionId::random(),
            label: String::new(),
            peer: Some(Peer {
                uid: 1000,
                pid: Some(5),
            }),
            opened: Instant::now(),
            events,
            stream: 1,
            kernels: HashSet::new(),
            buffers: BTreeSet::new(),
            events_held: BTreeSet::new(),
            buffer_bytes: 0,
            inflight: Default::default(),
        };
        assert!(session
            .authorize(Some(Peer {
                uid: 1000,
                pid: Some(9)
            }))
            .is_ok());
        assert!(matches!(
            session.authorize(Some(Peer {
                uid: 1001,
                pid: Some(9)
            })),
            Err(SessionError::WrongPeer {
                owner_uid: 1000,
                peer_uid: 1001,
                ..
            })
        ));
        // A TCP caller carries no credentials and cannot use a Unix session.
        assert!(session.authorize(None).is_err());
    }
}
