//! Supervision: an executor's death, its replacement, and the re-opening of
//! what the sessions registered on its device.
//!
//! Invariants:
//! - A device's generation changes only here, before the new executor's
//!   link is published: a death of the new executor during the re-open is
//!   attributed to it, and nothing is recorded against a generation whose
//!   executor the front does not know.
//! - Every buffer and event of the device is re-opened in the new
//!   generation or marked dead; one released meanwhile is closed again.
//! - No executor is restarted once the drain began.
//! - Every failed restart attempt tells every session so
//!   ([`LeaseEvent::ExecutorDown`], naming the dead generation) before the
//!   back-off; the restart that succeeds is announced
//!   ([`LeaseEvent::ExecutorRestarted`]), which supersedes an unread down
//!   notice. A client is never left without word while its device has no
//!   executor for longer than one spawn attempt.

use std::sync::Arc;
use std::time::Duration;

use ptxd_proto::executor as exec;
use tokio::sync::mpsc;

use super::buffers::open_buffer_request;
use super::effects::{run_cleanup, Cleanup};
use super::Front;
use crate::executor::link::CleanUp;
use crate::executor::supervisor::{DeathNotice, DownCause, ExecutorLink};
use crate::handles::DeviceGeneration;
use crate::sessions::LeaseEvent;

/// How long an executor that exited (rather than faulted or hung) waits to
/// be replaced, in case the exit came from a signal to the whole process
/// group that is about to start the drain.
const EXIT_GRACE: Duration = Duration::from_millis(100);

/// The wait after a device's first failed restart attempt; each further
/// failure doubles it, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

impl Front {
    pub(super) async fn supervise(
        self: Arc<Self>,
        mut deaths: mpsc::UnboundedReceiver<DeathNotice>,
    ) {
        while let Some((index, generation, cause)) = deaths.recv().await {
            let start = {
                let mut state = self.lock();
                let draining = state.draining;
                let Some(device) = state.devices.get_mut(index) else {
                    continue;
                };
                if device.generation != generation {
                    continue;
                }
                device.link = None;
                let start = !device.restarting && !draining && cause != DownCause::Stopped;
                if start {
                    device.restarting = true;
                }
                self.publish_availability(&state);
                start
            };
            if let (DownCause::Fault { .. }, Some(device)) =
                (&cause, self.lock().devices.get(index))
            {
                self.observer.kernel_fault(&device.desc.uuid);
            }
            if start {
                tokio::spawn(self.clone().restart(index, generation, cause));
            }
        }
    }

