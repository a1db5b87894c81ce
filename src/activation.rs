//! systemd socket activation: taking the listening Unix socket systemd (or
//! `systemd-socket-activate`) passed in, instead of binding one.
//!
//! The protocol (sd_listen_fds(3)): the passed sockets are fds 3.. (3 =
//! `SD_LISTEN_FDS_START`), `LISTEN_FDS` says how many, and `LISTEN_PID` names
//! the process they are for — a child that inherited the environment but
//! not the purpose must not take them.
//!
//! Invariants:
//! - fd 3 is taken only when `LISTEN_PID` is this process and `LISTEN_FDS`
//!   is exactly 1, and only once per process (a second call, or a call after
//!   the environment was consumed, returns `Ok(None)`); so the `OwnedFd` made
//!   from it is the only owner.
//! - Whatever fd 3 turns out to be, it is checked to be a listening
//!   `AF_UNIX` `SOCK_STREAM` socket before it is used: ptxd's peer-credential
//!   checks only mean something on a Unix socket.
//! - The returned socket is close-on-exec (executor children must not
//!   inherit the listener) and non-blocking (ready for
//!   `tokio::net::UnixListener::from_std`).
//! - `LISTEN_PID`, `LISTEN_FDS` and `LISTEN_FDNAMES` are removed from the
//!   environment by the first call, whatever they said, so executor children
//!   do not see them.

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, Ordering};

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::sys::socket::{
    getsockname, getsockopt, sockopt, AddressFamily, SockType, SockaddrLike, SockaddrStorage,
};

/// The first passed fd (`SD_LISTEN_FDS_START` in sd-daemon.h).
pub const SD_LISTEN_FDS_START: RawFd = 3;

/// Why the passed socket cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ActivationError {
    /// `LISTEN_PID` is set but is not a process id.
    #[error("LISTEN_PID is not a process id: {value:?}")]
    InvalidListenPid {
        /// The variable's value.
        value: String,
    },
    /// `LISTEN_FDS` is set for this process but is not a count.
    #[error("LISTEN_FDS is not a count: {value:?}")]
    InvalidListenFds {
        /// The variable's value.
        value: String,
    },
    /// More than one socket was passed; ptxd serves exactly one.
    #[error(
        "systemd passed {count} sockets; ptxd takes exactly one \
         (one ListenStream= in ptxd.socket)"
    )]
    TooManySockets {
        /// `LISTEN_FDS`.
        count: u32,
    },
    /// fd 3 is not open, or not a socket.
    #[error("the passed fd {fd} is not a socket: {errno}")]
    NotASocket {
        /// The fd.
        fd: RawFd,
        /// What the kernel said.
        errno: Errno,
    },
    /// fd 3 is a socket of another family than `AF_UNIX`.
    #[error("the passed socket is not a Unix socket (family {family:?}); use ListenStream=/path")]
    NotUnix {
        /// The family found, if nix knows it.
        family: Option<AddressFamily>,
    },
    /// fd 3 is not a stream socket.
    #[error("the passed socket is {found:?}, not SOCK_STREAM")]
    NotStream {
        /// The socket type found.
        found: SockType,
    },
    /// fd 3 is a socket that is not listening (e.g. `Accept=yes` passed a
    /// connection).
    #[error("the passed socket is not listening (is Accept=yes set in ptxd.socket?)")]
    NotListening,
    /// Setting close-on-exec or non-blocking mode failed.
    #[error("cannot set {what} on the passed socket: {errno}")]
    SetFlag {
        /// Which flag.
        what: &'static str,
        /// What the kernel said.
        errno: Errno,
    },
}

/// What the activation environment says, as read by [`parse_listen_env`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenEnv {
    /// No socket was passed to this process (variables absent, or for
    /// another process).
    NotActivated,
    /// Sockets were passed to this process, `count` of them, from fd 3 on.
    Activated {
        /// `LISTEN_FDS`.
        count: u32,
    },
}

