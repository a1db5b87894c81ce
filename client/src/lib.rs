//! ptxd-client: the async Rust SDK for ptxd.
//!
//! It hides the gRPC API: connect ([`Client`]), open a [`Session`] (its
//! lease is held for you and ends when the `Session` is dropped or closed),
//! load kernels ([`Session::load_ptx`], [`Session::load_cubin`]), register
//! buffers ([`Session::register_cuda_ipc`], [`Session::register_host_shm`],
//! [`HostShm`] for the host backend) and launch ([`Session::launch`],
//! [`Session::launch_stream`]). Every refusal arrives as
//! [`Error::Refused`] with a typed [`Refusal`].
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use ptxd_client::{Client, HostShm, Launch, LoadOptions};
//!
//! let client = Client::connect_default().await?;
//! let session = client.open_session("demo").await?;
//! let ptx = std::fs::read_to_string("add_f32_scalar.ptx")?;
//! let kernel = session.load_ptx(0, ptx, "add_f32_scalar", LoadOptions::default()).await?;
//! let (a, b, out) = (HostShm::create(4096)?, HostShm::create(4096)?, HostShm::create(4096)?);
//! let [a_buf, b_buf, out_buf] = [
//!     session.register_shm(&a, None).await?,
//!     session.register_shm(&b, None).await?,
//!     session.register_shm(&out, None).await?,
//! ];
//! session.launch(&kernel, &Launch::new([a_buf.operand(), b_buf.operand()], out_buf.operand(), 1024)).await?;
//! let sums = out.read_f32(0, 1024)?;
//! # let _ = sums;
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

mod client;
mod error;
mod fd_buffers;
mod fd_lane;
mod lane;
mod launch_ring;
mod session;
mod transport;
mod types;

#[cfg(feature = "cuda")]
pub mod cuda;
pub mod ring;

// Shared memory lives in `ptxd-ipc`, below the SDK and the daemon; the
// SDK's own modules reach it as `crate::shm`.
use ptxd_ipc::shm;

pub use client::{Client, Target};
pub use error::{Error, Refusal, RefusalDetails};
pub use fd_buffers::{attach_fd, FdBufferSpec};
pub use fd_lane::DEFAULT_REPLY_SPIN;
pub use launch_ring::{
    LaunchRing, OrphanCause, Orphaned, ReleasedWord, RingCompletion, RingRefusal, SemaphoreMemory,
    WordWriteError,
};
#[cfg(feature = "cuda")]
pub use launch_ring::{RawStreamLaunch, ORDERING_BYTES};
#[cfg(feature = "cuda")]
pub use launch_ring::{RawStreamOptions, RawStreamOutcome, RawStreamPhases};
pub use ptxd_ipc::shm::{HostMemfd, HostShm, SharedBytes, ShmError};
pub use ptxd_ipc::socket_dir::{
    checked_default_socket_path, default_socket_path, socket_path_for, SocketDirError,
};
pub use session::{
    BufferSource, Kernel, KernelState, LaunchReceiver, LaunchSender, LaunchStream, Session,
    SessionOptions, StreamReply,
};
pub use types::{
    Arg, Artifact, Buffer, BufferListing, CloseReport, DaemonInfo, DeclaredAbi, DeviceInfo,
    DeviceSelector, Event, KernelListing, KernelSignature, Launch, Launched, Limits, LoadOptions,
    Operand, SessionEvent, Usage,
};
