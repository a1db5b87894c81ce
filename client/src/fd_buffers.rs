//! Buffers passed by file descriptor: the session's side of the fd socket.
//!
//! A registration is one `RegisterBuffer` (source `posix_fd`), which returns
//! a one-time token, then one round trip on the daemon's fd socket
//! (`<socket>.fds`, `SOCK_SEQPACKET`): the token and the descriptor go in one
//! packet, and the reply is the registered buffer or a refusal. The daemon
//! checks the fd socket's peer credentials against the uid that asked for
//! the token, reads the memory's size from the driver or the file, and
//! keeps its own reference, so the caller may close its descriptor as soon
//! as the call returns.
//!
//! Descriptors cross PID, IPC and mount namespaces: a client in its own
//! containers needs only the two sockets.

use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use prost::Message;
use ptxd_proto::v1 as pb;
use tokio::io::unix::AsyncFd;

use crate::error::{from_launch_error, Error};
use crate::session::Session;
use crate::shm::HostMemfd;
use crate::types::Buffer;
use ptxd_ipc::packet::{
    connect_seqpacket, recv_async_in, send_async, PacketBuffer, PacketMeta, MAX_PACKET,
};

/// Where a buffer passed by descriptor lives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FdBufferSpec {
    /// The device; `None`: the daemon's first device.
    pub device_uuid: Option<String>,
    /// Where the buffer starts inside the allocation or file, in bytes.
    pub offset: u64,
    /// CUDA: the size of the whole allocation behind the descriptor
    /// (`ExportableAllocation::allocation_size`,
    /// `ExportedRange::allocation_size`). The driver maps an imported
    /// allocation only at its exact size, which ptxd cannot learn otherwise:
    /// `None` works only when the buffer ends in the allocation's last
    /// granule. ptxd verifies it; a wrong one is refused.
    pub allocation_size: Option<u64>,
    /// A label for listings.
    pub label: String,
}

impl Session {
    /// Registers `size` bytes of the memory behind `fd`, starting at
    /// `spec.offset`: on the CUDA backend an fd from
    /// `cuMemExportToShareableHandle` (see
    /// [`CudaDevice::alloc_exportable`](crate::cuda::CudaDevice::alloc_exportable)),
    /// on the host backend a memfd sealed with `F_SEAL_SHRINK` (see
    /// [`HostMemfd`]). Needs the Unix-socket transport.
    pub async fn register_fd_buffer(
        &self,
        fd: BorrowedFd<'_>,
        size: u64,
        spec: FdBufferSpec,
    ) -> Result<Buffer, Error> {
        let fd_socket = self.fd_socket_path()?;
        let request = pb::RegisterBufferRequest {
            session: self.id().to_owned(),
            source: Some(pb::register_buffer_request::Source::PosixFd(
                pb::PosixFdBuffer {
                    device_uuid: spec.device_uuid.unwrap_or_default(),
                    offset: spec.offset,
                    allocation_size: spec.allocation_size.unwrap_or(0),
                },
            )),
            size,
            label: spec.label,
        };
        let response = self.grpc()?.register_buffer(request).await?.into_inner();
        if response.fd_token.is_empty() {
            return Err(Error::Protocol(
                "a posix_fd registration returned no fd token".into(),
            ));
        }
        let registered = attach_fd(fd_socket, &response.fd_token, fd).await?;
        if registered.buffer.is_empty() {
            return Err(Error::Protocol("the fd socket returned no handle".into()));
        }
        Ok(Buffer {
            handle: registered.buffer,
            size,
            device_uuid: registered.device_uuid,
            generation: registered.generation,
            ring_index: registered.ring_index,
        })
    }

    /// The fd socket, or why this session has none.
    pub(crate) fn fd_socket_path(&self) -> Result<&Path, Error> {
        self.fd_socket.as_deref().ok_or_else(|| {
            Error::InvalidInput(
                "memory passes by file descriptor only over the Unix socket (this client has no fd socket)"
                    .into(),
            )
        })
    }

