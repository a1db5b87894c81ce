//! The ring object's byte layout: the versioned header, the control words and
//! where each ring's slots lie.
//!
//! The header is written once by the client when it creates the object and
//! read once by the server, with `pread`, before it maps anything: every size
//! the server uses afterwards comes from the [`RingLayout`] it validated
//! then, never from the (still writable) header bytes.

use super::completion::COMPLETION_SIZE;
use super::descriptor::DESCRIPTOR_SIZE;

/// `b"PTXDRING"`, read as a little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"PTXDRING");
/// The layout this module reads and writes.
pub const LAYOUT_VERSION: u32 = 1;
/// Bytes of the header at offset 0.
pub const HEADER_LEN: usize = 64;
/// Bytes of the header plus the control words; the submission slots start
/// here.
pub const CONTROL_LEN: usize = 0x200;
/// The largest slot count a ring may declare (8.25 MiB of slots).
pub const MAX_SLOTS: u32 = 4096;

/// One control word of the ring. Each lies alone on its own 64-byte cache
/// line, so the two sides never write the same line on the hot path; and
/// each 128-byte pair of lines (which x86 cores prefetch together) holds
/// words of one writer only (the header, written once, beside the
/// client's submission head), so no cursor's line is dragged to the other
/// core by a neighbour's write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ControlWord {
    /// u64, written by the client: submissions published.
    SubmissionHead,
    /// u64, written by the server: submissions completed (their slots are
    /// free again).
    SubmissionTail,
    /// u64, written by the server: submissions taken (copied out). Read only
    /// by a server that attaches after another one died.
    SubmissionClaimed,
    /// u32 futex word, on which the server sleeps.
    ServerWaiter,
    /// u64, written by the server: completions published.
    CompletionHead,
    /// u64, written by the client: completions consumed.
    CompletionTail,
    /// u32 futex word, on which the client sleeps.
    ClientWaiter,
}

impl ControlWord {
    /// Byte offset in the object: 64-byte aligned, below [`CONTROL_LEN`].
    pub(crate) const fn offset(self) -> usize {
        match self {
            ControlWord::SubmissionHead => 0x040,
            ControlWord::SubmissionTail => 0x080,
            ControlWord::SubmissionClaimed => 0x0C0,
            ControlWord::ServerWaiter => 0x100,
            ControlWord::CompletionHead => 0x140,
            ControlWord::CompletionTail => 0x180,
            ControlWord::ClientWaiter => 0x1C0,
        }
    }
}

/// Why a ring header (or a requested slot count) is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutError {
    /// The first eight bytes are not `PTXDRING`.
    #[error("not a ptxd ring: magic {found:#018x}")]
    BadMagic {
        /// The first eight bytes, read as a little-endian u64.
        found: u64,
    },
    /// A layout version this build does not know.
    #[error(
        "ring layout version {found} is not supported (this build reads version {LAYOUT_VERSION})"
    )]
    UnsupportedVersion {
        /// The version field of the header.
        found: u32,
    },
    /// Zero, not a power of two, or more than [`MAX_SLOTS`].
    #[error("ring slot count {slots} must be a power of two between 1 and {MAX_SLOTS}")]
    SlotCount {
        /// The slot count declared in the header or requested by the caller.
        slots: u32,
    },
    /// A descriptor size other than [`DESCRIPTOR_SIZE`].
    #[error("ring descriptor size {found} is not {DESCRIPTOR_SIZE}")]
    DescriptorSize {
        /// The descriptor size field of the header.
        found: u32,
    },
    /// A completion size other than [`COMPLETION_SIZE`].
    #[error("ring completion size {found} is not {COMPLETION_SIZE}")]
    CompletionSize {
        /// The completion size field of the header.
        found: u32,
    },
    /// A reserved header byte is not zero (a later layout may use it).
    #[error("ring header byte {offset} is reserved and must be zero")]
    ReservedNotZero {
        /// Byte offset in the header of the first non-zero reserved byte.
        offset: usize,
    },
}

/// The sizes and offsets of one ring object, derived from its slot count.
///
/// Object layout (all integers little-endian):
///
/// | offset | size | field |
/// | --- | --- | --- |
/// | 0x000 | 8 | magic `PTXDRING` |
/// | 0x008 | 4 | layout version (1) |
/// | 0x00C | 4 | slot count (power of two, 1..=4096) |
/// | 0x010 | 4 | descriptor size (2048) |
/// | 0x014 | 4 | completion size (64) |
/// | 0x018 | 40 | reserved, zero |
/// | 0x040 | 8 | submission head (client) |
/// | 0x080 | 8 | submission tail (server) |
/// | 0x0C0 | 8 | submission claimed (server) |
/// | 0x100 | 4 | server waiter (futex) |
/// | 0x140 | 8 | completion head (server) |
/// | 0x180 | 8 | completion tail (client) |
/// | 0x1C0 | 4 | client waiter (futex) |
/// | 0x200 | slots × 2048 | submission slots |
/// | 0x200 + slots × 2048 | slots × 64 | completion slots |
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingLayout {
    slots: u32,
}

