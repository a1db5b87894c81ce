//! Start, device choice, GetInfo, drain and shutdown.
//!
//! Invariants:
//! - Every configured device has a running executor before the front
//!   accepts its first request; a device whose executor cannot start fails
//!   the start rather than serving without it.
//! - Once the drain begins no verb starts new work (`State::draining`), and
//!   every session is told before its lease stream ends.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ptxd_proto::executor::DeviceDesc;
use tokio::sync::{mpsc, watch};

use super::{
    kernels, DeviceState, Front, State, Usage, CANONICAL_MEMO_BYTES, CANONICAL_MEMO_ENTRIES,
    REFUSAL_MEMO_BYTES, REFUSAL_MEMO_ENTRIES,
};
use crate::buffers::Registry;
use crate::config::{BackendChoice, CacheScope, Limits, ServeConfig};
use crate::executor::supervisor::{probe_cuda, ExecutorCommand, ExecutorLink, LinkConfig};
use crate::fd_tokens::FdTokens;
use crate::handles::{BootId, GenerationCounter};
use crate::observe::Observer;
use crate::ptx;
use crate::sessions::{Caller, LeaseEvent};
use crate::slots::SlotTable;

/// Why the front could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("the CUDA backend was requested but is unavailable: {0}")]
    CudaUnavailable(String),
    #[error("no CUDA device matches {0:?}")]
    NoMatchingDevice(String),
    #[error("executor for device {device} did not start: {error}")]
    Executor { device: String, error: String },
    #[error(transparent)]
    KernelCache(#[from] crate::executor::kernel_cache::CacheError),
}

/// One device, as GetInfo reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceReport {
    pub ordinal: u32,
    pub uuid: String,
    pub name: String,
    pub compute_major: u32,
    pub compute_minor: u32,
    pub generation: u64,
    pub total_memory: u64,
    pub available: bool,
    pub restarts: u64,
    /// 0 while no executor is up.
    pub executor_pid: u32,
    /// Whether the executor runs as an MPS client, as its latest hello
    /// said.
    pub mps_enabled: bool,
}

/// GetInfo: the daemon, its limits, and what the caller's tenant holds.
#[derive(Debug, Clone)]
pub struct Info {
    pub backend: &'static str,
    pub boot: BootId,
    pub devices: Vec<DeviceReport>,
    pub slots_used: u32,
    pub limits: Limits,
    pub sessions: u32,
    pub loaded_bytes: u64,
    pub caller_usage: Usage,
    pub kernel_cache_scope: CacheScope,
}

impl super::DeviceState {
    /// Whether the device's executor runs as a CUDA MPS client: as the
    /// live executor's hello said, else as the first one's did.
    pub(super) fn mps_enabled(&self) -> bool {
        self.live_link()
            .and_then(|l| l.hello.devices.first())
            .map_or(self.desc.mps_enabled, |h| h.mps_enabled)
    }
}

