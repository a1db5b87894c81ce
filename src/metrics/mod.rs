//! Prometheus metrics: the counters, gauges and histograms ptxd keeps, their
//! text exposition (format 0.0.4) and the HTTP/1.1 endpoint that serves it at
//! `GET /metrics` (hyper and axum, the HTTP stack tonic already brings).
//!
//! This module owns the [`Metrics`] registry (recording, the refresh hook and
//! what [`Metrics::render`] emits); `exposition` writes the text format and
//! `http` checks the listen address and serves the endpoint. Their public
//! items are re-exported here, so `crate::metrics::...` is the one path.
//!
//! Invariants:
//! - Recording never blocks on I/O and never panics: plain series are
//!   atomics; labelled series sit in a `Mutex<BTreeMap>` whose lock is held
//!   only to bump or copy a number (a poisoned lock is still used: the maps
//!   hold plain numbers, no invariant a panic could have broken).
//! - Every series ptxd can ever emit for a closed label set (cache, mode,
//!   refusal reason) is rendered from the start, at 0, so a rate over a
//!   counter that first moves between two scrapes is never lost.
//! - A histogram's `_count` and its `+Inf` bucket are computed from the same
//!   snapshot of its buckets, so they agree even while launches record
//!   concurrently with a scrape.
//! - The endpoint binds loopback unless told otherwise
//!   ([`check_listen_addr`]); it takes a request head of at most
//!   [`MAX_REQUEST_HEAD_BYTES`] within [`REQUEST_TIMEOUT`], answers once and
//!   closes, and holds at most [`MAX_CONNECTIONS`] connections at a time.

mod exposition;
mod http;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use self::exposition::Exposition;

pub use self::exposition::CONTENT_TYPE;
pub use self::http::{
    bind, check_listen_addr, serve, MetricsError, MAX_CONNECTIONS, MAX_REQUEST_HEAD_BYTES,
    REQUEST_TIMEOUT,
};

/// Load latency buckets, in seconds: a cache hit takes microseconds, a
/// driver JIT of a PTX module ~150 ms (measured on an H200), a large
/// module seconds.
const LOAD_BUCKETS: &[f64] = &[
    0.000_01, 0.000_05, 0.000_1, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
];

