//! The write half of an executor child's channel to the front: replies,
//! kernel-timeout notices and the fault report all go out through one
//! [`Channel`], so frames never interleave.
//!
//! Below `child` (its replier and serve loop) and `ring` (whose server
//! reports timeouts and faults from its own thread), so neither needs the
//! other to name it.
//!
//! Invariant: a sticky device fault is reported, then the process exits
//! ([`Channel::fatal`], [`Channel::fatal_now`]); nothing is served after.

use std::io::Write;
use std::sync::{Arc, Mutex};

use ptxd_proto::executor::{executor_message::Body, ExecutorMessage, Fault, KernelTimeout};

use super::protocol::{write_frame, ProtocolError};

/// Exit status of an executor that stopped because of a sticky device fault.
pub const EXIT_FAULT: i32 = 3;

/// The write half of the channel to the front, shared by every replier.
#[derive(Clone)]
pub struct Channel {
    out: Arc<Mutex<Box<dyn Write + Send>>>,
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Channel")
    }
}

impl Channel {
    pub(super) fn new(out: Box<dyn Write + Send>) -> Self {
        Channel {
            out: Arc::new(Mutex::new(out)),
        }
    }

    pub(super) fn send(&self, body: Body) -> Result<(), ProtocolError> {
        let message = ExecutorMessage { body: Some(body) };
        // A poisoned lock only means another replier panicked mid-write; the
        // stream is then unusable and the front will see the process exit.
        let mut out = self.out.lock().map_err(|_| ProtocolError::Closed)?;
        write_frame(&mut *out, &message)
    }

    /// Tells the front that a launch on `stream` ran past its budget (sent
    /// before that launch's reply, so the front has counted it by the time
    /// the client hears of it).
    pub fn kernel_timeout(&self, stream: u64) {
        if let Err(e) = self.send(Body::KernelTimeout(KernelTimeout { stream })) {
            tracing::warn!(error = %e, "cannot report a kernel timeout to the front");
        }
    }

    /// Reports a sticky device fault to the front and exits the process: a
    /// poisoned CUDA context cannot be recovered inside this process.
    pub fn fatal(&self, error_name: &str, message: &str) -> ! {
        tracing::error!(error_name, message, "sticky device fault; executor exits");
        let _ = self.send(Body::Fault(Fault {
            error_name: error_name.to_string(),
            message: message.to_string(),
        }));
        std::process::exit(EXIT_FAULT)
    }
}

impl Channel {
    /// As [`Channel::fatal`], but exits without running exit handlers:
    /// for when a kernel still runs on the device and a driver's exit-time
    /// clean-up might wait for it. The kernel driver reclaims the device's
    /// resources when the process is gone.
    pub fn fatal_now(&self, error_name: &str, message: &str) -> ! {
        tracing::error!(
            error_name,
            message,
            "unrecoverable device state; executor exits"
        );
        let _ = self.send(Body::Fault(Fault {
            error_name: error_name.to_string(),
            message: message.to_string(),
        }));
        // SAFETY: _exit has no preconditions; nothing after this runs.
        unsafe { nix::libc::_exit(EXIT_FAULT) }
    }
}
