//! A session's lease events on their way to its lease stream: a queue that
//! loses no event a client needs and never grows past a small bound, however
//! long the client leaves its stream unread.
//!
//! The client needs every restart of a device its kernels or ring live on
//! (its kernels there are stale; the SDK releases the waiters of a ring that
//! died with the executor) and the drain notice. A bounded channel that
//! drops what does not fit could drop exactly that; an unbounded one lets a
//! client that never reads grow the daemon's memory with every restart.
//!
//! Invariants:
//! - Events come out in the order they went in, except that a restart of a
//!   device whose earlier restart is still unread is merged into that one,
//!   in its place: from the older event's old generation to the newer
//!   event's new generation, with the newer cause. A second drain notice
//!   while one is unread is dropped (the first one's reason stands).
//! - A device-down notice replaces an unread one of the same device and goes
//!   to the end of the queue (the latest state of the device is what the
//!   client must see last); a restart of a device drops its unread down
//!   notice, since the device is back. So the last event about a device
//!   in the queue always says what the device is now.
//! - So the queue holds at most the opening event, one restart and one
//!   down notice per device, and one drain notice.
//! - The stream ends once the sender is closed or dropped and every queued
//!   event has been read.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use tokio_stream::Stream;

use crate::handles::{BootId, SessionId};

/// What a session's lease stream tells its client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseEvent {
    /// The first event: the session's id and the daemon's boot.
    Opened { session: SessionId, boot: BootId },
    /// A device's executor was replaced; the session's kernels on it are
    /// stale and must be loaded again.
    ExecutorRestarted {
        device_uuid: String,
        old_generation: u64,
        new_generation: u64,
        cause: String,
    },
    /// The daemon is draining: finish up, no new work is accepted.
    Draining { reason: String },
    /// A device's executor died and its restart failed: the device has no
    /// executor until an [`LeaseEvent::ExecutorRestarted`] says otherwise.
    ExecutorDown {
        device_uuid: String,
        /// The generation that died.
        generation: u64,
        /// Why it died.
        cause: String,
        /// Restart attempts that failed so far.
        failed_restarts: u32,
        /// Why the last one failed.
        restart_error: String,
        /// How long until the next attempt.
        retry_in: std::time::Duration,
    },
}

impl LeaseEvent {
    /// The device of a down notice.
    fn down_device(&self) -> Option<&str> {
        match self {
            LeaseEvent::ExecutorDown { device_uuid, .. } => Some(device_uuid),
            _ => None,
        }
    }
}

#[derive(Debug, Default)]
struct Queue {
    events: VecDeque<LeaseEvent>,
    closed: bool,
    waker: Option<Waker>,
}

type Shared = Arc<Mutex<Queue>>;

fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, Queue> {
    // A queue of plain values: a panic cannot leave it half changed.
    shared.lock().unwrap_or_else(|p| p.into_inner())
}

/// A new session's lease queue: the daemon's end and the stream's end.
pub fn channel() -> (LeaseSender, LeaseReceiver) {
    let shared = Shared::default();
    (
        LeaseSender {
            shared: shared.clone(),
        },
        LeaseReceiver { shared },
    )
}

/// The daemon's end (see the module docs).
#[derive(Debug)]
pub struct LeaseSender {
    shared: Shared,
}

