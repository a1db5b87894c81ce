//! The submission descriptor: one launch request in a fixed 2048-byte slot.
//!
//! Encoding is explicit little-endian at fixed offsets (no `#[repr(C)]`), and
//! canonical: [`Descriptor::decode`] accepts exactly the bytes that
//! [`Descriptor::encode`] can produce, so reserved bytes, unused operand and
//! scalar entries and the fields of an absent semaphore operation must all be
//! zero. That keeps every reserved byte usable by a later layout and makes
//! `encode(decode(b)) == b` for every accepted `b` (the fuzz target checks it).
//!
//! Byte layout (offsets in hex):
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 000 | 8 | ticket (client-chosen, echoed in the completion) |
//! | 008 | 4 | kernel index (into the session's capability table) |
//! | 00C | 4 | flags: bit 0 sync, 1 wait, 2 wait is 64-bit, 3 signal, 4 signal is 64-bit |
//! | 010 | 8 | n (element count) |
//! | 018 | 1 | input count (0..=64) |
//! | 019 | 1 | scalar count (0..=64) |
//! | 01A | 1 | typed arg count (0..=64) |
//! | 01B | 1 | reserved |
//! | 01C | 4 | reserved in a descriptor: the ring's sequence word for the slot (see below) |
//! | 020 | 24 | wait: buffer index u32, reserved u32, byte offset u64, value u64 |
//! | 038 | 24 | signal: same shape |
//! | 050 | 16 | output: buffer index u32, reserved u32, byte offset u64 |
//! | 060 | 64 × 16 | inputs, same shape as the output |
//! | 460 | 64 × 4 | scalars (f32 bits) |
//! | 560 | 64 × 1 | typed arg types: 1 i32, 2 u32, 3 i64, 4 u64, 5 f32, 6 f64 |
//! | 5A0 | 64 × 8 | typed arg values, little-endian; a 4-byte type in the low 4 bytes, the high 4 zero |
//! | 7A0 | 96 | reserved |
//!
//! Typed args (in the kernel's scalar parameter order) live in bytes that
//! the first layout reserved: a server that predates them refuses a
//! descriptor that carries any (`ReservedNotZero`). A descriptor carries f32
//! scalars or typed args; one with both decodes, and the launch check
//! refuses it (`SCALAR_ARGS_MISMATCH`).
//!
//! In a ring slot (layout 2), bytes 0x1C..0x20 hold the slot's sequence
//! word, and the u64 at 0x18 (the counts, the reserved byte and the
//! sequence word) is the slot's publication word, which the ring stores
//! last and loads first (`layout::SUBMISSION_WORD`). The ring zeroes the
//! sequence bytes in its copy before decoding, so a descriptor holds zero
//! there and decoding still refuses anything else (`ReservedNotZero`).
//!
//! Decoding reads only the caller's copy, never allocates, and never panics
//! (every offset is a constant inside the 2048-byte array).

/// Bytes of one submission slot.
pub const DESCRIPTOR_SIZE: usize = 2048;
/// The most inputs a launch may name.
pub const MAX_INPUTS: usize = 64;
/// The most f32 scalars a launch may carry.
pub const MAX_SCALARS: usize = 64;
/// The most typed scalar args a launch may carry.
pub const MAX_ARGS: usize = 64;

/// Complete after the kernel finished, not once it is enqueued.
const FLAG_SYNC: u32 = 1 << 0;
const FLAG_WAIT: u32 = 1 << 1;
const FLAG_WAIT_64: u32 = 1 << 2;
const FLAG_SIGNAL: u32 = 1 << 3;
const FLAG_SIGNAL_64: u32 = 1 << 4;
const KNOWN_FLAGS: u32 = FLAG_SYNC | FLAG_WAIT | FLAG_WAIT_64 | FLAG_SIGNAL | FLAG_SIGNAL_64;

const AT_TICKET: usize = 0x000;
const AT_KERNEL: usize = 0x008;
const AT_FLAGS: usize = 0x00C;
const AT_N: usize = 0x010;
const AT_INPUT_COUNT: usize = 0x018;
const AT_SCALAR_COUNT: usize = 0x019;
const AT_ARG_COUNT: usize = 0x01A;
const AT_WAIT: usize = 0x020;
const AT_SIGNAL: usize = 0x038;
const AT_OUTPUT: usize = 0x050;
const AT_INPUTS: usize = 0x060;
const AT_SCALARS: usize = 0x460;
const AT_ARG_TYPES: usize = 0x560;
const AT_ARG_VALUES: usize = 0x5A0;
const AT_TAIL: usize = 0x7A0;
const OPERAND_SIZE: usize = 16;
const SEMAPHORE_SIZE: usize = 24;

/// A buffer operand: an index into the session's capability table and a
/// byte offset into that buffer. Bounds are the launch checks' business.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct OperandRef {
    /// Index of the buffer in the session's capability table.
    pub buffer: u32,
    /// Byte offset of the operand's start inside that buffer.
    pub offset: u64,
}

/// A typed by-value scalar argument, in the kernel's scalar param order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TypedArg {
    /// For an `.s32` param.
    I32(i32),
    /// For a `.u32` or `.b32` param.
    U32(u32),
    /// For an `.s64` param.
    I64(i64),
    /// For a `.u64` or `.b64` param.
    U64(u64),
    /// For an `.f32` param.
    F32(f32),
    /// For an `.f64` param.
    F64(f64),
}

impl TypedArg {
    /// Its type byte and its value's 8 bytes as the slot holds them.
    fn encode(self) -> (u8, u64) {
        match self {
            TypedArg::I32(v) => (1, u64::from(v as u32)),
            TypedArg::U32(v) => (2, u64::from(v)),
            TypedArg::I64(v) => (3, v as u64),
            TypedArg::U64(v) => (4, v),
            TypedArg::F32(v) => (5, u64::from(v.to_bits())),
            TypedArg::F64(v) => (6, v.to_bits()),
        }
    }

    /// The arg a type byte and value hold, or `None` for an unknown type or
    /// a 4-byte value with high bytes set (not canonical).
    fn decode(ty: u8, bits: u64) -> Option<TypedArg> {
        let low = u32::try_from(bits).ok();
        Some(match ty {
            1 => TypedArg::I32(low? as i32),
            2 => TypedArg::U32(low?),
            3 => TypedArg::I64(bits as i64),
            4 => TypedArg::U64(bits),
            5 => TypedArg::F32(f32::from_bits(low?)),
            6 => TypedArg::F64(f64::from_bits(bits)),
            _ => return None,
        })
    }
}

