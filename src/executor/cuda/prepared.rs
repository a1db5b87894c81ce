//! A ring kernel's `cuLaunchKernel` parameter block, built once when the
//! kernel is granted to a ring and patched in place for each launch: the
//! ring's hot path packs nothing and allocates nothing for its params.
//!
//! Invariants:
//! - The block's layout is the packer's ([`super::params::pack`]): each
//!   param at the next offset aligned to its size, in 8-byte words, so a
//!   patched block holds exactly the bytes `pack` produces for the same
//!   launch (a test compares them over random layouts and launches).
//! - A launch writes every operand, count and scalar param of the block;
//!   a null param is zero from the start and never written. So nothing of
//!   an earlier launch survives a patch that succeeds.
//! - A patch checks everything before it writes anything (the operand
//!   indices, the number of scalars, a count past its type, scalar bits
//!   wider than theirs, each refused with `pack`'s message): a refused
//!   launch leaves the block as the last launch left it, and is never
//!   enqueued.
//! - The pointers handed to the driver point into the block's own heap
//!   words, which never move or reallocate while the block lives.
//! - A launch the ring sends through the kernel's graph (see
//!   `launch_ring`: while the ring is the executor's one launching ring)
//!   goes through it when one could be built (the graph's node is re-aimed
//!   at each launch, and the driver copies the params then): it enqueues
//!   the same kernel on the same grid with the same bytes as
//!   `cuLaunchKernel` would, in about half the time on an H200. A graph the
//!   driver refuses to build or update is dropped for good and that kind of
//!   launch goes through `cuLaunchKernel`.

use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard};

use ptxd_cuda::{DriverError, Stream, WordWrite};

use super::LoadedKernel;
use crate::executor::layout::Slot;
use crate::ptx::contract::ScalarType;

/// One param the launch writes: where, and what.
#[derive(Debug, Clone, Copy)]
struct Patch {
    /// The param's index in the kernel's order (for a refusal's message).
    param: usize,
    offset: usize,
    slot: Slot,
}

/// A kernel's parameter block, laid out once (see the module doc).
#[derive(Debug)]
pub(super) struct PreparedParams {
    /// The param values at their offsets.
    words: Box<[u64]>,
    /// One pointer per param into `words`, in the kernel's order: what
    /// `cuLaunchKernel` takes as `kernelParams`.
    pointers: Box<[*mut c_void]>,
    /// The params a launch writes (every one but the nulls).
    patches: Box<[Patch]>,
    /// Scalars the layout takes.
    scalars: usize,
}

// SAFETY: the raw pointers only ever point into `words`, a heap allocation
// this value owns (it moves with it, never reallocates); nothing else
// aliases it, so handing the whole block to another thread is sound.
unsafe impl Send for PreparedParams {}

/// The largest value a count of type `ty` holds, or `None` for a type that
/// is not a count (as the packer reads it).
fn count_max(ty: ScalarType) -> Option<u64> {
    match ty {
        ScalarType::U32 => Some(u64::from(u32::MAX)),
        ScalarType::S32 => Some(i32::MAX as u64),
        ScalarType::U64 => Some(u64::MAX),
        ScalarType::S64 => Some(i64::MAX as u64),
        ScalarType::F32 | ScalarType::F64 => None,
    }
}

impl PreparedParams {
    /// Lays out `layout`'s params: offsets, the zeroed words, the
    /// pointers.
    pub(super) fn new(layout: &[Slot]) -> Self {
        let mut end = 0usize;
        let mut offsets = Vec::with_capacity(layout.len());
        let mut patches = Vec::with_capacity(layout.len());
        for (param, slot) in layout.iter().enumerate() {
            let size = slot.size();
            let offset = end.next_multiple_of(size);
            end = offset + size;
            offsets.push(offset);
            if !matches!(slot, Slot::Null) {
                patches.push(Patch {
                    param,
                    offset,
                    slot: *slot,
                });
            }
        }
        let mut words = vec![0u64; end.div_ceil(8)].into_boxed_slice();
        let base = words.as_mut_ptr().cast::<u8>();
        let pointers = offsets
            .iter()
            // `wrapping_add` stays inside the allocation: every offset plus
            // its param's size is at most `end <= 8 × words.len()`.
            .map(|&offset| base.wrapping_add(offset).cast::<c_void>())
            .collect();
        PreparedParams {
            words,
            pointers,
            patches: patches.into_boxed_slice(),
            scalars: layout
                .iter()
                .filter(|s| matches!(s, Slot::Scalar(_)))
                .count(),
        }
    }

