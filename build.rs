//! Build-time identity of the PTX verifier: a hash of every file under
//! `src/ptx/` (the verifier, the canonical printer, the contract types: the
//! module is a leaf that imports nothing else of the crate) and of
//! `Cargo.lock` (the dependencies it is built with), exported as
//! `PTXD_VERIFIER_SOURCE_HASH`.
//!
//! The front's persistent verdict cache (`src/front/verdict_cache.rs`) puts
//! this hash in every key, so a verdict reached by one build of the
//! verifier is never served by a build whose verifier differs by one byte
//! of source. `rerun-if-changed` on the directory makes Cargo run this
//! script again whenever any file under it changes (Cargo scans a directory
//! recursively), so the constant cannot go stale.
//!
//! The hash is two passes of std's `DefaultHasher::new()` (fixed keys; its
//! algorithm is std's to choose, and it only has to be stable within one
//! build), 128 bits: it detects edits, it is not a
//! defence against someone who writes the source (they own the verifier).
//! No build dependency is needed for it.

use std::hash::{DefaultHasher, Hasher};
use std::path::{Path, PathBuf};

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(listing) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in listing.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files_under(&path, out);
        } else {
            out.push(path);
        }
    }
}

fn main() {
    let root = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let ptx = root.join("src").join("ptx");
    let lock = root.join("Cargo.lock");
    println!("cargo:rerun-if-changed={}", ptx.display());
    println!("cargo:rerun-if-changed={}", lock.display());
    let mut files = Vec::new();
    files_under(&ptx, &mut files);
    files.sort();
    files.push(lock);
    let mut halves = [DefaultHasher::new(), DefaultHasher::new()];
    halves[1].write(b"second half");
    for path in &files {
        let name = path.strip_prefix(&root).unwrap_or(path);
        let bytes = std::fs::read(path).unwrap_or_default();
        for half in &mut halves {
            half.write(name.to_string_lossy().as_bytes());
            half.write_u64(bytes.len() as u64);
            half.write(&bytes);
        }
    }
    println!(
        "cargo:rustc-env=PTXD_VERIFIER_SOURCE_HASH={:016x}{:016x}",
        halves[0].finish(),
        halves[1].finish()
    );
}
