//! Reading launch-ring completions in tests (host and GPU suites).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use ptxd_client::{LaunchRing, RingCompletion};

/// How long a test waits for one completion.
pub const WAIT: Duration = Duration::from_secs(10);

/// The next completion; panics if none comes within [`WAIT`].
pub fn next(ring: &mut LaunchRing) -> RingCompletion {
    ring.wait(WAIT).unwrap().expect("a completion within 10 s")
}

/// The reason a completion refused its launch with ("" when it ran).
pub fn refusal(completion: &RingCompletion) -> String {
    match &completion.outcome {
        Ok(()) => String::new(),
        Err(r) => r.reason.clone(),
    }
}