impl Front {
    /// Chooses the backend, starts an executor per device and the supervisor.
    pub async fn start(config: &ServeConfig, observer: Observer) -> Result<Arc<Front>, StartError> {
        // The kernel cache's directory is created and checked once, here,
        // so that a bad one stops the daemon rather than every executor
        // quietly compiling without it.
        if let Some(dir) = &config.kernel_cache_dir {
            crate::executor::kernel_cache::KernelCache::open(dir, config.kernel_cache_max_bytes)?;
        }
        // The verdict cache only saves verification time: a `verdicts`
        // path it cannot use (another user's, a link, a file) leaves the
        // daemon verifying every kernel after a restart, never stopped.
        let verdicts = match &config.kernel_cache_dir {
            Some(dir) => {
                match super::verdict_cache::VerdictCache::open(dir, config.verdict_cache_max_bytes)
                {
                    Ok(cache) => Some(Arc::new(cache)),
                    Err(e) => {
                        tracing::warn!(error = %e, "the verdict cache is not used");
                        None
                    }
                }
            }
            None => None,
        };
        let boot = BootId::random();
        let generations = GenerationCounter::new(boot);
        let (backend, devices) = choose_devices(config).await?;
        let (deaths_tx, deaths_rx) = mpsc::unbounded_channel();
        let executor = LinkConfig::from_config(config);
        let mut states = Vec::new();
        for (desc, command) in devices {
            let generation = generations.next();
            let index = states.len();
            let link =
                ExecutorLink::spawn(index, generation, &command, &executor, deaths_tx.clone())
                    .await
                    .map_err(|e| StartError::Executor {
                        device: desc.uuid.clone(),
                        error: e.to_string(),
                    })?;
            let desc = link.hello.devices.first().cloned().unwrap_or(desc);
            tracing::info!(device = %desc.uuid, name = %desc.name, %generation, pid = link.pid(), "executor up");
            states.push(DeviceState {
                desc,
                command,
                generation,
                link: Some(link),
                restarts: 0,
                restarting: false,
            });
        }
        let limits = Limits::from_config(config);
        let front = Arc::new(Front {
            boot,
            backend,
            generations,
            state: Mutex::new(State {
                sessions: HashMap::new(),
                slots: SlotTable::new(limits.slots, boot),
                registry: Registry::new(boot),
                devices: states,
                draining: false,
                fd_tokens: FdTokens::new(limits.fd_token_ttl),
            }),
            limits,
            deaths: deaths_tx,
            load_locks: Mutex::new(HashMap::new()),
            next_module: AtomicU64::new(1),
            next_stream: AtomicU64::new(1),
            available: watch::Sender::new(true),
            observer,
            executor,
            trust: config.trust_unverified_artifacts.clone(),
            cache_scope: config.kernel_cache_scope,
            idle_reclaim_after: config.idle_reclaim_after,
            drain: watch::Sender::new(false),
            drain_timeout: config.drain_timeout,
            canonical: Arc::new(ptx::memo::CanonicalMemo::new(
                ptx::memo::Bounds {
                    entries: CANONICAL_MEMO_ENTRIES,
                    bytes: CANONICAL_MEMO_BYTES,
                },
                ptx::memo::Bounds {
                    entries: REFUSAL_MEMO_ENTRIES,
                    bytes: REFUSAL_MEMO_BYTES,
                },
            )),
            verifications: kernels::VerificationGate::new(
                config.max_concurrent_verifications_per_uid,
            ),
            spares: super::supervise::Spares::new(config.spare_executor),
            verdicts,
        });
        tokio::spawn(front.clone().supervise(deaths_rx));
        for index in 0..front.lock().devices.len() {
            tokio::spawn(front.clone().keep_spare(index));
        }
        Ok(front)
    }

    /// GetInfo: the daemon, its limits, what is loaded, and what the
    /// caller's tenant holds against its quotas.
    pub fn info(&self, caller: Caller) -> Info {
        let state = self.lock();
        Info {
            backend: self.backend,
            boot: self.boot,
            devices: state
                .devices
                .iter()
                .map(|d| DeviceReport {
                    ordinal: d.desc.ordinal,
                    uuid: d.desc.uuid.clone(),
                    name: d.desc.name.clone(),
                    compute_major: d.desc.compute_major,
                    compute_minor: d.desc.compute_minor,
                    generation: d.generation.0,
                    total_memory: d.desc.total_memory,
                    available: d.live_link().is_some(),
                    restarts: d.restarts,
                    executor_pid: d.live_link().map(|l| l.pid()).unwrap_or(0),
                    mps_enabled: d.mps_enabled(),
                })
                .collect(),
            slots_used: state.slots.used(),
            limits: self.limits.clone(),
            sessions: state.sessions.len() as u32,
            loaded_bytes: state.slots.loaded_bytes(),
            caller_usage: state.tenant_usage(caller.tenant()),
            kernel_cache_scope: self.cache_scope,
        }
    }

    /// Begins the drain: refuses new work, tells every session and ends
    /// their lease streams.
    pub fn begin_drain(&self, reason: &str) {
        let mut state = self.lock();
        state.draining = true;
        self.drain.send_replace(true);
        let event = LeaseEvent::Draining {
            reason: reason.to_string(),
        };
        for session in state.sessions.values() {
            session.notify(event.clone());
        }
        self.publish_availability(&state);
    }

    /// Ends every session's lease stream (after the drain notice).
    pub fn end_leases(&self) {
        let state = self.lock();
        for session in state.sessions.values() {
            // The lease stream ends once the queued events are read.
            session.events.close();
        }
    }

