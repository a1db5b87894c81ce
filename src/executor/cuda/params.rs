//! A kernel's parameters, packed for `cuLaunchKernel` by its param layout
//! ([`crate::executor::layout`]): the one place both launch paths (the
//! protocol's and the ring's) enqueue a kernel.
//!
//! Invariants:
//! - A kernel is enqueued only with exactly the parameters its layout
//!   names, each of the size the load checked against the kernel's own
//!   declaration (`cuFuncGetParamInfo`, see
//!   [`super::images::expected_param_sizes`]): an operand's address or a
//!   null as an 8-byte pointer, the count as its type, each scalar as its
//!   type.
//! - Nothing is truncated: a count that does not fit its type, or scalar
//!   bits wider than their type, is refused before the driver sees them.
//! - Each param sits at the next offset aligned to its size, as the CUDA
//!   ABI lays out a parameter buffer (a pointer after a `.u32` starts at the
//!   next multiple of 8); the scalar ABI's layout packs exactly what it
//!   always did (8-byte pointers, an 8-byte `long long n`, 4-byte floats).

use std::ffi::c_void;

use ptxd_cuda::{DriverError, Stream};

use super::LoadedKernel;
use crate::executor::layout::Slot;
use crate::ptx::contract::ScalarType;

/// A kernel's param values at their offsets, in 8-byte words so that every
/// offset aligned to its param's size is aligned in memory too.
#[derive(Debug)]
pub(super) struct PackedParams {
    words: Vec<u64>,
    /// Each param's byte offset, in the kernel's order.
    offsets: Vec<usize>,
    /// Bytes the params span (the buffer's used length; read by the tests,
    /// which compare the packed bytes with hand-computed ones).
    #[cfg_attr(not(test), allow(dead_code))]
    len: usize,
}

impl PackedParams {
    /// The packed bytes, as a parameter buffer holds them.
    #[cfg(test)]
    pub(super) fn bytes(&self) -> Vec<u8> {
        let mut bytes: Vec<u8> = self.words.iter().flat_map(|w| w.to_ne_bytes()).collect();
        bytes.truncate(self.len);
        bytes
    }

    #[cfg(test)]
    pub(super) fn offsets(&self) -> &[usize] {
        &self.offsets
    }

    /// One pointer per param, to its value (what `cuLaunchKernel` takes as
    /// `kernelParams`); valid while `self` is neither moved nor dropped.
    fn pointers(&mut self) -> Vec<*mut c_void> {
        let base = self.words.as_mut_ptr().cast::<u8>();
        self.offsets
            .iter()
            // `wrapping_add` stays inside the allocation: every offset plus
            // its param's size is at most `len <= 8 × words.len()`.
            .map(|&offset| base.wrapping_add(offset).cast::<c_void>())
            .collect()
    }
}

/// The largest value a count of type `ty` holds, or `None` for a type that
/// is not a count.
fn count_max(ty: ScalarType) -> Option<u64> {
    match ty {
        ScalarType::U32 => Some(u64::from(u32::MAX)),
        ScalarType::S32 => Some(i32::MAX as u64),
        ScalarType::U64 => Some(u64::MAX),
        ScalarType::S64 => Some(i64::MAX as u64),
        ScalarType::F32 | ScalarType::F64 => None,
    }
}

/// Packs `layout`'s params for a launch of `n` elements over `operands`
/// (device addresses, inputs then output) with `scalars` (one per scalar
/// slot, bits zero-extended to 64).
pub(super) fn pack(
    layout: &[Slot],
    operands: &[u64],
    n: u64,
    scalars: &[u64],
) -> Result<PackedParams, String> {
    let wanted = layout
        .iter()
        .filter(|s| matches!(s, Slot::Scalar(_)))
        .count();
    if scalars.len() != wanted {
        return Err(format!(
            "the launch passes {} scalars; the kernel takes {wanted}",
            scalars.len()
        ));
    }
    let mut bytes: Vec<u8> = Vec::with_capacity(8 * layout.len());
    let mut offsets = Vec::with_capacity(layout.len());
    let mut scalars = scalars.iter();
    for (i, slot) in layout.iter().enumerate() {
        let size = slot.size();
        let value = match *slot {
            Slot::Operand(k) => *operands
                .get(k as usize)
                .ok_or_else(|| format!("param {i}: the launch has no operand {k}"))?,
            Slot::Null => 0,
            Slot::Count(ty) => {
                let max = count_max(ty)
                    .ok_or_else(|| format!("param {i}: a count of type {}", ty.as_str()))?;
                if n > max {
                    return Err(format!(
                        "param {i}: n = {n} does not fit the kernel's .{} count",
                        ty.as_str()
                    ));
                }
                n
            }
            Slot::Scalar(ty) => {
                let bits = *scalars
                    .next()
                    .ok_or_else(|| format!("param {i}: no scalar left"))?;
                if size < 8 && bits >> (8 * size) != 0 {
                    return Err(format!(
                        "param {i}: {bits:#x} does not fit a .{} scalar",
                        ty.as_str()
                    ));
                }
                bits
            }
        };
        let offset = bytes.len().next_multiple_of(size);
        bytes.resize(offset, 0);
        // Little or big endian alike: the low `size` bytes of the value,
        // in the machine's order (the device reads the host's layout).
        let value = value.to_ne_bytes();
        let low = if cfg!(target_endian = "little") {
            &value[..size]
        } else {
            &value[8 - size..]
        };
        bytes.extend_from_slice(low);
        offsets.push(offset);
    }
    let len = bytes.len();
    bytes.resize(len.next_multiple_of(8), 0);
    let words = bytes
        .chunks_exact(8)
        .map(|c| {
            let mut word = [0u8; 8];
            word.copy_from_slice(c);
            u64::from_ne_bytes(word)
        })
        .collect();
    Ok(PackedParams {
        words,
        offsets,
        len,
    })
}

