//! The host (CPU) executor backend: runs verified scalar kernels with the PTX
//! host engine over POSIX shared-memory buffers that sessions create and
//! register by name.
//!
//! Invariants:
//! - A buffer is mapped once, at registration, `MAP_SHARED`, so results land
//!   in the client's memory without copies; closing it unmaps it.
//! - A mapping is never smaller than the size the front bounds-checks
//!   launches against: registration refuses an object shorter than claimed.
//! - A launch only ever touches `[base + offset, base + size)` of each
//!   operand; the front checked `offset + n × element size <= size`, and the
//!   engine's checked mode re-checks every access.

use std::collections::HashMap;
use std::ffi::CString;
use std::num::NonZeroUsize;
use std::os::fd::AsFd;
use std::ptr::NonNull;
use std::sync::Arc;

use nix::fcntl::OFlag;
use nix::sys::mman::{mmap, munmap, shm_open, MapFlags, ProtFlags};
use nix::sys::stat::{fstat, Mode};
use ptxd_proto::executor::{
    open_buffer::Source, reply, request::Op, ArtifactKind, DeviceDesc, FailureKind, Hello,
    LoadModuleOk, OpenBufferOk,
};

use super::child::{Backend, Replier};
use crate::ptx::{HostKernel, HostLaunch, HostSpan, PtxError};

/// The UUID of host device `index`.
pub fn host_device_uuid(index: u32) -> String {
    format!("HOST-{index}")
}

/// One shared-memory mapping, and the object's descriptor: the object's
/// size is re-checked before every launch, since a client that shrinks it
/// after registration would otherwise make the executor fault (SIGBUS).
struct Mapping {
    base: NonNull<u8>,
    len: usize,
    fd: std::os::fd::OwnedFd,
}

impl Mapping {
    fn still_covered(&self) -> Result<(), String> {
        let size = fstat(self.fd.as_fd()).map(|st| st.st_size).unwrap_or(0);
        if u64::try_from(size).unwrap_or(0) < self.len as u64 {
            return Err(format!(
                "the shared-memory object shrank to {size} bytes after it was registered with {}",
                self.len
            ));
        }
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly what mmap returned for this
        // mapping, and it is unmapped only here, once.
        if let Err(e) = unsafe { munmap(self.base.cast(), self.len) } {
            tracing::warn!(error = %e, "munmap failed");
        }
    }
}

fn map_shm(
    name: &str,
    size: u64,
    owner_uid: Option<u32>,
) -> Result<Mapping, (FailureKind, String, String)> {
    let invalid = |what: &str, err: nix::Error| {
        (
            FailureKind::InvalidHandle,
            format!("shared memory {name:?}: {what}: {err}"),
            format!("{err:?}"),
        )
    };
    let cname = CString::new(name).map_err(|_| {
        (
            FailureKind::InvalidHandle,
            format!("shared memory name {name:?} contains a NUL byte"),
            "EINVAL".into(),
        )
    })?;
    let fd = shm_open(cname.as_c_str(), OFlag::O_RDWR, Mode::empty())
        .map_err(|e| invalid("shm_open", e))?;
    let stat = fstat(fd.as_fd()).map_err(|e| invalid("fstat", e))?;
    // The daemon may be able to open objects its clients cannot: a session
    // maps only objects its own uid owns (root may map any).
    if let Some(uid) = owner_uid {
        if uid != 0 && stat.st_uid != uid {
            return Err((
                FailureKind::InvalidHandle,
                format!(
                    "shared memory {name:?} belongs to uid {}, not to the session's uid {uid}",
                    stat.st_uid
                ),
                "EACCES".into(),
            ));
        }
    }
    let actual = u64::try_from(stat.st_size).unwrap_or(0);
    if actual < size {
        return Err((
            FailureKind::InvalidHandle,
            format!(
                "shared memory {name:?} holds {actual} bytes, fewer than the {size} registered"
            ),
            "ERANGE".into(),
        ));
    }
    let len = usize::try_from(size)
        .ok()
        .and_then(NonZeroUsize::new)
        .ok_or_else(|| {
            (
                FailureKind::InvalidHandle,
                format!("cannot map {size} bytes"),
                "EINVAL".into(),
            )
        })?;
    // SAFETY: a fresh shared mapping of an fd we own; no existing Rust object
    // aliases it.
    let base = unsafe {
        mmap(
            None,
            len,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_SHARED,
            &fd,
            0,
        )
    }
    .map_err(|e| invalid("mmap", e))?;
    Ok(Mapping {
        base: base.cast(),
        len: len.get(),
        fd,
    })
}

