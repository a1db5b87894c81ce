//! What the daemon reports about its work: the one place the front and the
//! gRPC layer record loads, launches, refusals, faults and restarts, so that
//! metrics (when enabled) see exactly what the logs see.

use std::time::Duration;

/// Records observations; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Observer {}

impl Observer {
    pub fn refusal(&self, reason: &'static str) {
        let _ = reason;
    }

    pub fn load(&self, cache_hit: bool, elapsed: Duration) {
        let _ = (cache_hit, elapsed);
    }

    pub fn launch(&self, sync: bool, elapsed: Duration) {
        let _ = (sync, elapsed);
    }

    pub fn kernel_fault(&self, device_uuid: &str) {
        let _ = device_uuid;
    }

    pub fn executor_restart(&self, device_uuid: &str) {
        let _ = device_uuid;
    }
}
