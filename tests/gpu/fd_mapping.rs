//! GPU tests of memory shared by POSIX file descriptor, without the daemon:
//! the SDK's `alloc_exportable` and `export_allocation_fd` on one side, the
//! driver layer's import (what the executor maps a received descriptor with)
//! on the other, in this one process (the driver imports a descriptor of the
//! process's own memory as it would another's, measured on an H200).

use std::os::fd::OwnedFd;

use ptxd_client::cuda::{CudaDevice, CudaError};
use ptxd_cuda as driver;
use ptxd_cuda::{ImportedMemory, PhysicalMemory, PrimaryContext, VirtualMapping};
use rand::Rng;

use super::{device, rng};

/// Makes `dev`'s primary context current on this thread, as the driver
/// layer's calls need; keep the returned context alive while using them.
fn bind(dev: &CudaDevice) -> PrimaryContext {
    let info = driver::device(dev.ordinal()).unwrap();
    let context = PrimaryContext::retain(info.device).unwrap();
    context.set_current().unwrap();
    context
}

fn random_words(len: usize) -> Vec<u32> {
    let mut rng = rng();
    (0..len).map(|_| rng.random()).collect()
}

/// Reads `len` words at device address `ptr` of `mapping`.
fn read_words(mapping: &VirtualMapping, ptr: u64, len: usize) -> Vec<u32> {
    assert!(ptr >= mapping.ptr() && ptr + 4 * len as u64 <= mapping.ptr() + mapping.size());
    let mut out = vec![0u32; len];
    // SAFETY: the span lies inside the live mapping (asserted), whose
    // device's context is current.
    unsafe { driver::copy_to_host(&mut out, ptr) }.unwrap();
    out
}

/// Writes `words` at device address `ptr` of `mapping` and waits for them.
fn write_words(mapping: &VirtualMapping, ptr: u64, words: &[u32]) {
    assert!(ptr >= mapping.ptr() && ptr + 4 * words.len() as u64 <= mapping.ptr() + mapping.size());
    // SAFETY: as in `read_words`.
    unsafe { driver::copy_to_device(ptr, words) }.unwrap();
    driver::synchronize_current().unwrap();
}

fn assert_same(found: &[u32], expected: &[u32]) {
    assert_eq!(found.len(), expected.len());
    let first_difference = found.iter().zip(expected).position(|(a, b)| a != b);
    assert_eq!(
        first_difference, None,
        "the words differ from index {first_difference:?}"
    );
}

/// Imports `fd` as the executor does and maps it for `dev`, trying `sizes`.
fn try_import(
    dev: &CudaDevice,
    fd: OwnedFd,
    sizes: &[u64],
) -> Result<VirtualMapping, driver::DriverError> {
    let memory = ImportedMemory::import(fd).unwrap();
    assert_eq!(memory.device_ordinal(), Some(dev.ordinal()));
    memory.map(sizes, dev.ordinal())
}

fn import(dev: &CudaDevice, fd: OwnedFd, expected: u64) -> VirtualMapping {
    try_import(dev, fd, &[expected]).unwrap()
}

#[test]
fn exportable_memory_maps_from_its_fd_with_every_word_intact() {
    let dev = device();
    // Not a multiple of the granularity: the allocation is rounded up.
    let words = (5 << 20) / 4 + 777;
    let mem = dev.alloc_exportable(words * 4).unwrap();
    assert_eq!(mem.size(), words * 4);
    assert!(mem.allocation_size() >= (words * 4) as u64);
    assert_eq!(mem.device_uuid(), dev.uuid());
    let data = random_words(words);
    mem.upload(0, &data).unwrap();

    let _context = bind(&dev);
    let mapping = import(&dev, mem.export_fd().unwrap(), mem.size() as u64);
    assert_eq!(mapping.size(), mem.allocation_size());
    assert_ne!(mapping.ptr(), mem.device_ptr());
    assert_same(&read_words(&mapping, mapping.ptr(), words), &data);

    // Both mappings are the same memory: a write through the import shows
    // through the exporter's.
    let written = random_words(words);
    write_words(&mapping, mapping.ptr(), &written);
    let mut back = vec![0u32; words];
    mem.download(0, &mut back).unwrap();
    assert_same(&back, &written);

    // Copies past the size asked for are refused, as for IPC memory.
    assert!(matches!(
        mem.upload(4, &data),
        Err(CudaError::OutOfBounds { .. })
    ));
}