    /// Registers the whole of a [`HostMemfd`] (host backend) by descriptor;
    /// `device_uuid` `None` means the first host device.
    pub async fn register_memfd(
        &self,
        memfd: &HostMemfd,
        device_uuid: Option<&str>,
    ) -> Result<Buffer, Error> {
        let spec = FdBufferSpec {
            device_uuid: device_uuid.map(str::to_owned),
            ..FdBufferSpec::default()
        };
        self.register_fd_buffer(memfd.as_fd(), memfd.size(), spec)
            .await
    }
}

/// One exchange on the fd socket at `path` for a buffer: `token` (from
/// `RegisterBuffer`) and `fd` out, the registered buffer (or the refusal)
/// back.
pub async fn attach_fd(
    path: &Path,
    token: &str,
    fd: BorrowedFd<'_>,
) -> Result<pb::RegisterBufferResponse, Error> {
    match exchange(path, token, fd).await? {
        pb::fd_attach_reply::Result::Registered(registered) => Ok(registered),
        other => Err(Error::Protocol(format!(
            "the fd socket answered a buffer's token with {other:?}"
        ))),
    }
}

/// The same for a ring's memfd (a token from `OpenRing` with `by_fd`).
pub(crate) async fn attach_ring_fd(
    path: &Path,
    token: &str,
    fd: BorrowedFd<'_>,
) -> Result<pb::OpenRingResponse, Error> {
    match exchange(path, token, fd).await? {
        pb::fd_attach_reply::Result::Ring(ring) => Ok(ring),
        other => Err(Error::Protocol(format!(
            "the fd socket answered a ring's token with {other:?}"
        ))),
    }
}

/// One exchange on the fd socket: the reply, a refusal as an error.
async fn exchange(
    path: &Path,
    token: &str,
    fd: BorrowedFd<'_>,
) -> Result<pb::fd_attach_reply::Result, Error> {
    let io = |what: &str, errno: nix::errno::Errno| {
        Error::Protocol(format!("fd socket {}: {what}: {errno}", path.display()))
    };
    let socket = connect_seqpacket(path, true).map_err(|e| io("connect", e))?;
    // SAFETY: the AsyncFd owns the OwnedFd, so the descriptor stays open and
    // names the same socket until the AsyncFd drops.
    let socket = unsafe { AsyncFd::register(socket) }
        .map_err(|e| Error::Protocol(format!("fd socket: {e}")))?;
    let packet = pb::FdAttach {
        body: Some(pb::fd_attach::Body::Token(token.to_owned())),
    }
    .encode_to_vec();
    send_async(&socket, &packet, Some(fd))
        .await
        .map_err(|e| io("send", e))?;
    let mut buffer = PacketBuffer::new();
    let reply = recv_async_in(&socket, &mut buffer)
        .await
        .map_err(|e| io("receive", e))?
        .ok_or_else(|| Error::Protocol("the daemon closed the fd socket without a reply".into()))?;
    decode_reply(buffer.bytes(&reply), reply)
}

/// An fd socket reply's result; a refusal becomes the error the same
/// refusal over gRPC would have been.
pub(crate) fn decode_reply(
    bytes: &[u8],
    reply: PacketMeta,
) -> Result<pb::fd_attach_reply::Result, Error> {
    if reply.truncated || bytes.len() > MAX_PACKET {
        return Err(Error::Protocol("an oversized fd socket reply".into()));
    }
    // The daemon sends no descriptors back; any that came are closed here.
    drop(reply.fds);
    let reply = pb::FdAttachReply::decode(bytes)
        .map_err(|e| Error::Protocol(format!("an undecodable fd socket reply: {e}")))?;
    match reply.result {
        Some(pb::fd_attach_reply::Result::Refused(refused)) => {
            Err(from_launch_error(pb::LaunchError {
                code: refused.code,
                reason: refused.reason,
                message: refused.message,
                metadata: refused.metadata,
            }))
        }
        Some(result) => Ok(result),
        None => Err(Error::Protocol("an empty fd socket reply".into())),
    }
}
