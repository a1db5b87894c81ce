//! The nvcc compatibility corpus of issue 8 on the GPU: every accepted
//! kernel of the sm_90 plain, sm_90 -use_fast_math and sm_80 plain PTX is
//! canonicalized, and its CANONICAL text (what ptxd runs) is loaded into the
//! CUDA executor, launched on random inputs from the manifest domains into a
//! poisoned output (n random, never a multiple of the block), and compared
//! element by element with the Rust reference of `tests/support/nvcc_ref.rs`
//! within the manifest tolerance (`tol_fastmath` for -use_fast_math, whose
//! approximate division, sqrt and transcendentals the host engine computes
//! exactly). Nothing past n may be written.
//!
//! The corpus comes from `$PTXD_NVCC_CORPUS` (`.gpu/nvcc`, packed by
//! tests/gpu/build.sh) or tests/corpus/nvcc. Every failure is collected and
//! printed in one table before the test fails.

use ptxd::ptx;
use ptxd_client::cuda::DeviceAllocation;
use ptxd_proto::executor::{reply, ArtifactKind, CloseBuffer, LoadModule, UnloadModule};
use rand::Rng;

use super::executor_client::*;
use super::nvcc_ref::{
    self, compare, describe, line_text, make_case, poisoned, print_table, Files, Row, TAIL,
};
use super::{device, rng, Op};

/// The variants run on the H200: sm_100 PTX does not load on sm_90.
const GPU_VARIANTS: [(&str, &str); 3] = [
    ("sm_90", "plain"),
    ("sm_90", "fastmath"),
    ("sm_80", "plain"),
];

#[test]
fn nvcc_corpus_matches_the_reference_on_the_gpu() {
    let dev = device();
    let mut exec = Executor::spawn_cuda(dev.uuid());
    let mut r = rng();
    let (kernels, refused) = nvcc_ref::manifest();
    let mut files = Files::default();
    let mut rows: Vec<Row> = Vec::new();
    let mut ran = 0;
    let mut module_id = 0u64;
    let mut buffer_id = 0u64;
    for (arch, variant) in GPU_VARIANTS {
        for k in kernels.iter().chain(&refused) {
            if k.reference.is_none() || k.expected_refusal(variant).is_some() {
                continue;
            }
            let mut row = |got: String, line: Option<u32>, text: String| {
                rows.push(Row {
                    kernel: k.name.clone(),
                    variant: format!("{arch}.{variant}"),
                    expected: format!("{:?}", k.tol(variant)),
                    got,
                    line,
                    text,
                })
            };
            let Some(text) = files.get(k.ptx_path(arch, variant)) else {
                row("missing file".into(), None, String::new());
                continue;
            };
            let canonical = match ptx::canonicalize(text, &k.name, None) {
                Ok(c) => c,
                Err(e) => {
                    let (got, line) = describe(&e);
                    row(format!("refused: {got}"), line, line_text(text, line));
                    continue;
                }
            };
            let sig = canonical.signature.clone();
            module_id += 1;
            let load = Op::LoadModule(LoadModule {
                module_id,
                kind: ArtifactKind::Ptx as i32,
                artifact: canonical.text.into_bytes(),
                symbol: k.name.clone(),
                inputs: sig.inputs,
                scalar_params: sig.scalar_params,
                element_sizes: sig.element_sizes.clone(),
                reqntid: sig.reqntid.unwrap_or(0),
                maxntid: sig.maxntid.unwrap_or(0),
                ..Default::default()
            });
            let block = match exec.call(load) {
                reply::Result::LoadModule(ok) => ok.block_size,
                other => {
                    row(format!("load: {other:?}"), None, String::new());
                    continue;
                }
            };
            // The executor caps at 256 and at what the compiled kernel allows.
            let most = k.launch_bounds().map_or(256, |m| m.min(256));
            if block == 0 || block > most {
                row(
                    format!("block size {block} (at most {most})"),
                    None,
                    String::new(),
                );
            }
            let mut n = r.random_range(50_000..400_000usize);
            if n % block.max(1) as usize == 0 {
                n += 1;
            }
            let case = match make_case(k, n, &mut r) {
                Ok(c) => c,
                Err(e) => {
                    row(format!("reference: {e}"), None, String::new());
                    continue;
                }
            };
            let mut register = |mem: &DeviceAllocation| {
                buffer_id += 1;
                open_buffer(
                    &mut exec,
                    buffer_id,
                    mem.ipc_handle().unwrap(),
                    mem.size() as u64,
                    mem.device_uuid(),
                );
                buffer_id
            };
            let mut mems = Vec::new();
            let mut operands = Vec::new();
            for bytes in &case.inputs {
                let mem = dev.alloc(bytes.len()).unwrap();
                mem.upload(0, bytes).unwrap();
                operands.push(operand(register(&mem), 0));
                mems.push(mem);
            }
            let out_bytes = poisoned(k.output, n + TAIL);
            let out = dev.alloc(out_bytes.len()).unwrap();
            out.upload(0, &out_bytes).unwrap();
            let out_id = register(&out);
            let params = k.reference.as_ref().unwrap().param_values.clone();
            match exec.call(launch_op(
                module_id,
                operands.clone(),
                operand(out_id, 0),
                n as u64,
                params,
                1,
                true,
            )) {
                reply::Result::Ok(_) => {
                    ran += 1;
                    let mut got = vec![0u8; out_bytes.len()];
                    out.download(0, &mut got).unwrap();
                    if let Some(what) = compare(k, variant, &case, &got) {
                        row(what, None, String::new());
                    }
                }
                other => row(format!("launch: {other:?}"), None, String::new()),
            }
            for o in operands.iter().chain(std::iter::once(&operand(out_id, 0))) {
                expect_ok(exec.call(Op::CloseBuffer(CloseBuffer {
                    buffer_id: o.buffer_id,
                })));
            }
            expect_ok(exec.call(Op::UnloadModule(UnloadModule { module_id })));
        }
    }
    exec.shutdown();
    assert!(
        rows.is_empty(),
        "{}\n{ran} kernel variants ran",
        print_table("nvcc corpus on the GPU", rows)
    );
    assert!(ran >= 3 * 100, "only {ran} kernel variants ran");
    eprintln!("{ran} kernel variants ran on the GPU and matched");
}
