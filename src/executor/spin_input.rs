//! The executor's end of the front's channel, read with a short spin.
//!
//! A blocking `read` puts the request loop to sleep between requests, and
//! the next request then pays for a wakeup: on the H200 host (a VM) that is
//! several microseconds of a ~15 µs executor round trip. So when the loop
//! wants more bytes it first polls the socket without blocking
//! (`MSG_DONTWAIT`) for up to `spin`, and only then blocks. A session
//! launching back to back keeps the executor awake; an idle executor
//! spins once, for `spin`, after its last request and then sleeps, so an
//! idle daemon costs nothing.
//!
//! The spin yields the core every few microseconds, so on a machine with
//! more runnable threads than cores the front (which must run for the next
//! request to come) is not starved by it. Each spin holds a permit of the
//! daemon-wide spin bound ([`crate::spin`], shared with the front and every
//! other executor): without one, or with a spin of 0, it reads as before.
//! Anything that is not a socket (a pipe in a test) is read plainly.

use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::Arc;
use std::time::Instant;

use nix::errno::Errno;
use nix::sys::socket::{recv, MsgFlags};

use crate::spin::Spinners;

/// Spins between yields: about a microsecond of `spin_loop` hints.
const YIELD_EVERY: u32 = 64;

/// A reader over a socket that polls before it blocks.
#[derive(Debug)]
pub struct SpinInput<R> {
    inner: R,
    /// The spin and the bound it is taken under (none: never spins).
    spinners: Option<Arc<Spinners>>,
    /// Cleared once a non-blocking `recv` says the descriptor is not a
    /// socket.
    socket: bool,
}

impl<R: Read + AsFd> SpinInput<R> {
    /// Reads `inner`, polling for up to the spinners' spin before each
    /// blocking read, when they grant a permit.
    pub fn new(inner: R, spinners: Option<Arc<Spinners>>) -> Self {
        SpinInput {
            inner,
            spinners,
            socket: true,
        }
    }

    /// One non-blocking receive: `Ok(None)` when nothing is there yet.
    fn try_recv(fd: BorrowedFd<'_>, buf: &mut [u8]) -> Result<Option<usize>, Errno> {
        loop {
            match recv(fd.as_raw_fd(), buf, MsgFlags::MSG_DONTWAIT) {
                Ok(n) => return Ok(Some(n)),
                Err(Errno::EAGAIN) => return Ok(None),
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

impl<R: Read + AsFd> Read for SpinInput<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let (spin, permit) = match &self.spinners {
            Some(spinners) if self.socket && !buf.is_empty() => spinners.take(),
            _ => (std::time::Duration::ZERO, None),
        };
        if permit.is_some() {
            let until = Instant::now() + spin;
            let mut spins: u32 = 0;
            loop {
                match Self::try_recv(self.inner.as_fd(), buf) {
                    Ok(Some(n)) => return Ok(n),
                    Ok(None) => {}
                    Err(Errno::ENOTSOCK) => {
                        self.socket = false;
                        break;
                    }
                    Err(e) => return Err(e.into()),
                }
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(YIELD_EVERY) {
                    if Instant::now() >= until {
                        break;
                    }
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
        drop(permit);
        self.inner.read(buf)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    use std::time::Duration;

    use rand::Rng;

    use super::*;

    fn spinners(spin: Duration) -> Option<Arc<Spinners>> {
        Some(Spinners::new(spin, 4))
    }

    fn bytes(len: usize) -> Vec<u8> {
        let mut rng = rand::rng();
        (0..len).map(|_| rng.random()).collect()
    }

    #[test]
    fn a_spinning_read_returns_bytes_written_before_and_during_the_spin() {
        let (mut front, executor) = UnixStream::pair().unwrap();
        let mut input = SpinInput::new(executor, spinners(Duration::from_millis(50)));
        let first = bytes(300);
        front.write_all(&first).unwrap();
        let mut got = vec![0u8; first.len()];
        input.read_exact(&mut got).unwrap();
        assert_eq!(got, first);

        let second = bytes(1000);
        let sent = second.clone();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            front.write_all(&sent).unwrap();
            front
        });
        let mut got = vec![0u8; second.len()];
        input.read_exact(&mut got).unwrap();
        assert_eq!(got, second);
        drop(writer.join().unwrap());
        // The front hung up: end of stream, after the spin.
        assert_eq!(input.read(&mut [0u8; 8]).unwrap(), 0);
    }

    #[test]
    fn a_read_past_the_spin_blocks_until_the_bytes_come() {
        let (mut front, executor) = UnixStream::pair().unwrap();
        let mut input = SpinInput::new(executor, spinners(Duration::from_micros(100)));
        let message = bytes(64);
        let sent = message.clone();
        // Timed from before the writer starts: the bytes cannot come sooner
        // than 30 ms after this, however late either thread is scheduled
        // (timed after the spawn, a reader preempted for 5 ms read early).
        let start = Instant::now();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            front.write_all(&sent).unwrap();
            front
        });
        let mut got = vec![0u8; message.len()];
        input.read_exact(&mut got).unwrap();
        assert!(start.elapsed() >= Duration::from_millis(25));
        assert_eq!(got, message);
        drop(writer.join().unwrap());
    }

    #[test]
    fn a_pipe_is_read_plainly() {
        let (read, write) = nix::unistd::pipe().unwrap();
        let mut input = SpinInput::new(
            std::fs::File::from(read),
            spinners(Duration::from_millis(10)),
        );
        let message = bytes(32);
        std::fs::File::from(write).write_all(&message).unwrap();
        let mut got = vec![0u8; message.len()];
        input.read_exact(&mut got).unwrap();
        assert_eq!(got, message);
        assert!(!input.socket);
    }
}