fn u32_at(header: &[u8; HEADER_LEN], at: usize) -> u32 {
    u32::from_le_bytes(std::array::from_fn(|i| header[at + i]))
}

impl RingLayout {
    /// A layout of `slots` slots in each ring.
    pub fn new(slots: u32) -> Result<Self, LayoutError> {
        if slots == 0 || !slots.is_power_of_two() || slots > MAX_SLOTS {
            return Err(LayoutError::SlotCount { slots });
        }
        Ok(RingLayout { slots })
    }

    /// The smallest layout that lets `depth` launches be outstanding at once
    /// (`depth` rounded up to a power of two, at most [`MAX_SLOTS`]).
    pub fn for_depth(depth: u32) -> Self {
        let slots = depth.clamp(1, MAX_SLOTS).next_power_of_two();
        RingLayout { slots }
    }

    /// Validates a header the peer wrote (any bytes at all).
    pub fn from_header(header: &[u8; HEADER_LEN]) -> Result<Self, LayoutError> {
        let magic = u64::from_le_bytes(std::array::from_fn(|i| header[i]));
        if magic != MAGIC {
            return Err(LayoutError::BadMagic { found: magic });
        }
        let version = u32_at(header, 0x08);
        if version != LAYOUT_VERSION {
            return Err(LayoutError::UnsupportedVersion { found: version });
        }
        let layout = RingLayout::new(u32_at(header, 0x0C))?;
        let descriptor_size = u32_at(header, 0x10);
        if descriptor_size as usize != DESCRIPTOR_SIZE {
            return Err(LayoutError::DescriptorSize {
                found: descriptor_size,
            });
        }
        let completion_size = u32_at(header, 0x14);
        if completion_size as usize != COMPLETION_SIZE {
            return Err(LayoutError::CompletionSize {
                found: completion_size,
            });
        }
        if let Some(offset) = (0x18..HEADER_LEN).find(|at| header[*at] != 0) {
            return Err(LayoutError::ReservedNotZero { offset });
        }
        Ok(layout)
    }

    /// The header bytes that describe this layout.
    pub fn header(&self) -> [u8; HEADER_LEN] {
        let mut header = [0u8; HEADER_LEN];
        header[0x00..0x08].copy_from_slice(&MAGIC.to_le_bytes());
        header[0x08..0x0C].copy_from_slice(&LAYOUT_VERSION.to_le_bytes());
        header[0x0C..0x10].copy_from_slice(&self.slots.to_le_bytes());
        header[0x10..0x14].copy_from_slice(&(DESCRIPTOR_SIZE as u32).to_le_bytes());
        header[0x14..0x18].copy_from_slice(&(COMPLETION_SIZE as u32).to_le_bytes());
        header
    }

    /// Slots in each ring: at most this many launches are outstanding
    /// (submitted and not yet completed) at once.
    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// Byte offset of submission slot 0.
    pub fn submission_offset(&self) -> usize {
        CONTROL_LEN
    }

    /// Byte offset of completion slot 0.
    pub fn completion_offset(&self) -> usize {
        CONTROL_LEN + self.slots as usize * DESCRIPTOR_SIZE
    }

    /// Bytes of the whole object (at most 8.25 MiB + 512).
    pub fn total_len(&self) -> usize {
        self.completion_offset() + self.slots as usize * COMPLETION_SIZE
    }

    /// Byte offset of the submission slot that counter value `position` uses:
    /// below `completion_offset()` for every `position`.
    pub(crate) fn submission_slot(&self, position: u64) -> usize {
        self.submission_offset() + self.index(position) * DESCRIPTOR_SIZE
    }

    /// Byte offset of the completion slot that counter value `position`
    /// uses: below `total_len()` for every `position`.
    pub(crate) fn completion_slot(&self, position: u64) -> usize {
        self.completion_offset() + self.index(position) * COMPLETION_SIZE
    }