/// The host backend for one host device.
pub struct HostBackend {
    index: u32,
    threads: usize,
    checked: bool,
    kernels: HashMap<u64, Arc<HostKernel>>,
    buffers: HashMap<u64, Mapping>,
}

impl std::fmt::Debug for HostBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBackend")
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}

impl HostBackend {
    pub fn new(index: u32, threads: usize, checked: bool) -> Self {
        HostBackend {
            index,
            threads: threads.max(1),
            checked,
            kernels: HashMap::new(),
            buffers: HashMap::new(),
        }
    }

    fn span(&self, buffer_id: u64, offset: u64) -> Result<HostSpan, (FailureKind, String)> {
        let mapping = self.buffers.get(&buffer_id).ok_or_else(|| {
            (
                FailureKind::UnknownObject,
                format!("buffer {buffer_id} is not open"),
            )
        })?;
        mapping
            .still_covered()
            .map_err(|e| (FailureKind::OutOfBounds, e))?;
        let offset = usize::try_from(offset)
            .ok()
            .filter(|o| *o <= mapping.len)
            .ok_or_else(|| {
                (
                    FailureKind::OutOfBounds,
                    format!(
                        "offset {offset} is past the end of buffer {buffer_id} ({} bytes)",
                        mapping.len
                    ),
                )
            })?;
        // SAFETY: offset <= len, so the result stays inside (or one past) the mapping.
        let ptr = unsafe { mapping.base.as_ptr().add(offset) };
        Ok(HostSpan {
            ptr,
            len: mapping.len - offset,
        })
    }

    fn load(&mut self, load: ptxd_proto::executor::LoadModule, reply: Replier) {
        if load.kind != ArtifactKind::Ptx as i32 {
            return reply.fail(
                FailureKind::UnsupportedArtifact,
                "the host backend runs PTX only; cubin and fatbin need the CUDA backend",
                &[],
            );
        }
        let text = match std::str::from_utf8(&load.artifact) {
            Ok(t) => t,
            Err(e) => {
                return reply.fail(
                    FailureKind::InvalidArtifact,
                    format!("PTX is not UTF-8: {e}"),
                    &[],
                )
            }
        };
        match HostKernel::compile(text, &load.symbol) {
            Ok(kernel) => {
                // The block the engine runs with (`.reqntid`, else `.maxntid`
                // capped at the default), so LoadKernel reports the truth.
                let block_size = kernel.block_size();
                self.kernels.insert(load.module_id, Arc::new(kernel));
                reply.send(reply::Result::LoadModule(LoadModuleOk {
                    block_size,
                    info_log: String::new(),
                }))
            }
            Err(e) => {
                let kind = match &e {
                    PtxError::Parse { .. } => FailureKind::InvalidArtifact,
                    PtxError::SymbolNotFound { .. } => FailureKind::SymbolNotFound,
                    PtxError::NonScalarAbi { .. } => FailureKind::NonScalarAbi,
                    PtxError::AbiMismatch { .. } => FailureKind::AbiMismatch,
                    PtxError::UnsupportedOnHost { .. } => FailureKind::UnsupportedOnHost,
                };
                let metadata: Vec<(&str, String)> = e
                    .metadata()
                    .into_iter()
                    .map(|(k, v)| (leak_key(&k), v))
                    .collect();
                reply.fail(kind, e.to_string(), &metadata)
            }
        }
    }

