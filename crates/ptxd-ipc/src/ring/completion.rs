//! The completion record: the answer to one submission, in a fixed 64-byte
//! slot.
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 00 | 8 | ticket (the submission's, echoed) |
//! | 08 | 4 | status: 0 ok, 1 refused, 2 failed |
//! | 0C | 4 | reason (the daemon's `ErrorReason` number; 0 when ok) |
//! | 10 | 8 | detail (e.g. an operand index or a u64 argument) |
//! | 18 | 32 | reserved, zero |
//! | 38 | 8 | reserved in a record: the ring's sequence word for the slot |
//!
//! Canonical like the descriptor: decode accepts exactly what encode writes.
//! In a ring slot (layout 2) the last word is the slot's sequence word,
//! which the server stores after the rest (`layout::COMPLETION_WORD`); the
//! client's copy holds zero there, so a record's last word is zero and
//! decoding still refuses anything else.

/// Bytes of one completion slot.
pub const COMPLETION_SIZE: usize = 64;

const AT_TICKET: usize = 0x00;
const AT_STATUS: usize = 0x08;
const AT_REASON: usize = 0x0C;
const AT_DETAIL: usize = 0x10;
const AT_RESERVED: usize = 0x18;

const STATUS_OK: u32 = 0;
const STATUS_REFUSED: u32 = 1;
const STATUS_FAILED: u32 = 2;

/// How a submission ended. The reason is a number the daemon chooses (its
/// proto `ErrorReason`); this module only carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CompletionStatus {
    /// Launched (enqueued, or finished for a sync launch).
    Ok,
    /// Refused by the launch checks (or malformed); nothing ran.
    Refused {
        /// Why it was refused: the daemon's `ErrorReason` number.
        reason: u32,
    },
    /// Accepted but did not complete (a fault, a lost executor).
    Failed {
        /// Why it failed: the daemon's `ErrorReason` number.
        reason: u32,
    },
}

/// Why completion bytes are malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CompletionError {
    /// A status number this layout does not define.
    #[error("unknown completion status {status}")]
    UnknownStatus {
        /// The status field as read.
        status: u32,
    },
    /// An ok completion with a non-zero reason.
    #[error("an ok completion carries reason {reason}")]
    ReasonOnOk {
        /// The reason field as read (must be 0 for an ok status).
        reason: u32,
    },
    /// A reserved byte is not zero; `offset` is the first such byte.
    #[error("completion byte {offset:#x} is reserved and must be zero")]
    ReservedNotZero {
        /// Byte offset in the record of the first non-zero reserved byte.
        offset: usize,
    },
}

/// One completion record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Completion {
    /// The ticket of the submission this answers.
    pub ticket: u64,
    /// Whether the launch happened, and if not, the reason number.
    pub status: CompletionStatus,
    /// Status-specific detail (0 when unused).
    pub detail: u64,
}

fn field<const N: usize>(bytes: &[u8; COMPLETION_SIZE], at: usize) -> [u8; N] {
    let mut field = [0u8; N];
    field.copy_from_slice(&bytes[at..at + N]);
    field
}

impl Completion {
    /// The canonical bytes of this record.
    pub fn encode(&self) -> [u8; COMPLETION_SIZE] {
        let (status, reason) = match self.status {
            CompletionStatus::Ok => (STATUS_OK, 0),
            CompletionStatus::Refused { reason } => (STATUS_REFUSED, reason),
            CompletionStatus::Failed { reason } => (STATUS_FAILED, reason),
        };
        let mut bytes = [0u8; COMPLETION_SIZE];
        bytes[AT_TICKET..AT_TICKET + 8].copy_from_slice(&self.ticket.to_le_bytes());
        bytes[AT_STATUS..AT_STATUS + 4].copy_from_slice(&status.to_le_bytes());
        bytes[AT_REASON..AT_REASON + 4].copy_from_slice(&reason.to_le_bytes());
        bytes[AT_DETAIL..AT_DETAIL + 8].copy_from_slice(&self.detail.to_le_bytes());
        bytes
    }

    /// Decodes a copy of a completion slot.
    pub fn decode(bytes: &[u8; COMPLETION_SIZE]) -> Result<Self, CompletionError> {
        let status = u32::from_le_bytes(field(bytes, AT_STATUS));
        let reason = u32::from_le_bytes(field(bytes, AT_REASON));
        let status = match status {
            STATUS_OK if reason != 0 => return Err(CompletionError::ReasonOnOk { reason }),
            STATUS_OK => CompletionStatus::Ok,
            STATUS_REFUSED => CompletionStatus::Refused { reason },
            STATUS_FAILED => CompletionStatus::Failed { reason },
            status => return Err(CompletionError::UnknownStatus { status }),
        };
        if let Some(offset) = (AT_RESERVED..COMPLETION_SIZE).find(|at| bytes[*at] != 0) {
            return Err(CompletionError::ReservedNotZero { offset });
        }
        Ok(Completion {
            ticket: u64::from_le_bytes(field(bytes, AT_TICKET)),
            status,
            detail: u64::from_le_bytes(field(bytes, AT_DETAIL)),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    #[test]
    fn random_completions_round_trip() {
        let mut rng = StdRng::seed_from_u64(0xc0);
        for _ in 0..10_000 {
            let status = match rng.random_range(0..3) {
                0 => CompletionStatus::Ok,
                1 => CompletionStatus::Refused {
                    reason: rng.random(),
                },
                _ => CompletionStatus::Failed {
                    reason: rng.random(),
                },
            };
            let completion = Completion {
                ticket: rng.random(),
                status,
                detail: rng.random(),
            };
            let bytes = completion.encode();
            assert_eq!(Completion::decode(&bytes), Ok(completion));
        }
    }

    #[test]
    fn every_malformed_field_has_its_error() {
        let good = Completion {
            ticket: 1,
            status: CompletionStatus::Refused { reason: 7 },
            detail: 3,
        }
        .encode();
        let with = |at: usize, bytes: &[u8]| {
            let mut record = good;
            record[at..at + bytes.len()].copy_from_slice(bytes);
            Completion::decode(&record)
        };
        assert_eq!(
            with(AT_STATUS, &3u32.to_le_bytes()),
            Err(CompletionError::UnknownStatus { status: 3 })
        );
        assert_eq!(
            with(AT_STATUS, &STATUS_OK.to_le_bytes()),
            Err(CompletionError::ReasonOnOk { reason: 7 })
        );
        for offset in [0x18, 0x2A, 0x3F] {
            assert_eq!(
                with(offset, &[1]),
                Err(CompletionError::ReservedNotZero { offset })
            );
        }
        let mut ok = good;
        ok[AT_STATUS..AT_REASON + 4].fill(0);
        assert_eq!(
            Completion::decode(&ok).map(|c| c.status),
            Ok(CompletionStatus::Ok)
        );
    }
}
