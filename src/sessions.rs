//! Sessions: who holds what, and who may act in a session.
//!
//! A session is opened by a lease stream and owns every buffer registration,
//! event registration and kernel hold made in it. It ends when the client
//! closes it or its lease stream ends (client killed, connection gone); then
//! everything it holds is released.
//!
//! Invariants:
//! - A session id is a 128-bit random bearer secret, and it is bound to the
//!   caller that opened it: a session opened on the Unix socket is usable
//!   only by callers with the same peer uid; a session opened without peer
//!   credentials (TCP) only on the very connection that opened it. Nobody
//!   crosses from one transport to the other.
//! - No identity, no privilege: a [`Caller::Remote`] has no uid, so nothing
//!   whose access depends on the caller's identity (host shared-memory names,
//!   trust for unverified machine code) is ever granted to it.
//! - A session only ever sees and releases what it registered itself; its
//!   handles are tokens in its own tables, meaningless in any other session.
//! - Every session belongs to one [`Tenant`]; per-tenant quotas are counted
//!   over the tenant's sessions.

use std::net::SocketAddr;
use std::time::Instant;

use crate::handles::{KernelHandle, SessionId, Tokens};
/// Lives in `lease` (below this module); named here for the callers that
/// notify sessions.
pub use crate::lease::LeaseEvent;

/// A Unix-socket peer's credentials, from SO_PEERCRED (kernel-verified).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    pub uid: u32,
    pub gid: u32,
    pub pid: Option<i32>,
}

/// Who made a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// A Unix-socket peer with kernel-verified credentials.
    Local(Peer),
    /// A caller without credentials (TCP), known only by its connection's
    /// remote address (`None` when the transport gave none).
    Remote { connection: Option<SocketAddr> },
}

impl Caller {
    /// The caller's peer credentials, if it has any.
    pub fn credentials(&self) -> Option<Peer> {
        match self {
            Caller::Local(peer) => Some(*peer),
            Caller::Remote { .. } => None,
        }
    }

    /// The tenant quotas are charged to.
    pub fn tenant(&self) -> Tenant {
        match self {
            Caller::Local(peer) => Tenant::Uid(peer.uid),
            Caller::Remote { .. } => Tenant::Anonymous,
        }
    }

    /// The transport, for refusals ("unix" or "tcp").
    pub fn transport(&self) -> &'static str {
        match self {
            Caller::Local(_) => "unix",
            Caller::Remote { .. } => "tcp",
        }
    }
}

/// Whom per-uid quotas are counted for: a uid, or every caller without
/// credentials together (they cannot be told apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tenant {
    Uid(u32),
    Anonymous,
}

impl std::fmt::Display for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tenant::Uid(uid) => write!(f, "uid {uid}"),
            Tenant::Anonymous => f.write_str("callers without credentials (TCP)"),
        }
    }
}

/// Why a session lookup failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    #[error("no open session {session}")]
    Unknown { session: String },
    /// The session was opened by another caller. Neither side's identity is
    /// named: the refusal must not tell one user who another is.
    #[error(
        "session {session} was opened by another caller (another uid, transport or connection)"
    )]
    WrongPeer { session: String },
}

/// Ring indices: how a session's ring descriptors name its kernels and
/// buffers. Per session, never reused within it, so a descriptor written
/// for a released object cannot reach a later one: a session mints at most
/// `u32::MAX` of them (1 to `u32::MAX`; 0 names nothing), and then none,
/// rather than wrapping onto indices its ring may still name.
#[derive(Debug, Default)]
pub struct RingIndices {
    next: u32,
    kernels: std::collections::HashMap<KernelHandle, u32>,
}

impl RingIndices {
    /// A fresh index (for a buffer); `None` once every one was minted.
    pub fn fresh(&mut self) -> Option<u32> {
        self.next = self.next.checked_add(1)?;
        Some(self.next)
    }

    /// Whether [`kernel`](Self::kernel) has an index for `kernel` (`None`:
    /// a kernel the session does not hold yet): it holds one already, or
    /// one is left to mint.
    pub fn has_room_for(&self, kernel: Option<&KernelHandle>) -> bool {
        kernel.is_some_and(|k| self.kernels.contains_key(k)) || self.next < u32::MAX
    }

    /// The index of `kernel`, minted the first time the session holds it;
    /// `None` when it has none and every one was minted.
    pub fn kernel(&mut self, kernel: KernelHandle) -> Option<u32> {
        if let Some(index) = self.kernels.get(&kernel) {
            return Some(*index);
        }
        let index = self.fresh()?;
        self.kernels.insert(kernel, index);
        Some(index)
    }

    /// Forgets `kernel` (released); returns its index.
    pub fn forget_kernel(&mut self, kernel: &KernelHandle) -> Option<u32> {
        self.kernels.remove(kernel)
    }

    /// Every kernel the session holds an index for.
    pub fn kernels(&self) -> impl Iterator<Item = (&KernelHandle, u32)> {
        self.kernels.iter().map(|(k, i)| (k, *i))
    }
}

