//! What verification costs against kernel size: time and peak heap of one
//! `ptx::canonicalize` (parse, verify, print, re-parse and re-verify, as
//! LoadKernel runs it), from 1 KiB to the largest artifact ptxd accepts by
//! default (16 MiB), for an accepted kernel (the guarded elementwise body
//! replicated, registers of its own per copy) and a hostile one (a long
//! forward branch chain, one block and one register per link, refused at
//! its last store), a valid loop of many blocks branching back over many
//! registers, and a hostile kernel whose many join blocks each meet two
//! states differing in every register (see `tests/support/big_kernels.rs`);
//! and what a repeat costs when the memo answers it.
//!
//! Peak memory is measured by this binary's global allocator, which counts
//! live heap bytes. A series stops once one size took more than
//! `PTXD_VERIFY_BENCH_MAX_SECONDS` (5) or `PTXD_VERIFY_BENCH_MAX_MIB`
//! (512) of heap: the next size would cost about twice as much, or four
//! times where the cost is quadratic.
//!
//! Run: `cargo bench --bench verify`. `PTXD_VERIFY_BENCH_ONLY=loops:1048576`
//! verifies that one kernel (series, bytes) once, so that
//! `/usr/bin/time -v` of the binary gives its peak RSS.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

#[path = "../tests/support/big_kernels.rs"]
mod big_kernels;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ptxd::ptx;
use ptxd::ptx::memo::{Bounds, CanonicalMemo};

/// The system allocator, counting live bytes and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(bytes: usize) {
    let live = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

// SAFETY: every call is forwarded unchanged to `System`, which upholds
// `GlobalAlloc`'s contract; the counters are only arithmetic beside it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout contract is forwarded as is.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator (hence `System`) with
        // `layout`, as the caller guarantees.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded from the caller, who owns `ptr` with `layout`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            grew(new_size);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f` once; its time and the heap it held at its peak beyond what
/// was live before.
fn measure<T>(f: impl FnOnce() -> T) -> (T, Duration, usize) {
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let t = Instant::now();
    let out = f();
    let elapsed = t.elapsed();
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(before);
    (out, elapsed, peak)
}

fn env_f64(name: &str, default: f64) -> f64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

const MIB: f64 = 1024.0 * 1024.0;

fn main() {
    let max_seconds = env_f64("PTXD_VERIFY_BENCH_MAX_SECONDS", 5.0);
    let max_mib = env_f64("PTXD_VERIFY_BENCH_MAX_MIB", 512.0);
    type Generate = fn(usize) -> String;
    // The verdict column shows what the verifier made of each: a valid
    // kernel past the verifier's own caps is refused `too_complex`.
    let series: [(&str, &str, Generate); 4] = [
        ("accepted", "big_add", big_kernels::accepted),
        ("hostile", "big_hostile", big_kernels::refused),
        ("loops", "big_loops", big_kernels::loops),
        ("joins", "big_joins", big_kernels::joins),
    ];
    if let Ok(only) = std::env::var("PTXD_VERIFY_BENCH_ONLY") {
        let (kind, bytes) = only
            .split_once(':')
            .expect("PTXD_VERIFY_BENCH_ONLY=series:bytes");
        let bytes: usize = bytes.parse().expect("a byte count");
        let (_, symbol, generate) = series
            .iter()
            .find(|(k, _, _)| *k == kind)
            .expect("a series name");
        let text = generate(bytes);
        let t = Instant::now();
        let result = ptx::canonicalize(&text, symbol, None);
        println!(
            "{kind} {} bytes: {:.1} ms, {}",
            text.len(),
            t.elapsed().as_secs_f64() * 1e3,
            match result {
                Ok(_) => "accepted".to_string(),
                Err(e) => format!("refused: {e}"),
            }
        );
        return;
    }
    println!(
        "| kernel | text | lines | verify | peak heap | heap / text byte | memo repeat | verdict |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |");
    for (kind, symbol, generate) in series {
        let mut bytes = 1usize << 10;
        while bytes <= 16 << 20 {
            let text = generate(bytes);
            let lines = text.lines().count();
            // Small texts: the best of a few runs; large ones: one.
            let runs = ((1 << 20) / bytes).clamp(1, 10);
            let mut best = Duration::MAX;
            let mut peak = 0;
            let mut verdict = String::new();
            for _ in 0..runs {
                let (result, elapsed, held) = measure(|| ptx::canonicalize(&text, symbol, None));
                best = best.min(elapsed);
                peak = peak.max(held);
                verdict = match &result {
                    Ok(_) => "accepted".into(),
                    Err(ptx::PtxError::NonScalarAbi { sub_reason, .. }) => {
                        format!("refused ({sub_reason})")
                    }
                    Err(e) => format!("refused: {e}"),
                };
            }
            // The memo: the first load verifies, the repeat is one hash.
            let memo = CanonicalMemo::new(
                Bounds {
                    entries: 4,
                    bytes: 64 << 20,
                },
                Bounds {
                    entries: 4,
                    bytes: 1 << 20,
                },
            );
            let _ = memo.canonicalize(&text, symbol, None);
            let (_, repeat, _) = measure(|| memo.canonicalize(&text, symbol, None));
            assert_eq!(memo.stats().verifications, 1);
            println!(
                "| {kind} | {} KiB | {lines} | {:.1} ms | {:.1} MiB | {:.0} | {:.0} µs | {verdict} |",
                text.len() / 1024,
                best.as_secs_f64() * 1e3,
                peak as f64 / MIB,
                peak as f64 / text.len() as f64,
                repeat.as_secs_f64() * 1e6,
            );
            if best.as_secs_f64() > max_seconds || peak as f64 / MIB > max_mib {
                println!(
                    "| {kind} | stopped | | | | | | the next size would pass {max_seconds} s or {max_mib} MiB |"
                );
                break;
            }
            bytes *= 2;
        }
    }
}
