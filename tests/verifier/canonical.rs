//! Canonical PTX: what runs is what was verified. Every kernel of the
//! corpora prints to a text that parses back to the same program, and the
//! accepted ones canonicalize to a text that verifies to the same signature
//! and runs on the host engine with the same results as the original.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::path::{Path, PathBuf};

use ptxd::ptx::{self, print};

/// Every `.ptx` under `tests/corpus/` (recursively), with its entries.
fn corpus_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "ptx") {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus"),
        &mut out,
    );
    out.sort();
    out
}

fn entries(text: &str) -> Vec<String> {
    ptx::parse::parse(text)
        .unwrap()
        .functions
        .into_iter()
        .filter(|f| f.is_entry && f.body.is_some())
        .map(|f| f.name)
        .collect()
}

#[test]
fn every_corpus_kernel_round_trips_through_the_printer() {
    let mut count = 0;
    for path in corpus_files() {
        let text = std::fs::read_to_string(&path).unwrap();
        for symbol in entries(&text) {
            let ir = match ptx::lower(&text, &symbol) {
                Ok(ir) => ir,
                // Refused while lowering (duplicate labels, ..): nothing to print.
                Err(ptx::PtxError::NonScalarAbi { .. }) => continue,
                Err(e) => panic!("{}:{symbol}: {e}", path.display()),
            };
            let printed = print::print(&ir);
            let again = ptx::lower(&printed, &symbol)
                .unwrap_or_else(|e| panic!("{}:{symbol}: {e}\n{printed}", path.display()));
            assert!(
                print::same_program(&ir, &again),
                "{}:{symbol} does not round-trip:\n{printed}",
                path.display()
            );
            // Printing is a fixed point.
            assert_eq!(print::print(&again), printed);
            count += 1;
        }
    }
    assert!(count >= 7, "only {count} kernels found");
}

#[test]
fn accepted_kernels_canonicalize_to_the_same_signature() {
    for path in corpus_files() {
        let text = std::fs::read_to_string(&path).unwrap();
        for symbol in entries(&text) {
            let Ok(sig) = ptx::verify(&text, &symbol, None) else {
                continue;
            };
            let canonical = ptx::canonicalize(&text, &symbol, None)
                .unwrap_or_else(|e| panic!("{}:{symbol}: {e}", path.display()));
            assert_eq!(canonical.signature, sig);
            assert_eq!(
                ptx::verify(&canonical.text, &symbol, None).unwrap(),
                sig,
                "{}",
                path.display()
            );
            // No debug info, no other entry, no client text survives.
            assert!(!canonical.text.contains(".loc"));
            assert!(!canonical.text.contains(".file"));
            assert!(!canonical.text.contains(".section"));
            assert_eq!(entries(&canonical.text), vec![symbol.clone()]);
        }
    }
}

#[test]
fn ptxd_verify_prints_the_verdict_and_the_canonical_text() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let run = |file: &str, symbol: &str, print: bool| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ptxd"));
        cmd.arg("verify")
            .arg(corpus.join(file))
            .args(["--symbol", symbol]);
        if print {
            cmd.arg("--print");
        }
        cmd.output().unwrap()
    };
    let ok = run("add_f32_scalar.ptx", "add_f32_scalar", false);
    assert!(ok.status.success());
    let shown = String::from_utf8_lossy(&ok.stdout).into_owned();
    assert!(
        shown.starts_with("accepted: add_f32_scalar: 2 inputs"),
        "{shown}"
    );
    // The contract, as LoadKernel reports it: footprints of n × 4 bytes.
    assert!(
        shown.contains("\ncontract: params(") && shown.contains("[n × 4] align 4"),
        "{shown}"
    );
    // A Vectorized{4} kernel: its operands are float4s, n counted in them.
    let vec4 = run("add_f32_vec4.ptx", "add_f32_vec4", false);
    assert!(vec4.status.success());
    let shown = String::from_utf8_lossy(&vec4.stdout).into_owned();
    assert!(shown.contains("[n × 16] align 16"), "{shown}");
    let refused = run(
        "nvcc/refused-ptx/grid_stride.sm_90.ptx",
        "grid_stride_scale_f32",
        false,
    );
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stdout).contains("sub_reason: param_misuse"));
    let printed = run("add_f32_scalar.ptx", "add_f32_scalar", true);
    let text = String::from_utf8(printed.stdout).unwrap();
    let canonical = ptx::canonicalize(
        &std::fs::read_to_string(corpus.join("add_f32_scalar.ptx")).unwrap(),
        "add_f32_scalar",
        None,
    )
    .unwrap();
    assert_eq!(text, canonical.text);
}

/// A reader that stops early (`ptxd verify ... | head -1`) gets the
/// verdict's exit code, not a panic on the closed pipe: here the pipe's
/// read end is closed before the verifier has answered.
#[test]
fn ptxd_verify_into_a_closed_pipe_exits_with_the_verdict() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    for (file, symbol, print, code) in [
        ("add_f32_scalar.ptx", "add_f32_scalar", true, 0),
        ("add_f32_scalar.ptx", "add_f32_scalar", false, 0),
        (
            "nvcc/refused-ptx/grid_stride.sm_90.ptx",
            "grid_stride_scale_f32",
            false,
            1,
        ),
    ] {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ptxd"));
        cmd.arg("verify")
            .arg(corpus.join(file))
            .args(["--symbol", symbol])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        if print {
            cmd.arg("--print");
        }
        let mut child = cmd.spawn().unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{file}: {stderr}");
        assert_eq!(out.status.code(), Some(code), "{file}: {stderr}");
    }
}

#[test]
fn a_module_without_version_or_target_round_trips_and_is_refused() {
    // Found by the ptx_parse_verify fuzz target: the printer used to invent
    // a `.version` and `.target`, so the round trip changed the program.
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/fuzz/no_version_target.ptx.txt");
    let text = String::from_utf8_lossy(&std::fs::read(path).unwrap()).into_owned();
    let ir = ptx::lower(&text, "add_f32_scalar").unwrap();
    assert!(ir.version.is_none());
    let again = ptx::lower(&print::print(&ir), "add_f32_scalar").unwrap();
    assert!(print::same_program(&ir, &again));
    // (The fuzzer also broke its index: %rd7 is never the thread index.)
    let reason = |text: &str| match ptx::canonicalize(text, "add_f32_scalar", None) {
        Err(ptx::PtxError::NonScalarAbi { sub_reason, .. }) => sub_reason,
        other => panic!("{other:?}"),
    };
    assert_eq!(reason(&text), "unguarded_access");
    // A correct kernel without `.version` is refused: ptxas needs it.
    let corpus = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/add_f32_scalar.ptx"),
    )
    .unwrap();
    let unversioned = corpus.replace(".version 9.0\n", "");
    assert_ne!(unversioned, corpus);
    assert_eq!(reason(&unversioned), "canonical_form");
}
