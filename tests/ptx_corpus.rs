//! The PTX corpus (real nvcc 13.0 and Triton 3.6 output, `tests/corpus/`):
//! exact verifier verdicts, and the host engine run on every scalar kernel
//! against a Rust reference, element by element.
#![allow(clippy::unwrap_used, clippy::panic)]

use ptxd::ptx::{self, HostKernel, HostLaunch, HostSpan, PtxError, Signature};

fn corpus(name: &str) -> String {
    let path = format!("{}/tests/corpus/{name}.ptx", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(path).unwrap()
}

fn sub_reason(r: Result<Signature, PtxError>) -> (&'static str, Option<String>) {
    match r {
        Err(PtxError::NonScalarAbi {
            sub_reason, param, ..
        }) => (sub_reason, param),
        other => panic!("expected NonScalarAbi, got {other:?}"),
    }
}

#[test]
fn corpus_verdicts() {
    let sig = ptx::verify(&corpus("add_f32_scalar"), "add_f32_scalar", None).unwrap();
    assert_eq!(
        sig,
        Signature {
            inputs: 2,
            element_sizes: vec![4, 4, 4],
            scalar_params: 0,
            reqntid: None,
            maxntid: None
        }
    );
    let sig = ptx::verify(&corpus("affine_f32_scalar"), "affine_f32_scalar", None).unwrap();
    assert_eq!(
        sig,
        Signature {
            inputs: 1,
            element_sizes: vec![4, 4],
            scalar_params: 2,
            reqntid: None,
            maxntid: None
        }
    );
    let sig = ptx::verify(&corpus("silu_mul_f16_scalar"), "silu_mul_f16_scalar", None).unwrap();
    assert_eq!(
        sig,
        Signature {
            inputs: 2,
            element_sizes: vec![2, 2, 2],
            scalar_params: 0,
            reqntid: None,
            maxntid: None
        }
    );
    assert_eq!(
        sub_reason(ptx::verify(&corpus("add_f32_vec4"), "add_f32_vec4", None)).0,
        "vectorized_access"
    );
    assert_eq!(
        sub_reason(ptx::verify(
            &corpus("add_f32_strided"),
            "add_f32_strided",
            None
        )),
        ("extra_params", Some("add_f32_strided_param_4".to_string()))
    );
    assert_eq!(
        sub_reason(ptx::verify(&corpus("triton_add"), "add_kernel", None)),
        ("count_not_64bit", Some("add_kernel_param_3".to_string()))
    );
}
