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

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use ptxd_proto::executor as exec;
use tokio::sync::mpsc;

use super::buffers::open_buffer_request;
use super::effects::{run_cleanup, Cleanup};
use super::Front;
use crate::buffers::{BufferEntry, EventEntry};
use crate::executor::link::CleanUp;
use crate::executor::supervisor::{
    other_spin_lane, recovery_mark, DeathNotice, DownCause, ExecutorLink,
};
use crate::executor::ExecutorError;
use crate::handles::{BufferId, DeviceGeneration, EventId};
use crate::sessions::LeaseEvent;

/// How long an executor that exited (rather than faulted or hung) waits to
/// be replaced, in case the exit came from a signal to the whole process
/// group that is about to start the drain.
const EXIT_GRACE: Duration = Duration::from_millis(100);

/// The wait after a device's first failed restart attempt; each further
/// failure doubles it, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// How often a waiting spare is brought in step with its device's
/// registrations (what a promotion has left to open is what was registered
/// in the last period). A period in which nothing was registered or
/// released costs one look at the registry's change count.
const SPARE_SYNC: Duration = Duration::from_millis(100);

/// How long after a spare's death the next one starts (a device whose
/// spares die at once is not restarted in a tight loop).
const SPARE_RESTART_DELAY: Duration = Duration::from_millis(100);

/// What a device's spare slot holds.
#[derive(Debug)]
enum Spare {
    /// A spare is being started on this spin lane.
    Starting { lane: usize },
    /// A started spare, waiting to be promoted, and what it has opened of
    /// its device's registrations (kept in step by `Front::mirror_spare`).
    Ready {
        link: Arc<ExecutorLink>,
        mirror: SharedMirror,
    },
}

/// What an executor has opened of its device's registrations: each buffer
/// and event it was asked to open, and whether that worked.
#[derive(Debug, Default)]
struct Mirror {
    buffers: HashMap<BufferId, bool>,
    events: HashMap<EventId, bool>,
}

/// A spare's mirror, locked by whoever opens or closes in the spare: its
/// sync task, or the promotion, which takes it over.
type SharedMirror = Arc<tokio::sync::Mutex<Mirror>>;

/// The executor did not answer a call (it died, or its channel broke): the
/// attempt is lost, and says nothing about the registration.
#[derive(Debug)]
struct Lost;

/// Opens in `link` every registration of `buffers` and `events` that
/// `mirror` does not hold open (every one it holds no outcome for, and,
/// with `retry_failed`, every one it failed to open), recording each
/// outcome.
async fn open_registrations(
    link: &ExecutorLink,
    mirror: &mut Mirror,
    buffers: &[BufferEntry],
    events: &[EventEntry],
    retry_failed: bool,
) -> Result<(), Lost> {
    let wanted = |opened: Option<&bool>| match opened {
        None => true,
        Some(ok) => !ok && retry_failed,
    };
    for buffer in buffers {
        if !wanted(mirror.buffers.get(&buffer.id)) {
            continue;
        }
        let ok = match open_buffer_request(buffer, link) {
            Ok(open) => match link.open_buffer(open).await {
                Ok(_) => true,
                Err(ExecutorError::Unavailable { .. }) => return Err(Lost),
                Err(_) => false,
            },
            Err(_) => false,
        };
        mirror.buffers.insert(buffer.id, ok);
    }
    for event in events {
        if !wanted(mirror.events.get(&event.id)) {
            continue;
        }
        let open = exec::OpenEvent {
            event_id: event.id.0,
            handle: event.handle.clone(),
        };
        let ok = match link.open_event(open).await {
            Ok(()) => true,
            Err(ExecutorError::Unavailable { .. }) => return Err(Lost),
            Err(_) => false,
        };
        mirror.events.insert(event.id, ok);
    }
    Ok(())
}

