//! Executors: the child processes that do device work, one per device, and
//! the front's side of them.
//!
//! - [`protocol`]: the framing of the internal protocol.
//! - [`child`]: the executor process's request loop and the [`child::Backend`]
//!   trait that a device backend implements.
//! - [`host`]: the host (CPU) backend over POSIX shared memory.
//! - [`cuda`]: the CUDA backend.
//! - [`supervisor`]: spawns executors, assigns device generations, notices
//!   death, respawns and re-opens buffers.

pub mod child;
pub mod cuda;
pub mod host;
pub mod protocol;
pub mod supervisor;