    fn launch(&mut self, launch: ptxd_proto::executor::Launch, reply: Replier) {
        let Some(kernel) = self.kernels.get(&launch.module_id).cloned() else {
            return reply.fail(
                FailureKind::UnknownObject,
                format!("module {} is not loaded", launch.module_id),
                &[("object", "module".into())],
            );
        };
        let spans: Result<Vec<HostSpan>, (FailureKind, String)> = launch
            .inputs
            .iter()
            .map(|o| self.span(o.buffer_id, o.offset))
            .collect();
        let output = launch
            .output
            .as_ref()
            .ok_or_else(|| {
                (
                    FailureKind::Internal,
                    "launch without an output".to_string(),
                )
            })
            .and_then(|o| self.span(o.buffer_id, o.offset));
        let (inputs, output) = match (spans, output) {
            (Ok(i), Ok(o)) => (i, o),
            (Err((FailureKind::UnknownObject, e)), _)
            | (_, Err((FailureKind::UnknownObject, e))) => {
                return reply.fail(
                    FailureKind::UnknownObject,
                    e,
                    &[("object", "buffer".into())],
                )
            }
            (Err((kind, e)), _) | (_, Err((kind, e))) => return reply.fail(kind, e, &[]),
        };
        let host_launch = HostLaunch {
            inputs: &inputs,
            output,
            n: launch.n,
            params: &launch.params,
            threads: self.threads,
            checked: self.checked,
        };
        // SAFETY: every span lies inside a live MAP_SHARED mapping owned by
        // `self.buffers` (checked by `span`), which is not unmapped while the
        // launch runs: this thread owns `self` for the whole call.
        match unsafe { kernel.launch(&host_launch) } {
            Ok(()) => reply.ok(),
            Err(fault) => reply.fail(
                FailureKind::KernelFault,
                fault.to_string(),
                &[("line", fault.line.to_string())],
            ),
        }
    }
}

/// Metadata keys of a PTX error come from a small closed set; map them to
/// static strings without leaking memory.
fn leak_key(key: &str) -> &'static str {
    match key {
        "line" => "line",
        "column" => "column",
        "symbol" => "symbol",
        "entries" => "entries",
        "sub_reason" => "sub_reason",
        "param" => "param",
        "explanation" => "explanation",
        "what" => "what",
        "expected" => "expected",
        "found" => "found",
        "opcode" => "opcode",
        _ => "detail",
    }
}

impl Backend for HostBackend {
    fn hello(&self) -> Hello {
        Hello {
            backend: "host".into(),
            devices: vec![DeviceDesc {
                ordinal: self.index,
                uuid: host_device_uuid(self.index),
                name: format!("host CPU ({} threads)", self.threads),
                compute_major: 0,
                compute_minor: 0,
                total_memory: 0,
            }],
            pid: std::process::id(),
        }
    }

    fn handle(&mut self, op: Op, reply: Replier) {
        match op {
            Op::LoadModule(load) => self.load(load, reply),
            Op::UnloadModule(unload) => {
                self.kernels.remove(&unload.module_id);
                reply.ok()
            }
            Op::OpenBuffer(open) => match open.source {
                Some(Source::ShmName(name)) => match map_shm(&name, open.size, open.owner_uid) {
                    Ok(mapping) => {
                        self.buffers.insert(open.buffer_id, mapping);
                        reply.send(reply::Result::OpenBuffer(OpenBufferOk {
                            device_uuid: host_device_uuid(self.index),
                        }))
                    }
                    Err((kind, message, errno)) => {
                        reply.fail(kind, message, &[("os_error", errno)])
                    }
                },
                Some(Source::CudaIpc(_)) => reply.fail(
                    FailureKind::UnsupportedOnHost,
                    "the host backend cannot open CUDA IPC handles; register POSIX shared memory",
                    &[],
                ),
                None => reply.fail(FailureKind::InvalidHandle, "buffer without a source", &[]),
            },
            Op::CloseBuffer(close) => {
                self.buffers.remove(&close.buffer_id);
                reply.ok()
            }
            Op::OpenEvent(_) => reply.fail(
                FailureKind::UnsupportedOnHost,
                "the host backend has no IPC events",
                &[],
            ),
            Op::CloseEvent(_) | Op::CloseStream(_) => reply.ok(),
            Op::Launch(launch) => self.launch(launch, reply),
            Op::Shutdown(_) | Op::Ping(_) => reply.ok(),
        }
    }

    fn shutdown(&mut self) {
        self.kernels.clear();
        self.buffers.clear();
    }
}