#[test]
fn an_imported_allocation_maps_only_at_its_real_size() {
    let dev = device();
    let mem = dev.alloc_exportable(3 << 20).unwrap();
    let real = mem.allocation_size();
    let data = random_words(mem.size() / 4);
    mem.upload(0, &data).unwrap();
    let _context = bind(&dev);
    // Only the allocation's own size maps (sizes are rounded up to the
    // granularity first); any other is refused, never searched from.
    for wrong in [real / 4, real + 1, 4 * real, u64::MAX] {
        let refused = try_import(&dev, mem.export_fd().unwrap(), &[wrong]);
        assert!(
            refused.is_err(),
            "size {wrong} mapped an allocation of {real}"
        );
    }
    for sizes in [
        vec![real],
        vec![real - 1],
        vec![4 * real, real],
        vec![0, real],
    ] {
        let mapping = try_import(&dev, mem.export_fd().unwrap(), &sizes).unwrap();
        assert_eq!(mapping.size(), real, "sizes {sizes:?}");
        assert_same(&read_words(&mapping, mapping.ptr(), data.len()), &data);
    }
}

#[test]
fn a_descriptor_that_is_not_cuda_memory_does_not_import() {
    let _dev = device();
    let null = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
    let error = ImportedMemory::import(null).unwrap_err();
    assert_eq!(error.call, "cuMemImportFromShareableHandle");
    assert!(!error.is_sticky(), "{error}");
}

/// Two allocations mapped back to back into one reserved range, the way
/// PyTorch's `expandable_segments` grows a segment.
fn two_page_segment(dev: &CudaDevice) -> (VirtualMapping, Vec<u32>) {
    let pages = vec![
        PhysicalMemory::create(dev.ordinal(), 1).unwrap(),
        PhysicalMemory::create(dev.ordinal(), 1).unwrap(),
    ];
    let page = pages[0].size();
    assert_eq!(pages[1].size(), page);
    let segment = VirtualMapping::map(pages, dev.ordinal()).unwrap();
    assert_eq!(segment.size(), 2 * page);
    let data = random_words((segment.size() / 4) as usize);
    write_words(&segment, segment.ptr(), &data);
    (segment, data)
}

#[test]
fn a_range_exported_by_address_maps_at_its_offset_in_its_own_allocation() {
    let dev = device();
    let _context = bind(&dev);
    let (segment, data) = two_page_segment(&dev);
    let page = segment.allocations()[0].size();
    for (start, len) in [
        (100u64, 1000u64),
        (page + 4096, 8192),
        (0, page),
        (page, page),
    ] {
        let ptr = segment.ptr() + start;
        let exported = dev.export_allocation_fd(ptr, len).unwrap();
        assert_eq!(exported.allocation_size, page);
        assert_eq!(exported.offset, start % page, "range at {start}");
        let mapping = import(&dev, exported.fd, exported.offset + len);
        assert_eq!(mapping.size(), page);
        let words = (len / 4) as usize;
        let first = (start / 4) as usize;
        assert_same(
            &read_words(&mapping, mapping.ptr() + exported.offset, words),
            &data[first..first + words],
        );
    }
}

#[test]
fn a_range_crossing_two_allocations_is_refused() {
    let dev = device();
    let _context = bind(&dev);
    let (segment, _data) = two_page_segment(&dev);
    let page = segment.allocations()[0].size();
    for (start, len) in [
        (page - 16, 32),
        (0, page + 1),
        (page + 8, page),
        (0, u64::MAX),
    ] {
        match dev.export_allocation_fd(segment.ptr() + start, len) {
            Err(CudaError::SpansAllocations {
                ptr,
                len: refused_len,
                allocation_base,
                allocation_size,
            }) => {
                assert_eq!(ptr, segment.ptr() + start);
                assert_eq!(refused_len, len);
                assert_eq!(allocation_base, segment.ptr() + start / page * page);
                assert_eq!(allocation_size, page);
            }
            other => panic!("range at {start} of {len} bytes: {other:?}"),
        }
    }
}

#[test]
fn memory_without_an_allocation_handle_is_not_fd_exportable() {
    let dev = device();
    let mem = dev.alloc(4096).unwrap();
    match dev.export_allocation_fd(mem.device_ptr(), 4096) {
        Err(CudaError::NotFdExportable { ptr, .. }) => assert_eq!(ptr, mem.device_ptr()),
        other => panic!("cuMemAlloc memory: {other:?}"),
    }
}