    /// Writes a launch's values into the block: `operands` (device
    /// addresses, inputs then output), the count `n`, `scalars` (bits
    /// zero-extended to 64, one per scalar param). Checks everything
    /// first; a refusal (`pack`'s message) writes nothing.
    pub(super) fn patch(
        &mut self,
        operands: &[u64],
        n: u64,
        scalars: &[u64],
    ) -> Result<(), String> {
        if scalars.len() != self.scalars {
            return Err(format!(
                "the launch passes {} scalars; the kernel takes {}",
                scalars.len(),
                self.scalars
            ));
        }
        // Checks, in the kernel's param order (the packer's first error).
        let mut next_scalar = scalars.iter();
        for patch in self.patches.iter() {
            let i = patch.param;
            match patch.slot {
                Slot::Operand(k) if k as usize >= operands.len() => {
                    return Err(format!("param {i}: the launch has no operand {k}"));
                }
                Slot::Count(ty) => match count_max(ty) {
                    None => return Err(format!("param {i}: a count of type {}", ty.as_str())),
                    Some(max) if n > max => {
                        return Err(format!(
                            "param {i}: n = {n} does not fit the kernel's .{} count",
                            ty.as_str()
                        ))
                    }
                    Some(_) => {}
                },
                Slot::Scalar(ty) => {
                    let size = patch.slot.size();
                    let bits = next_scalar.next().copied().unwrap_or(0);
                    if size < 8 && bits >> (8 * size) != 0 {
                        return Err(format!(
                            "param {i}: {bits:#x} does not fit a .{} scalar",
                            ty.as_str()
                        ));
                    }
                }
                Slot::Operand(_) | Slot::Null => {}
            }
        }
        let mut next_scalar = scalars.iter();
        for patch in self.patches.iter() {
            let value = match patch.slot {
                Slot::Operand(k) => operands.get(k as usize).copied().unwrap_or(0),
                Slot::Count(_) => n,
                Slot::Scalar(_) => next_scalar.next().copied().unwrap_or(0),
                Slot::Null => continue,
            };
            write(&mut self.words, patch.offset, patch.slot.size(), value);
        }
        Ok(())
    }

    /// The block's bytes (its used length rounded up to whole words).
    #[cfg(test)]
    fn bytes(&self) -> Vec<u8> {
        self.words.iter().flat_map(|w| w.to_ne_bytes()).collect()
    }
}

/// Writes the low `size` bytes of `value` (in the machine's order, as the
/// device reads the host's layout) at byte `offset` of `words`. The offset
/// is a multiple of `size` (at most 8), so the value never straddles two
/// words.
fn write(words: &mut [u64], offset: usize, size: usize, value: u64) {
    let Some(word) = words.get_mut(offset / 8) else {
        return;
    };
    let at = offset % 8;
    let mut bytes = word.to_ne_bytes();
    let value = value.to_ne_bytes();
    let low = if cfg!(target_endian = "little") {
        value.get(..size)
    } else {
        value.get(8usize.saturating_sub(size)..)
    };
    if let (Some(dst), Some(low)) = (bytes.get_mut(at..at + size), low) {
        if dst.len() == low.len() {
            dst.copy_from_slice(low);
        }
    }
    *word = u64::from_ne_bytes(bytes);
}

/// Whether a ring launches through graphs ([`ptxd_cuda::KernelGraph`]);
/// `PTXD_RING_GRAPHS=0` in the executor's environment turns them off (every
/// ring launch then goes through `cuLaunchKernel`), for comparing the two.
pub(super) fn graphs_enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var_os("PTXD_RING_GRAPHS").is_none_or(|v| v != "0"))
}

/// One of a ring kernel's graphs: built at the first launch that needs it;
/// `Failed` once building or updating it failed, after which that kind of
/// launch goes through `cuLaunchKernel` (and a separate word write).
#[derive(Debug, Default)]
enum GraphSlot {
    #[default]
    Unbuilt,
    Built(ptxd_cuda::KernelGraph),
    Failed,
}

/// A kernel's parameter block and its graphs: what one launch uses.
#[derive(Debug)]
struct Prepared {
    params: PreparedParams,
    /// The kernel alone.
    plain: GraphSlot,
    /// The kernel, then a word write (a watchdog marker).
    marked: GraphSlot,
}

/// How a ring kernel is submitted.
#[derive(Debug, Clone, Copy)]
pub(super) struct Submit {
    /// A word write after the kernel (a watchdog marker): in the same
    /// submission (the graph's write node) or, without a graph, right
    /// after it on the stream.
    pub marker: Option<WordWrite>,
    /// Through the kernel's graph, where it can be built; else
    /// `cuLaunchKernel`.
    pub graph: bool,
}

