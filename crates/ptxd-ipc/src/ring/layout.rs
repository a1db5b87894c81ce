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
/// The layout this module reads and writes. Version 2 publishes each slot
/// by a sequence word inside it (version 1 had a head counter per ring) and
/// puts each control word on its own 128-byte block; a version 1 object is
/// refused ([`LayoutError::UnsupportedVersion`]).
pub const LAYOUT_VERSION: u32 = 2;
/// Bytes of the header at offset 0.
pub const HEADER_LEN: usize = 64;
/// Bytes of the header plus the control words; the submission slots start
/// here.
pub const CONTROL_LEN: usize = 0x300;
/// The largest slot count a ring may declare (8.25 MiB of slots).
pub const MAX_SLOTS: u32 = 4096;

/// The padding between two words that different sides write: x86 cores
/// fetch 64-byte lines in pairs (the adjacent-line prefetcher), so two
/// words 64 bytes apart still drag one line between cores when either is
/// written. crossbeam's `CachePadded` and the Disruptor's padded
/// `Sequence` pad to 128 bytes for the same reason.
pub const CONTROL_BLOCK: usize = 128;

/// Byte offset, inside a submission slot, of the slot's publication word:
/// the u64 that holds the descriptor's three counts (0x18..0x1B), a
/// reserved byte (0x1B), and the slot's sequence word (0x1C..0x20, a
/// little-endian u32, [`submission_sequence`]). The client writes it last,
/// with Release, as one store; the server polls it with Acquire.
pub(crate) const SUBMISSION_WORD: usize = 0x18;
/// Byte offset, inside a submission slot, of the sequence word's 4 bytes
/// (the high half of the publication word).
pub(crate) const SUBMISSION_SEQUENCE: usize = 0x1C;
/// Byte offset, inside a completion slot, of its sequence word (a
/// little-endian u64, [`completion_sequence`]): the server writes it last,
/// with Release; the client polls it with Acquire.
pub(crate) const COMPLETION_WORD: usize = 0x38;

// The publication words are aligned words inside their slots.
const _: () = assert!(SUBMISSION_WORD.is_multiple_of(8) && SUBMISSION_WORD + 8 <= DESCRIPTOR_SIZE);
const _: () = assert!(SUBMISSION_SEQUENCE == SUBMISSION_WORD + 4);
const _: () = assert!(COMPLETION_WORD.is_multiple_of(8) && COMPLETION_WORD + 8 <= COMPLETION_SIZE);

/// The sequence word that publishes submission `position`: the low 32 bits
/// of `position + 1`. A slot's previous occupant (`position - slots`, or a
/// zero-filled slot in the first lap of a fresh ring, whose positions start
/// at 0) holds another value, since `slots` is below 2^32: a slot left from
/// the last lap never reads as published.
pub(crate) const fn submission_sequence(position: u64) -> u32 {
    position.wrapping_add(1) as u32
}

/// The sequence word that publishes completion `position`:
/// `position + 1`, for the same reason.
pub(crate) const fn completion_sequence(position: u64) -> u64 {
    position.wrapping_add(1)
}

/// The sequence word in a submission slot's publication word (as loaded,
/// native byte order).
pub(crate) fn sequence_of(publication: u64) -> u32 {
    let bytes = publication.to_ne_bytes();
    let at = SUBMISSION_SEQUENCE - SUBMISSION_WORD;
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// `publication` with its sequence bytes set to `sequence` (zero: the
/// bytes a descriptor holds there).
pub(crate) fn with_sequence(publication: u64, sequence: u32) -> u64 {
    let mut bytes = publication.to_ne_bytes();
    let at = SUBMISSION_SEQUENCE - SUBMISSION_WORD;
    bytes[at..at + 4].copy_from_slice(&sequence.to_le_bytes());
    u64::from_ne_bytes(bytes)
}

/// One control word of the ring. Each lies alone on its own 128-byte
/// block ([`CONTROL_BLOCK`]), so a word one side writes never shares a
/// line, nor a prefetched pair of lines, with a word the other side
/// writes or polls. None is touched per launch in the common case: the
/// slots' sequence words publish the work, the tails are read only when
/// a ring looks full, `claimed` only by a server that attaches after
/// another one, and a waiter word is read once per publication (the
/// futex protocol) and written only around a sleep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ControlWord {
    /// u64, written by the server: submissions completed (their slots are
    /// free again); also the count of completions published, since the
    /// answer to submission `p` is completion `p`.
    SubmissionTail,
    /// u64, written by the server: submissions taken (copied out). Read only
    /// by a server that attaches after another one died.
    SubmissionClaimed,
    /// u32 futex word, on which the server sleeps.
    ServerWaiter,
    /// u64, written by the client: completions consumed.
    CompletionTail,
    /// u32 futex word, on which the client sleeps.
    ClientWaiter,
}

