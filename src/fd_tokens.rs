//! One-time tokens that pair a `RegisterBuffer` (source `posix_fd`) with
//! the descriptor a client then sends on the fd socket.
//!
//! Invariants:
//! - A token is 128 random bits, bound to one session and the uid that
//!   asked for it, and takes at most one descriptor: [`FdTokens::redeem`]
//!   removes it whatever it answers.
//! - A token that is not redeemed within its time-to-live is refused
//!   ("expired"); a used or expired token is remembered for [`REMEMBER`] so
//!   that a retry learns why, then forgotten ("unknown").
//! - The table is bounded: at most [`MAX_WAITING_PER_SESSION`] tokens wait
//!   per session, and at most `MAX_REMEMBERED` spent tokens are kept.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::error::{Error, FdTokenState};
use crate::handles::SessionId;

/// How long a spent (used or expired) token is remembered.
pub const REMEMBER: Duration = Duration::from_secs(60);

/// The most tokens one session may have waiting for a descriptor.
pub const MAX_WAITING_PER_SESSION: usize = 16;

/// The most spent tokens remembered.
const MAX_REMEMBERED: usize = 4096;

/// A token waiting for its descriptor, and what it registers.
#[derive(Debug)]
struct Waiting<T> {
    session: SessionId,
    uid: u32,
    deadline: Instant,
    registration: T,
}

/// The tokens of one daemon, generic over what a registration carries.
#[derive(Debug)]
pub struct FdTokens<T> {
    ttl: Duration,
    waiting: HashMap<String, Waiting<T>>,
    spent: HashMap<String, (FdTokenState, Instant)>,
    spent_order: VecDeque<String>,
}

/// A redeemed token: the session it was issued to and its registration.
#[derive(Debug)]
pub struct Redeemed<T> {
    pub session: SessionId,
    pub registration: T,
}

impl<T> FdTokens<T> {
    /// An empty table whose tokens live `ttl`.
    pub fn new(ttl: Duration) -> Self {
        FdTokens {
            ttl,
            waiting: HashMap::new(),
            spent: HashMap::new(),
            spent_order: VecDeque::new(),
        }
    }

    /// How long a token lives.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Issues a token for `session`, redeemable by `uid` until the time to
    /// live runs out.
    pub fn issue(
        &mut self,
        session: &SessionId,
        uid: u32,
        registration: T,
        now: Instant,
    ) -> Result<String, Error> {
        self.expire(now);
        let waiting = self
            .waiting
            .values()
            .filter(|w| &w.session == session)
            .count();
        if waiting >= MAX_WAITING_PER_SESSION {
            return Err(Error::LimitExceeded {
                limit: "fd_tokens_per_session",
                value: MAX_WAITING_PER_SESSION as u64,
            });
        }
        let token = format!("fdt-{:032x}", rand::random::<u128>());
        self.waiting.insert(
            token.clone(),
            Waiting {
                session: session.clone(),
                uid,
                deadline: now + self.ttl,
                registration,
            },
        );
        Ok(token)
    }

    /// Takes the registration of `token` for a descriptor sent by `uid`.
    /// The token is spent whatever the answer: a token shown by another
    /// user is burnt, since it has leaked.
    pub fn redeem(&mut self, token: &str, uid: u32, now: Instant) -> Result<Redeemed<T>, Error> {
        self.expire(now);
        let Some(waiting) = self.waiting.remove(token) else {
            let why = self
                .spent
                .get(token)
                .map_or(FdTokenState::Unknown, |(why, _)| *why);
            return Err(Error::StaleFdToken { why });
        };
        self.remember(token.to_owned(), FdTokenState::Used, now);
        if waiting.uid != uid {
            return Err(Error::FdWrongPeer);
        }
        Ok(Redeemed {
            session: waiting.session,
            registration: waiting.registration,
        })
    }

    /// Forgets every token of a session that ended.
    pub fn forget_session(&mut self, session: &SessionId) {
        self.waiting.retain(|_, w| &w.session != session);
    }

