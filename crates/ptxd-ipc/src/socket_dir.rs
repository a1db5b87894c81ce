//! Where ptxd's socket is by default ([`default_socket_path`]), and is a
//! directory safe to hold (or to find) it ([`check_socket_dir`])? One
//! answer for the daemon, which listens there, and the SDK, which connects.
//!
//! Without `$XDG_RUNTIME_DIR`, the default socket sits in
//! `<temp dir>/ptxd-<euid>/`, a name any user can create first. If another
//! user owns that directory, or may write into it, they can put their own
//! socket there and every client of the victim talks to them. So, as
//! ssh-agent and tmux do, the daemon and the SDK refuse a default socket
//! directory that:
//! - is a symlink (checked with `lstat`, never followed);
//! - is not a directory;
//! - is owned by neither the user nor root;
//! - is group- or world-writable without the sticky bit.
//!
//! Invariants:
//! - The daemon and the SDK compute the default path with the same
//!   function, so they agree on it for the same `$XDG_RUNTIME_DIR` and uid.
//! - The check never follows a symlink and never creates anything; a
//!   directory that does not exist yet passes (there is nothing to trust,
//!   and a connect into it fails on its own).

use std::ffi::OsStr;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The socket file name inside a runtime directory.
const SOCKET_FILE: &str = "ptxd.sock";
/// The system-wide socket of a daemon run as root without a runtime dir.
const SYSTEM_SOCKET: &str = "/run/ptxd/ptxd.sock";

/// The socket path ptxd listens on (and the SDK connects to) by default:
/// `$XDG_RUNTIME_DIR/ptxd.sock` when that is set to an absolute path, else
/// `/run/ptxd/ptxd.sock` for root, else `<temp dir>/ptxd-<euid>/ptxd.sock`.
pub fn default_socket_path() -> PathBuf {
    socket_path_for(
        std::env::var_os("XDG_RUNTIME_DIR").as_deref(),
        nix::unistd::geteuid().as_raw(),
    )
}

/// [`default_socket_path`], refused when its directory is not safe to trust
/// (see [`check_socket_dir`]): another user could
/// have created the directory first and put their own daemon's socket in it.
pub fn checked_default_socket_path() -> Result<PathBuf, SocketDirError> {
    let path = default_socket_path();
    check_socket_dir(socket_dir(&path), nix::unistd::geteuid().as_raw())?;
    Ok(path)
}

/// [`default_socket_path`] for a given `$XDG_RUNTIME_DIR` and effective uid.
pub fn socket_path_for(xdg_runtime_dir: Option<&OsStr>, euid: u32) -> PathBuf {
    // The XDG spec says a relative (or empty) value must be ignored.
    match xdg_runtime_dir.map(Path::new) {
        Some(dir) if dir.is_absolute() => dir.join(SOCKET_FILE),
        _ if euid == 0 => PathBuf::from(SYSTEM_SOCKET),
        _ => std::env::temp_dir()
            .join(format!("ptxd-{euid}"))
            .join(SOCKET_FILE),
    }
}

/// Why a socket directory is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SocketDirError {
    /// The path is a symlink, which could point anywhere another user
    /// chose; it is not followed.
    #[error("socket directory {} is a symlink; refusing it (another user may have planted it)", .0.display())]
    Symlink(PathBuf),
    /// The path exists but is a file, socket or other non-directory.
    #[error("socket directory {} is not a directory", .0.display())]
    NotADirectory(PathBuf),
    /// Another user (not root) owns the directory and so controls what
    /// socket sits in it.
    #[error(
        "socket directory {} is owned by uid {owner}, not by uid {uid} or root; refusing it \
         (another user may have created it first)",
        path.display()
    )]
    NotOwned {
        /// The directory.
        path: PathBuf,
        /// The uid that owns it.
        owner: u32,
        /// The uid it was checked for.
        uid: u32,
    },
    /// Others may create or replace entries in the directory.
    #[error(
        "socket directory {} has mode {mode:04o}: group- or world-writable without the sticky \
         bit; refusing it (chmod 700 it, or remove it)",
        path.display()
    )]
    Writable {
        /// The directory.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The directory exists but its metadata cannot be read, so it cannot
    /// be trusted.
    #[error("cannot inspect socket directory {}: {message}", path.display())]
    Inspect {
        /// The directory.
        path: PathBuf,
        /// The OS error, as text (to keep the error `Clone` and `Eq`).
        message: String,
    },
}

