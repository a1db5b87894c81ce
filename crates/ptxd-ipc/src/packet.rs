//! File descriptors over Unix sockets (`SCM_RIGHTS`): the fd socket beside
//! ptxd's gRPC socket, and the daemon's inbox to each executor.
//!
//! Both are `SOCK_SEQPACKET` sockets, so a packet's bytes and the
//! descriptors sent with them arrive together, and one packet is one
//! message: no framing, and no descriptor can drift onto the next message.
//!
//! Invariants:
//! - A received descriptor is owned ([`OwnedFd`]) from the moment the call
//!   returns, so every descriptor a packet carried is closed unless the
//!   caller keeps it; received descriptors are close-on-exec.
//! - The control buffer holds the most descriptors one packet can carry
//!   (`SCM_MAX_FD`), so the kernel never truncates it and no descriptor is
//!   installed without being returned.
//! - A packet longer than [`MAX_PACKET`] is reported as truncated, never
//!   read in parts.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use nix::errno::Errno;
use nix::sys::socket::{
    connect, recvmsg, sendmsg, socket, AddressFamily, ControlMessage, ControlMessageOwned,
    MsgFlags, SockFlag, SockType, UnixAddr,
};

/// The largest packet either side sends or accepts, in bytes: room for a
/// kernel load of a typical JIT module (the fd socket's connections are
/// capped, so this bounds what the daemon buffers for them).
pub const MAX_PACKET: usize = 64 << 10;

/// The most descriptors Linux lets one packet carry (`SCM_MAX_FD`).
const SCM_MAX_FD: usize = 253;

/// The fd socket that belongs to a gRPC socket: the same path with `.fds`
/// appended (`ptxd.sock` → `ptxd.sock.fds`).
pub fn fd_socket_path(grpc_socket: &Path) -> std::path::PathBuf {
    let mut path = grpc_socket.as_os_str().to_owned();
    path.push(".fds");
    path.into()
}

/// One received packet.
#[derive(Debug)]
pub struct Packet {
    /// The packet's bytes (at most [`MAX_PACKET`]).
    pub bytes: Vec<u8>,
    /// Every descriptor the packet carried, owned.
    pub fds: Vec<OwnedFd>,
    /// The packet was longer than [`MAX_PACKET`]; `bytes` holds its start.
    pub truncated: bool,
}