/// The registrations `mirror` holds open that are no longer among
/// `buffers` and `events` (released since), taken out of it: they are to
/// be closed in its executor.
fn released_since(
    mirror: &mut Mirror,
    buffers: &[BufferEntry],
    events: &[EventEntry],
) -> Vec<CleanUp> {
    let live_buffers: HashSet<BufferId> = buffers.iter().map(|b| b.id).collect();
    let live_events: HashSet<EventId> = events.iter().map(|e| e.id).collect();
    let mut closes = Vec::new();
    mirror.buffers.retain(|id, ok| {
        let live = live_buffers.contains(id);
        if !live && *ok {
            closes.push(CleanUp::new(exec::CloseBuffer { buffer_id: id.0 }));
        }
        live
    });
    mirror.events.retain(|id, ok| {
        let live = live_events.contains(id);
        if !live && *ok {
            closes.push(CleanUp::new(exec::CloseEvent { event_id: id.0 }));
        }
        live
    });
    closes
}

impl Spare {
    fn lane(&self) -> usize {
        match self {
            Spare::Starting { lane } => *lane,
            Spare::Ready { link, .. } => link.spin_index,
        }
    }
}

/// The hot spare executors, at most one per device (`--spare-executor`).
///
/// Invariants:
/// - A device's slot is claimed before its spare is spawned, so at most one
///   spare per device is ever starting or waiting.
/// - A spare is taken out of its slot before it is promoted, and a death
///   notice of a generation still in a slot is the spare's: it is never
///   taken for a death of the device.
/// - A waiting spare is never older than the generation serving (it could
///   never be promoted, generations only grow): one that got ready while a
///   newer executor was started is replaced, by the restart before it
///   publishes or by the spare's own start after it filled the slot.
#[derive(Debug)]
pub struct Spares {
    enabled: bool,
    slots: std::sync::Mutex<std::collections::HashMap<usize, Spare>>,
}

