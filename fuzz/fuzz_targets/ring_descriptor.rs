//! Any bytes, as a submission slot, a completion slot or a ring header:
//! decoding returns a value or a typed error without panicking or
//! allocating, and whatever decodes is canonical (encoding it gives back the
//! exact bytes, so no accepted input carries state the decoder dropped).
//!
//! The first byte picks how the rest fills the slot: even, the bytes
//! themselves (zero-padded, as the zero-filled tail of a real slot is);
//! odd, (u16 offset, u8 value) patches over a zero slot, so that single
//! bytes anywhere in the 2048 reach the reserved and unused-entry checks.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ptxd_ipc::ring::{
    Completion, Descriptor, RingLayout, COMPLETION_SIZE, DESCRIPTOR_SIZE, HEADER_LEN,
};

fn slot(data: &[u8]) -> [u8; DESCRIPTOR_SIZE] {
    let mut bytes = [0u8; DESCRIPTOR_SIZE];
    match data.split_first() {
        Some((mode, rest)) if mode % 2 == 1 => {
            for patch in rest.chunks_exact(3) {
                let offset =
                    usize::from(u16::from_le_bytes([patch[0], patch[1]])) % DESCRIPTOR_SIZE;
                bytes[offset] = patch[2];
            }
        }
        Some((_, rest)) => {
            let len = rest.len().min(DESCRIPTOR_SIZE);
            bytes[..len].copy_from_slice(&rest[..len]);
        }
        None => {}
    }
    bytes
}

fuzz_target!(|data: &[u8]| {
    let bytes = slot(data);
    if let Ok(descriptor) = Descriptor::decode(&bytes) {
        assert_eq!(
            descriptor.encode(),
            bytes,
            "descriptor encoding is not canonical"
        );
        assert_eq!(Descriptor::ticket_of(&bytes), descriptor.ticket);
        assert!(descriptor.inputs().len() <= 64 && descriptor.scalar_bits().len() <= 64);
    }

    let mut record = [0u8; COMPLETION_SIZE];
    record.copy_from_slice(&bytes[..COMPLETION_SIZE]);
    if let Ok(completion) = Completion::decode(&record) {
        assert_eq!(
            completion.encode(),
            record,
            "completion encoding is not canonical"
        );
    }

    let mut header = [0u8; HEADER_LEN];
    header.copy_from_slice(&bytes[..HEADER_LEN]);
    if let Ok(layout) = RingLayout::from_header(&header) {
        assert_eq!(layout.header(), header, "header encoding is not canonical");
        assert!(layout.slots().is_power_of_two() && layout.total_len() <= 16 << 20);
    }
});