/// A kernel as a ring holds it: the loaded kernel, its parameter block and
/// its graphs, prepared when the kernel was granted (the graphs at their
/// first launch). The ring's thread is their only user, so the lock is
/// never contended.
#[derive(Debug)]
pub struct RingKernel {
    // Declared (so dropped) before `kernel`: a graph names the kernel's
    // function, which lives as long as its module.
    prepared: Mutex<Prepared>,
    pub(super) kernel: Arc<LoadedKernel>,
}

impl RingKernel {
    /// Prepares `kernel`'s block for a ring (once per grant).
    pub(super) fn prepare(kernel: Arc<LoadedKernel>) -> Arc<Self> {
        let prepared = Mutex::new(Prepared {
            params: PreparedParams::new(&kernel.layout),
            plain: GraphSlot::Unbuilt,
            marked: GraphSlot::Unbuilt,
        });
        Arc::new(RingKernel { prepared, kernel })
    }

    fn prepared(&self) -> MutexGuard<'_, Prepared> {
        // A patch either wrote the whole launch or nothing it checked, and
        // a graph slot is replaced whole: a panic cannot leave anything a
        // later launch would misread.
        self.prepared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// As [`LoadedKernel::enqueue`], through the prepared block and, with
    /// `graph` and where it can be built, the kernel's graph (see
    /// [`Submit`]).
    ///
    /// # Safety
    /// As [`LoadedKernel::enqueue`]; `marker`'s word stays valid until the
    /// stream has run the launch.
    ///
    /// `Ok(true)`: the kernel and its marker (if any) are enqueued;
    /// `Ok(false)`: the kernel is, but its marker's separate write (after
    /// `cuLaunchKernel`) was refused without harm to the context, so the
    /// caller writes the marker itself; `Err`: nothing usable is enqueued.
    pub(super) unsafe fn enqueue(
        &self,
        stream: &Stream,
        grid: u32,
        operands: &[u64],
        n: u64,
        scalars: &[u64],
        Submit { marker, graph }: Submit,
    ) -> Result<bool, DriverError> {
        let refused = || DriverError {
            call: "packing the kernel's parameters",
            name: "CUDA_ERROR_INVALID_VALUE".into(),
        };
        if operands.len() != self.kernel.inputs as usize + 1 {
            return Err(refused());
        }
        let mut guard = self.prepared();
        let Prepared {
            params,
            plain,
            marked,
        } = &mut *guard;
        params.patch(operands, n, scalars).map_err(|_| refused())?;
        let kernel = &self.kernel;
        let slot = if marker.is_some() { marked } else { plain };
        let graph = graph && graphs_enabled();
        if graph && matches!(slot, GraphSlot::Unbuilt) {
            // SAFETY: the block holds one pointer per kernel parameter, each
            // to a value of its declared size (see below); nothing is
            // enqueued.
            let built = unsafe {
                ptxd_cuda::KernelGraph::new(
                    &kernel.function,
                    grid,
                    kernel.block,
                    &mut params.pointers,
                    marker,
                )
            };
            *slot = match built {
                Ok(graph) => GraphSlot::Built(graph),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot build a ring kernel's graph; it launches with cuLaunchKernel");
                    GraphSlot::Failed
                }
            };
        }
        if let (true, GraphSlot::Built(graph)) = (graph, &mut *slot) {
            // SAFETY: the block holds one pointer per kernel parameter (the
            // layout's, which the load checked against the kernel's declared
            // sizes), each to a value of that size in the block's words,
            // which stay put under the lock until the call returns (the
            // driver copies them during it); every address among them is
            // device memory with room for the launch until it has run, and
            // the marker's word outlives it (this function's contract); the
            // function is of the ring's context, where the graph was built.
            let launched = unsafe {
                graph.launch(
                    stream,
                    &kernel.function,
                    grid,
                    kernel.block,
                    &mut params.pointers,
                    marker,
                )
            };
            match launched {
                Err(e) if !e.is_sticky() && e.call != "cuGraphLaunch" => {
                    // An update the driver refused (nothing was enqueued):
                    // this kind of launch goes through cuLaunchKernel from
                    // now on.
                    tracing::warn!(error = %e, "cannot update a ring kernel's graph; it launches with cuLaunchKernel");
                    *slot = GraphSlot::Failed;
                }
                launched => return launched.map(|()| true),
            }
        }
        // SAFETY: as above, for `cuLaunchKernel`.
        unsafe {
            kernel
                .function
                .launch(grid, kernel.block, stream, &mut params.pointers)
        }?;
        let Some(marker) = marker else {
            return Ok(true);
        };
        // SAFETY: the marker's word outlives the launch (the contract).
        match unsafe { stream.write_value(marker.addr, marker.value, true) } {
            Ok(()) => Ok(true),
            // The kernel is enqueued whatever happened to the write: the
            // caller must count it and close its group another way.
            Err(e) if !e.is_sticky() => {
                tracing::warn!(error = %e, "a ring kernel's marker was refused after the kernel; it goes in the batch after it");
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::executor::cuda::params::pack;

    /// A small deterministic generator (fresh per seed), so that a failure
    /// names the seed that reproduces it.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    const TYPES: [ScalarType; 6] = [
        ScalarType::U32,
        ScalarType::S32,
        ScalarType::U64,
        ScalarType::S64,
        ScalarType::F32,
        ScalarType::F64,
    ];

    fn random_layout(rng: &mut Rng, operands: u32) -> Vec<Slot> {
        let mut layout: Vec<Slot> = (0..operands).map(Slot::Operand).collect();
        layout.push(Slot::Count(TYPES[rng.below(4) as usize]));
        for _ in 0..rng.below(6) {
            layout.push(Slot::Scalar(TYPES[rng.below(6) as usize]));
        }
        for _ in 0..rng.below(3) {
            layout.push(Slot::Null);
        }
        // Shuffle: kernels order their params as they like.
        for i in (1..layout.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            layout.swap(i, j);
        }
        layout
    }

    fn random_scalar(rng: &mut Rng, slot: Slot) -> u64 {
        match slot.size() {
            4 => rng.next() & u64::from(u32::MAX),
            _ => rng.next(),
        }
    }

    /// Over random layouts, a block prepared once and patched launch after
    /// launch holds exactly the bytes the packer builds for each launch:
    /// no value of an earlier launch survives, the nulls stay zero.
    #[test]
    fn a_patched_block_is_the_packers_block_launch_after_launch() {
        for seed in 1..=300u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let operands = 1 + rng.below(5) as u32;
            let layout = random_layout(&mut rng, operands);
            let mut block = PreparedParams::new(&layout);
            for launch in 0..8 {
                let addresses: Vec<u64> = (0..operands).map(|_| rng.next() & !7).collect();
                let n = match layout.iter().find_map(|s| match s {
                    Slot::Count(ty) => count_max(*ty),
                    _ => None,
                }) {
                    Some(max) => rng.next() % max.saturating_add(1).max(1),
                    None => 0,
                };
                let scalars: Vec<u64> = layout
                    .iter()
                    .filter(|s| matches!(s, Slot::Scalar(_)))
                    .map(|s| random_scalar(&mut rng, *s))
                    .collect();
                let packed = pack(&layout, &addresses, n, &scalars).unwrap();
                block.patch(&addresses, n, &scalars).unwrap();
                let mut want = packed.bytes();
                want.resize(want.len().next_multiple_of(8), 0);
                assert_eq!(
                    block.bytes(),
                    want,
                    "seed {seed}, launch {launch}, layout {layout:?}"
                );
                // The pointers the driver reads are the packer's offsets.
                let base = block.words.as_ptr() as usize;
                let offsets: Vec<usize> =
                    block.pointers.iter().map(|p| *p as usize - base).collect();
                assert_eq!(offsets, packed.offsets(), "seed {seed}");
            }
        }
    }