impl Spares {
    pub fn new(enabled: bool) -> Spares {
        Spares {
            enabled,
            slots: Default::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<usize, Spare>> {
        // A map of plain values: a panic cannot leave it half changed.
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Claims device `index`'s slot for a spare to start on the lane
    /// `lane` chooses; none when spares are off or the slot is taken.
    fn claim(&self, index: usize, lane: impl FnOnce(usize) -> usize) -> Option<usize> {
        if !self.enabled {
            return None;
        }
        let mut slots = self.lock();
        if slots.contains_key(&index) {
            return None;
        }
        let lane = lane(index);
        slots.insert(index, Spare::Starting { lane });
        Some(lane)
    }

    fn unclaim(&self, index: usize) {
        self.lock().remove(&index);
    }

    fn fill(&self, index: usize, link: Arc<ExecutorLink>, mirror: SharedMirror) {
        self.lock().insert(index, Spare::Ready { link, mirror });
    }

    /// True while `generation` is device `index`'s waiting spare.
    fn is_waiting(&self, index: usize, generation: DeviceGeneration) -> bool {
        matches!(self.lock().get(&index), Some(Spare::Ready { link, .. }) if link.generation == generation)
    }

    /// The spin lane for a new serving executor of device `index`: the one
    /// its spare does not use.
    fn lane_beside(&self, index: usize) -> usize {
        match self.lock().get(&index) {
            Some(spare) => other_spin_lane(index, spare.lane()),
            None => index,
        }
    }

    /// Takes device `index`'s started spare out, for promotion.
    fn take_ready(&self, index: usize) -> Option<(Arc<ExecutorLink>, SharedMirror)> {
        let mut slots = self.lock();
        match slots.remove(&index) {
            Some(Spare::Ready { link, mirror }) => Some((link, mirror)),
            Some(starting) => {
                slots.insert(index, starting);
                None
            }
            None => None,
        }
    }

    /// True (and the slot emptied) when `generation` is device `index`'s
    /// waiting spare.
    fn forget(&self, index: usize, generation: DeviceGeneration) -> bool {
        let mut slots = self.lock();
        let spare = matches!(slots.get(&index), Some(Spare::Ready { link, .. }) if link.generation == generation);
        if spare {
            slots.remove(&index);
        }
        spare
    }

    /// Device `index`'s waiting spare, taken out, when it is older than
    /// `generation` (the executor now serving): it started before an
    /// executor that replaced a spare still starting, and as generations
    /// only grow it could never be promoted.
    fn take_older(&self, index: usize, generation: DeviceGeneration) -> Option<Arc<ExecutorLink>> {
        let mut slots = self.lock();
        let older = matches!(slots.get(&index), Some(Spare::Ready { link, .. }) if link.generation < generation);
        if !older {
            return None;
        }
        match slots.remove(&index) {
            Some(Spare::Ready { link, .. }) => Some(link),
            // Not reached: `older` saw a ready spare under this lock.
            Some(other) => {
                slots.insert(index, other);
                None
            }
            None => None,
        }
    }

    /// Every waiting spare, taken out (the drain stops them).
    pub fn take_all(&self) -> Vec<Arc<ExecutorLink>> {
        self.lock()
            .drain()
            .filter_map(|(_, spare)| match spare {
                Spare::Ready { link, .. } => Some(link),
                Spare::Starting { .. } => None,
            })
            .collect()
    }

    /// The process ids of the waiting spares (tests, diagnostics).
    pub fn pids(&self) -> Vec<u32> {
        self.lock()
            .values()
            .filter_map(|spare| match spare {
                Spare::Ready { link, .. } => Some(link.pid()),
                Spare::Starting { .. } => None,
            })
            .collect()
    }
}

impl Front {
    pub(super) async fn supervise(
        self: Arc<Self>,
        mut deaths: mpsc::UnboundedReceiver<DeathNotice>,
    ) {
        while let Some((index, generation, cause)) = deaths.recv().await {
            recovery_mark!("death_seen", device = index, %generation);
            if self.spares.forget(index, generation) {
                // A spare that died unpromoted: nothing served on it.
                tracing::warn!(device = index, %generation, %cause, "spare executor died; starting another");
                tokio::spawn(self.clone().keep_spare_after(index, SPARE_RESTART_DELAY));
                continue;
            }
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
        let mut spare = self.spares.take_ready(index);
        recovery_mark!("restart_begins", device = index, generation = %old, spare = spare.is_some());
        // Generations only grow: a spare started before the executor that
        // just died (which then replaced a spare still starting) is older
        // than it, and is not promoted.
        if let Some((stale, _)) = spare.take_if(|(link, _)| link.generation <= old) {
            tracing::info!(
                device = index,
                pid = stale.pid(),
                "a spare older than the dead executor is not promoted"
            );
            stale.kill();
        }
        // With a spare there is no process to start, so no reason to wait:
        // if the drain begins after all, it stops the promoted spare as it
        // would have stopped the executor.
        if spare.is_none() && matches!(cause, DownCause::Exited { .. }) {
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
            // What the new executor has opened already (a spare kept in
            // step), taken over from the spare's sync task.
            let mut mirror = Mirror::default();
            let next = match spare.take().filter(|(link, _)| !link.is_down()) {
                Some((link, shared)) => {
                    tracing::info!(device = %uuid, pid = link.pid(), "promoting the spare executor");
                    mirror = std::mem::take(&mut *shared.lock().await);
                    recovery_mark!("spare_taken_over", device = index, generation = %link.generation,
                        buffers_open = mirror.buffers.len(), events_open = mirror.events.len());
                    Ok(link)
                }
                None => {
                    let lane = self.spares.lane_beside(index);
                    recovery_mark!("spawn_begins", device = index);
                    ExecutorLink::spawn_on_lane(
                        index,
                        lane,
                        self.generations.next(),
                        &command,
                        &self.executor,
                        self.deaths.clone(),
                    )
                    .await
                }
            };
            let link = match next {
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
            let generation = link.generation;
            recovery_mark!("executor_in_hand", device = index, %generation);
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
            // A call the new executor could not answer (it died, or its
            // channel broke) says nothing about the buffer: the attempt is
            // lost, not the buffer, which must never be marked dead for it.
            // What a promoted spare failed to open is tried once more.
            // The last call: a spare may have died unseen, with nothing
            // left to open in it, and must not be published.
            let opened_before = mirror.buffers.len() + mirror.events.len();
            let lost = open_registrations(&link, &mut mirror, &buffers, &events, true)
                .await
                .is_err();
            recovery_mark!("registrations_opened", device = index, %generation,
                buffers = buffers.len(), events = events.len(),
                opened_now = (mirror.buffers.len() + mirror.events.len()).saturating_sub(opened_before));
            let lost = lost || !link.answers().await;
            recovery_mark!("successor_answered", device = index, %generation);
            // Opened by the spare and released since: closed once it serves.
            let released = released_since(&mut mirror, &buffers, &events);
            let reopened_buffers: Vec<(BufferId, bool)> = buffers
                .iter()
                .map(|b| (b.id, mirror.buffers.get(&b.id).copied().unwrap_or(false)))
                .collect();
            let reopened_events: Vec<(EventId, bool)> = events
                .iter()
                .map(|e| (e.id, mirror.events.get(&e.id).copied().unwrap_or(false)))
                .collect();
            // One line per restart, not one per buffer: clients decide how
            // many of their buffers cannot be re-opened (a shrunk object).
            let stale = reopened_buffers.iter().filter(|(_, ok)| !ok).count();
            if stale > 0 && !lost {
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
            if lost || link.is_down() {
                // Whatever is left of it serves nothing.
                link.kill();
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
            // A spare that got ready while this executor was started (it
            // started before it) is older than the generation about to
            // serve: it is replaced by one that can be promoted. Taken out
            // before the generation is published, so that a client told of
            // the restart never sees it waiting; one that gets ready later
            // sees the device's new generation and leaves by itself.
            if let Some(older) = self.spares.take_older(index, generation) {
                tracing::info!(
                    device = index,
                    pid = older.pid(),
                    "a spare older than the new executor is replaced"
                );
                older.kill();
            }
            let mut late_closes: Cleanup = released
                .into_iter()
                .map(|close| (link.clone(), close))
                .collect();
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
                    recovery_mark!("generation_published", device = index, %generation);
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
            tokio::spawn(self.clone().keep_spare(index));
            self.observer.executor_restart(&uuid);
            tracing::info!(device = %uuid, old = %old, new = %generation, pid = link.pid(), "executor restarted");
            return;
        }
    }

    /// Starts device `index`'s hot spare, unless spares are off, one is
    /// there or starting, or the drain began; retries a failed start with
    /// the restarts' back-off.
    pub(super) async fn keep_spare(self: Arc<Self>, index: usize) {
        let Some(lane) = self.spares.claim(index, |index| {
            let state = self.lock();
            let serving = state.devices.get(index).and_then(|d| d.link.as_ref());
            other_spin_lane(index, serving.map_or(index, |link| link.spin_index))
        }) else {
            return;
        };
        let mut backoff = FIRST_BACKOFF;
        loop {
            let (command, uuid) = {
                let state = self.lock();
                let device = state.devices.get(index).filter(|_| !state.draining);
                match device {
                    Some(device) => (device.command.clone(), device.desc.uuid.clone()),
                    None => {
                        self.spares.unclaim(index);
                        return;
                    }
                }
            };
            let spawned = ExecutorLink::spawn_on_lane(
                index,
                lane,
                self.generations.next(),
                &command,
                &self.executor,
                self.deaths.clone(),
            )
            .await;
            match spawned {
                Ok(link)
                    if link.hello.devices.first().map(|d| d.uuid.as_str())
                        == Some(uuid.as_str()) =>
                {
                    if self.lock().draining {
                        self.spares.unclaim(index);
                        link.shutdown(Duration::from_secs(1)).await;
                        return;
                    }
                    // One that died while starting was reported before it
                    // was a spare: it is not kept.
                    if !link.is_down() {
                        tracing::info!(device = %uuid, pid = link.pid(), generation = %link.generation, "spare executor ready");
                        recovery_mark!("spare_ready", device = index, generation = %link.generation);
                        let mirror = SharedMirror::default();
                        self.spares.fill(index, link.clone(), mirror.clone());
                        // Checked after the fill: a restart that published
                        // a newer executor meanwhile either sees this spare
                        // in the slot (and replaces it) or published before
                        // this look.
                        let serving = self.lock().devices.get(index).map(|d| d.generation);
                        if serving.is_some_and(|serving| link.generation < serving) {
                            if self.spares.forget(index, link.generation) {
                                tracing::info!(device = %uuid, pid = link.pid(), "a spare older than the serving executor is replaced");
                                link.kill();
                                tokio::spawn(self.clone().keep_spare_after(index, Duration::ZERO));
                            }
                            return;
                        }
                        tokio::spawn(self.clone().mirror_spare(index, link, mirror));
                        return;
                    }
                }
                Ok(link) => {
                    tracing::error!(device = %uuid, "a spare executor drives another device");
                    link.shutdown(Duration::from_secs(1)).await;
                }
                Err(e) => {
                    tracing::error!(device = %uuid, error = %e, "cannot start a spare executor")
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Keeps device `index`'s waiting spare in step with the device's
    /// registrations: every [`SPARE_SYNC`] in which the registry changed,
    /// opens in it what was registered and closes what was released since,
    /// until it is promoted (the promotion takes the mirror over, and opens
    /// what this did not yet) or dies.
    async fn mirror_spare(
        self: Arc<Self>,
        index: usize,
        link: Arc<ExecutorLink>,
        mirror: SharedMirror,
    ) {
        // The registry's change count at the last sync that opened and
        // closed everything it asked for (none yet).
        let mut synced: Option<u64> = None;
        loop {
            if !self.spares.is_waiting(index, link.generation) {
                return;
            }
            {
                let mut mirror = mirror.lock().await;
                // Checked again under the mirror's lock, which a promotion
                // takes after taking the spare out of its slot.
                if !self.spares.is_waiting(index, link.generation) {
                    return;
                }
                let registrations = {
                    let state = self.lock();
                    let changes = state.registry.changes();
                    // Nothing registered or released since the last sync:
                    // no copy of the registry, no call to the spare.
                    (synced != Some(changes)).then(|| (changes, state.registry.on_device(index)))
                };
                let Some((changes, (buffers, events))) = registrations else {
                    drop(mirror);
                    tokio::time::sleep(SPARE_SYNC).await;
                    continue;
                };
                let mut lost = false;
                for close in released_since(&mut mirror, &buffers, &events) {
                    if let Err(ExecutorError::Unavailable { .. }) = link.request(close).await {
                        lost = true;
                        break;
                    }
                }
                lost = lost
                    || open_registrations(&link, &mut mirror, &buffers, &events, false)
                        .await
                        .is_err();
                if lost {
                    // The spare is gone (its death notice may have come
                    // before it was a spare, and started nothing): another
                    // one starts.
                    link.kill();
                    if self.spares.forget(index, link.generation) {
                        tokio::spawn(self.clone().keep_spare_after(index, SPARE_RESTART_DELAY));
                    }
                    return;
                }
                synced = Some(changes);
            }
            tokio::time::sleep(SPARE_SYNC).await;
        }
    }

    /// [`Front::keep_spare`] after `delay`. Boxed and `Send` by signature:
    /// the spare's sync task calls it, and `keep_spare` spawns that task,
    /// so the compiler cannot infer either future's `Send` through the
    /// other.
    fn keep_spare_after(
        self: Arc<Self>,
        index: usize,
        delay: Duration,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            self.keep_spare(index).await
        })
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