    /// How many tokens wait for a descriptor.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    fn expire(&mut self, now: Instant) {
        let expired: Vec<String> = self
            .waiting
            .iter()
            .filter(|(_, w)| w.deadline <= now)
            .map(|(token, _)| token.clone())
            .collect();
        for token in expired {
            self.waiting.remove(&token);
            self.remember(token, FdTokenState::Expired, now);
        }
        while let Some(oldest) = self.spent_order.front() {
            let stale = self
                .spent
                .get(oldest)
                .is_none_or(|(_, at)| now.saturating_duration_since(*at) >= REMEMBER);
            if !stale && self.spent_order.len() <= MAX_REMEMBERED {
                break;
            }
            if let Some(oldest) = self.spent_order.pop_front() {
                self.spent.remove(&oldest);
            }
        }
    }

    fn remember(&mut self, token: String, why: FdTokenState, now: Instant) {
        self.spent.insert(token.clone(), (why, now));
        self.spent_order.push_back(token);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn session() -> SessionId {
        SessionId::random()
    }

    fn why(error: Error) -> FdTokenState {
        match error {
            Error::StaleFdToken { why } => why,
            other => panic!("expected STALE_FD_TOKEN, got {other:?}"),
        }
    }

    #[test]
    fn a_token_takes_one_descriptor_from_its_uid_then_says_used() {
        let mut tokens = FdTokens::new(Duration::from_secs(10));
        let now = Instant::now();
        let s = session();
        let payload = rand::random::<u64>();
        let token = tokens.issue(&s, 1000, payload, now).unwrap();
        let redeemed = tokens.redeem(&token, 1000, now).unwrap();
        assert_eq!(redeemed.session, s);
        assert_eq!(redeemed.registration, payload);
        assert_eq!(
            why(tokens.redeem(&token, 1000, now).unwrap_err()),
            FdTokenState::Used
        );
        assert_eq!(
            why(tokens.redeem("fdt-never", 1000, now).unwrap_err()),
            FdTokenState::Unknown
        );
    }

    #[test]
    fn another_uid_burns_the_token() {
        let mut tokens = FdTokens::new(Duration::from_secs(10));
        let now = Instant::now();
        let token = tokens.issue(&session(), 1000, (), now).unwrap();
        assert_eq!(
            tokens.redeem(&token, 1001, now).unwrap_err(),
            Error::FdWrongPeer
        );
        assert_eq!(
            why(tokens.redeem(&token, 1000, now).unwrap_err()),
            FdTokenState::Used
        );
    }

    #[test]
    fn a_late_token_is_expired_then_forgotten() {
        let ttl = Duration::from_millis(500);
        let mut tokens = FdTokens::new(ttl);
        let now = Instant::now();
        let token = tokens.issue(&session(), 7, (), now).unwrap();
        let late = now + ttl;
        assert_eq!(
            why(tokens.redeem(&token, 7, late).unwrap_err()),
            FdTokenState::Expired
        );
        assert_eq!(tokens.waiting(), 0);
        let much_later = late + REMEMBER;
        assert_eq!(
            why(tokens.redeem(&token, 7, much_later).unwrap_err()),
            FdTokenState::Unknown
        );
    }

    #[test]
    fn a_session_has_a_bounded_number_of_waiting_tokens() {
        let mut tokens = FdTokens::new(Duration::from_secs(10));
        let now = Instant::now();
        let (a, b) = (session(), session());
        let issued: Vec<String> = (0..MAX_WAITING_PER_SESSION)
            .map(|_| tokens.issue(&a, 1, (), now).unwrap())
            .collect();
        assert_eq!(
            tokens.issue(&a, 1, (), now).unwrap_err(),
            Error::LimitExceeded {
                limit: "fd_tokens_per_session",
                value: MAX_WAITING_PER_SESSION as u64
            }
        );
        tokens.issue(&b, 1, (), now).unwrap();
        tokens.redeem(&issued[0], 1, now).unwrap();
        tokens.issue(&a, 1, (), now).unwrap();
        tokens.forget_session(&a);
        assert_eq!(tokens.waiting(), 1);
        assert_eq!(
            why(tokens.redeem(&issued[1], 1, now).unwrap_err()),
            FdTokenState::Unknown
        );
    }
}
