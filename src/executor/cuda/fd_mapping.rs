//! Buffers shared by POSIX file descriptor: `cuMemCreate` memory (the SDK's
//! `alloc_exportable`, PyTorch's `expandable_segments`) that legacy CUDA IPC
//! cannot export. The front hands the executor the descriptor a session sent
//! through the fd inbox, tagged; [`import_fd_buffer`] maps the physical
//! allocation behind it and checks the session's claims against what the
//! driver says.
//!
//! Invariants:
//! - Nothing about the allocation is taken from the session: its device
//!   comes from the allocation's properties, its size from the one mapping
//!   size the driver accepts (the driver maps an allocation whole or not at
//!   all, and reports no size otherwise; see `driver::ImportedMemory`). The
//!   session's device UUID, offset and size are checked against those.
//! - The descriptor is closed as soon as it is imported: the imported handle
//!   holds the memory (measured), so no descriptor outlives the request.
//! - Each buffer owns its own mapping (dropping an [`ImportedBuffer`]
//!   unmaps); the caller drains the device before dropping one, as it does
//!   before closing an IPC mapping, so no in-flight kernel reads an unmapped
//!   range.
//! - A sticky driver error is not turned into a refusal: it goes to
//!   `fail_driver`, which ends the process as for every other request.

use std::os::fd::OwnedFd;

use ptxd_cuda::{DeviceInfo, DriverError, ImportedMemory, VirtualMapping};
use ptxd_proto::executor::{reply, FailureKind, OpenBuffer, OpenBufferOk};

use super::super::child::Replier;
use super::{fail_driver, Backing, CudaBackend, OpenedBuffer};

impl CudaBackend {
    /// OpenBuffer with `Source::FdTag`: takes the descriptor the front sent
    /// with `tag` from the fd inbox and maps it ([`import_fd_buffer`]).
    pub(super) fn open_fd_buffer(&mut self, tag: u64, open: OpenBuffer, reply: Replier) {
        // Taken first, so that a refused request leaves nothing in the inbox.
        let fd = match self
            .fd_inbox
            .as_mut()
            .ok_or_else(|| "this executor has no fd inbox".to_owned())
            .and_then(|inbox| inbox.take(tag))
        {
            Ok(fd) => fd,
            Err(message) => return reply.fail(FailureKind::Internal, message, &[]),
        };
        if self.buffers.contains_key(&open.buffer_id) {
            return reply.fail(
                FailureKind::Internal,
                format!("buffer {} is already open", open.buffer_id),
                &[],
            );
        }
        let imported = import_fd_buffer(
            fd,
            open.offset,
            open.size,
            open.allocation_size,
            &open.claimed_device_uuid,
            &self.device,
            |ordinal| self.device_uuid_of(ordinal),
        );
        let buffer = match imported {
            Ok(buffer) => buffer,
            Err(refusal) => return refusal.reply(reply),
        };
        let device_uuid = buffer.device_uuid().to_string();
        self.buffers.insert(
            open.buffer_id,
            OpenedBuffer {
                base: buffer.base(),
                size: buffer.size(),
                backing: Backing::Fd { _mapping: buffer },
            },
        );
        reply.send(reply::Result::OpenBuffer(OpenBufferOk { device_uuid }))
    }
}

/// A buffer inside an allocation mapped from a file descriptor; unmapped on
/// drop.
#[derive(Debug)]
pub(super) struct ImportedBuffer {
    mapping: VirtualMapping,
    offset: u64,
    size: u64,
    device_uuid: String,
}

impl ImportedBuffer {
    /// The device address of the buffer's first byte.
    pub(super) fn base(&self) -> u64 {
        self.mapping.ptr() + self.offset
    }

    /// The buffer's size in bytes, as registered (checked to fit).
    pub(super) fn size(&self) -> u64 {
        self.size
    }

    /// The UUID of the device the allocation lives on (the executor's).
    pub(super) fn device_uuid(&self) -> &str {
        &self.device_uuid
    }
}