    /// What the packer refuses, the block refuses with the same message,
    /// and a refused launch writes nothing: the block still holds the last
    /// launch that passed.
    #[test]
    fn a_refused_patch_writes_nothing_and_says_what_the_packer_says() {
        let layout = [
            Slot::Operand(0),
            Slot::Count(ScalarType::U32),
            Slot::Scalar(ScalarType::F32),
            Slot::Operand(1),
            Slot::Null,
        ];
        let mut block = PreparedParams::new(&layout);
        block.patch(&[0xa0, 0xb0], 7, &[1]).unwrap();
        let good = block.bytes();
        let refusals: [(&[u64], u64, &[u64]); 4] = [
            // The count past its type.
            (&[0xc0, 0xd0], u64::from(u32::MAX) + 1, &[2]),
            // Scalar bits wider than an f32.
            (&[0xc0, 0xd0], 9, &[1 << 32]),
            // Another number of scalars.
            (&[0xc0, 0xd0], 9, &[]),
            // An operand the launch does not have.
            (&[0xc0], 9, &[2]),
        ];
        for (operands, n, scalars) in refusals {
            let want = pack(&layout, operands, n, scalars).unwrap_err();
            let got = block.patch(operands, n, scalars).unwrap_err();
            assert_eq!(got, want);
            assert_eq!(block.bytes(), good, "a refused launch wrote into the block");
        }
    }
}