/// The width of a GPU semaphore word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SemaphoreWidth {
    /// A u32 word: values above `u32::MAX` are refused, offsets must be
    /// 4-aligned.
    Bits32,
    /// A u64 word: any value, offsets must be 8-aligned.
    Bits64,
}

impl SemaphoreWidth {
    /// Bytes of the word; its offset must be a multiple of this.
    pub fn bytes(self) -> u64 {
        match self {
            SemaphoreWidth::Bits32 => 4,
            SemaphoreWidth::Bits64 => 8,
        }
    }
}

/// A GPU semaphore operation: "wait until the word at (buffer, offset) is
/// >= value" before the kernel, or "write value to it" after the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SemaphoreOp {
    /// Index of the buffer holding the word, in the session's capability
    /// table.
    pub buffer: u32,
    /// Byte offset of the word inside that buffer; a multiple of the width.
    pub offset: u64,
    /// The threshold to wait for (`>=`), or the value to write.
    pub value: u64,
    /// Whether the word is 32 or 64 bits; a 32-bit op's value must fit.
    pub width: SemaphoreWidth,
}

/// Which of the two semaphore operations an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SemaphoreRole {
    /// The wait before the kernel ([`Descriptor::wait`]).
    Wait,
    /// The write after the kernel ([`Descriptor::signal`]).
    Signal,
}

impl std::fmt::Display for SemaphoreRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SemaphoreRole::Wait => "wait",
            SemaphoreRole::Signal => "signal",
        })
    }
}

/// Why a descriptor is malformed (decoding) or cannot be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DescriptorError {
    /// More than [`MAX_ARGS`] typed args.
    #[error("{count} typed args, more than the {MAX_ARGS} a descriptor holds")]
    TooManyArgs {
        /// The arg count requested or read from the descriptor.
        count: usize,
    },
    /// A typed arg entry with an unknown type byte, or a 4-byte type whose
    /// high value bytes are not zero.
    #[error("typed arg {index} has type byte {ty} and value {bits:#x}, which no arg encodes to")]
    BadArg {
        /// The arg (0-based).
        index: usize,
        /// Its type byte.
        ty: u8,
        /// Its value bytes.
        bits: u64,
    },
    /// A typed arg entry past the arg count is not zero.
    #[error("typed arg entry {index} is past the arg count but not zero")]
    UnusedArgNotZero {
        /// The entry (0-based) holding the first non-zero byte.
        index: usize,
    },
    /// Flag bits this layout does not define.
    #[error("unknown descriptor flags {bits:#x}")]
    UnknownFlags {
        /// The undefined bits that were set (the known ones masked off).
        bits: u32,
    },
    /// More than [`MAX_INPUTS`] inputs.
    #[error("{count} inputs, more than the {MAX_INPUTS} a descriptor holds")]
    TooManyInputs {
        /// The input count requested or read from the descriptor.
        count: usize,
    },
    /// More than [`MAX_SCALARS`] scalars.
    #[error("{count} scalars, more than the {MAX_SCALARS} a descriptor holds")]
    TooManyScalars {
        /// The scalar count requested or read from the descriptor.
        count: usize,
    },
    /// A reserved byte (of the header, of an operand in use or of the tail)
    /// is not zero; `offset` is the first such byte.
    #[error("descriptor byte {offset:#x} is reserved and must be zero")]
    ReservedNotZero {
        /// Byte offset in the descriptor of the first non-zero reserved byte.
        offset: usize,
    },
    /// An input entry past the input count is not all zero.
    #[error("input entry {index} is past the input count but not zero")]
    UnusedInputNotZero {
        /// The input entry (0-based) holding the first non-zero byte.
        index: usize,
    },
    /// A scalar entry past the scalar count is not zero.
    #[error("scalar entry {index} is past the scalar count but not zero")]
    UnusedScalarNotZero {
        /// The scalar entry (0-based) holding the first non-zero byte.
        index: usize,
    },
    /// The 64-bit width flag of an operation whose flag is clear.
    #[error("the {role} semaphore's 64-bit flag is set but the {role} flag is not")]
    WidthWithoutSemaphore {
        /// The operation whose 64-bit flag is set.
        role: SemaphoreRole,
    },
    /// Fields of an operation whose flag is clear are not zero.
    #[error("the {role} semaphore's fields are set but the {role} flag is not")]
    SemaphoreWithoutFlag {
        /// The operation whose fields are set.
        role: SemaphoreRole,
    },
    /// A 32-bit operation with a value above `u32::MAX`.
    #[error("the {role} semaphore is 32-bit but its value {value} is not")]
    SemaphoreValueTooWide {
        /// The operation at fault.
        role: SemaphoreRole,
        /// Its value, which does not fit in 32 bits.
        value: u64,
    },
    /// The word's offset is not a multiple of its width.
    #[error("the {role} semaphore's offset {offset} is not a multiple of {width} bytes")]
    SemaphoreMisaligned {
        /// The operation at fault.
        role: SemaphoreRole,
        /// The word's byte offset in its buffer.
        offset: u64,
        /// The word's width in bytes (4 or 8), which `offset` must divide
        /// by.
        width: u64,
    },
}

/// One launch request, as the client builds it and the server decodes it.
///
/// The input, scalar and semaphore fields are private so that every
/// `Descriptor` holds at most 64 of each and semaphore operations that fit
/// their width: `encode` cannot fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    /// Client-chosen; the completion carries it back. The server does not
    /// require it to be unique.
    pub ticket: u64,
    /// Index of the kernel in the session's capability table.
    pub kernel: u32,
    /// Element count.
    pub n: u64,
    /// Complete after the kernel finished (true) or once accepted (on
    /// CUDA: checked, then enqueued right after).
    pub sync: bool,
    /// The output operand.
    pub output: OperandRef,
    inputs: [OperandRef; MAX_INPUTS],
    input_count: u8,
    scalars: [u32; MAX_SCALARS],
    scalar_count: u8,
    /// Each typed arg's type byte and value bytes (two arrays: 576 bytes
    /// to initialize per decode, not 1024).
    arg_types: [u8; MAX_ARGS],
    arg_values: [u64; MAX_ARGS],
    arg_count: u8,
    wait: Option<SemaphoreOp>,
    signal: Option<SemaphoreOp>,
}