impl LeaseSender {
    /// Queues `event`, merging it as the module docs say. After
    /// [`LeaseSender::close`] nothing is queued.
    pub fn send(&self, event: LeaseEvent) {
        let waker = {
            let mut queue = lock(&self.shared);
            if queue.closed {
                return;
            }
            match event {
                LeaseEvent::ExecutorDown { .. } => {
                    let device = event.down_device().map(str::to_owned);
                    queue
                        .events
                        .retain(|e| e.down_device() != device.as_deref());
                    queue.events.push_back(event);
                }
                LeaseEvent::ExecutorRestarted {
                    device_uuid,
                    new_generation,
                    cause,
                    old_generation,
                } => {
                    queue
                        .events
                        .retain(|e| e.down_device() != Some(device_uuid.as_str()));
                    let unread = queue.events.iter_mut().find_map(|e| match e {
                        LeaseEvent::ExecutorRestarted {
                            device_uuid: d,
                            new_generation: n,
                            cause: c,
                            ..
                        } if *d == device_uuid => Some((n, c)),
                        _ => None,
                    });
                    match unread {
                        Some((n, c)) => {
                            *n = new_generation;
                            *c = cause;
                        }
                        None => queue.events.push_back(LeaseEvent::ExecutorRestarted {
                            device_uuid,
                            old_generation,
                            new_generation,
                            cause,
                        }),
                    }
                }
                LeaseEvent::Draining { .. }
                    if queue
                        .events
                        .iter()
                        .any(|e| matches!(e, LeaseEvent::Draining { .. })) => {}
                event => queue.events.push_back(event),
            }
            queue.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Ends the stream once the queued events are read.
    pub fn close(&self) {
        let waker = {
            let mut queue = lock(&self.shared);
            queue.closed = true;
            queue.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Events queued and not yet read.
    #[cfg(test)]
    fn unread(&self) -> usize {
        lock(&self.shared).events.len()
    }
}

impl Drop for LeaseSender {
    fn drop(&mut self) {
        self.close();
    }
}

/// The lease stream's end: the session's events, then the end.
#[derive(Debug)]
pub struct LeaseReceiver {
    shared: Shared,
}

impl Stream for LeaseReceiver {
    type Item = LeaseEvent;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<LeaseEvent>> {
        let mut queue = lock(&self.shared);
        if let Some(event) = queue.events.pop_front() {
            return Poll::Ready(Some(event));
        }
        if queue.closed {
            return Poll::Ready(None);
        }
        queue.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;
    use tokio_stream::StreamExt;

    fn restart(device: &str, old: u64, new: u64) -> LeaseEvent {
        LeaseEvent::ExecutorRestarted {
            device_uuid: device.into(),
            old_generation: old,
            new_generation: new,
            cause: format!("cause {new}"),
        }
    }

    fn draining(reason: &str) -> LeaseEvent {
        LeaseEvent::Draining {
            reason: reason.into(),
        }
    }

    async fn drain(receiver: &mut LeaseReceiver) -> Vec<LeaseEvent> {
        let mut events = Vec::new();
        while let Some(event) = receiver.next().await {
            events.push(event);
        }
        events
    }

    #[tokio::test]
    async fn unread_restarts_of_a_device_merge_in_place_and_nothing_else_is_lost() {
        let (sender, mut receiver) = channel();
        sender.send(restart("GPU-a", 0, 1));
        sender.send(restart("GPU-b", 4, 5));
        sender.send(draining("SIGTERM"));
        // Thousands of restarts of a client that does not read: the queue
        // stays at one per device and one drain notice.
        for generation in 2..5000 {
            sender.send(restart("GPU-a", generation - 1, generation));
        }
        sender.send(draining("SIGINT"));
        assert_eq!(sender.unread(), 3);
        drop(sender);
        assert_eq!(
            drain(&mut receiver).await,
            vec![
                LeaseEvent::ExecutorRestarted {
                    device_uuid: "GPU-a".into(),
                    old_generation: 0,
                    new_generation: 4999,
                    cause: "cause 4999".into(),
                },
                restart("GPU-b", 4, 5),
                draining("SIGTERM"),
            ]
        );
    }

    #[tokio::test]
    async fn a_restart_after_the_last_was_read_is_its_own_event() {
        let (sender, mut receiver) = channel();
        sender.send(restart("GPU-a", 0, 1));
        assert_eq!(receiver.next().await, Some(restart("GPU-a", 0, 1)));
        sender.send(restart("GPU-a", 1, 2));
        assert_eq!(receiver.next().await, Some(restart("GPU-a", 1, 2)));
        sender.send(draining("SIGTERM"));
        assert_eq!(receiver.next().await, Some(draining("SIGTERM")));
        // A drain notice after the first was read is queued again.
        sender.send(draining("SIGTERM"));
        sender.close();
        // Closed: queued events are still read, later ones are not queued.
        sender.send(restart("GPU-a", 2, 3));
        assert_eq!(drain(&mut receiver).await, vec![draining("SIGTERM")]);
    }

    fn down(device: &str, generation: u64, failed_restarts: u32) -> LeaseEvent {
        LeaseEvent::ExecutorDown {
            device_uuid: device.into(),
            generation,
            cause: "exited".into(),
            failed_restarts,
            restart_error: format!("attempt {failed_restarts} failed"),
            retry_in: std::time::Duration::from_millis(50 << failed_restarts.min(8)),
        }
    }

    #[tokio::test]
    async fn a_down_notice_is_the_last_word_on_its_device_until_a_restart_supersedes_it() {
        let (sender, mut receiver) = channel();
        sender.send(restart("GPU-a", 0, 1));
        sender.send(down("GPU-a", 1, 1));
        sender.send(down("GPU-b", 7, 1));
        // A client that does not read while restarts keep failing: one
        // notice per device, the latest, after the device's restart.
        for attempt in 2..1000 {
            sender.send(down("GPU-a", 1, attempt));
        }
        assert_eq!(sender.unread(), 3);
        assert_eq!(
            receiver.next().await,
            Some(restart("GPU-a", 0, 1)),
            "the earlier restart stays first"
        );
        assert_eq!(receiver.next().await, Some(down("GPU-b", 7, 1)));
        assert_eq!(receiver.next().await, Some(down("GPU-a", 1, 999)));
        // Down, then back before the client read: only the restart is
        // left, so the device's last word says it serves.
        sender.send(down("GPU-a", 1, 1000));
        sender.send(restart("GPU-a", 1, 2));
        sender.send(down("GPU-b", 7, 2));
        sender.send(restart("GPU-b", 7, 8));
        drop(sender);
        assert_eq!(
            drain(&mut receiver).await,
            vec![restart("GPU-a", 1, 2), restart("GPU-b", 7, 8)]
        );
    }

    #[tokio::test]
    async fn a_restart_merged_into_an_older_one_leaves_no_down_notice_after_it() {
        let (sender, mut receiver) = channel();
        sender.send(restart("GPU-a", 0, 1));
        sender.send(down("GPU-a", 1, 1));
        sender.send(restart("GPU-a", 1, 2));
        sender.send(down("GPU-a", 2, 3));
        drop(sender);
        assert_eq!(
            drain(&mut receiver).await,
            vec![
                LeaseEvent::ExecutorRestarted {
                    device_uuid: "GPU-a".into(),
                    old_generation: 0,
                    new_generation: 2,
                    cause: "cause 2".into(),
                },
                down("GPU-a", 2, 3),
            ]
        );
    }

    #[tokio::test]
    async fn a_waiting_stream_wakes_for_an_event_and_for_the_close() {
        let (sender, mut receiver) = channel();
        let reader = tokio::spawn(async move { drain(&mut receiver).await });
        tokio::task::yield_now().await;
        sender.send(restart("GPU-a", 0, 1));
        tokio::task::yield_now().await;
        sender.send(restart("GPU-b", 0, 1));
        drop(sender);
        let events = tokio::time::timeout(std::time::Duration::from_secs(5), reader)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(events, vec![restart("GPU-a", 0, 1), restart("GPU-b", 0, 1)]);
    }
}