/// Launch latency buckets, in seconds: an async launch is ~4 µs, a
/// synchronous one ~9 µs plus the kernel's own run time.
const LAUNCH_BUCKETS: &[f64] = &[
    0.000_005, 0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005,
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// A latency histogram with fixed bucket bounds.
#[derive(Debug)]
struct Histogram {
    /// Upper bounds in seconds, ascending.
    bounds: &'static [f64],
    /// Per-bucket (not cumulative) counts; one more than `bounds`, the last
    /// one for observations above every bound.
    buckets: Box<[AtomicU64]>,
    sum_nanos: AtomicU64,
}

/// A consistent copy of a histogram, cumulative as the exposition wants it.
struct HistogramSnapshot {
    bounds: &'static [f64],
    /// Cumulative counts, one per bound.
    cumulative: Vec<u64>,
    count: u64,
    sum_seconds: f64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_nanos: AtomicU64::new(0),
        }
    }

    fn observe(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        let index = self
            .bounds
            .iter()
            .position(|&bound| seconds <= bound)
            .unwrap_or(self.bounds.len());
        if let Some(bucket) = self.buckets.get(index) {
            bucket.fetch_add(1, Ordering::Relaxed);
        }
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    fn snapshot(&self) -> HistogramSnapshot {
        let mut running = 0u64;
        let mut cumulative = Vec::with_capacity(self.bounds.len());
        for bucket in self.buckets.iter() {
            running = running.saturating_add(bucket.load(Ordering::Relaxed));
            cumulative.push(running);
        }
        // The last entry is the +Inf bucket: it is the count.
        let count = cumulative.pop().unwrap_or(0);
        HistogramSnapshot {
            bounds: self.bounds,
            cumulative,
            count,
            sum_seconds: self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

/// The per-device series, keyed by device UUID.
#[derive(Debug, Default, Clone, Copy)]
struct DeviceSeries {
    restarts: u64,
    generation: u64,
    kernel_faults: u64,
    /// 1 while the device's executor runs as a CUDA MPS client.
    mps_enabled: u64,
    executor_available: u64,
}

/// A per-device family: name, type, help, and which number it shows.
type DeviceFamily = (
    &'static str,
    &'static str,
    &'static str,
    fn(&DeviceSeries) -> u64,
);

/// Sets gauges from live state just before a render.
type Refresh = Box<dyn Fn(&Metrics) + Send + Sync>;

/// Everything ptxd reports to Prometheus. Shared as `Arc<Metrics>` between
/// the service (which records) and the endpoint (which renders).
pub struct Metrics {
    loads_hit: Histogram,
    loads_miss: Histogram,
    launches_sync: Histogram,
    launches_async: Histogram,
    refusals: Mutex<BTreeMap<&'static str, u64>>,
    sessions: AtomicU64,
    buffers: AtomicU64,
    buffer_bytes: AtomicU64,
    slots_used: AtomicU64,
    slot_capacity: u32,
    loaded_bytes: AtomicU64,
    loaded_bytes_limit: AtomicU64,
    devices: Mutex<BTreeMap<String, DeviceSeries>>,
    refresh: OnceLock<Refresh>,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics")
            .field("slot_capacity", &self.slot_capacity)
            .field("refresh", &self.refresh.get().is_some())
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Metrics {
    /// New metrics for a slot table of `slot_capacity` slots, every series
    /// at zero.
    pub fn new(slot_capacity: u32) -> Arc<Metrics> {
        let refusals = (1..)
            .map_while(|value| ptxd_proto::v1::Reason::try_from(value).ok())
            .map(|reason| (reason.wire_name(), 0))
            .collect();
        Arc::new(Metrics {
            loads_hit: Histogram::new(LOAD_BUCKETS),
            loads_miss: Histogram::new(LOAD_BUCKETS),
            launches_sync: Histogram::new(LAUNCH_BUCKETS),
            launches_async: Histogram::new(LAUNCH_BUCKETS),
            refusals: Mutex::new(refusals),
            sessions: AtomicU64::new(0),
            buffers: AtomicU64::new(0),
            buffer_bytes: AtomicU64::new(0),
            slots_used: AtomicU64::new(0),
            slot_capacity,
            loaded_bytes: AtomicU64::new(0),
            loaded_bytes_limit: AtomicU64::new(0),
            devices: Mutex::new(BTreeMap::new()),
            refresh: OnceLock::new(),
        })
    }

    /// Installs the hook [`Metrics::render`] calls first, to set the gauges
    /// (sessions, buffers, slots, generations) from the daemon's live state
    /// rather than tracking every change. Returns false, keeping the first
    /// hook, when one is already installed. The hook should hold only a
    /// `Weak` to state that owns these metrics, or the two keep each other
    /// alive.
    pub fn set_refresh(&self, refresh: impl Fn(&Metrics) + Send + Sync + 'static) -> bool {
        self.refresh.set(Box::new(refresh)).is_ok()
    }

    /// A kernel load that succeeded, from request to handle.
    pub fn record_load(&self, cache_hit: bool, elapsed: Duration) {
        let histogram = if cache_hit {
            &self.loads_hit
        } else {
            &self.loads_miss
        };
        histogram.observe(elapsed);
    }

    /// A launch that succeeded: to completion when `sync`, else to enqueue.
    pub fn record_launch(&self, sync: bool, elapsed: Duration) {
        let histogram = if sync {
            &self.launches_sync
        } else {
            &self.launches_async
        };
        histogram.observe(elapsed);
    }

    /// A refusal, by its wire name (`Reason::wire_name`, e.g.
    /// `"STALE_KERNEL"`).
    pub fn record_refusal(&self, reason: &'static str) {
        *lock(&self.refusals).entry(reason).or_insert(0) += 1;
    }

    /// The number of open sessions.
    pub fn set_sessions(&self, n: u64) {
        self.sessions.store(n, Ordering::Relaxed);
    }

    /// The registered buffers over all sessions, and their total size.
    pub fn set_buffers(&self, count: u64, bytes: u64) {
        self.buffers.store(count, Ordering::Relaxed);
        self.buffer_bytes.store(bytes, Ordering::Relaxed);
    }

    /// The slots in use, including those of dead generations not yet
    /// reclaimed.
    pub fn set_slots_used(&self, used: u64) {
        self.slots_used.store(used, Ordering::Relaxed);
    }

    /// Artifact bytes the executors hold for loaded kernels, and the limit
    /// (`--max-loaded-bytes`).
    pub fn set_loaded_bytes(&self, loaded: u64, limit: u64) {
        self.loaded_bytes.store(loaded, Ordering::Relaxed);
        self.loaded_bytes_limit.store(limit, Ordering::Relaxed);
    }

    /// A device's executor was restarted (after a fault or an exit).
    pub fn record_executor_restart(&self, device_uuid: &str) {
        self.with_device(device_uuid, |series| series.restarts += 1);
    }

    /// A device's executor now runs `generation`.
    pub fn set_generation(&self, device_uuid: &str, generation: u64) {
        self.with_device(device_uuid, |series| series.generation = generation);
    }

    /// Whether a device's executor runs as a CUDA MPS client (from its
    /// hello, at every executor start).
    pub fn set_mps_enabled(&self, device_uuid: &str, enabled: bool) {
        self.with_device(device_uuid, |series| {
            series.mps_enabled = u64::from(enabled)
        });
    }

    /// Whether a device has a live executor now (0 while its restarts
    /// fail and requests for it are refused `EXECUTOR_UNAVAILABLE`).
    pub fn set_executor_available(&self, device_uuid: &str, available: bool) {
        self.with_device(device_uuid, |series| {
            series.executor_available = u64::from(available)
        });
    }

    /// A kernel faulted on a device.
    pub fn record_kernel_fault(&self, device_uuid: &str) {
        self.with_device(device_uuid, |series| series.kernel_faults += 1);
    }

    fn with_device(&self, device_uuid: &str, update: impl FnOnce(&mut DeviceSeries)) {
        let mut devices = lock(&self.devices);
        if let Some(series) = devices.get_mut(device_uuid) {
            update(series);
        } else {
            let mut series = DeviceSeries::default();
            update(&mut series);
            devices.insert(device_uuid.to_owned(), series);
        }
    }

    /// The text exposition (format 0.0.4) of every series, with `# HELP`
    /// and `# TYPE` lines.
    pub fn render(&self) -> String {
        if let Some(refresh) = self.refresh.get() {
            refresh(self);
        }
        let mut out = Exposition(String::with_capacity(8 * 1024));

        out.family(
            "ptxd_loads_total",
            "counter",
            "Kernel loads that succeeded, by kernel cache hit or miss.",
        );
        let hit = self.loads_hit.snapshot();
        let miss = self.loads_miss.snapshot();
        out.sample("ptxd_loads_total", &[("cache", "hit")], hit.count);
        out.sample("ptxd_loads_total", &[("cache", "miss")], miss.count);
        out.family(
            "ptxd_load_duration_seconds",
            "histogram",
            "Time a successful kernel load took inside ptxd.",
        );
        out.histogram("ptxd_load_duration_seconds", ("cache", "hit"), &hit);
        out.histogram("ptxd_load_duration_seconds", ("cache", "miss"), &miss);

        out.family(
            "ptxd_launches_total",
            "counter",
            "Launches that succeeded, by mode (sync: answered after completion).",
        );
        let sync = self.launches_sync.snapshot();
        let asynchronous = self.launches_async.snapshot();
        out.sample("ptxd_launches_total", &[("mode", "sync")], sync.count);
        out.sample(
            "ptxd_launches_total",
            &[("mode", "async")],
            asynchronous.count,
        );
        out.family(
            "ptxd_launch_duration_seconds",
            "histogram",
            "Time a successful launch took inside ptxd: to completion when sync, to enqueue when async.",
        );
        out.histogram("ptxd_launch_duration_seconds", ("mode", "sync"), &sync);
        out.histogram(
            "ptxd_launch_duration_seconds",
            ("mode", "async"),
            &asynchronous,
        );

        out.family(
            "ptxd_refusals_total",
            "counter",
            "Requests refused, by reason (the google.rpc.ErrorInfo reason).",
        );
        let refusals = lock(&self.refusals).clone();
        for (reason, count) in refusals {
            out.sample("ptxd_refusals_total", &[("reason", reason)], count);
        }

        let gauges: [(&str, &str, u64); 7] = [
            (
                "ptxd_sessions",
                "Open sessions.",
                self.sessions.load(Ordering::Relaxed),
            ),
            (
                "ptxd_buffers",
                "Registered buffers over all sessions.",
                self.buffers.load(Ordering::Relaxed),
            ),
            (
                "ptxd_buffer_bytes",
                "Total size of the registered buffers, in bytes.",
                self.buffer_bytes.load(Ordering::Relaxed),
            ),
            (
                "ptxd_slots_used",
                "Kernel slots in use, including slots of dead generations not yet reclaimed.",
                self.slots_used.load(Ordering::Relaxed),
            ),
            (
                "ptxd_slots_capacity",
                "Kernel slots in the slot table.",
                u64::from(self.slot_capacity),
            ),
            (
                "ptxd_loaded_artifact_bytes",
                "Artifact bytes of the loaded kernels (what the executors hold for them).",
                self.loaded_bytes.load(Ordering::Relaxed),
            ),
            (
                "ptxd_loaded_artifact_bytes_limit",
                "The limit on loaded artifact bytes over all executors (--max-loaded-bytes).",
                self.loaded_bytes_limit.load(Ordering::Relaxed),
            ),
        ];
        for (name, help, value) in gauges {
            out.family(name, "gauge", help);
            out.sample(name, &[], value);
        }

        let devices = lock(&self.devices).clone();
        let per_device: [DeviceFamily; 5] = [
            (
                "ptxd_executor_restarts_total",
                "counter",
                "Executor restarts, by device UUID.",
                |series| series.restarts,
            ),
            (
                "ptxd_device_generation",
                "gauge",
                "The device generation the device's executor runs now.",
                |series| series.generation,
            ),
            (
                "ptxd_kernel_faults_total",
                "counter",
                "Kernels that faulted on the device, by device UUID.",
                |series| series.kernel_faults,
            ),
            (
                "ptxd_device_mps_enabled",
                "gauge",
                "1 while the device's executor runs as a CUDA MPS client, by device UUID.",
                |series| series.mps_enabled,
            ),
            (
                "ptxd_device_executor_available",
                "gauge",
                "1 while the device has a live executor, 0 while it has none (a restart failing), by device UUID.",
                |series| series.executor_available,
            ),
        ];
        for (name, kind, help, value) in per_device {
            out.family(name, kind, help);
            for (device, series) in &devices {
                out.sample(name, &[("device", device)], value(series));
            }
        }

        out.0
    }
}

/// The strict exposition reader the integration tests use too (the metrics
/// contract, `tests/ops/exposition.rs`), for the unit tests of this module
/// and its children.
#[cfg(test)]
#[path = "../../tests/ops/exposition.rs"]
mod strict_reader;

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use rand::Rng;

    use super::strict_reader::Exposition as Parsed;

    /// Renders `metrics` and parses the text strictly.
    pub(super) fn parse(metrics: &Metrics) -> Parsed {
        let text = metrics.render();
        Parsed::parse(&text).unwrap_or_else(|error| panic!("{error}\n---\n{text}"))
    }

    #[test]
    fn fresh_metrics_render_every_family_at_zero() {
        let metrics = Metrics::new(128);
        let parsed = parse(&metrics);
        for (family, kind) in [
            ("ptxd_loads_total", "counter"),
            ("ptxd_load_duration_seconds", "histogram"),
            ("ptxd_launches_total", "counter"),
            ("ptxd_launch_duration_seconds", "histogram"),
            ("ptxd_refusals_total", "counter"),
            ("ptxd_sessions", "gauge"),
            ("ptxd_buffers", "gauge"),
            ("ptxd_buffer_bytes", "gauge"),
            ("ptxd_slots_used", "gauge"),
            ("ptxd_slots_capacity", "gauge"),
            ("ptxd_loaded_artifact_bytes", "gauge"),
            ("ptxd_loaded_artifact_bytes_limit", "gauge"),
            ("ptxd_executor_restarts_total", "counter"),
            ("ptxd_device_generation", "gauge"),
            ("ptxd_kernel_faults_total", "counter"),
            ("ptxd_device_mps_enabled", "gauge"),
            ("ptxd_device_executor_available", "gauge"),
        ] {
            assert_eq!(parsed.kind(family), Some(kind), "{family}");
        }
        assert_eq!(parsed.value("ptxd_slots_capacity", &[]), Some(128.0));
        assert_eq!(
            parsed.value("ptxd_loads_total", &[("cache", "miss")]),
            Some(0.0)
        );
        assert_eq!(
            parsed.value("ptxd_launches_total", &[("mode", "async")]),
            Some(0.0)
        );
        // Every reason of the closed list is there from the start.
        for value in 1.. {
            let Ok(reason) = ptxd_proto::v1::Reason::try_from(value) else {
                break;
            };
            assert_eq!(
                parsed.value("ptxd_refusals_total", &[("reason", reason.wire_name())]),
                Some(0.0),
                "{reason:?}"
            );
        }
        assert_eq!(
            parsed.value("ptxd_refusals_total", &[("reason", "UNSPECIFIED")]),
            None
        );
    }

    /// Random events, recorded and counted on the side: every series must
    /// show exactly the reference's count, sum and bucket.
    #[test]
    fn series_move_exactly_as_recorded() {
        let mut rng = rand::rng();
        let metrics = Metrics::new(rng.random_range(1..4096));
        let reasons = [
            "STALE_KERNEL",
            "SLOT_BANK_FULL",
            "NON_SCALAR_ABI",
            "DRAINING",
        ];
        let devices = ["GPU-0a1b", "GPU-ffee", "HOST-0"];
        let mut loads = [0u64; 2];
        let mut launches = [0u64; 2];
        let mut launch_nanos = [0u128; 2];
        let mut launch_le_50us = [0u64; 2];
        let mut refusals = BTreeMap::<&str, u64>::new();
        let mut restarts = BTreeMap::<&str, u64>::new();
        let mut faults = BTreeMap::<&str, u64>::new();
        let mut generations = BTreeMap::<&str, u64>::new();
        let mut gauges = (0u64, 0u64, 0u64, 0u64);
        for _ in 0..rng.random_range(200..2000) {
            match rng.random_range(0..9) {
                0 => {
                    let hit = rng.random_bool(0.5);
                    metrics.record_load(hit, Duration::from_micros(rng.random_range(1..500_000)));
                    loads[usize::from(hit)] += 1;
                }
                1 => {
                    let sync = rng.random_bool(0.5);
                    let elapsed = Duration::from_nanos(rng.random_range(100..2_000_000_000));
                    metrics.record_launch(sync, elapsed);
                    launches[usize::from(sync)] += 1;
                    launch_nanos[usize::from(sync)] += elapsed.as_nanos();
                    if elapsed <= Duration::from_micros(50) {
                        launch_le_50us[usize::from(sync)] += 1;
                    }
                }
                2 => {
                    let reason = reasons[rng.random_range(0..reasons.len())];
                    metrics.record_refusal(reason);
                    *refusals.entry(reason).or_default() += 1;
                }
                3 => {
                    gauges.0 = rng.random();
                    metrics.set_sessions(gauges.0);
                }
                4 => {
                    gauges.1 = rng.random_range(0..1 << 40);
                    gauges.2 = rng.random_range(0..1 << 52);
                    metrics.set_buffers(gauges.1, gauges.2);
                }
                5 => {
                    gauges.3 = rng.random_range(0..4096);
                    metrics.set_slots_used(gauges.3);
                }
                6 => {
                    let device = devices[rng.random_range(0..devices.len())];
                    metrics.record_executor_restart(device);
                    *restarts.entry(device).or_default() += 1;
                }
                7 => {
                    let device = devices[rng.random_range(0..devices.len())];
                    let generation = rng.random_range(0..1 << 50);
                    metrics.set_generation(device, generation);
                    generations.insert(device, generation);
                }
                _ => {
                    let device = devices[rng.random_range(0..devices.len())];
                    metrics.record_kernel_fault(device);
                    *faults.entry(device).or_default() += 1;
                }
            }
        }
        let parsed = parse(&metrics);
        let exact = |value: u64| Some(value as f64);
        for (index, cache) in ["miss", "hit"].into_iter().enumerate() {
            assert_eq!(
                parsed.value("ptxd_loads_total", &[("cache", cache)]),
                exact(loads[index])
            );
            assert_eq!(
                parsed.value("ptxd_load_duration_seconds_count", &[("cache", cache)]),
                exact(loads[index])
            );
        }
        for (index, mode) in ["async", "sync"].into_iter().enumerate() {
            assert_eq!(
                parsed.value("ptxd_launches_total", &[("mode", mode)]),
                exact(launches[index])
            );
            assert_eq!(
                parsed.value(
                    "ptxd_launch_duration_seconds_bucket",
                    &[("mode", mode), ("le", "+Inf")]
                ),
                exact(launches[index])
            );
            assert_eq!(
                parsed.value(
                    "ptxd_launch_duration_seconds_bucket",
                    &[("mode", mode), ("le", "0.00005")]
                ),
                exact(launch_le_50us[index])
            );
            let sum = parsed
                .value("ptxd_launch_duration_seconds_sum", &[("mode", mode)])
                .unwrap();
            let expected = launch_nanos[index] as f64 / 1e9;
            assert!(
                (sum - expected).abs() <= expected * 1e-9 + 1e-9,
                "{sum} vs {expected}"
            );
        }
        for reason in reasons {
            assert_eq!(
                parsed.value("ptxd_refusals_total", &[("reason", reason)]),
                exact(refusals.get(reason).copied().unwrap_or(0))
            );
        }
        assert_eq!(parsed.value("ptxd_sessions", &[]), exact(gauges.0));
        assert_eq!(parsed.value("ptxd_buffers", &[]), exact(gauges.1));
        assert_eq!(parsed.value("ptxd_buffer_bytes", &[]), exact(gauges.2));
        assert_eq!(parsed.value("ptxd_slots_used", &[]), exact(gauges.3));
        for device in devices {
            let known = restarts.contains_key(device)
                || faults.contains_key(device)
                || generations.contains_key(device);
            let expect = |map: &BTreeMap<&str, u64>| {
                known.then(|| map.get(device).copied().unwrap_or(0) as f64)
            };
            let labels = [("device", device)];
            assert_eq!(
                parsed.value("ptxd_executor_restarts_total", &labels),
                expect(&restarts)
            );
            assert_eq!(
                parsed.value("ptxd_kernel_faults_total", &labels),
                expect(&faults)
            );
            assert_eq!(
                parsed.value("ptxd_device_generation", &labels),
                expect(&generations)
            );
        }
    }

    #[test]
    fn the_refresh_hook_sets_gauges_at_every_render() {
        let metrics = Metrics::new(8);
        let renders = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&renders);
        assert!(metrics.set_refresh(move |metrics| {
            let n = counted.fetch_add(1, Ordering::Relaxed) + 1;
            metrics.set_sessions(n);
            metrics.set_generation("GPU-77", 100 + n);
        }));
        assert!(!metrics.set_refresh(|_| {}), "a second hook is refused");
        for n in 1..=3u64 {
            let parsed = parse(&metrics);
            assert_eq!(parsed.value("ptxd_sessions", &[]), Some(n as f64));
            assert_eq!(
                parsed.value("ptxd_device_generation", &[("device", "GPU-77")]),
                Some((100 + n) as f64)
            );
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod mps_tests {
    use super::*;

    #[test]
    fn the_executor_gauge_follows_each_device() {
        let metrics = Metrics::new(8);
        for (a, b) in [(true, false), (false, true), (false, false), (true, true)] {
            metrics.set_executor_available("GPU-a", a);
            metrics.set_executor_available("GPU-b", b);
            let parsed = tests::parse(&metrics);
            for (device, up) in [("GPU-a", a), ("GPU-b", b)] {
                assert_eq!(
                    parsed.value("ptxd_device_executor_available", &[("device", device)]),
                    Some(if up { 1.0 } else { 0.0 }),
                    "{device}"
                );
            }
        }
    }

    #[test]
    fn the_mps_gauge_follows_each_device() {
        let metrics = Metrics::new(8);
        let parse = |metrics: &Metrics| tests::parse(metrics);
        for (a, b) in [(true, false), (false, true), (true, true), (false, false)] {
            metrics.set_mps_enabled("GPU-a", a);
            metrics.set_mps_enabled("GPU-b", b);
            let parsed = parse(&metrics);
            for (device, on) in [("GPU-a", a), ("GPU-b", b)] {
                assert_eq!(
                    parsed.value("ptxd_device_mps_enabled", &[("device", device)]),
                    Some(if on { 1.0 } else { 0.0 }),
                    "{device}"
                );
            }
        }
    }
}