/// Why a descriptor did not become a buffer.
#[derive(Debug)]
pub(super) enum FdRefusal {
    /// The session's descriptor or claims are wrong: answered with `kind`.
    Refused {
        kind: FailureKind,
        message: String,
        metadata: Vec<(&'static str, String)>,
    },
    /// A driver call failed for a reason of the executor's, not the
    /// session's: answered as every driver failure is (a sticky one ends the
    /// process).
    Driver {
        error: DriverError,
        doing: &'static str,
    },
}

impl FdRefusal {
    fn invalid_handle(message: String, metadata: Vec<(&'static str, String)>) -> Self {
        FdRefusal::Refused {
            kind: FailureKind::InvalidHandle,
            message,
            metadata,
        }
    }

    /// A failed driver call: the session's fault (`INVALID_HANDLE`, saying
    /// `what` went wrong) when `session_call` failed with an error that is
    /// not sticky, the executor's otherwise.
    fn from_driver(
        error: DriverError,
        session_call: &str,
        what: &str,
        doing: &'static str,
    ) -> Self {
        if error.call == session_call && !error.is_sticky() {
            let message = format!("{what}: {error}");
            return FdRefusal::invalid_handle(message, vec![("cuda_error", error.name)]);
        }
        FdRefusal::Driver { error, doing }
    }

    /// Answers the request with this refusal.
    pub(super) fn reply(self, reply: Replier) {
        match self {
            FdRefusal::Refused {
                kind,
                message,
                metadata,
            } => reply.fail(kind, message, &metadata),
            FdRefusal::Driver { error, doing } => fail_driver(reply, &error, doing),
        }
    }
}

/// Maps the allocation behind `fd` (closing `fd`) and returns the buffer of
/// `size` bytes at `offset` in it. Refused with `DEVICE_MISMATCH` when the
/// allocation lives on a device other than the claimed one or the
/// executor's, and with `INVALID_HANDLE` when `fd` is not CUDA device memory,
/// the allocation is neither `allocation_size` bytes nor the smallest that
/// holds `offset + size`, or it holds fewer than `offset + size` bytes.
///
/// `uuid_of` names a device of this process by ordinal.
pub(super) fn import_fd_buffer(
    fd: OwnedFd,
    offset: u64,
    size: u64,
    allocation_size: u64,
    claimed_device_uuid: &str,
    executor: &DeviceInfo,
    uuid_of: impl Fn(u32) -> String,
) -> Result<ImportedBuffer, FdRefusal> {
    let memory = ImportedMemory::import(fd).map_err(|e| {
        FdRefusal::from_driver(
            e,
            "cuMemImportFromShareableHandle",
            "the file descriptor does not import as CUDA memory",
            "importing a file descriptor",
        )
    })?;
    let Some(ordinal) = memory.device_ordinal() else {
        return Err(FdRefusal::invalid_handle(
            "the allocation behind the file descriptor is not device memory".into(),
            Vec::new(),
        ));
    };
    let actual_device = uuid_of(ordinal);
    check_device(&actual_device, claimed_device_uuid, &executor.uuid)?;
    let Some(end) = offset.checked_add(size) else {
        return Err(FdRefusal::invalid_handle(
            format!("offset {offset} plus size {size} overflows"),
            Vec::new(),
        ));
    };
    // The sizes tried: the client's word for the allocation, then the
    // smallest allocation that holds the buffer. The driver accepts only the
    // real size, so neither is trusted; a wrong one is refused.
    let mapping = memory
        .map(&[allocation_size, end], executor.ordinal)
        .map_err(|e| {
            FdRefusal::from_driver(
                e,
                "cuMemMap",
                "the allocation behind the file descriptor maps at no size",
                "mapping an imported allocation",
            )
        })?;
    check_range(offset, size, mapping.size())?;
    Ok(ImportedBuffer {
        mapping,
        offset,
        size,
        device_uuid: actual_device,
    })
}

/// Refuses an allocation on a device other than the claimed one or the
/// executor's (the same refusal as for a CUDA IPC handle).
fn check_device(actual: &str, claimed: &str, executor: &str) -> Result<(), FdRefusal> {
    if actual == claimed && actual == executor {
        return Ok(());
    }
    Err(FdRefusal::Refused {
        kind: FailureKind::DeviceMismatch,
        message: format!(
            "the buffer lives on {actual}, not on the claimed {claimed} (this executor drives {executor})"
        ),
        metadata: vec![
            ("actual_device", actual.to_string()),
            ("claimed_device", claimed.to_string()),
        ],
    })
}

/// Refuses a buffer that does not fit in the allocation.
fn check_range(offset: u64, size: u64, allocation_size: u64) -> Result<(), FdRefusal> {
    match offset.checked_add(size) {
        Some(end) if end <= allocation_size => Ok(()),
        _ => Err(FdRefusal::invalid_handle(
            format!(
                "the allocation behind the file descriptor holds {allocation_size} bytes, fewer than the {size} registered at offset {offset}"
            ),
            vec![("allocation_size", allocation_size.to_string())],
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(
        result: Result<(), FdRefusal>,
    ) -> (FailureKind, String, Vec<(&'static str, String)>) {
        match result {
            Err(FdRefusal::Refused {
                kind,
                message,
                metadata,
            }) => (kind, message, metadata),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_buffer_on_another_device_is_a_device_mismatch_naming_both() {
        assert!(check_device("GPU-a", "GPU-a", "GPU-a").is_ok());
        let (kind, message, metadata) = refused(check_device("GPU-b", "GPU-a", "GPU-a"));
        assert_eq!(kind, FailureKind::DeviceMismatch);
        assert!(
            message.contains("GPU-b") && message.contains("GPU-a"),
            "{message}"
        );
        assert_eq!(
            metadata,
            vec![
                ("actual_device", "GPU-b".to_string()),
                ("claimed_device", "GPU-a".to_string())
            ]
        );
        // Claimed right, but not this executor's device.
        let (kind, _, _) = refused(check_device("GPU-b", "GPU-b", "GPU-a"));
        assert_eq!(kind, FailureKind::DeviceMismatch);
    }

    #[test]
    fn a_buffer_past_the_allocation_is_an_invalid_handle_with_its_size() {
        assert!(check_range(0, 4096, 4096).is_ok());
        assert!(check_range(2048, 2048, 4096).is_ok());
        let (kind, message, metadata) = refused(check_range(2048, 2049, 4096));
        assert_eq!(kind, FailureKind::InvalidHandle);
        assert!(message.contains("4096"), "{message}");
        assert_eq!(metadata, vec![("allocation_size", "4096".to_string())]);
        let (kind, _, _) = refused(check_range(u64::MAX, 1, 4096));
        assert_eq!(kind, FailureKind::InvalidHandle);
    }
}