/// Reads the activation variables the way sd_listen_fds(3) does: absent or
/// for another pid means not activated; a malformed value for this pid is an
/// error. Pure, for testing; [`take_activated_unix_listener`] feeds it the
/// real environment.
pub fn parse_listen_env(
    listen_pid: Option<&OsStr>,
    listen_fds: Option<&OsStr>,
    own_pid: u32,
) -> Result<ListenEnv, ActivationError> {
    let Some(listen_pid) = listen_pid else {
        return Ok(ListenEnv::NotActivated);
    };
    let text = listen_pid.to_string_lossy();
    let pid = text
        .parse::<u32>()
        .ok()
        .filter(|&pid| pid > 0)
        .ok_or_else(|| ActivationError::InvalidListenPid {
            value: text.clone().into_owned(),
        })?;
    if pid != own_pid {
        return Ok(ListenEnv::NotActivated);
    }
    let Some(listen_fds) = listen_fds else {
        return Ok(ListenEnv::NotActivated);
    };
    let text = listen_fds.to_string_lossy();
    let count = text
        .parse::<u32>()
        .map_err(|_| ActivationError::InvalidListenFds {
            value: text.clone().into_owned(),
        })?;
    Ok(match count {
        0 => ListenEnv::NotActivated,
        count => ListenEnv::Activated { count },
    })
}

/// Set once fd 3 has been taken (or looked at and refused), so it has at
/// most one owner even if two threads call at once.
static TAKEN: AtomicBool = AtomicBool::new(false);

/// The listening Unix socket systemd passed to this process, if any.
///
/// `Ok(None)` when the process was not socket-activated; then the caller
/// binds its own socket. Call it once, early in `main`, before other threads
/// read the environment: it removes the activation variables (as
/// `sd_listen_fds(1)` does), and `std::env::remove_var` races with
/// concurrent environment reads.
pub fn take_activated_unix_listener() -> Result<Option<UnixListener>, ActivationError> {
    let listen_pid = std::env::var_os("LISTEN_PID");
    let listen_fds = std::env::var_os("LISTEN_FDS");
    let parsed = parse_listen_env(
        listen_pid.as_deref(),
        listen_fds.as_deref(),
        std::process::id(),
    );
    // As sd_listen_fds(3) with unset_environment: consumed whatever they
    // said, so executor children never see them.
    for name in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        std::env::remove_var(name);
    }
    let count = match parsed? {
        ListenEnv::NotActivated => return Ok(None),
        ListenEnv::Activated { count } => count,
    };
    if TAKEN.swap(true, Ordering::SeqCst) {
        return Ok(None);
    }
    if count > 1 {
        return Err(ActivationError::TooManySockets { count });
    }
    let fd = SD_LISTEN_FDS_START;
    // F_GETFD fails with EBADF on a closed fd: check before borrowing it.
    fcntl(
        // SAFETY: only used for this one fcntl call, which tolerates a
        // closed fd (it reports EBADF); nothing is closed or kept.
        unsafe { BorrowedFd::borrow_raw(fd) },
        FcntlArg::F_GETFD,
    )
    .map_err(|errno| ActivationError::NotASocket { fd, errno })?;
    // SAFETY: fd 3 is open (F_GETFD succeeded) and was passed to this
    // process by its activator (LISTEN_PID is our pid); TAKEN guarantees this
    // line runs at most once per process, so this OwnedFd is fd 3's only
    // owner and the only one to close it.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    check_listening_unix_stream(owned.as_fd())?;
    fcntl(owned.as_fd(), FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC)).map_err(|errno| {
        ActivationError::SetFlag {
            what: "FD_CLOEXEC",
            errno,
        }
    })?;
    let listener = UnixListener::from(owned);
    listener
        .set_nonblocking(true)
        .map_err(|error| ActivationError::SetFlag {
            what: "O_NONBLOCK",
            errno: Errno::from_raw(error.raw_os_error().unwrap_or(0)),
        })?;
    Ok(Some(listener))
}