/// Sends one packet holding `bytes` and, if given, one descriptor.
/// `dont_wait`: fail with `EAGAIN` instead of blocking when the peer's
/// queue is full.
pub fn send_packet(
    socket: BorrowedFd<'_>,
    bytes: &[u8],
    fd: Option<BorrowedFd<'_>>,
    dont_wait: bool,
) -> nix::Result<()> {
    let raw: [RawFd; 1] = [fd.map_or(-1, |fd| fd.as_raw_fd())];
    let control = [ControlMessage::ScmRights(&raw)];
    let control: &[ControlMessage<'_>] = if fd.is_some() { &control } else { &[] };
    let mut flags = MsgFlags::MSG_NOSIGNAL;
    if dont_wait {
        flags |= MsgFlags::MSG_DONTWAIT;
    }
    let iov = [IoSlice::new(bytes)];
    let sent = sendmsg::<()>(socket.as_raw_fd(), &iov, control, flags, None)?;
    if sent != bytes.len() {
        // A SOCK_SEQPACKET send is all or nothing; anything else is not the
        // socket this module was given.
        return Err(Errno::EMSGSIZE);
    }
    Ok(())
}

/// Receives one packet. `Ok(None)`: the peer closed the connection (an
/// empty packet from a peer still connected is `Some`, with no bytes).
/// `dont_wait`: `EAGAIN` instead of blocking when nothing is queued.
pub fn recv_packet(socket: BorrowedFd<'_>, dont_wait: bool) -> nix::Result<Option<Packet>> {
    let mut buffer = PacketBuffer::new();
    Ok(
        recv_packet_in(socket, dont_wait, &mut buffer)?.map(|meta| Packet {
            bytes: buffer.bytes[..meta.len].to_vec(),
            fds: meta.fds,
            truncated: meta.truncated,
        }),
    )
}

/// Room for one packet and its descriptors, kept by a connection from one
/// packet to the next (a fresh one is [`MAX_PACKET`] bytes to allocate and
/// zero for every packet).
#[derive(Debug)]
pub struct PacketBuffer {
    bytes: Vec<u8>,
    control: Vec<u8>,
}

impl Default for PacketBuffer {
    fn default() -> Self {
        Self::new()
    }
}

impl PacketBuffer {
    /// A buffer for one packet of up to [`MAX_PACKET`] bytes.
    pub fn new() -> Self {
        PacketBuffer {
            bytes: vec![0u8; MAX_PACKET],
            control: nix::cmsg_space!([RawFd; SCM_MAX_FD]),
        }
    }

    /// The bytes of the packet `meta` describes.
    pub fn bytes(&self, meta: &PacketMeta) -> &[u8] {
        &self.bytes[..meta.len.min(self.bytes.len())]
    }
}

/// A packet received into a [`PacketBuffer`].
#[derive(Debug)]
pub struct PacketMeta {
    /// How many of the buffer's bytes the packet filled.
    pub len: usize,
    /// Every descriptor the packet carried, owned.
    pub fds: Vec<OwnedFd>,
    /// The packet was longer than [`MAX_PACKET`]; the buffer holds its
    /// start.
    pub truncated: bool,
}

/// [`recv_packet`] into `buffer`, which the caller keeps for the next.
pub fn recv_packet_in(
    socket: BorrowedFd<'_>,
    dont_wait: bool,
    buffer: &mut PacketBuffer,
) -> nix::Result<Option<PacketMeta>> {
    let mut flags = MsgFlags::MSG_CMSG_CLOEXEC;
    if dont_wait {
        flags |= MsgFlags::MSG_DONTWAIT;
    }
    let PacketBuffer { bytes, control } = buffer;
    let (len, returned_flags, fds) = {
        let mut iov = [IoSliceMut::new(bytes)];
        let message = recvmsg::<()>(socket.as_raw_fd(), &mut iov, Some(control), flags)?;
        let mut fds = Vec::new();
        // With room for SCM_MAX_FD descriptors the control data is never
        // truncated; if it were, nix refuses to walk it (ENOBUFS) and the
        // caller drops the connection.
        for message in message.cmsgs()? {
            if let ControlMessageOwned::ScmRights(raw) = message {
                for fd in raw {
                    // SAFETY: the kernel installed `fd` in this process for
                    // this message and nothing else refers to it: taking
                    // ownership closes it exactly once.
                    fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                }
            }
        }
        (message.bytes, message.flags, fds)
    };
    // A SOCK_SEQPACKET receive of 0 bytes is either an empty packet or the
    // end of the stream; only the peer's hang-up tells them apart (at end
    // of stream the socket has RCV_SHUTDOWN, which poll reports as
    // POLLRDHUP). An empty packet whose sender has since hung up is taken
    // as the end: nobody is left to answer.
    if len == 0 && fds.is_empty() && peer_hung_up(socket) {
        return Ok(None);
    }
    Ok(Some(PacketMeta {
        len,
        fds,
        truncated: returned_flags.contains(MsgFlags::MSG_TRUNC),
    }))
}

/// True when the peer of `socket` has hung up (or its state cannot be
/// read: then the connection is as good as ended).
fn peer_hung_up(socket: BorrowedFd<'_>) -> bool {
    use nix::libc::{poll, pollfd, POLLERR, POLLHUP, POLLRDHUP};
    let mut watched = pollfd {
        fd: socket.as_raw_fd(),
        events: POLLRDHUP,
        revents: 0,
    };
    // SAFETY: `watched` is one valid pollfd for the call's duration, the
    // count passed is 1, and a zero timeout never blocks; `socket` is
    // borrowed, so the descriptor stays open throughout.
    let ready = unsafe { poll(&mut watched, 1, 0) };
    ready < 0 || watched.revents & (POLLRDHUP | POLLHUP | POLLERR) != 0
}

/// A connected, close-on-exec `SOCK_SEQPACKET` socket to `path`.
/// `nonblocking` sets `O_NONBLOCK` (for an async reactor).
pub fn connect_seqpacket(path: &Path, nonblocking: bool) -> nix::Result<OwnedFd> {
    let mut flags = SockFlag::SOCK_CLOEXEC;
    if nonblocking {
        flags |= SockFlag::SOCK_NONBLOCK;
    }
    let fd = socket(AddressFamily::Unix, SockType::SeqPacket, flags, None)?;
    let address = UnixAddr::new(path)?;
    connect(fd.as_raw_fd(), &address)?;
    Ok(fd)
}

/// Sends one packet on a non-blocking socket the reactor watches, waiting
/// while the peer's queue is full.
pub async fn send_async(
    socket: &tokio::io::unix::AsyncFd<OwnedFd>,
    bytes: &[u8],
    fd: Option<BorrowedFd<'_>>,
) -> nix::Result<()> {
    use std::os::fd::AsFd;
    loop {
        let mut ready = socket.writable().await.map_err(io_errno)?;
        match send_packet(socket.get_ref().as_fd(), bytes, fd, true) {
            Err(Errno::EAGAIN) => ready.clear_ready(),
            Err(Errno::EINTR) => {}
            other => return other,
        }
    }
}

/// Receives one packet into `buffer` on a non-blocking socket the reactor
/// watches; `None` when the peer closed.
pub async fn recv_async_in(
    socket: &tokio::io::unix::AsyncFd<OwnedFd>,
    buffer: &mut PacketBuffer,
) -> nix::Result<Option<PacketMeta>> {
    use std::os::fd::AsFd;
    loop {
        let mut ready = socket.readable().await.map_err(io_errno)?;
        match recv_packet_in(socket.get_ref().as_fd(), true, buffer) {
            Err(Errno::EAGAIN) => ready.clear_ready(),
            Err(Errno::EINTR) => {}
            other => return other,
        }
    }
}

/// [`recv_async_in`], polling the socket first for up to `spin` (zero:
/// not at all) with non-blocking receives, yielding to the runtime between
/// polls (and the thread's core to the kernel's other runnable threads). A
/// peer that answers within the spin is read without this thread going to
/// sleep and being woken again, which on a VM costs more than the answer
/// itself; the spin never holds the runtime's thread from its other tasks,
/// and ends after `spin` however busy the socket is.
pub async fn recv_spinning_in(
    socket: &tokio::io::unix::AsyncFd<OwnedFd>,
    buffer: &mut PacketBuffer,
    spin: std::time::Duration,
) -> nix::Result<Option<PacketMeta>> {
    match spin_recv_in(socket, buffer, spin).await {
        Some(received) => received,
        None => recv_async_in(socket, buffer).await,
    }
}

/// The spinning half of [`recv_spinning_in`]: `None` when nothing came
/// within `spin` (then wait with [`recv_async_in`]).
pub async fn spin_recv_in(
    socket: &tokio::io::unix::AsyncFd<OwnedFd>,
    buffer: &mut PacketBuffer,
    spin: std::time::Duration,
) -> Option<nix::Result<Option<PacketMeta>>> {
    use std::os::fd::AsFd;
    if spin.is_zero() {
        return None;
    }
    let until = std::time::Instant::now() + spin;
    loop {
        match recv_packet_in(socket.get_ref().as_fd(), true, buffer) {
            Err(Errno::EAGAIN | Errno::EINTR) => {}
            other => return Some(other),
        }
        if std::time::Instant::now() >= until {
            return None;
        }
        // The thread's core too, to any thread waiting for one: on a
        // machine with fewer cores than spinners, the peer this spin waits
        // for may be one of them.
        std::thread::yield_now();
        tokio::task::yield_now().await;
    }
}

fn io_errno(error: std::io::Error) -> Errno {
    error.raw_os_error().map_or(Errno::EIO, Errno::from_raw)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use nix::sys::socket::socketpair;
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsFd;

    fn pair() -> (OwnedFd, OwnedFd) {
        socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap()
    }

    #[test]
    fn a_descriptor_arrives_with_its_packet_and_refers_to_the_same_file() {
        let (a, b) = pair();
        let mut file = tempfile_in_memory();
        let payload: Vec<u8> = (0..64).map(|_| rand::random::<u8>()).collect();
        file.write_all(&payload).unwrap();
        send_packet(a.as_fd(), b"token-1", Some(file.as_fd()), false).unwrap();
        send_packet(a.as_fd(), b"token-2", None, false).unwrap();
        let first = recv_packet(b.as_fd(), false).unwrap().unwrap();
        assert_eq!(first.bytes, b"token-1");
        assert_eq!(first.fds.len(), 1);
        assert!(!first.truncated);
        let mut received = std::fs::File::from(first.fds.into_iter().next().unwrap());
        received.rewind().unwrap();
        let mut read = Vec::new();
        received.read_to_end(&mut read).unwrap();
        assert_eq!(read, payload);
        let second = recv_packet(b.as_fd(), false).unwrap().unwrap();
        assert_eq!(second.bytes, b"token-2");
        assert!(second.fds.is_empty());
    }

    #[test]
    fn an_oversized_packet_is_reported_truncated_and_a_closed_peer_is_none() {
        let (a, b) = pair();
        send_packet(a.as_fd(), &vec![7u8; MAX_PACKET + 100], None, false).unwrap();
        let packet = recv_packet(b.as_fd(), false).unwrap().unwrap();
        assert!(packet.truncated);
        assert_eq!(packet.bytes.len(), MAX_PACKET);
        assert_eq!(recv_packet(b.as_fd(), true).unwrap_err(), Errno::EAGAIN);
        drop(a);
        assert!(recv_packet(b.as_fd(), false).unwrap().is_none());
    }

    /// An empty packet is a packet, not the end of the stream: the peer is
    /// still there, and what it sends next still arrives.
    #[test]
    fn an_empty_packet_is_not_the_end_of_the_stream() {
        let (a, b) = pair();
        send_packet(a.as_fd(), b"", None, false).unwrap();
        send_packet(a.as_fd(), b"next", None, false).unwrap();
        let empty = recv_packet(b.as_fd(), false).unwrap().unwrap();
        assert!(empty.bytes.is_empty() && empty.fds.is_empty() && !empty.truncated);
        assert_eq!(
            recv_packet(b.as_fd(), false).unwrap().unwrap().bytes,
            b"next"
        );
        drop(a);
        assert!(recv_packet(b.as_fd(), false).unwrap().is_none());
    }

    /// A packet sent during the spin, one sent after it (read by the
    /// reactor), and the peer's close, each arrive intact; with no spin the
    /// receive is the reactor's alone.
    #[test]
    fn a_spinning_receive_reads_packets_sent_during_and_after_the_spin() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            for spin in [
                std::time::Duration::from_millis(20),
                std::time::Duration::ZERO,
            ] {
                let (ours, theirs) = pair();
                nix::fcntl::fcntl(
                    &ours,
                    nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
                )
                .unwrap();
                // SAFETY: the AsyncFd owns the socket until it drops.
                let ours = unsafe { tokio::io::unix::AsyncFd::register(ours) }.unwrap();
                let mut buffer = PacketBuffer::new();
                let peer = std::thread::spawn(move || {
                    let during: Vec<u8> = (0..200u8).collect();
                    std::thread::sleep(std::time::Duration::from_millis(2));
                    send_packet(theirs.as_fd(), &during, None, false).unwrap();
                    std::thread::sleep(std::time::Duration::from_millis(60));
                    let after = vec![7u8; 3000];
                    send_packet(theirs.as_fd(), &after, None, false).unwrap();
                    theirs
                });
                let spun = std::time::Instant::now();
                let meta = recv_spinning_in(&ours, &mut buffer, spin)
                    .await
                    .unwrap()
                    .unwrap();
                assert_eq!(
                    buffer.bytes(&meta),
                    (0..200u8).collect::<Vec<u8>>().as_slice()
                );
                assert!(spun.elapsed() < std::time::Duration::from_millis(50));
                let meta = recv_spinning_in(&ours, &mut buffer, spin)
                    .await
                    .unwrap()
                    .unwrap();
                assert_eq!(buffer.bytes(&meta), vec![7u8; 3000].as_slice());
                drop(peer.join().unwrap());
                assert!(recv_spinning_in(&ours, &mut buffer, spin)
                    .await
                    .unwrap()
                    .is_none());
            }
        });
    }

    fn tempfile_in_memory() -> std::fs::File {
        let fd = nix::sys::memfd::memfd_create(
            c"fd-passing-test",
            nix::sys::memfd::MFdFlags::MFD_CLOEXEC,
        )
        .unwrap();
        std::fs::File::from(fd)
    }
}