    /// Releases every session and stops every executor.
    pub async fn shutdown(&self, grace: Duration) {
        // The executors release every module, mapping, event and stream when
        // they stop, so the sessions are dropped here without a clean-up
        // request per object (a hung executor would make that take minutes).
        let links: Vec<Arc<ExecutorLink>> = {
            let mut state = self.lock();
            state.draining = true;
            let sessions = std::mem::take(&mut state.sessions);
            for id in sessions.keys() {
                for held in state.slots.held_by(id) {
                    let _ = state.slots.release(&held.handle, id);
                }
            }
            state.registry.clear();
            state
                .devices
                .iter_mut()
                .filter_map(|d| d.link.take())
                .collect()
        };
        // A spare still starting sees the drain and stops itself.
        let links: Vec<Arc<ExecutorLink>> =
            links.into_iter().chain(self.spares.take_all()).collect();
        futures_util::future::join_all(links.iter().map(|l| l.shutdown(grace))).await;
    }

    /// The process ids of the devices' waiting spare executors.
    pub fn spare_pids(&self) -> Vec<u32> {
        self.spares.pids()
    }
}

async fn choose_devices(
    config: &ServeConfig,
) -> Result<(&'static str, Vec<(DeviceDesc, ExecutorCommand)>), StartError> {
    let host = || {
        let threads = config.host_threads.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        });
        (0..config.host_devices)
            .map(|index| {
                let desc = DeviceDesc {
                    ordinal: index,
                    uuid: crate::executor::host::host_device_uuid(index),
                    name: "host CPU".into(),
                    ..Default::default()
                };
                (
                    desc,
                    ExecutorCommand::Host {
                        index,
                        threads,
                        checked: config.host_checked,
                    },
                )
            })
            .collect::<Vec<_>>()
    };
    match config.backend {
        BackendChoice::Host => {
            tracing::info!("backend: host (requested)");
            Ok(("host", host()))
        }
        BackendChoice::Cuda | BackendChoice::Auto => match probe_cuda().await {
            Ok(hello) => {
                let selected = select_devices(&hello.devices, &config.devices)?;
                tracing::info!(
                    devices = selected.len(),
                    "backend: cuda (libcuda present, devices answer)"
                );
                Ok(("cuda", selected))
            }
            Err(e) if config.backend == BackendChoice::Auto => {
                tracing::info!(reason = %e, "backend: host (CUDA unavailable)");
                Ok(("host", host()))
            }
            Err(e) => Err(StartError::CudaUnavailable(e.to_string())),
        },
    }
}

fn select_devices(
    devices: &[DeviceDesc],
    spec: &str,
) -> Result<Vec<(DeviceDesc, ExecutorCommand)>, StartError> {
    let chosen: Vec<&DeviceDesc> = if spec.trim() == "all" {
        devices.iter().collect()
    } else {
        let mut chosen = Vec::new();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let device = devices
                .iter()
                .find(|d| d.uuid == item || d.ordinal.to_string() == item)
                .ok_or_else(|| StartError::NoMatchingDevice(item.to_string()))?;
            chosen.push(device);
        }
        chosen
    };
    if chosen.is_empty() {
        return Err(StartError::NoMatchingDevice(spec.to_string()));
    }
    Ok(chosen
        .into_iter()
        .map(|d| {
            (
                d.clone(),
                ExecutorCommand::Cuda {
                    uuid: d.uuid.clone(),
                },
            )
        })
        .collect())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn device_selection_by_uuid_and_ordinal() {
        let devices: Vec<DeviceDesc> = (0..3)
            .map(|i| DeviceDesc {
                ordinal: i,
                uuid: format!("GPU-{i}"),
                ..Default::default()
            })
            .collect();
        assert_eq!(select_devices(&devices, "all").unwrap().len(), 3);
        let picked = select_devices(&devices, "GPU-2, 0").unwrap();
        assert_eq!(
            picked.iter().map(|(d, _)| d.ordinal).collect::<Vec<_>>(),
            vec![2, 0]
        );
        assert!(matches!(
            select_devices(&devices, "GPU-9"),
            Err(StartError::NoMatchingDevice(_))
        ));
    }
}