fn field<const N: usize>(bytes: &[u8; DESCRIPTOR_SIZE], at: usize) -> [u8; N] {
    let mut field = [0u8; N];
    field.copy_from_slice(&bytes[at..at + N]);
    field
}

fn u32_at(bytes: &[u8; DESCRIPTOR_SIZE], at: usize) -> u32 {
    u32::from_le_bytes(field(bytes, at))
}

fn u64_at(bytes: &[u8; DESCRIPTOR_SIZE], at: usize) -> u64 {
    u64::from_le_bytes(field(bytes, at))
}

/// The first non-zero byte in `range`. The zero checks cover most of the
/// descriptor on every decode: the OR-fold has no early exit, so it
/// vectorizes, and only a malformed descriptor pays for the search.
fn first_non_zero(bytes: &[u8; DESCRIPTOR_SIZE], range: std::ops::Range<usize>) -> Option<usize> {
    let start = range.start;
    let region = &bytes[range];
    if region.iter().fold(0u8, |any, byte| any | byte) == 0 {
        return None;
    }
    region
        .iter()
        .position(|byte| *byte != 0)
        .map(|at| start + at)
}

/// The OR of `region`'s bytes, eight at a time (zero: all zero).
fn or_of(region: &[u8]) -> u64 {
    let words = region.chunks_exact(8);
    let tail = words
        .remainder()
        .iter()
        .fold(0u64, |any, b| any | u64::from(*b));
    words.fold(tail, |any, word| {
        let mut w = [0u8; 8];
        w.copy_from_slice(word);
        any | u64::from_ne_bytes(w)
    })
}

/// Whether every byte a well-formed slot with these `flags` and
/// (inputs, scalars, args) counts must leave zero is zero: the reserved
/// bytes, the unused inputs, scalars and args, and a semaphore whose flag
/// is off. The counts are at most their maxima.
fn zero_where_required(
    bytes: &[u8; DESCRIPTOR_SIZE],
    flags: u32,
    (inputs, scalars, args): (usize, usize, usize),
) -> bool {
    let mut any = or_of(&bytes[AT_ARG_COUNT + 1..AT_WAIT]);
    for at in [AT_WAIT, AT_SIGNAL, AT_OUTPUT] {
        any |= u64::from(u32_at(bytes, at + 4));
    }
    for (at, flag) in [(AT_WAIT, FLAG_WAIT), (AT_SIGNAL, FLAG_SIGNAL)] {
        if flags & flag == 0 {
            any |= or_of(&bytes[at..at + SEMAPHORE_SIZE]);
        }
    }
    for i in 0..inputs {
        any |= u64::from(u32_at(bytes, AT_INPUTS + i * OPERAND_SIZE + 4));
    }
    any |= or_of(&bytes[AT_INPUTS + inputs * OPERAND_SIZE..AT_SCALARS]);
    any |= or_of(&bytes[AT_SCALARS + scalars * 4..AT_ARG_TYPES]);
    any |= or_of(&bytes[AT_ARG_TYPES + args..AT_ARG_VALUES]);
    any |= or_of(&bytes[AT_ARG_VALUES + args * 8..DESCRIPTOR_SIZE]);
    any == 0
}

fn check_semaphore(role: SemaphoreRole, op: &SemaphoreOp) -> Result<(), DescriptorError> {
    if op.width == SemaphoreWidth::Bits32 && op.value > u64::from(u32::MAX) {
        return Err(DescriptorError::SemaphoreValueTooWide {
            role,
            value: op.value,
        });
    }
    let width = op.width.bytes();
    if !op.offset.is_multiple_of(width) {
        return Err(DescriptorError::SemaphoreMisaligned {
            role,
            offset: op.offset,
            width,
        });
    }
    Ok(())
}

impl Descriptor {
    /// A launch of kernel `kernel` over `n` elements, without scalars or
    /// semaphore operations, completing once enqueued.
    pub fn new(
        ticket: u64,
        kernel: u32,
        inputs: &[OperandRef],
        output: OperandRef,
        n: u64,
    ) -> Result<Self, DescriptorError> {
        if inputs.len() > MAX_INPUTS {
            return Err(DescriptorError::TooManyInputs {
                count: inputs.len(),
            });
        }
        let mut all = [OperandRef::default(); MAX_INPUTS];
        all[..inputs.len()].copy_from_slice(inputs);
        Ok(Descriptor {
            ticket,
            kernel,
            n,
            sync: false,
            output,
            inputs: all,
            // At most MAX_INPUTS (64), checked above.
            input_count: inputs.len() as u8,
            scalars: [0; MAX_SCALARS],
            scalar_count: 0,
            arg_types: [0; MAX_ARGS],
            arg_values: [0; MAX_ARGS],
            arg_count: 0,
            wait: None,
            signal: None,
        })
    }

    /// Sets the scalars as raw f32 bits.
    pub fn with_scalar_bits(mut self, bits: &[u32]) -> Result<Self, DescriptorError> {
        if bits.len() > MAX_SCALARS {
            return Err(DescriptorError::TooManyScalars { count: bits.len() });
        }
        self.scalars = [0; MAX_SCALARS];
        self.scalars[..bits.len()].copy_from_slice(bits);
        // At most MAX_SCALARS (64), checked above.
        self.scalar_count = bits.len() as u8;
        Ok(self)
    }

    /// Sets the scalars.
    pub fn with_scalars(self, values: &[f32]) -> Result<Self, DescriptorError> {
        if values.len() > MAX_SCALARS {
            return Err(DescriptorError::TooManyScalars {
                count: values.len(),
            });
        }
        let mut bits = [0u32; MAX_SCALARS];
        for (slot, value) in bits.iter_mut().zip(values) {
            *slot = value.to_bits();
        }
        self.with_scalar_bits(&bits[..values.len()])
    }

    /// Sets the typed scalar args (the kernel's scalar params in order).
    pub fn with_args(mut self, args: &[TypedArg]) -> Result<Self, DescriptorError> {
        if args.len() > MAX_ARGS {
            return Err(DescriptorError::TooManyArgs { count: args.len() });
        }
        self.arg_types = [0; MAX_ARGS];
        self.arg_values = [0; MAX_ARGS];
        for (i, arg) in args.iter().enumerate() {
            (self.arg_types[i], self.arg_values[i]) = arg.encode();
        }
        // At most MAX_ARGS (64), checked above.
        self.arg_count = args.len() as u8;
        Ok(self)
    }