    /// `position & (slots - 1)`: below `slots` for every `position`.
    pub(crate) fn index(&self, position: u64) -> usize {
        // The mask is below MAX_SLOTS, so the cast cannot truncate.
        (position & u64::from(self.slots - 1)) as usize
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_for_every_slot_count() {
        for shift in 0..=12 {
            let layout = RingLayout::new(1 << shift).unwrap();
            assert_eq!(RingLayout::from_header(&layout.header()), Ok(layout));
            assert_eq!(
                layout.total_len(),
                CONTROL_LEN + (1usize << shift) * (DESCRIPTOR_SIZE + COMPLETION_SIZE)
            );
        }
    }

    #[test]
    fn slot_counts_are_checked() {
        for slots in [0, 3, 6, 100, MAX_SLOTS * 2, u32::MAX] {
            assert_eq!(
                RingLayout::new(slots),
                Err(LayoutError::SlotCount { slots })
            );
        }
        assert_eq!(RingLayout::for_depth(0).slots(), 1);
        assert_eq!(RingLayout::for_depth(100).slots(), 128);
        assert_eq!(RingLayout::for_depth(u32::MAX).slots(), MAX_SLOTS);
    }

    #[test]
    fn every_malformed_header_field_has_its_error() {
        let good = RingLayout::new(64).unwrap().header();
        let with = |at: usize, bytes: &[u8]| {
            let mut header = good;
            header[at..at + bytes.len()].copy_from_slice(bytes);
            RingLayout::from_header(&header)
        };
        assert_eq!(
            with(0, b"PTXDRINH"),
            Err(LayoutError::BadMagic {
                found: u64::from_le_bytes(*b"PTXDRINH")
            })
        );
        assert_eq!(
            with(8, &2u32.to_le_bytes()),
            Err(LayoutError::UnsupportedVersion { found: 2 })
        );
        assert_eq!(
            with(12, &48u32.to_le_bytes()),
            Err(LayoutError::SlotCount { slots: 48 })
        );
        assert_eq!(
            with(16, &1024u32.to_le_bytes()),
            Err(LayoutError::DescriptorSize { found: 1024 })
        );
        assert_eq!(
            with(20, &128u32.to_le_bytes()),
            Err(LayoutError::CompletionSize { found: 128 })
        );
        for offset in [0x18, 0x30, 0x3F] {
            assert_eq!(
                with(offset, &[1]),
                Err(LayoutError::ReservedNotZero { offset })
            );
        }
    }

    /// Which side writes a control word on the hot path.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Writer {
        Client,
        Server,
    }

    fn writer(word: ControlWord) -> Writer {
        match word {
            ControlWord::SubmissionHead
            | ControlWord::CompletionTail
            | ControlWord::ClientWaiter => Writer::Client,
            ControlWord::SubmissionTail
            | ControlWord::SubmissionClaimed
            | ControlWord::ServerWaiter
            | ControlWord::CompletionHead => Writer::Server,
        }
    }

    /// The cursors are padded against false sharing at both granularities:
    /// one word per 64-byte line, and one writer per 128-byte pair of
    /// lines (the adjacent-line prefetch); the slots start on a fresh pair.
    #[test]
    fn each_cursor_pair_of_lines_has_one_writer() {
        let words = [
            ControlWord::SubmissionHead,
            ControlWord::SubmissionTail,
            ControlWord::SubmissionClaimed,
            ControlWord::ServerWaiter,
            ControlWord::CompletionHead,
            ControlWord::CompletionTail,
            ControlWord::ClientWaiter,
        ];
        for a in words {
            for b in words {
                if a != b {
                    assert_ne!(
                        a.offset() / 64,
                        b.offset() / 64,
                        "{a:?} and {b:?} share a line"
                    );
                    if a.offset() / 128 == b.offset() / 128 {
                        assert_eq!(writer(a), writer(b), "{a:?} and {b:?} share a pair");
                    }
                }
            }
        }
        // The header's pair holds one cursor, the client's (the header is
        // read once, at attach).
        let in_header_pair: Vec<_> = words.iter().filter(|w| w.offset() < 128).collect();
        assert_eq!(in_header_pair, [&ControlWord::SubmissionHead]);
        assert_eq!(CONTROL_LEN % 128, 0);
    }

    #[test]
    fn slot_offsets_stay_inside_their_ring() {
        let layout = RingLayout::new(8).unwrap();
        for position in [0, 7, 8, 9, u64::MAX, u64::MAX - 7] {
            let sq = layout.submission_slot(position);
            assert!(sq >= CONTROL_LEN && sq + DESCRIPTOR_SIZE <= layout.completion_offset());
            let cq = layout.completion_slot(position);
            assert!(cq >= layout.completion_offset() && cq + COMPLETION_SIZE <= layout.total_len());
        }
        for word in [
            ControlWord::SubmissionHead,
            ControlWord::SubmissionTail,
            ControlWord::SubmissionClaimed,
            ControlWord::ServerWaiter,
            ControlWord::CompletionHead,
            ControlWord::CompletionTail,
            ControlWord::ClientWaiter,
        ] {
            assert_eq!(word.offset() % 64, 0);
            assert!(word.offset() >= HEADER_LEN && word.offset() + 8 <= CONTROL_LEN);
        }
    }
}
