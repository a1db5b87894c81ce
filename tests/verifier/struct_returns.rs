//! Struct returns and the double `sin` of NVRTC (issue 21).
#![allow(clippy::unwrap_used, clippy::panic)]

use ptxd::ptx::{self, Families, PtxError};

fn jit(file: &str) -> String {
    let path = format!("{}/tests/corpus/jit/{file}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(path).unwrap()
}

#[test]
#[ignore]
fn probe() {
    for (f, e) in [
        ("nvrtc/sin_f64_O3.ptx", "sin_f64"),
        ("nvrtc/sin_f64_fast.ptx", "sin_f64"),
        ("nvrtc/sin_f64_G.ptx", "sin_f64"),
        ("nvrtc/add_f16_vec2_G.ptx", "add_f16_vec2"),
    ] {
        match ptx::canonicalize_with(&jit(f), e, None, Families::ALL) {
            Ok(_) => eprintln!("{f}: accepted"),
            Err(PtxError::NonScalarAbi { sub_reason, explanation, line, .. }) => {
                eprintln!("{f}: {sub_reason} line {line:?}: {explanation}")
            }
            Err(e) => eprintln!("{f}: {e}"),
        }
    }
}