/// One open session.
#[derive(Debug)]
pub struct Session {
    pub id: SessionId,
    pub label: String,
    /// Who opened it: the only caller that may act in it.
    pub opener: Caller,
    pub opened: Instant,
    /// The lease stream's queue: events for the client.
    pub events: crate::lease::LeaseSender,
    /// The executor stream id of this session (one per session and device).
    pub stream: u64,
    /// The session's kernel handles.
    pub kernels: Tokens<KernelHandle>,
    /// How the session's ring names its kernels (see [`RingIndices`]).
    pub ring_indices: RingIndices,
    /// The session's launch ring, if it opened one: the device and the
    /// executor generation serving it.
    pub ring: Option<(usize, crate::handles::DeviceGeneration)>,
    /// Held shared by every launch between its check and its reply; the
    /// release takes it exclusively, so the session's executor stream is
    /// closed only after its last launch was sent.
    pub inflight: std::sync::Arc<tokio::sync::RwLock<()>>,
}

impl Session {
    /// Queues `event` on the session's lease stream ([`crate::lease`]: a
    /// client that does not read its stream loses no restart or drain
    /// notice, and its queue stays small).
    pub fn notify(&self, event: LeaseEvent) {
        self.events.send(event);
    }

    pub fn tenant(&self) -> Tenant {
        self.opener.tenant()
    }

    /// Checks that `caller` may act in this session.
    pub fn authorize(&self, caller: Caller) -> Result<(), SessionError> {
        let allowed = match (self.opener, caller) {
            (Caller::Local(owner), Caller::Local(peer)) => owner.uid == peer.uid,
            // No credentials: bound to the connection that opened it.
            (
                Caller::Remote {
                    connection: Some(a),
                },
                Caller::Remote {
                    connection: Some(b),
                },
            ) => a == b,
            _ => false,
        };
        if allowed {
            Ok(())
        } else {
            Err(SessionError::WrongPeer {
                session: self.id.to_string(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(opener: Caller) -> Session {
        let (events, _rx) = crate::lease::channel();
        Session {
            id: SessionId::random(),
            label: String::new(),
            opener,
            opened: Instant::now(),
            events,
            stream: 1,
            kernels: Tokens::default(),
            ring_indices: RingIndices::default(),
            ring: None,
            inflight: Default::default(),
        }
    }

    fn local(uid: u32, pid: i32) -> Caller {
        Caller::Local(Peer {
            uid,
            gid: uid,
            pid: Some(pid),
        })
    }

    fn remote(port: u16) -> Caller {
        Caller::Remote {
            connection: Some(SocketAddr::from(([127, 0, 0, 1], port))),
        }
    }

    #[test]
    fn only_the_opening_uid_may_use_a_unix_session() {
        let session = session(local(1000, 5));
        assert!(session.authorize(local(1000, 9)).is_ok());
        let refused = session.authorize(local(1001, 9)).unwrap_err();
        assert!(
            !refused.to_string().contains("1000") && !refused.to_string().contains("1001"),
            "the refusal names no uid: {refused}"
        );
        // A TCP caller carries no credentials and cannot use a Unix session.
        assert!(session.authorize(remote(4000)).is_err());
    }

    #[test]
    fn a_tcp_session_is_bound_to_its_connection() {
        let session = session(remote(4000));
        assert!(session.authorize(remote(4000)).is_ok());
        assert!(
            session.authorize(remote(4001)).is_err(),
            "another connection"
        );
        assert!(
            session.authorize(local(0, 1)).is_err(),
            "even root over Unix"
        );
        assert!(session.authorize(local(1000, 1)).is_err());
        let unknown = Caller::Remote { connection: None };
        assert!(self::session(unknown).authorize(unknown).is_err());
        assert_eq!(remote(1).tenant(), Tenant::Anonymous);
        assert_eq!(local(7, 1).tenant(), Tenant::Uid(7));
    }

    /// A session's ring indices run out rather than wrap: near the end of
    /// the range every index minted is fresh and non-zero, a kernel that
    /// has one keeps it, and then none is minted (the front refuses the
    /// registration or load), where a wrapped counter handed out 0 and
    /// then 1, the index of a buffer the ring may still name.
    #[test]
    fn ring_indices_run_out_instead_of_wrapping_onto_live_ones() {
        use rand::Rng;
        let mut rng = rand::rng();
        let mut kernel = |slot: u32| KernelHandle {
            slot,
            epoch: rng.random(),
            generation: crate::handles::DeviceGeneration(1),
            boot: crate::handles::BootId(1),
        };
        let (early, late, fresh) = (kernel(1), kernel(2), kernel(3));
        let mut indices = RingIndices::default();
        let first = indices.kernel(early);
        assert_eq!(first, Some(1));
        let left = rng.random_range(1..64u32);
        indices.next = u32::MAX - left;
        let mut minted = std::collections::BTreeSet::from([1]);
        for k in 0..left {
            assert!(indices.has_room_for(None));
            let index = if k == 0 {
                indices.kernel(late)
            } else {
                indices.fresh()
            };
            assert!(
                index.is_some_and(|i| i != 0 && minted.insert(i)),
                "{index:?}: none left, 0, or minted twice"
            );
        }
        assert_eq!(indices.next, u32::MAX);
        assert_eq!(indices.fresh(), None);
        assert!(!indices.has_room_for(None) && !indices.has_room_for(Some(&fresh)));
        assert_eq!(indices.kernel(fresh), None);
        // Kernels that hold an index keep it.
        assert!(indices.has_room_for(Some(&early)) && indices.has_room_for(Some(&late)));
        assert_eq!(indices.kernel(early), first);
        assert_eq!(indices.kernel(late), Some(u32::MAX - left + 1));
        assert_eq!(indices.fresh(), None, "still none: no wrap to 0 or 1");
    }
}