impl LoadedKernel {
    /// Enqueues this kernel on `stream`, `grid` blocks of its block size,
    /// over `n` elements of `operands` (device addresses, inputs then
    /// output) with `scalars` (bits zero-extended to 64, one per scalar
    /// param). Parameters that do not match the kernel's layout are
    /// refused before the driver sees them.
    ///
    /// # Safety
    /// Every address in `operands` must lie in device memory with room for
    /// the launch's footprint of its operand, and stay mapped until the
    /// stream has run the launch.
    pub(super) unsafe fn enqueue(
        &self,
        stream: &Stream,
        grid: u32,
        operands: &[u64],
        n: u64,
        scalars: &[u64],
    ) -> Result<(), DriverError> {
        if operands.len() != self.inputs as usize + 1 {
            return Err(DriverError {
                call: "packing the kernel's parameters",
                name: "CUDA_ERROR_INVALID_VALUE".into(),
            });
        }
        let mut packed = pack(&self.layout, operands, n, scalars).map_err(|_| DriverError {
            call: "packing the kernel's parameters",
            name: "CUDA_ERROR_INVALID_VALUE".into(),
        })?;
        // Each parameter is passed as a pointer to its value; the values
        // live in `packed` until cuLaunchKernel returns (the driver copies
        // them during the call).
        let mut params = packed.pointers();
        // SAFETY: `params` holds one pointer per kernel parameter (the
        // layout's, which the load checked against the kernel's declared
        // sizes), each to a value of that size inside `packed`, which lives
        // until the call returns; every address among them is device memory
        // with room for the launch until it has run (this function's
        // contract).
        unsafe { self.function.launch(grid, self.block, stream, &mut params) }
    }
}