impl ControlWord {
    /// Every control word.
    #[cfg(test)]
    pub(crate) const ALL: [ControlWord; 5] = [
        ControlWord::SubmissionTail,
        ControlWord::SubmissionClaimed,
        ControlWord::ServerWaiter,
        ControlWord::CompletionTail,
        ControlWord::ClientWaiter,
    ];

    /// Byte offset in the object: 128-byte aligned, below [`CONTROL_LEN`].
    pub(crate) const fn offset(self) -> usize {
        match self {
            ControlWord::SubmissionTail => 0x080,
            ControlWord::SubmissionClaimed => 0x100,
            ControlWord::ServerWaiter => 0x180,
            ControlWord::CompletionTail => 0x200,
            ControlWord::ClientWaiter => 0x280,
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
/// | 0x008 | 4 | layout version (2) |
/// | 0x00C | 4 | slot count (power of two, 1..=4096) |
/// | 0x010 | 4 | descriptor size (2048) |
/// | 0x014 | 4 | completion size (64) |
/// | 0x018 | 40 | reserved, zero |
/// | 0x080 | 8 | submission tail (server) |
/// | 0x100 | 8 | submission claimed (server) |
/// | 0x180 | 4 | server waiter (futex) |
/// | 0x200 | 8 | completion tail (client) |
/// | 0x280 | 4 | client waiter (futex) |
/// | 0x300 | slots × 2048 | submission slots; each publishes itself by its sequence word at slot + 0x1C |
/// | 0x300 + slots × 2048 | slots × 64 | completion slots; each publishes itself by its sequence word at slot + 0x38 |
///
/// Every other byte of the control area is reserved (zero in a fresh
/// object; neither side reads it).
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

    /// Bytes of the whole object (at most 8.25 MiB + 768).
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
        // Version 1 (a head counter per ring) is refused, not misread.
        for version in [0u32, 1, 3, u32::MAX] {
            assert_eq!(
                with(8, &version.to_le_bytes()),
                Err(LayoutError::UnsupportedVersion { found: version })
            );
        }
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

    /// Every control word has a 128-byte block to itself (the adjacent-line
    /// prefetch pairs 64-byte lines), the header's block holds none, and
    /// the slots start on a fresh block.
    #[test]
    fn each_control_word_has_its_own_128_byte_block() {
        let blocks: Vec<usize> = ControlWord::ALL
            .iter()
            .map(|word| word.offset() / CONTROL_BLOCK)
            .collect();
        for (i, a) in blocks.iter().enumerate() {
            assert_ne!(*a, 0, "{:?} shares the header's block", ControlWord::ALL[i]);
            for (j, b) in blocks.iter().enumerate() {
                if i != j {
                    assert_ne!(
                        a,
                        b,
                        "{:?} and {:?}",
                        ControlWord::ALL[i],
                        ControlWord::ALL[j]
                    );
                }
            }
        }
        for word in ControlWord::ALL {
            assert_eq!(word.offset() % CONTROL_BLOCK, 0);
        }
        assert_eq!(CONTROL_LEN % CONTROL_BLOCK, 0);
        assert_eq!(DESCRIPTOR_SIZE % CONTROL_BLOCK, 0);
    }

    /// A slot's sequence word tells its own lap from the one before, for
    /// every slot count and across the u64 wrap, and the publication word
    /// keeps the counts beside it intact.
    #[test]
    fn a_sequence_word_tells_a_lap_from_the_last() {
        use rand::Rng;
        let mut rng = rand::rng();
        for shift in 0..=12 {
            let slots = 1u64 << shift;
            for _ in 0..200 {
                let position = match rng.random_range(0..3) {
                    0 => rng.random::<u64>(),
                    1 => u64::MAX - rng.random_range(0..2 * slots),
                    _ => rng.random_range(0..2 * slots),
                };
                let previous = position.wrapping_sub(slots);
                assert_ne!(submission_sequence(position), submission_sequence(previous));
                assert_ne!(completion_sequence(position), completion_sequence(previous));
                if position < slots {
                    // A fresh ring's zero-filled slot is not published.
                    assert_ne!(submission_sequence(position), 0);
                    assert_ne!(completion_sequence(position), 0);
                }
                let counts: u64 = rng.random::<u64>() & 0xFF_FFFF;
                let word = with_sequence(counts, submission_sequence(position));
                assert_eq!(sequence_of(word), submission_sequence(position));
                assert_eq!(with_sequence(word, 0), counts);
            }
        }
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
        for word in ControlWord::ALL {
            assert_eq!(word.offset() % 64, 0);
            assert!(word.offset() >= HEADER_LEN && word.offset() + 8 <= CONTROL_LEN);
        }
    }
}