/// Checks that `fd` is a listening `AF_UNIX` `SOCK_STREAM` socket.
pub fn check_listening_unix_stream(fd: BorrowedFd<'_>) -> Result<(), ActivationError> {
    let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
    let found = getsockopt(&fd, sockopt::SockType)
        .map_err(|errno| ActivationError::NotASocket { fd: raw, errno })?;
    let address = getsockname::<SockaddrStorage>(raw)
        .map_err(|errno| ActivationError::NotASocket { fd: raw, errno })?;
    if address.family() != Some(AddressFamily::Unix) {
        return Err(ActivationError::NotUnix {
            family: address.family(),
        });
    }
    if found != SockType::Stream {
        return Err(ActivationError::NotStream { found });
    }
    let listening = getsockopt(&fd, sockopt::AcceptConn)
        .map_err(|errno| ActivationError::NotASocket { fd: raw, errno })?;
    if !listening {
        return Err(ActivationError::NotListening);
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::ffi::OsString;
    use std::net::TcpListener;
    use std::os::unix::net::{UnixDatagram, UnixStream};

    fn parse(pid: Option<&str>, fds: Option<&str>, own: u32) -> Result<ListenEnv, ActivationError> {
        let pid = pid.map(OsString::from);
        let fds = fds.map(OsString::from);
        parse_listen_env(pid.as_deref(), fds.as_deref(), own)
    }

    #[test]
    fn the_environment_is_read_as_sd_listen_fds_reads_it() {
        let own = 4242;
        assert_eq!(parse(None, None, own).unwrap(), ListenEnv::NotActivated);
        assert_eq!(
            parse(None, Some("1"), own).unwrap(),
            ListenEnv::NotActivated
        );
        // For another process: not ours, whatever LISTEN_FDS says.
        assert_eq!(
            parse(Some("4243"), Some("1"), own).unwrap(),
            ListenEnv::NotActivated
        );
        assert_eq!(
            parse(Some("4243"), Some("junk"), own).unwrap(),
            ListenEnv::NotActivated
        );
        assert_eq!(
            parse(Some("4242"), None, own).unwrap(),
            ListenEnv::NotActivated
        );
        assert_eq!(
            parse(Some("4242"), Some("0"), own).unwrap(),
            ListenEnv::NotActivated
        );
        assert_eq!(
            parse(Some("4242"), Some("1"), own).unwrap(),
            ListenEnv::Activated { count: 1 }
        );
        assert_eq!(
            parse(Some("4242"), Some("3"), own).unwrap(),
            ListenEnv::Activated { count: 3 }
        );
        for bad_pid in ["", "0", "-1", "12x", " 4242", "99999999999999"] {
            assert!(
                matches!(
                    parse(Some(bad_pid), Some("1"), own),
                    Err(ActivationError::InvalidListenPid { value }) if value == bad_pid
                ),
                "{bad_pid:?}"
            );
        }
        for bad_count in ["", "-1", "one", "1 ", "4294967296"] {
            assert!(
                matches!(
                    parse(Some("4242"), Some(bad_count), own),
                    Err(ActivationError::InvalidListenFds { value }) if value == bad_count
                ),
                "{bad_count:?}"
            );
        }
    }

    #[test]
    fn only_a_listening_unix_stream_socket_passes_the_check() {
        let dir = tempfile::tempdir().unwrap();
        let listener = UnixListener::bind(dir.path().join("ok.sock")).unwrap();
        check_listening_unix_stream(listener.as_fd()).unwrap();

        let (connected, _peer) = UnixStream::pair().unwrap();
        assert!(matches!(
            check_listening_unix_stream(connected.as_fd()),
            Err(ActivationError::NotListening)
        ));
        let datagram = UnixDatagram::bind(dir.path().join("dgram.sock")).unwrap();
        assert!(matches!(
            check_listening_unix_stream(datagram.as_fd()),
            Err(ActivationError::NotStream {
                found: SockType::Datagram
            })
        ));
        let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(matches!(
            check_listening_unix_stream(tcp.as_fd()),
            Err(ActivationError::NotUnix {
                family: Some(AddressFamily::Inet)
            })
        ));
        let file = std::fs::File::open(dir.path()).unwrap();
        assert!(matches!(
            check_listening_unix_stream(file.as_fd()),
            Err(ActivationError::NotASocket {
                errno: Errno::ENOTSOCK,
                ..
            })
        ));
    }
}