/// The f32 scalars of a launch as the packer takes them.
pub(super) fn f32_bits(scalars: &[f32]) -> Vec<u64> {
    scalars.iter().map(|s| u64::from(s.to_bits())).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::executor::layout::{scalar_abi, slots_of};

    fn le(words: &[(u64, usize)]) -> Vec<u8> {
        words
            .iter()
            .flat_map(|&(v, size)| v.to_le_bytes()[..size].to_vec())
            .collect()
    }

    /// The scalar ABI packs what it always did: one 8-byte pointer per
    /// operand, an 8-byte `long long n`, one 4-byte float per scalar,
    /// back to back (each offset already aligned).
    #[test]
    fn the_scalar_abi_packs_as_it_always_did() {
        let layout = scalar_abi(2, 2);
        let (a, b, out) = (0x7f00_0000_1000u64, 0x7f00_0000_2000, 0x7f00_0000_3000);
        let scalars = f32_bits(&[1.5, -0.0]);
        let packed = pack(&layout, &[a, b, out], 1000, &scalars).unwrap();
        assert_eq!(packed.offsets(), &[0, 8, 16, 24, 32, 36]);
        assert_eq!(
            packed.bytes(),
            le(&[
                (a, 8),
                (b, 8),
                (out, 8),
                (1000, 8),
                (u64::from(1.5f32.to_bits()), 4),
                (u64::from((-0.0f32).to_bits()), 4),
            ])
        );
        // The values the old packer passed, read back through the pointers
        // cuLaunchKernel gets.
        let mut packed = packed;
        let pointers = packed.pointers();
        // SAFETY: each pointer is inside `packed` with room for its value,
        // aligned to its size (the offsets are multiples of it and the
        // buffer is 8-byte aligned).
        unsafe {
            assert_eq!(*pointers[0].cast::<u64>(), a);
            assert_eq!(*pointers[2].cast::<u64>(), out);
            assert_eq!(*pointers[3].cast::<i64>(), 1000);
            assert_eq!(*pointers[4].cast::<f32>(), 1.5);
            assert_eq!((*pointers[5].cast::<f32>()).to_bits(), (-0.0f32).to_bits());
        }
    }

    /// Triton's shape, hand-computed: the output pointer first at 0, x at 8,
    /// the `.u32` count at 16, the f32 scale at 20, y at 24, an `.s64` at
    /// 32, the two null scratch pointers at 40 and 48.
    #[test]
    fn a_triton_like_layout_packs_each_param_at_its_aligned_offset() {
        let contract = crate::executor::layout::tests_support::triton_like();
        let load = ptxd_proto::executor::LoadModule {
            inputs: 2,
            scalar_params: 2,
            params: slots_of(&contract),
            ..Default::default()
        };
        let layout = crate::executor::layout::decode(&load).unwrap();
        let (x, y, out) = (
            0x1111_2222_3333_4440u64,
            0x5555_6666_7777_8880,
            0x9999_aaaa_bbbb_ccc0,
        );
        let scale = u64::from(0.125f32.to_bits());
        let shift = (-3i64) as u64;
        let packed = pack(&layout, &[x, y, out], 4097, &[scale, shift]).unwrap();
        assert_eq!(packed.offsets(), &[0, 8, 16, 20, 24, 32, 40, 48]);
        assert_eq!(
            packed.bytes(),
            le(&[
                (out, 8),
                (x, 8),
                (4097, 4),
                (scale, 4),
                (y, 8),
                (shift, 8),
                (0, 8),
                (0, 8),
            ])
        );
    }

    /// The seed's Strided schedule, from its verified contract: pointers,
    /// the `.s64` count and four `.u64` shape/stride args, each 8 bytes at
    /// the next multiple of 8, the args' bits as given (a value the
    /// kernel reads as negative is packed whole, never cut).
    #[test]
    fn a_strided_layout_packs_its_u64_args_whole() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/corpus/jit/nvrtc/add_f32_strided_O3.ptx"
        ))
        .unwrap();
        let (_, contract) =
            crate::ptx::verify_contract(&text, "add_f32_strided", None, crate::ptx::Families::ALL)
                .unwrap();
        let load = ptxd_proto::executor::LoadModule {
            inputs: 2,
            scalar_params: 4,
            params: slots_of(&contract),
            ..Default::default()
        };
        let layout = crate::executor::layout::decode(&load).unwrap();
        let (in0, in1, out) = (0x1000u64, 0x2000, 0x3000);
        let args = [56u64, 0, 37, u64::MAX];
        let packed = pack(&layout, &[in0, in1, out], 1961, &args).unwrap();
        assert_eq!(packed.offsets(), &[0, 8, 16, 24, 32, 40, 48, 56]);
        assert_eq!(
            packed.bytes(),
            le(&[
                (in0, 8),
                (in1, 8),
                (out, 8),
                (1961, 8),
                (56, 8),
                (0, 8),
                (37, 8),
                (u64::MAX, 8),
            ])
        );
    }

    /// A pointer after a lone `.u32` starts at the next multiple of 8, the
    /// four bytes between are zero.
    #[test]
    fn a_pointer_after_a_u32_is_aligned_to_eight() {
        let layout = [
            Slot::Operand(0),
            Slot::Count(ScalarType::U32),
            Slot::Operand(1),
            Slot::Scalar(ScalarType::S32),
            Slot::Scalar(ScalarType::F64),
            Slot::Null,
        ];
        let minus_one = u64::from((-1i32) as u32);
        let packed = pack(&layout, &[0xa0, 0xb0], 7, &[minus_one, 2.5f64.to_bits()]).unwrap();
        assert_eq!(packed.offsets(), &[0, 8, 16, 24, 32, 40]);
        let mut want = le(&[(0xa0, 8), (7, 4), (0, 4), (0xb0, 8), (minus_one, 4), (0, 4)]);
        want.extend(le(&[(2.5f64.to_bits(), 8), (0, 8)]));
        assert_eq!(packed.bytes(), want);
    }

    /// Nothing is truncated: a count past its type, scalar bits wider than
    /// theirs, another number of scalars, are refused.
    #[test]
    fn what_does_not_fit_is_refused_not_truncated() {
        let u32_count = [Slot::Operand(0), Slot::Count(ScalarType::U32)];
        assert!(pack(&u32_count, &[1], u64::from(u32::MAX), &[]).is_ok());
        let err = pack(&u32_count, &[1], u64::from(u32::MAX) + 1, &[]).unwrap_err();
        assert!(
            err.contains("does not fit the kernel's .u32 count"),
            "{err}"
        );
        let s32_count = [Slot::Operand(0), Slot::Count(ScalarType::S32)];
        assert!(pack(&s32_count, &[1], i32::MAX as u64, &[]).is_ok());
        assert!(pack(&s32_count, &[1], i32::MAX as u64 + 1, &[]).is_err());
        let s64_count = scalar_abi(0, 0);
        assert!(pack(&s64_count, &[1], i64::MAX as u64 + 1, &[]).is_err());
        let f32_scalar = [Slot::Operand(0), Slot::Scalar(ScalarType::F32)];
        let err = pack(&f32_scalar, &[1], 0, &[1 << 32]).unwrap_err();
        assert!(err.contains("does not fit a .f32 scalar"), "{err}");
        let err = pack(&f32_scalar, &[1], 0, &[]).unwrap_err();
        assert!(
            err.contains("passes 0 scalars; the kernel takes 1"),
            "{err}"
        );
        let err = pack(&[Slot::Operand(3)], &[1], 0, &[]).unwrap_err();
        assert!(err.contains("no operand 3"), "{err}");
    }
}