    /// The typed args, in order.
    pub fn args(&self) -> impl ExactSizeIterator<Item = TypedArg> + '_ {
        let count = usize::from(self.arg_count);
        self.arg_types[..count]
            .iter()
            .zip(&self.arg_values[..count])
            // Every entry was encoded from a `TypedArg` or decoded into
            // one: it decodes; the fallback is never taken.
            .map(|(&ty, &bits)| TypedArg::decode(ty, bits).unwrap_or(TypedArg::U64(bits)))
    }

    /// Completes after the kernel finished (true) or once accepted (false;
    /// on CUDA: checked, then enqueued right after).
    pub fn with_sync(mut self, sync: bool) -> Self {
        self.sync = sync;
        self
    }

    /// Before the kernel, the GPU waits until the semaphore is >= `op.value`.
    pub fn with_wait(mut self, op: SemaphoreOp) -> Result<Self, DescriptorError> {
        check_semaphore(SemaphoreRole::Wait, &op)?;
        self.wait = Some(op);
        Ok(self)
    }

    /// After the kernel, the GPU writes `op.value` to the semaphore.
    pub fn with_signal(mut self, op: SemaphoreOp) -> Result<Self, DescriptorError> {
        check_semaphore(SemaphoreRole::Signal, &op)?;
        self.signal = Some(op);
        Ok(self)
    }

    /// The input operands, in kernel order.
    pub fn inputs(&self) -> &[OperandRef] {
        &self.inputs[..usize::from(self.input_count)]
    }

    /// The scalars as raw f32 bits.
    pub fn scalar_bits(&self) -> &[u32] {
        &self.scalars[..usize::from(self.scalar_count)]
    }

    /// The scalars.
    pub fn scalars(&self) -> impl ExactSizeIterator<Item = f32> + '_ {
        self.scalar_bits().iter().map(|bits| f32::from_bits(*bits))
    }

    /// The semaphore wait before the kernel, if any.
    pub fn wait(&self) -> Option<SemaphoreOp> {
        self.wait
    }

    /// The semaphore write after the kernel, if any.
    pub fn signal(&self) -> Option<SemaphoreOp> {
        self.signal
    }

    /// The ticket field of raw descriptor bytes, whether or not the rest is
    /// well formed (a malformed submission is refused under this ticket).
    pub fn ticket_of(bytes: &[u8; DESCRIPTOR_SIZE]) -> u64 {
        u64_at(bytes, AT_TICKET)
    }

    /// The canonical bytes of this descriptor.
    pub fn encode(&self) -> [u8; DESCRIPTOR_SIZE] {
        let mut bytes = [0u8; DESCRIPTOR_SIZE];
        self.encode_into(&mut bytes);
        bytes
    }

    /// Writes the canonical bytes of this descriptor over all of `bytes`.
    pub fn encode_into(&self, bytes: &mut [u8; DESCRIPTOR_SIZE]) {
        bytes.fill(0);
        let mut put = |at: usize, field: &[u8]| bytes[at..at + field.len()].copy_from_slice(field);
        let mut flags = 0;
        if self.sync {
            flags |= FLAG_SYNC;
        }
        for (op, at, flag, wide) in [
            (self.wait, AT_WAIT, FLAG_WAIT, FLAG_WAIT_64),
            (self.signal, AT_SIGNAL, FLAG_SIGNAL, FLAG_SIGNAL_64),
        ] {
            if let Some(op) = op {
                flags |= flag;
                if op.width == SemaphoreWidth::Bits64 {
                    flags |= wide;
                }
                put(at, &op.buffer.to_le_bytes());
                put(at + 8, &op.offset.to_le_bytes());
                put(at + 16, &op.value.to_le_bytes());
            }
        }
        put(AT_TICKET, &self.ticket.to_le_bytes());
        put(AT_KERNEL, &self.kernel.to_le_bytes());
        put(AT_FLAGS, &flags.to_le_bytes());
        put(AT_N, &self.n.to_le_bytes());
        put(AT_INPUT_COUNT, &[self.input_count]);
        put(AT_SCALAR_COUNT, &[self.scalar_count]);
        put(AT_ARG_COUNT, &[self.arg_count]);
        let count = usize::from(self.arg_count);
        for (i, (ty, bits)) in self.arg_types[..count]
            .iter()
            .zip(&self.arg_values[..count])
            .enumerate()
        {
            put(AT_ARG_TYPES + i, &[*ty]);
            put(AT_ARG_VALUES + i * 8, &bits.to_le_bytes());
        }
        let operands = std::iter::once((AT_OUTPUT, &self.output)).chain(
            self.inputs()
                .iter()
                .enumerate()
                .map(|(i, input)| (AT_INPUTS + i * OPERAND_SIZE, input)),
        );
        for (at, operand) in operands {
            put(at, &operand.buffer.to_le_bytes());
            put(at + 8, &operand.offset.to_le_bytes());
        }
        for (i, bits) in self.scalar_bits().iter().enumerate() {
            put(AT_SCALARS + i * 4, &bits.to_le_bytes());
        }
    }

    /// Decodes a copy of a submission slot. Any bytes: a typed error for
    /// every malformed field, checked in a fixed order (flags, counts,
    /// reserved bytes, unused entries, semaphores).
    ///
    /// A well-formed slot takes the fast path: one pass of word-wide ORs
    /// over every byte that must be zero, then each field read once into
    /// the descriptor (the unused entries, being zero, read as the empty
    /// entries; nothing is zeroed and then overwritten). A slot with a
    /// non-zero byte where a zero belongs is decoded by
    /// the field-by-field `decode_in_order`, which names the first
    /// malformed field; both give the same result for every input (tested).
    pub fn decode(bytes: &[u8; DESCRIPTOR_SIZE]) -> Result<Self, DescriptorError> {
        let flags = u32_at(bytes, AT_FLAGS);
        let counts = (
            usize::from(bytes[AT_INPUT_COUNT]),
            usize::from(bytes[AT_SCALAR_COUNT]),
            usize::from(bytes[AT_ARG_COUNT]),
        );
        let (input_count, scalar_count, arg_count) = counts;
        if flags & !KNOWN_FLAGS != 0
            || input_count > MAX_INPUTS
            || scalar_count > MAX_SCALARS
            || arg_count > MAX_ARGS
            || !zero_where_required(bytes, flags, counts)
        {
            return Self::decode_in_order(bytes);
        }
        // Every unused entry is zero (checked above): reading all of them
        // gives the empty entries, with no branch per entry.
        let operand = |at: usize| OperandRef {
            buffer: u32_at(bytes, at),
            offset: u64_at(bytes, at + 8),
        };
        let inputs: [OperandRef; MAX_INPUTS] =
            std::array::from_fn(|i| operand(AT_INPUTS + i * OPERAND_SIZE));
        let scalars: [u32; MAX_SCALARS] =
            std::array::from_fn(|i| u32_at(bytes, AT_SCALARS + i * 4));
        let arg_types: [u8; MAX_ARGS] = field(bytes, AT_ARG_TYPES);
        let arg_values: [u64; MAX_ARGS] =
            std::array::from_fn(|i| u64_at(bytes, AT_ARG_VALUES + i * 8));
        for (i, (ty, bits)) in arg_types
            .iter()
            .zip(&arg_values)
            .enumerate()
            .take(arg_count)
        {
            if TypedArg::decode(*ty, *bits).is_none() {
                return Err(DescriptorError::BadArg {
                    index: i,
                    ty: *ty,
                    bits: *bits,
                });
            }
        }
        let mut semaphores = [None, None];
        for (slot, role, at, flag, wide) in [
            (0, SemaphoreRole::Wait, AT_WAIT, FLAG_WAIT, FLAG_WAIT_64),
            (
                1,
                SemaphoreRole::Signal,
                AT_SIGNAL,
                FLAG_SIGNAL,
                FLAG_SIGNAL_64,
            ),
        ] {
            if flags & flag == 0 {
                // Its bytes are zero (checked above).
                if flags & wide != 0 {
                    return Err(DescriptorError::WidthWithoutSemaphore { role });
                }
                continue;
            }
            let op = SemaphoreOp {
                buffer: u32_at(bytes, at),
                offset: u64_at(bytes, at + 8),
                value: u64_at(bytes, at + 16),
                width: if flags & wide != 0 {
                    SemaphoreWidth::Bits64
                } else {
                    SemaphoreWidth::Bits32
                },
            };
            check_semaphore(role, &op)?;
            semaphores[slot] = Some(op);
        }
        let [wait, signal] = semaphores;
        Ok(Descriptor {
            ticket: u64_at(bytes, AT_TICKET),
            kernel: u32_at(bytes, AT_KERNEL),
            n: u64_at(bytes, AT_N),
            sync: flags & FLAG_SYNC != 0,
            output: operand(AT_OUTPUT),
            inputs,
            // All three at most 64, checked above.
            input_count: input_count as u8,
            scalars,
            scalar_count: scalar_count as u8,
            arg_types,
            arg_values,
            arg_count: arg_count as u8,
            wait,
            signal,
        })
    }

    /// [`decode`](Self::decode), checking each field in turn: the first
    /// malformed one in the fixed order is the error.
    pub(crate) fn decode_in_order(bytes: &[u8; DESCRIPTOR_SIZE]) -> Result<Self, DescriptorError> {
        let flags = u32_at(bytes, AT_FLAGS);
        if flags & !KNOWN_FLAGS != 0 {
            return Err(DescriptorError::UnknownFlags {
                bits: flags & !KNOWN_FLAGS,
            });
        }
        let input_count = usize::from(bytes[AT_INPUT_COUNT]);
        if input_count > MAX_INPUTS {
            return Err(DescriptorError::TooManyInputs { count: input_count });
        }
        let scalar_count = usize::from(bytes[AT_SCALAR_COUNT]);
        if scalar_count > MAX_SCALARS {
            return Err(DescriptorError::TooManyScalars {
                count: scalar_count,
            });
        }

        let arg_count = usize::from(bytes[AT_ARG_COUNT]);
        if arg_count > MAX_ARGS {
            return Err(DescriptorError::TooManyArgs { count: arg_count });
        }

        // Reserved bytes, in address order.
        let operand_reserved = |at: usize| at + 4..at + 8;
        let reserved = [
            AT_ARG_COUNT + 1..AT_WAIT,
            operand_reserved(AT_WAIT),
            operand_reserved(AT_SIGNAL),
            operand_reserved(AT_OUTPUT),
        ]
        .into_iter()
        .chain((0..input_count).map(|i| operand_reserved(AT_INPUTS + i * OPERAND_SIZE)))
        .chain(std::iter::once(AT_TAIL..DESCRIPTOR_SIZE));
        for range in reserved {
            if let Some(offset) = first_non_zero(bytes, range) {
                return Err(DescriptorError::ReservedNotZero { offset });
            }
        }
        let unused_inputs = AT_INPUTS + input_count * OPERAND_SIZE..AT_SCALARS;
        if let Some(offset) = first_non_zero(bytes, unused_inputs) {
            return Err(DescriptorError::UnusedInputNotZero {
                index: (offset - AT_INPUTS) / OPERAND_SIZE,
            });
        }
        let unused_scalars = AT_SCALARS + scalar_count * 4..AT_ARG_TYPES;
        if let Some(offset) = first_non_zero(bytes, unused_scalars) {
            return Err(DescriptorError::UnusedScalarNotZero {
                index: (offset - AT_SCALARS) / 4,
            });
        }
        if let Some(offset) = first_non_zero(bytes, AT_ARG_TYPES + arg_count..AT_ARG_VALUES) {
            return Err(DescriptorError::UnusedArgNotZero {
                index: offset - AT_ARG_TYPES,
            });
        }
        if let Some(offset) = first_non_zero(bytes, AT_ARG_VALUES + arg_count * 8..AT_TAIL) {
            return Err(DescriptorError::UnusedArgNotZero {
                index: (offset - AT_ARG_VALUES) / 8,
            });
        }
        let (mut arg_types, mut arg_values) = ([0u8; MAX_ARGS], [0u64; MAX_ARGS]);
        for i in 0..arg_count {
            let (ty, bits) = (
                bytes[AT_ARG_TYPES + i],
                u64_at(bytes, AT_ARG_VALUES + i * 8),
            );
            if TypedArg::decode(ty, bits).is_none() {
                return Err(DescriptorError::BadArg { index: i, ty, bits });
            }
            (arg_types[i], arg_values[i]) = (ty, bits);
        }

        let mut semaphores = [None, None];
        for (slot, role, at, flag, wide) in [
            (0, SemaphoreRole::Wait, AT_WAIT, FLAG_WAIT, FLAG_WAIT_64),
            (
                1,
                SemaphoreRole::Signal,
                AT_SIGNAL,
                FLAG_SIGNAL,
                FLAG_SIGNAL_64,
            ),
        ] {
            if flags & flag == 0 {
                if flags & wide != 0 {
                    return Err(DescriptorError::WidthWithoutSemaphore { role });
                }
                if first_non_zero(bytes, at..at + SEMAPHORE_SIZE).is_some() {
                    return Err(DescriptorError::SemaphoreWithoutFlag { role });
                }
                continue;
            }
            let op = SemaphoreOp {
                buffer: u32_at(bytes, at),
                offset: u64_at(bytes, at + 8),
                value: u64_at(bytes, at + 16),
                width: if flags & wide != 0 {
                    SemaphoreWidth::Bits64
                } else {
                    SemaphoreWidth::Bits32
                },
            };
            check_semaphore(role, &op)?;
            semaphores[slot] = Some(op);
        }

        let operand = |at: usize| OperandRef {
            buffer: u32_at(bytes, at),
            offset: u64_at(bytes, at + 8),
        };
        let mut inputs = [OperandRef::default(); MAX_INPUTS];
        for (i, input) in inputs.iter_mut().enumerate().take(input_count) {
            *input = operand(AT_INPUTS + i * OPERAND_SIZE);
        }
        let mut scalars = [0u32; MAX_SCALARS];
        for (i, scalar) in scalars.iter_mut().enumerate().take(scalar_count) {
            *scalar = u32_at(bytes, AT_SCALARS + i * 4);
        }
        let [wait, signal] = semaphores;
        Ok(Descriptor {
            ticket: u64_at(bytes, AT_TICKET),
            kernel: u32_at(bytes, AT_KERNEL),
            n: u64_at(bytes, AT_N),
            sync: flags & FLAG_SYNC != 0,
            output: operand(AT_OUTPUT),
            inputs,
            // Both at most 64, checked above.
            input_count: input_count as u8,
            scalars,
            scalar_count: scalar_count as u8,
            arg_types,
            arg_values,
            // At most 64, checked above.
            arg_count: arg_count as u8,
            wait,
            signal,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    fn random_semaphore(rng: &mut StdRng) -> SemaphoreOp {
        let width = if rng.random() {
            SemaphoreWidth::Bits64
        } else {
            SemaphoreWidth::Bits32
        };
        let value = match width {
            SemaphoreWidth::Bits32 => u64::from(rng.random::<u32>()),
            SemaphoreWidth::Bits64 => rng.random(),
        };
        SemaphoreOp {
            buffer: rng.random(),
            offset: (rng.random::<u64>() / 8) * width.bytes(),
            value,
            width,
        }
    }

    fn random_arg(rng: &mut StdRng) -> TypedArg {
        match rng.random_range(0..6) {
            0 => TypedArg::I32(rng.random()),
            1 => TypedArg::U32(rng.random()),
            2 => TypedArg::I64(rng.random()),
            3 => TypedArg::U64(rng.random()),
            4 => TypedArg::F32(f32::from_bits(rng.random())),
            _ => TypedArg::F64(f64::from_bits(rng.random())),
        }
    }

    #[test]
    fn typed_args_sit_at_their_offsets_and_malformed_ones_are_refused() {
        let out = OperandRef::default();
        let args = [
            TypedArg::I32(-2),
            TypedArg::U32(7),
            TypedArg::I64(-3),
            TypedArg::U64(u64::MAX),
            TypedArg::F32(1.5),
            TypedArg::F64(-0.25),
        ];
        let d = Descriptor::new(1, 2, &[], out, 9)
            .unwrap()
            .with_args(&args)
            .unwrap();
        let bytes = d.encode();
        assert_eq!(bytes[0x01A], 6);
        assert_eq!(&bytes[0x560..0x566], &[1, 2, 3, 4, 5, 6]);
        assert_eq!(bytes[0x566], 0);
        assert_eq!(u64_at(&bytes, 0x5A0), u64::from((-2i32) as u32));
        assert_eq!(u64_at(&bytes, 0x5A8), 7);
        assert_eq!(u64_at(&bytes, 0x5B0), (-3i64) as u64);
        assert_eq!(u64_at(&bytes, 0x5B8), u64::MAX);
        assert_eq!(u64_at(&bytes, 0x5C0), u64::from(1.5f32.to_bits()));
        assert_eq!(u64_at(&bytes, 0x5C8), (-0.25f64).to_bits());
        let back = Descriptor::decode(&bytes).unwrap();
        assert_eq!(back.args().collect::<Vec<_>>(), args.to_vec());
        let with = |edit: &dyn Fn(&mut [u8; DESCRIPTOR_SIZE])| {
            let mut b = bytes;
            edit(&mut b);
            Descriptor::decode(&b)
        };
        assert_eq!(
            with(&|b| b[0x01A] = 65),
            Err(DescriptorError::TooManyArgs { count: 65 })
        );
        assert_eq!(
            with(&|b| b[0x560] = 7),
            Err(DescriptorError::BadArg {
                index: 0,
                ty: 7,
                bits: u64::from((-2i32) as u32)
            })
        );
        // A 4-byte type with its high bytes set is not canonical.
        assert_eq!(
            with(&|b| b[0x5A8 + 4] = 1),
            Err(DescriptorError::BadArg {
                index: 1,
                ty: 2,
                bits: 7 | 1 << 32
            })
        );
        assert_eq!(
            with(&|b| b[0x566] = 1),
            Err(DescriptorError::UnusedArgNotZero { index: 6 })
        );
        assert_eq!(
            with(&|b| b[0x5A0 + 6 * 8 + 7] = 1),
            Err(DescriptorError::UnusedArgNotZero { index: 6 })
        );
        assert_eq!(
            Descriptor::new(1, 2, &[], out, 9)
                .unwrap()
                .with_args(&[TypedArg::U32(0); MAX_ARGS + 1]),
            Err(DescriptorError::TooManyArgs {
                count: MAX_ARGS + 1
            })
        );
        // Shrinking the args clears the old tail.
        let d = d.with_args(&[TypedArg::U32(1)]).unwrap();
        assert_eq!(Descriptor::decode(&d.encode()).unwrap(), d);
    }

    /// A random valid descriptor: every field, count and option varies.
    pub(crate) fn random_descriptor(rng: &mut StdRng) -> Descriptor {
        let operand = |rng: &mut StdRng| OperandRef {
            buffer: rng.random(),
            offset: rng.random(),
        };
        let inputs: Vec<OperandRef> = (0..rng.random_range(0..=MAX_INPUTS))
            .map(|_| operand(rng))
            .collect();
        let scalars: Vec<u32> = (0..rng.random_range(0..=MAX_SCALARS))
            .map(|_| rng.random())
            .collect();
        let output = operand(rng);
        let mut descriptor =
            Descriptor::new(rng.random(), rng.random(), &inputs, output, rng.random())
                .unwrap()
                .with_scalar_bits(&scalars)
                .unwrap()
                .with_sync(rng.random());
        let args: Vec<TypedArg> = (0..rng.random_range(0..=MAX_ARGS))
            .map(|_| random_arg(rng))
            .collect();
        descriptor = descriptor.with_args(&args).unwrap();
        if rng.random() {
            descriptor = descriptor.with_wait(random_semaphore(rng)).unwrap();
        }
        if rng.random() {
            descriptor = descriptor.with_signal(random_semaphore(rng)).unwrap();
        }
        descriptor
    }

    #[test]
    fn random_descriptors_round_trip() {
        let mut rng = StdRng::seed_from_u64(0xdec0de);
        for _ in 0..20_000 {
            let descriptor = random_descriptor(&mut rng);
            let bytes = descriptor.encode();
            assert_eq!(Descriptor::ticket_of(&bytes), descriptor.ticket);
            let decoded = Descriptor::decode(&bytes).unwrap();
            assert_eq!(decoded, descriptor);
            assert_eq!(decoded.encode(), bytes, "the encoding is canonical");
        }
    }

    /// The fast path and the field-by-field path decode every input alike:
    /// well-formed slots, and slots with 1-4 random bytes changed anywhere
    /// (a reserved byte, an unused entry, a count, a flag, a semaphore, an
    /// arg's type), each compared error for error.
    #[test]
    fn the_fast_decode_is_the_field_by_field_decode() {
        let seed = rand::random();
        let mut rng = StdRng::seed_from_u64(seed);
        let (mut ok, mut refused) = (0, 0);
        for round in 0..40_000 {
            let mut bytes = random_descriptor(&mut rng).encode();
            if round % 4 != 0 {
                for _ in 0..rng.random_range(1..=4) {
                    // Half the changes in the header and semaphores, where
                    // one byte changes the meaning of the rest.
                    let at = if rng.random() {
                        rng.random_range(0..AT_INPUTS)
                    } else {
                        rng.random_range(0..DESCRIPTOR_SIZE)
                    };
                    bytes[at] = if rng.random() { rng.random() } else { 0 };
                }
            }
            let fast = Descriptor::decode(&bytes);
            assert_eq!(
                fast,
                Descriptor::decode_in_order(&bytes),
                "seed {seed}, round {round}"
            );
            if fast.is_ok() {
                ok += 1;
            } else {
                refused += 1;
            }
        }
        assert!(
            ok > 10_000 && refused > 10_000,
            "{ok} ok, {refused} refused"
        );
    }

    #[test]
    fn accessors_and_builders() {
        let a = OperandRef {
            buffer: 1,
            offset: 16,
        };
        let out = OperandRef {
            buffer: 2,
            offset: 0,
        };
        let d = Descriptor::new(7, 3, &[a, a], out, 1024)
            .unwrap()
            .with_scalars(&[1.5, -2.0])
            .unwrap();
        assert_eq!(d.inputs(), &[a, a]);
        assert_eq!(d.scalars().collect::<Vec<_>>(), vec![1.5, -2.0]);
        assert_eq!(d.scalar_bits(), &[1.5f32.to_bits(), (-2.0f32).to_bits()]);
        assert!(!d.sync && d.wait().is_none() && d.signal().is_none());
        // Shrinking the scalars clears the old tail, so encoding stays canonical.
        let d = d.with_scalars(&[4.0]).unwrap();
        assert_eq!(Descriptor::decode(&d.encode()).unwrap(), d);

        assert_eq!(
            Descriptor::new(0, 0, &[a; MAX_INPUTS + 1], out, 1),
            Err(DescriptorError::TooManyInputs { count: 65 })
        );
        let d = Descriptor::new(0, 0, &[a; MAX_INPUTS], out, 1).unwrap();
        assert_eq!(
            d.clone().with_scalars(&[0.0; MAX_SCALARS + 1]),
            Err(DescriptorError::TooManyScalars { count: 65 })
        );
        assert_eq!(
            d.clone().with_scalar_bits(&[0; MAX_SCALARS + 1]),
            Err(DescriptorError::TooManyScalars { count: 65 })
        );
        let op = SemaphoreOp {
            buffer: 9,
            offset: 4,
            value: u64::from(u32::MAX) + 1,
            width: SemaphoreWidth::Bits32,
        };
        assert_eq!(
            d.clone().with_wait(op),
            Err(DescriptorError::SemaphoreValueTooWide {
                role: SemaphoreRole::Wait,
                value: op.value
            })
        );
        let op = SemaphoreOp {
            width: SemaphoreWidth::Bits64,
            ..op
        };
        assert_eq!(
            d.clone().with_signal(op),
            Err(DescriptorError::SemaphoreMisaligned {
                role: SemaphoreRole::Signal,
                offset: 4,
                width: 8
            })
        );
        let op = SemaphoreOp { offset: 8, ..op };
        let d = d.with_signal(op).unwrap();
        assert_eq!(d.signal(), Some(op));
    }

    /// A valid descriptor with two inputs, two scalars and both semaphore
    /// operations (wait 32-bit, signal 64-bit).
    fn base() -> [u8; DESCRIPTOR_SIZE] {
        let operand = OperandRef {
            buffer: 5,
            offset: 64,
        };
        Descriptor::new(42, 1, &[operand, operand], operand, 100)
            .unwrap()
            .with_scalars(&[1.0, 2.0])
            .unwrap()
            .with_wait(SemaphoreOp {
                buffer: 3,
                offset: 4,
                value: 10,
                width: SemaphoreWidth::Bits32,
            })
            .unwrap()
            .with_signal(SemaphoreOp {
                buffer: 3,
                offset: 8,
                value: 11,
                width: SemaphoreWidth::Bits64,
            })
            .unwrap()
            .encode()
    }

    fn decode_with(
        edit: impl FnOnce(&mut [u8; DESCRIPTOR_SIZE]),
    ) -> Result<Descriptor, DescriptorError> {
        let mut bytes = base();
        edit(&mut bytes);
        Descriptor::decode(&bytes)
    }

    fn set_u32(bytes: &mut [u8; DESCRIPTOR_SIZE], at: usize, value: u32) {
        bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
    }

    fn set_u64(bytes: &mut [u8; DESCRIPTOR_SIZE], at: usize, value: u64) {
        bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
    }

    #[test]
    fn every_malformed_field_has_its_error() {
        use DescriptorError as E;
        use SemaphoreRole::{Signal, Wait};
        assert!(Descriptor::decode(&base()).is_ok());
        let flags = FLAG_WAIT | FLAG_SIGNAL | FLAG_SIGNAL_64;
        assert_eq!(u32_at(&base(), AT_FLAGS), flags);

        // Flags.
        for bit in 5..32 {
            assert_eq!(
                decode_with(|b| set_u32(b, AT_FLAGS, flags | 1 << bit)),
                Err(E::UnknownFlags { bits: 1 << bit })
            );
        }
        // Counts.
        for count in [65u8, 200, 255] {
            assert_eq!(
                decode_with(|b| b[AT_INPUT_COUNT] = count),
                Err(E::TooManyInputs {
                    count: count.into()
                })
            );
            assert_eq!(
                decode_with(|b| b[AT_SCALAR_COUNT] = count),
                Err(E::TooManyScalars {
                    count: count.into()
                })
            );
        }
        // Reserved bytes: header, each operand's padding, an input in use, tail.
        for offset in [
            0x01B, 0x01F, 0x024, 0x027, 0x03C, 0x054, 0x064, 0x074, 0x7A0, 0x7FF,
        ] {
            assert_eq!(
                decode_with(|b| b[offset] = 0x80),
                Err(E::ReservedNotZero { offset }),
                "byte {offset:#x}"
            );
        }
        // The padding of an unused input is part of the unused entry.
        assert_eq!(
            decode_with(|b| b[AT_INPUTS + 2 * OPERAND_SIZE + 4] = 1),
            Err(E::UnusedInputNotZero { index: 2 })
        );
        for index in [2, 40, 63] {
            assert_eq!(
                decode_with(|b| b[AT_INPUTS + index * OPERAND_SIZE + 15] = 1),
                Err(E::UnusedInputNotZero { index })
            );
            assert_eq!(
                decode_with(|b| b[AT_SCALARS + index * 4 + 3] = 1),
                Err(E::UnusedScalarNotZero { index })
            );
        }
        // Lowering a count turns the dropped entry into a non-zero unused one.
        assert_eq!(
            decode_with(|b| b[AT_INPUT_COUNT] = 1),
            Err(E::UnusedInputNotZero { index: 1 })
        );
        assert_eq!(
            decode_with(|b| b[AT_SCALAR_COUNT] = 0),
            Err(E::UnusedScalarNotZero { index: 0 })
        );
        // Semaphores without their flag.
        assert_eq!(
            decode_with(|b| set_u32(b, AT_FLAGS, flags & !FLAG_WAIT)),
            Err(E::SemaphoreWithoutFlag { role: Wait })
        );
        assert_eq!(
            decode_with(|b| set_u32(b, AT_FLAGS, flags & !FLAG_SIGNAL)),
            Err(E::WidthWithoutSemaphore { role: Signal })
        );
        assert_eq!(
            decode_with(|b| set_u32(b, AT_FLAGS, flags & !(FLAG_SIGNAL | FLAG_SIGNAL_64))),
            Err(E::SemaphoreWithoutFlag { role: Signal })
        );
        assert_eq!(
            decode_with(|b| {
                set_u32(b, AT_FLAGS, FLAG_SIGNAL | FLAG_SIGNAL_64 | FLAG_WAIT_64);
                b[AT_WAIT..AT_WAIT + SEMAPHORE_SIZE].fill(0);
            }),
            Err(E::WidthWithoutSemaphore { role: Wait })
        );
        // Values and alignment.
        assert_eq!(
            decode_with(|b| set_u64(b, AT_WAIT + 16, 1 << 32)),
            Err(E::SemaphoreValueTooWide {
                role: Wait,
                value: 1 << 32
            })
        );
        assert_eq!(
            decode_with(|b| set_u64(b, AT_WAIT + 8, 6)),
            Err(E::SemaphoreMisaligned {
                role: Wait,
                offset: 6,
                width: 4
            })
        );
        assert_eq!(
            decode_with(|b| set_u64(b, AT_SIGNAL + 8, 12)),
            Err(E::SemaphoreMisaligned {
                role: Signal,
                offset: 12,
                width: 8
            })
        );
        // The 64-bit signal accepts any value; flipping wait to 64-bit needs
        // an 8-aligned offset.
        assert!(decode_with(|b| set_u64(b, AT_SIGNAL + 16, u64::MAX)).is_ok());
        assert_eq!(
            decode_with(|b| set_u32(b, AT_FLAGS, flags | FLAG_WAIT_64)),
            Err(E::SemaphoreMisaligned {
                role: Wait,
                offset: 4,
                width: 8
            })
        );
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut rng = StdRng::seed_from_u64(7);
        let mut bytes = [0u8; DESCRIPTOR_SIZE];
        for round in 0..20_000 {
            rng.fill(&mut bytes[..]);
            // Mostly valid prefixes reach the deeper checks.
            if round % 2 == 0 {
                let keep = rng.random_range(0..DESCRIPTOR_SIZE);
                bytes[keep..].fill(0);
            }
            if let Ok(descriptor) = Descriptor::decode(&bytes) {
                assert_eq!(descriptor.encode(), bytes);
            }
        }
    }
}
