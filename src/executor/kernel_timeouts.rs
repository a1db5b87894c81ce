//! Kernel timeouts counted per session, across executor restarts.
//!
//! Every executor tells the front when a launch outlives the per-launch
//! budget (`KernelTimeout`, naming the session's stream) before it answers
//! that launch; the link that reads the message records it here at once, so
//! by the time the client hears `KERNEL_TIMEOUT` the count already includes
//! it. A session whose launches timed out `limit` times is refused every
//! further launch: on a CUDA device each timeout restarts the executor for
//! everyone, so one session must not be able to do it again and again.
//!
//! Invariant: a count is kept from the first timeout until the session is
//! released ([`KernelTimeouts::forget`]), whatever happens to the executors.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::error::Error;

/// The name of the limit in refusals and in `--help`.
pub const LIMIT_NAME: &str = "max_kernel_timeouts_per_session";

/// Timeouts per session stream.
#[derive(Debug)]
pub struct KernelTimeouts {
    limit: u32,
    counts: Mutex<HashMap<u64, u32>>,
}

impl KernelTimeouts {
    /// Refuses a session's launches once `limit` of them timed out.
    pub fn new(limit: u32) -> KernelTimeouts {
        KernelTimeouts {
            limit,
            counts: Mutex::new(HashMap::new()),
        }
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, HashMap<u64, u32>> {
        // A plain map: a panic while holding the lock cannot leave it
        // inconsistent.
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts one timeout of a launch on `stream`; returns the new count.
    pub fn record(&self, stream: u64) -> u32 {
        let mut counts = self.counts();
        let count = counts.entry(stream).or_insert(0);
        *count = count.saturating_add(1);
        *count
    }

    /// The limit.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// How many launches on `stream` timed out.
    pub fn count(&self, stream: u64) -> u32 {
        self.counts().get(&stream).copied().unwrap_or(0)
    }

    /// Refuses a launch on `stream` once the session reached the limit.
    pub fn check(&self, stream: u64) -> Result<(), Error> {
        let count = self.count(stream);
        if count >= self.limit {
            return Err(Error::LimitExceeded {
                limit: LIMIT_NAME,
                value: u64::from(count),
            });
        }
        Ok(())
    }

    /// Drops the count of a released session's stream.
    pub fn forget(&self, stream: u64) {
        self.counts().remove(&stream);
    }
}

/// The executor's copy of one session's timeout count, for the launches
/// that never pass through the front (its ring): seeded from the front's
/// count when the ring opens, raised by every timeout of the session in
/// this executor (ring or gRPC), refused at the same limit. A timeout in
/// another executor reaches it when the ring is next opened.
#[derive(Debug)]
pub struct TimeoutAllowance {
    limit: u32,
    count: std::sync::atomic::AtomicU32,
}

impl TimeoutAllowance {
    /// A session that has timed out `count` times, refused at `limit`
    /// (0: no limit known, never refused here).
    pub fn new(count: u32, limit: u32) -> TimeoutAllowance {
        TimeoutAllowance {
            limit,
            count: count.into(),
        }
    }

    /// Counts one timeout.
    pub fn record(&self) {
        let _ = self.count.fetch_update(
            std::sync::atomic::Ordering::AcqRel,
            std::sync::atomic::Ordering::Acquire,
            |c| c.checked_add(1),
        );
    }

    /// Refuses a launch once the session reached the limit, as the front
    /// refuses a gRPC launch ([`KernelTimeouts::check`]).
    pub fn check(&self) -> Result<(), Error> {
        let count = self.count.load(std::sync::atomic::Ordering::Acquire);
        if self.limit > 0 && count >= self.limit {
            return Err(Error::LimitExceeded {
                limit: LIMIT_NAME,
                value: u64::from(count),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_refused_at_the_limit_and_forgotten_when_released() {
        let timeouts = KernelTimeouts::new(2);
        assert!(timeouts.check(7).is_ok());
        assert_eq!(timeouts.record(7), 1);
        assert!(timeouts.check(7).is_ok());
        assert_eq!(timeouts.record(7), 2);
        assert_eq!(
            timeouts.check(7),
            Err(Error::LimitExceeded {
                limit: LIMIT_NAME,
                value: 2
            })
        );
        assert!(timeouts.check(8).is_ok(), "other sessions are unaffected");
        timeouts.forget(7);
        assert!(timeouts.check(7).is_ok());
    }

    #[test]
    fn an_allowance_refuses_at_the_same_limit_and_zero_is_unlimited() {
        let allowance = TimeoutAllowance::new(1, 3);
        assert!(allowance.check().is_ok());
        allowance.record();
        assert!(allowance.check().is_ok());
        allowance.record();
        assert_eq!(
            allowance.check(),
            Err(Error::LimitExceeded {
                limit: LIMIT_NAME,
                value: 3
            })
        );
        let unlimited = TimeoutAllowance::new(u32::MAX, 0);
        unlimited.record();
        assert!(unlimited.check().is_ok());
    }
}
