//! What the daemon reports about its work: the one place the front and the
//! gRPC layer record loads, launches, refusals, faults and restarts, so that
//! metrics (when enabled) see exactly what the logs see.

use std::sync::Arc;
use std::time::Duration;

use crate::metrics::Metrics;

/// Records observations into the metrics, when they are enabled; cheap to
/// clone.
#[derive(Debug, Clone, Default)]
pub struct Observer {
    metrics: Option<Arc<Metrics>>,
}

impl Observer {
    pub fn new(metrics: Option<Arc<Metrics>>) -> Self {
        Observer { metrics }
    }

    pub fn refusal(&self, reason: &'static str) {
        if let Some(m) = &self.metrics {
            m.record_refusal(reason);
        }
    }

    pub fn load(&self, cache_hit: bool, elapsed: Duration) {
        if let Some(m) = &self.metrics {
            m.record_load(cache_hit, elapsed);
        }
    }

    pub fn launch(&self, sync: bool, elapsed: Duration) {
        if let Some(m) = &self.metrics {
            m.record_launch(sync, elapsed);
        }
    }

    pub fn kernel_fault(&self, device_uuid: &str) {
        if let Some(m) = &self.metrics {
            m.record_kernel_fault(device_uuid);
        }
    }

    pub fn executor_restart(&self, device_uuid: &str) {
        if let Some(m) = &self.metrics {
            m.record_executor_restart(device_uuid);
        }
    }
}