/// Checks `dir` for the user `euid` (see the module doc). A directory that
/// does not exist passes: there is nothing to trust yet, and a connect to a
/// socket inside it fails on its own.
pub fn check_socket_dir(dir: &Path, euid: u32) -> Result<(), SocketDirError> {
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(SocketDirError::Inspect {
                path: dir.to_owned(),
                message: e.to_string(),
            })
        }
    };
    if meta.file_type().is_symlink() {
        return Err(SocketDirError::Symlink(dir.to_owned()));
    }
    if !meta.is_dir() {
        return Err(SocketDirError::NotADirectory(dir.to_owned()));
    }
    if meta.uid() != euid && meta.uid() != 0 {
        return Err(SocketDirError::NotOwned {
            path: dir.to_owned(),
            owner: meta.uid(),
            uid: euid,
        });
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o022 != 0 && mode & 0o1000 == 0 {
        return Err(SocketDirError::Writable {
            path: dir.to_owned(),
            mode,
        });
    }
    Ok(())
}

/// The directory of a socket path (`.` for a bare name).
pub fn socket_dir(socket: &Path) -> &Path {
    match socket.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn socket_path_follows_xdg_then_root_then_temp() {
        assert_eq!(
            socket_path_for(Some(OsStr::new("/run/user/1000")), 1000),
            PathBuf::from("/run/user/1000/ptxd.sock")
        );
        assert_eq!(
            socket_path_for(Some(OsStr::new("/run/user/0")), 0),
            PathBuf::from("/run/user/0/ptxd.sock")
        );
        assert_eq!(
            socket_path_for(None, 0),
            PathBuf::from("/run/ptxd/ptxd.sock")
        );
        assert_eq!(
            socket_path_for(Some(OsStr::new("relative/dir")), 0),
            PathBuf::from("/run/ptxd/ptxd.sock")
        );
        assert_eq!(
            socket_path_for(Some(OsStr::new("")), 1000),
            std::env::temp_dir().join("ptxd-1000/ptxd.sock")
        );
        assert_eq!(
            socket_path_for(None, 1000),
            std::env::temp_dir().join("ptxd-1000/ptxd.sock")
        );
    }

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    fn euid() -> u32 {
        nix::unistd::geteuid().as_raw()
    }

    #[test]
    fn a_private_or_sticky_directory_of_the_user_passes() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("ptxd-1");
        std::fs::create_dir(&dir).unwrap();
        chmod(&dir, 0o700);
        check_socket_dir(&dir, euid()).unwrap();
        chmod(&dir, 0o1777);
        check_socket_dir(&dir, euid()).unwrap();
        chmod(&dir, 0o755);
        check_socket_dir(&dir, euid()).unwrap();
        check_socket_dir(&root.path().join("absent"), euid()).unwrap();
    }

    #[test]
    fn a_group_or_world_writable_directory_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("ptxd-1");
        std::fs::create_dir(&dir).unwrap();
        for mode in [0o777, 0o770, 0o702, 0o720] {
            chmod(&dir, mode);
            assert_eq!(
                check_socket_dir(&dir, euid()),
                Err(SocketDirError::Writable {
                    path: dir.clone(),
                    mode
                }),
                "{mode:o}"
            );
        }
        let message = check_socket_dir(&dir, euid()).unwrap_err().to_string();
        assert!(
            message.contains("0720") && message.contains("sticky"),
            "{message}"
        );
    }

    #[test]
    fn a_symlink_is_refused_even_to_a_good_directory() {
        let root = tempfile::tempdir().unwrap();
        let target = root.path().join("real");
        std::fs::create_dir(&target).unwrap();
        chmod(&target, 0o700);
        let link = root.path().join("ptxd-1");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert_eq!(
            check_socket_dir(&link, euid()),
            Err(SocketDirError::Symlink(link.clone()))
        );
        let file = root.path().join("file");
        std::fs::write(&file, b"").unwrap();
        assert_eq!(
            check_socket_dir(&file, euid()),
            Err(SocketDirError::NotADirectory(file.clone()))
        );
    }

    #[test]
    fn a_directory_of_another_user_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("ptxd-1");
        std::fs::create_dir(&dir).unwrap();
        chmod(&dir, 0o700);
        let owner = std::fs::metadata(&dir).unwrap().uid();
        // Checked as another (non-root) user than the directory's owner; as
        // root, also with the directory given away for real.
        let other = if owner == 4242 { 4243 } else { 4242 };
        if owner != 0 {
            assert_eq!(
                check_socket_dir(&dir, other),
                Err(SocketDirError::NotOwned {
                    path: dir.clone(),
                    owner,
                    uid: other
                })
            );
        }
        if euid() == 0 {
            nix::unistd::chown(&dir, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
            assert_eq!(
                check_socket_dir(&dir, 0),
                Err(SocketDirError::NotOwned {
                    path: dir.clone(),
                    owner: 65534,
                    uid: 0
                })
            );
        }
    }
}
