//! ptxd-ipc: the building blocks two processes share, below both the daemon
//! (`ptxd`) and the SDK (`ptxd-client`), as iceoryx2 keeps its transport
//! below its user API.
//!
//! - [`ring`]: the shared-memory launch ring: its byte layout, descriptor
//!   and completion records, the mapping every access goes through, the
//!   futex sleep, and both ends ([`ring::Submitter`] for the session,
//!   [`ring::Server`] for the executor).
//! - [`shm`]: shared memory a session creates (named POSIX objects and
//!   sealed memfds) and the portable-name check the daemon applies to a
//!   name it is given.
//! - [`packet`]: the packet socket's I/O (`SOCK_SEQPACKET` datagrams with
//!   at most one descriptor each), used by the SDK's fd lane, the daemon's
//!   fd socket and the executor's fd inbox alike.
//! - [`socket_dir`]: where ptxd's socket is by default, and whether its
//!   directory can be trusted.
//!
//! The SDK re-exports only what its users call (the records its
//! `LaunchRing` takes, the shared-memory buffers, the default socket path);
//! the ring's server, the shared-memory name check and the directory check
//! are the daemon's.
//!
//! Invariants (each kept by the module named, whose doc states it in full):
//! - In a ring, every byte the peer may write is read through an atomic
//!   operation on an aligned word, never through a `&`/`&mut` reference
//!   (`ring::region`), so a hostile peer yields a torn value to validate,
//!   never undefined behavior; so are a shared buffer's semaphore words
//!   (`shm`).
//! - A mapping lives exactly as long as the value that owns it, which
//!   unmaps it (and unlinks a name it created) once, on drop (`shm`,
//!   `ring::region`).
//! - Sizes and offsets come from a validated [`ring::RingLayout`], never
//!   from counters or bytes the peer wrote; a counter out of its window
//!   poisons that side of the ring (`ring`).
//! - Every sleep is bounded; a peer that never wakes us costs latency, not
//!   a hang (`ring::futex`).
//! - The daemon and the SDK share one definition of each format and path:
//!   nothing here is duplicated on either side.
//! - This crate knows nothing of gRPC, CUDA or the daemon's policy: a
//!   [`ring::Descriptor`] that decodes is well formed, not authorized.

#![warn(missing_docs)]

pub mod packet;
pub mod ring;
pub mod shm;
pub mod socket_dir;