    async fn restart(self: Arc<Self>, index: usize, old: DeviceGeneration, cause: DownCause) {
        if matches!(cause, DownCause::Exited { .. }) {
            // A SIGTERM sent to the whole process group (systemd, a
            // terminal's ^C) reaches the executors as it reaches the daemon,
            // and their exit can be seen before the drain begins: give the
            // drain a moment to start rather than replace them during
            // shutdown. Faults and timeouts restart at once.
            let mut drain = self.drain.subscribe();
            let _ = tokio::time::timeout(EXIT_GRACE, drain.wait_for(|d| *d)).await;
            if self.lock().draining {
                tracing::info!(device = index, %old, "executor exited during shutdown; not restarting");
                return;
            }
        }
        tracing::warn!(device = index, generation = %old, %cause, "executor died; restarting");
        let mut backoff = FIRST_BACKOFF;
        let mut failed_restarts = 0u32;
        let cause_text = match &cause {
            DownCause::Fault { error_name, .. } => format!("KERNEL_FAULT {error_name}"),
            DownCause::Exited { .. } => "exited".to_string(),
            DownCause::Unresponsive { .. } => "unresponsive".to_string(),
            DownCause::Stopped => "stopped".to_string(),
        };
        loop {
            let (command, uuid) = {
                let state = self.lock();
                if state.draining {
                    return;
                }
                let Some(device) = state.devices.get(index) else {
                    return;
                };
                (device.command.clone(), device.desc.uuid.clone())
            };
            let generation = self.generations.next();
            let link = match ExecutorLink::spawn(
                index,
                generation,
                &command,
                &self.executor,
                self.deaths.clone(),
            )
            .await
            {
                Ok(link)
                    if link.hello.devices.first().map(|d| d.uuid.as_str())
                        == Some(uuid.as_str()) =>
                {
                    link
                }
                Ok(link) => {
                    tracing::error!(device = %uuid, "restarted executor drives another device; retrying");
                    link.shutdown(Duration::from_secs(1)).await;
                    let error = "the restarted executor drives another device";
                    self.restart_failed(
                        &uuid,
                        old,
                        &cause_text,
                        error,
                        &mut failed_restarts,
                        &mut backoff,
                    )
                    .await;
                    continue;
                }
                Err(e) => {
                    tracing::error!(device = %uuid, error = %e, "executor restart failed; retrying");
                    let error = e.to_string();
                    self.restart_failed(
                        &uuid,
                        old,
                        &cause_text,
                        &error,
                        &mut failed_restarts,
                        &mut backoff,
                    )
                    .await;
                    continue;
                }
            };
            // Publish the generation first so a death of the new executor
            // during the re-open is attributed to it, not dropped as stale.
            let (buffers, events) = {
                let mut state = self.lock();
                let Some(device) = state.devices.get_mut(index) else {
                    return;
                };
                device.generation = generation;
                let (buffers, events) = state.registry.on_device(index);
                (buffers, events)
            };
            let mut reopened_buffers = Vec::new();
            for buffer in &buffers {
                let ok = match open_buffer_request(buffer, &link) {
                    Ok(open) => link.open_buffer(open).await.is_ok(),
                    Err(_) => false,
                };
                reopened_buffers.push((buffer.id, ok));
            }
            // One line per restart, not one per buffer: clients decide how
            // many of their buffers cannot be re-opened (a shrunk object).
            let stale = reopened_buffers.iter().filter(|(_, ok)| !ok).count();
            if stale > 0 {
                let first = reopened_buffers
                    .iter()
                    .find(|(_, ok)| !ok)
                    .map(|(id, _)| id.0);
                tracing::warn!(
                    count = stale,
                    first,
                    "buffers could not be re-opened after restart; they are stale"
                );
            }
            let mut reopened_events = Vec::new();
            for event in &events {
                let open = exec::OpenEvent {
                    event_id: event.id.0,
                    handle: event.handle.clone(),
                };
                let ok = link.open_event(open).await.is_ok();
                reopened_events.push((event.id, ok));
            }
            if link.is_down() {
                tracing::error!(device = %uuid, "restarted executor died while re-opening; retrying");
                let error = "the restarted executor died while re-opening the device's buffers";
                self.restart_failed(
                    &uuid,
                    old,
                    &cause_text,
                    error,
                    &mut failed_restarts,
                    &mut backoff,
                )
                .await;
                continue;
            }
            let mut late_closes: Cleanup = Vec::new();
            let mut died_before_publishing = false;
            {
                let mut state = self.lock();
                for (id, ok) in reopened_buffers {
                    // Released while we re-opened it: close it again.
                    if !state
                        .registry
                        .set_buffer_open_in(id, ok.then_some(generation))
                        && ok
                    {
                        late_closes.push((
                            link.clone(),
                            CleanUp::new(exec::CloseBuffer { buffer_id: id.0 }),
                        ));
                    }
                }
                for (id, ok) in reopened_events {
                    if !state
                        .registry
                        .set_event_open_in(id, ok.then_some(generation))
                        && ok
                    {
                        late_closes.push((
                            link.clone(),
                            CleanUp::new(exec::CloseEvent { event_id: id.0 }),
                        ));
                    }
                }
                if state.draining {
                    return;
                }
                // A death between the re-open and here was handled by
                // `supervise` while `restarting` was set: retry ourselves.
                if link.is_down() {
                    died_before_publishing = true;
                } else {
                    let Some(device) = state.devices.get_mut(index) else {
                        return;
                    };
                    device.link = Some(link.clone());
                    device.restarts += 1;
                    device.restarting = false;
                    let event = LeaseEvent::ExecutorRestarted {
                        device_uuid: uuid.clone(),
                        old_generation: old.0,
                        new_generation: generation.0,
                        cause: cause_text.clone(),
                    };
                    for session in state.sessions.values_mut() {
                        // A ring lived in the dead executor: it is gone.
                        if session.ring.is_some_and(|(device, _)| device == index) {
                            session.ring = None;
                        }
                        session.notify(event.clone());
                    }
                    self.publish_availability(&state);
                }
            }
            if died_before_publishing {
                tracing::error!(device = %uuid, "restarted executor died before it was published; retrying");
                let error = "the restarted executor died before it served";
                self.restart_failed(
                    &uuid,
                    old,
                    &cause_text,
                    error,
                    &mut failed_restarts,
                    &mut backoff,
                )
                .await;
                continue;
            }
            run_cleanup(late_closes).await;
            self.observer.executor_restart(&uuid);
            tracing::info!(device = %uuid, old = %old, new = %generation, pid = link.pid(), "executor restarted");
            return;
        }
    }

    /// A restart attempt failed: tells every session that the device has
    /// no executor (the generation `old` is gone and the next attempt is
    /// `backoff` away), then waits that long, doubling the next wait.
    async fn restart_failed(
        &self,
        uuid: &str,
        old: DeviceGeneration,
        cause: &str,
        error: &str,
        failed_restarts: &mut u32,
        backoff: &mut Duration,
    ) {
        *failed_restarts = failed_restarts.saturating_add(1);
        let event = LeaseEvent::ExecutorDown {
            device_uuid: uuid.to_owned(),
            generation: old.0,
            cause: cause.to_owned(),
            failed_restarts: *failed_restarts,
            restart_error: error.to_owned(),
            retry_in: *backoff,
        };
        {
            let state = self.lock();
            for session in state.sessions.values() {
                session.notify(event.clone());
            }
        }
        tokio::time::sleep(*backoff).await;
        *backoff = (*backoff * 2).min(MAX_BACKOFF);
    }

    /// Kills the executor of device `index` (fault injection for tests and
    /// operators; the supervisor restarts it).
    pub fn kill_executor(&self, index: usize) -> bool {
        let state = self.lock();
        match state.devices.get(index).and_then(|d| d.link.as_ref()) {
            Some(link) => {
                link.kill();
                true
            }
            None => false,
        }
    }
}
