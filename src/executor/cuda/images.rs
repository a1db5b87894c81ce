//! What the CUDA executor checks of a module before the driver sees it:
//! the scalar ABI's parameter layout, the block size, and the headers of
//! cubin and fatbin images (a forged size in a header must be refused
//! here, not read past by the driver).

use crate::executor::layout::Slot;

/// Picks the block size for a kernel (see the module docs).
pub(super) fn choose_block(reqntid: u32, maxntid: u32, kernel_max: u32) -> Result<u32, String> {
    if reqntid > 0 {
        if reqntid > kernel_max {
            return Err(format!(
                "the kernel requires {reqntid} threads per block but its compiled form allows {kernel_max}"
            ));
        }
        return Ok(reqntid);
    }
    let declared = if maxntid > 0 { maxntid } else { 1024 };
    Ok(declared.min(kernel_max).clamp(1, crate::ptx::DEFAULT_BLOCK))
}

/// The parameter sizes a layout prescribes (the scalar ABI's: input
/// pointers, the output pointer, `long long n`, then the `float` scalars);
/// `cuFuncGetParamInfo` must report exactly these.
pub(super) fn expected_param_sizes(layout: &[Slot]) -> Vec<usize> {
    layout.iter().map(|slot| slot.size()).collect()
}

fn read_u16(bytes: &[u8], at: usize) -> Option<u64> {
    let b = bytes.get(at..at + 2)?;
    Some(u64::from(u16::from_le_bytes([b[0], b[1]])))
}

fn read_u64(bytes: &[u8], at: usize) -> Option<u64> {
    let b: [u8; 8] = bytes.get(at..at + 8)?.try_into().ok()?;
    Some(u64::from_le_bytes(b))
}

/// Checks that a cubin's ELF headers lie within the bytes we hold: the
/// driver trusts the offsets written inside an image, so a truncated or
/// forged one must not reach it.
pub(super) fn check_cubin(image: &[u8]) -> Result<(), String> {
    const ELFCLASS64: u8 = 2;
    if image.len() < 64 || &image[..4] != b"\x7fELF" || image[4] != ELFCLASS64 {
        return Err("not a 64-bit ELF cubin".into());
    }
    let len = image.len() as u64;
    let table_fits = |offset: Option<u64>, entry: Option<u64>, count: Option<u64>| match (
        offset, entry, count,
    ) {
        (Some(o), Some(e), Some(c)) => o.checked_add(e * c).is_some_and(|end| end <= len),
        _ => false,
    };
    // ELF64 header: e_phoff at 0x20, e_shoff at 0x28, e_phentsize 0x36,
    // e_phnum 0x38, e_shentsize 0x3a, e_shnum 0x3c.
    if !table_fits(
        read_u64(image, 0x20),
        read_u16(image, 0x36),
        read_u16(image, 0x38),
    ) || !table_fits(
        read_u64(image, 0x28),
        read_u16(image, 0x3a),
        read_u16(image, 0x3c),
    ) {
        return Err("the cubin's header tables reach past its end".into());
    }
    Ok(())
}

/// Checks a fatbin's header against its length (see [`check_cubin`]).
pub(super) fn check_fatbin(image: &[u8]) -> Result<(), String> {
    const FATBIN_MAGIC: u32 = 0xBA55_ED50;
    let magic = image
        .get(..4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    if magic != Some(FATBIN_MAGIC) {
        return Err("not a fatbin (bad magic)".into());
    }
    // Header: magic u32, version u16, header size u16, payload size u64.
    match (read_u16(image, 6), read_u64(image, 8)) {
        (Some(header), Some(payload))
            if header
                .checked_add(payload)
                .is_some_and(|end| end <= image.len() as u64) =>
        {
            Ok(())
        }
        _ => Err("the fatbin's declared size reaches past its end".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_size_prefers_reqntid_then_caps_at_256() {
        assert_eq!(choose_block(128, 0, 1024), Ok(128));
        assert_eq!(choose_block(512, 0, 1024), Ok(512));
        assert!(choose_block(1024, 0, 512).is_err());
        assert_eq!(choose_block(0, 0, 1024), Ok(256));
        assert_eq!(choose_block(0, 64, 1024), Ok(64));
        assert_eq!(choose_block(0, 0, 128), Ok(128));
        assert_eq!(choose_block(0, 0, 0), Ok(1));
    }

    #[test]
    fn scalar_abi_layout_is_pointers_then_n_then_floats() {
        use crate::executor::layout::scalar_abi;
        assert_eq!(expected_param_sizes(&scalar_abi(2, 0)), vec![8, 8, 8, 8]);
        assert_eq!(expected_param_sizes(&scalar_abi(1, 2)), vec![8, 8, 8, 4, 4]);
        assert_eq!(expected_param_sizes(&scalar_abi(0, 0)), vec![8, 8]);
    }

    /// A Triton-like layout: pointers 8, the `.u32` count and f32 scale 4,
    /// an `.s64` scalar 8, the null scratch pointers 8.
    #[test]
    fn a_contract_layout_has_each_params_size() {
        let contract = crate::executor::layout::tests_support::triton_like();
        let load = ptxd_proto::executor::LoadModule {
            inputs: 2,
            scalar_params: 2,
            params: crate::executor::layout::slots_of(&contract),
            ..Default::default()
        };
        let layout = crate::executor::layout::decode(&load).unwrap();
        assert_eq!(expected_param_sizes(&layout), vec![8, 8, 4, 4, 8, 8, 8, 8]);
    }

    #[test]
    fn truncated_or_forged_images_are_refused_before_the_driver() {
        assert!(check_cubin(b"not an elf").is_err());
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        assert!(check_cubin(&elf).is_ok(), "empty tables fit");
        // A section table at offset 64 with 10 entries of 64 bytes.
        elf[0x28..0x30].copy_from_slice(&64u64.to_le_bytes());
        elf[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        elf[0x3c..0x3e].copy_from_slice(&10u16.to_le_bytes());
        assert!(check_cubin(&elf).is_err());
        elf.resize(64 + 640, 0);
        assert!(check_cubin(&elf).is_ok());

        let mut fat = vec![0u8; 16];
        fat[..4].copy_from_slice(&0xBA55_ED50u32.to_le_bytes());
        fat[6..8].copy_from_slice(&16u16.to_le_bytes());
        fat[8..16].copy_from_slice(&100u64.to_le_bytes());
        assert!(check_fatbin(&fat).is_err());
        fat.resize(116, 0);
        assert!(check_fatbin(&fat).is_ok());
        assert!(check_fatbin(b"\0\0\0\0").is_err());
    }
}
