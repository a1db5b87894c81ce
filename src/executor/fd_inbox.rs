//! How a descriptor a client passed reaches its executor process.
//!
//! Each executor gets a `SOCK_SEQPACKET` socket as fd [`INBOX_FD`] (the
//! front keeps the other end, the [`FdOutbox`]). To open a buffer passed by
//! descriptor the front first sends the descriptor there, in a packet
//! holding an 8-byte tag, then the `OpenBuffer` request naming that tag on
//! the request channel. The send completes before the request is queued, so
//! by the time the executor reads the request the descriptor is already in
//! its inbox, and [`FdInbox::take`] never waits.
//!
//! Invariants:
//! - A tag is sent once per link and never reused (a counter).
//! - Every received descriptor is owned: one the executor takes is closed
//!   when its mapping no longer needs it, and a packet that is not a tag
//!   and exactly one descriptor is dropped with everything it carried.
//! - Descriptors waiting for their request are few (the front sends one
//!   just before its request); the inbox holds at most `MAX_WAITING` and
//!   drops the oldest beyond that.

use std::collections::{BTreeMap, VecDeque};
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::errno::Errno;
use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
use ptxd_ipc::packet::{recv_packet, send_packet};

/// The descriptor number of the inbox in an executor process.
pub const INBOX_FD: RawFd = 3;

/// The most descriptors an inbox keeps for requests it has not read yet.
const MAX_WAITING: usize = 64;

/// A fresh inbox pair: the front's outbox and the executor's end, to be
/// installed as [`INBOX_FD`] in the child.
pub fn pair() -> std::io::Result<(FdOutbox, OwnedFd)> {
    let (front, child) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )?;
    Ok((
        FdOutbox {
            socket: front,
            next_tag: AtomicU64::new(1),
        },
        child,
    ))
}

/// The front's end of an executor's inbox.
#[derive(Debug)]
pub struct FdOutbox {
    socket: OwnedFd,
    next_tag: AtomicU64,
}

impl FdOutbox {
    /// Sends a duplicate of `fd` to the executor and returns its tag. Never
    /// blocks: a full inbox (an executor that stopped reading) is an error.
    pub fn send(&self, fd: BorrowedFd<'_>) -> Result<u64, Errno> {
        let tag = self.next_tag.fetch_add(1, Ordering::Relaxed);
        send_packet(self.socket.as_fd(), &tag.to_le_bytes(), Some(fd), true)?;
        Ok(tag)
    }
}

/// The executor's end: descriptors by tag.
#[derive(Debug)]
pub struct FdInbox {
    socket: OwnedFd,
    waiting: BTreeMap<u64, OwnedFd>,
    order: VecDeque<u64>,
}

impl FdInbox {
    /// The inbox the front installed as [`INBOX_FD`]; `None` when that
    /// descriptor is not a socket (an executor started by hand).
    pub fn inherited() -> Option<FdInbox> {
        use nix::sys::stat::SFlag;
        // SAFETY: only borrowed for the fstat; ownership is taken below.
        let borrowed = unsafe { BorrowedFd::borrow_raw(INBOX_FD) };
        let stat = nix::sys::stat::fstat(borrowed).ok()?;
        if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFSOCK {
            return None;
        }
        // SAFETY: fd 3 was installed by the front for this purpose (it is a
        // socket, checked above) and nothing else in this process owns it.
        let socket = unsafe { OwnedFd::from_raw_fd(INBOX_FD) };
        Some(FdInbox::new(socket))
    }

    fn new(socket: OwnedFd) -> FdInbox {
        FdInbox {
            socket,
            waiting: BTreeMap::new(),
            order: VecDeque::new(),
        }
    }

    /// The descriptor sent with `tag`.
    pub fn take(&mut self, tag: u64) -> Result<OwnedFd, String> {
        loop {
            if let Some(fd) = self.waiting.remove(&tag) {
                self.order.retain(|t| *t != tag);
                return Ok(fd);
            }
            match recv_packet(self.socket.as_fd(), true) {
                Ok(Some(packet)) => {
                    let Ok(bytes) = <[u8; 8]>::try_from(packet.bytes.as_slice()) else {
                        continue;
                    };
                    let mut fds = packet.fds;
                    if fds.len() != 1 {
                        continue;
                    }
                    if let Some(fd) = fds.pop() {
                        self.keep(u64::from_le_bytes(bytes), fd);
                    }
                }
                Ok(None) => return Err("the front closed the fd inbox".into()),
                Err(Errno::EAGAIN) => return Err(format!("no descriptor arrived with tag {tag}")),
                Err(Errno::EINTR) => {}
                Err(e) => return Err(format!("reading the fd inbox failed: {e}")),
            }
        }
    }

    fn keep(&mut self, tag: u64, fd: OwnedFd) {
        if self.order.len() >= MAX_WAITING {
            if let Some(oldest) = self.order.pop_front() {
                self.waiting.remove(&oldest);
            }
        }
        self.waiting.insert(tag, fd);
        self.order.push_back(tag);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use nix::sys::stat::fstat;

    fn memfd(len: i64) -> OwnedFd {
        let fd = nix::sys::memfd::memfd_create(c"inbox-test", nix::sys::memfd::MFdFlags::empty())
            .unwrap();
        nix::unistd::ftruncate(&fd, len).unwrap();
        fd
    }

    #[test]
    fn descriptors_come_out_by_tag_in_any_order() {
        let (outbox, child) = pair().unwrap();
        let mut inbox = FdInbox::new(child);
        let sizes: Vec<i64> = (0..5).map(|_| rand::random::<u16>() as i64 + 1).collect();
        let tags: Vec<u64> = sizes
            .iter()
            .map(|len| outbox.send(memfd(*len).as_fd()).unwrap())
            .collect();
        for (tag, len) in tags.iter().zip(&sizes).rev() {
            let fd = inbox.take(*tag).unwrap();
            assert_eq!(fstat(&fd).unwrap().st_size, *len);
        }
        let error = inbox.take(tags[0]).unwrap_err();
        assert_eq!(error, format!("no descriptor arrived with tag {}", tags[0]));
    }

    #[test]
    fn junk_packets_are_dropped_and_a_closed_front_is_reported() {
        let (outbox, child) = pair().unwrap();
        let mut inbox = FdInbox::new(child);
        send_packet(
            outbox.socket.as_fd(),
            b"short",
            Some(memfd(1).as_fd()),
            true,
        )
        .unwrap();
        send_packet(outbox.socket.as_fd(), &9u64.to_le_bytes(), None, true).unwrap();
        let tag = outbox.send(memfd(7).as_fd()).unwrap();
        assert_eq!(fstat(inbox.take(tag).unwrap()).unwrap().st_size, 7);
        assert!(inbox.take(9).is_err());
        drop(outbox);
        assert_eq!(inbox.take(10).unwrap_err(), "the front closed the fd inbox");
    }
}
