//! The canonical text compiles like the client's: for every entry of every
//! PTX file of the nvcc corpus that ptxd accepts (sm_80 and sm_90, plain,
//! `-lineinfo`, `-use_fast_math`, the refused-ptx files' accepted variants,
//! and the `-G` debug builds of `tests/corpus/nvcc_g`), the client's own
//! text and ptxd's canonical text are loaded into this process
//! (`cuModuleLoadData`, as the CUDA executor loads), launched with the
//! executor's parameter layout on the same random inputs (the manifest's
//! domains where the kernel has a reference, random bits otherwise) into
//! poisoned outputs, and the two outputs must be identical bit for bit,
//! past `n` included. Every difference is collected and printed in one
//! table before the test fails.
//!
//! The corpora come from `$PTXD_NVCC_CORPUS` and `$PTXD_NVCC_G_CORPUS` (or
//! the source tree's `tests/corpus/nvcc` and `tests/corpus/nvcc_g`).

use std::ffi::c_void;
use std::path::{Path, PathBuf};

use ptxd::ptx;
use ptxd_client::cuda::{CudaDevice, DeviceAllocation};
use rand::Rng;

use super::nvcc_ref::{self, make_case};
use super::{device, rng};

/// Architectures whose PTX loads on an H200.
const ARCHS: [&str; 2] = ["sm_80", "sm_90"];

/// The `-G` corpus: `$PTXD_NVCC_G_CORPUS`, else the source tree's.
fn g_corpus_root() -> PathBuf {
    std::env::var_os("PTXD_NVCC_G_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/corpus/nvcc_g"))
        })
}

/// Every `.ptx` file of `dir` whose name names an architecture of [`ARCHS`].
fn ptx_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.retain(|p| {
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        name.ends_with(".ptx") && ARCHS.iter().any(|a| name.contains(&format!(".{a}")))
    });
    files.sort();
    files
}

/// One launch's operands, copied to the device the same way for both texts.
struct Operands {
    inputs: Vec<Vec<u8>>,
    output: Vec<u8>,
    params: Vec<f32>,
    n: usize,
}

fn operands(
    signature: &ptx::Signature,
    reference: Option<&nvcc_ref::Kernel>,
    r: &mut impl Rng,
) -> Operands {
    let block = 256;
    let mut n = r.random_range(20_000..120_000usize);
    if n % block == 0 {
        n += 1;
    }
    let sizes = &signature.element_sizes;
    let inputs_n = signature.inputs as usize;
    let case = reference
        .filter(|k| k.reference.is_some() && k.element_sizes() == *sizes)
        .and_then(|k| make_case(k, n, r).ok());
    let inputs = match &case {
        Some(case) => case.inputs.clone(),
        None => sizes[..inputs_n]
            .iter()
            .map(|s| {
                let mut bytes = vec![0u8; n * *s as usize];
                r.fill_bytes(&mut bytes);
                bytes
            })
            .collect(),
    };
    let params = match reference.and_then(|k| k.reference.as_ref()) {
        Some(rf) if rf.param_values.len() == signature.scalar_params as usize => {
            rf.param_values.clone()
        }
        _ => (0..signature.scalar_params)
            .map(|_| r.random_range(-4.0f32..4.0))
            .collect(),
    };
    let out_size = sizes[inputs_n] as usize;
    Operands {
        inputs,
        output: vec![0xA5; (n + nvcc_ref::TAIL) * out_size],
        params,
        n,
    }
}

/// The block a launch of `signature` uses: `.reqntid`, else 256 capped by
/// `.maxntid` (what the CUDA executor picks for these kernels).
fn block_of(signature: &ptx::Signature) -> u32 {
    signature
        .reqntid
        .unwrap_or_else(|| signature.maxntid.map_or(256, |m| m.min(256)))
}

/// Loads `text`, launches `symbol` on `ops` and returns the output bytes.
fn run_text(
    dev: &CudaDevice,
    text: &str,
    symbol: &str,
    signature: &ptx::Signature,
    ops: &Operands,
) -> Result<Vec<u8>, String> {
    let module = dev
        .load_module(text.as_bytes())
        .map_err(|e| format!("load: {e}"))?;
    let function = module.function(symbol).map_err(|e| format!("{e}"))?;
    let mut mems: Vec<DeviceAllocation> = Vec::new();
    for bytes in &ops.inputs {
        let mem = dev.alloc(bytes.len().max(1)).map_err(|e| format!("{e}"))?;
        mem.upload(0, bytes).map_err(|e| format!("{e}"))?;
        mems.push(mem);
    }
    let out = dev.alloc(ops.output.len()).map_err(|e| format!("{e}"))?;
    out.upload(0, &ops.output).map_err(|e| format!("{e}"))?;
    let mut addresses: Vec<u64> = mems.iter().map(|m| m.device_ptr()).collect();
    addresses.push(out.device_ptr());
    let mut n = ops.n as i64;
    let mut scalars = ops.params.clone();
    let mut params: Vec<*mut c_void> = addresses
        .iter_mut()
        .map(|a| (a as *mut u64).cast::<c_void>())
        .collect();
    params.push((&mut n as *mut i64).cast());
    params.extend(scalars.iter_mut().map(|p| (p as *mut f32).cast::<c_void>()));
    let block = block_of(signature);
    let grid = ops.n.div_ceil(block as usize) as u32;
    let stream = dev.stream().map_err(|e| format!("{e}"))?;
    // SAFETY: `params` holds one pointer per kernel parameter (the verified
    // signature: inputs and output as u64 addresses, n as i64, the f32
    // scalars), each to a local that outlives the synchronize below; the
    // buffers hold n elements of each operand's verified size.
    unsafe { function.launch(&stream, grid, block, &mut params) }
        .map_err(|e| format!("launch: {e}"))?;
    stream.synchronize().map_err(|e| format!("run: {e}"))?;
    let mut got = vec![0u8; ops.output.len()];
    out.download(0, &mut got).map_err(|e| format!("{e}"))?;
    Ok(got)
}

/// A description of where two outputs differ, or None.
fn differs(client: &[u8], canonical: &[u8], element: usize) -> Option<String> {
    let elements = client.len() / element;
    let diff: Vec<usize> = (0..elements)
        .filter(|i| {
            client[i * element..(i + 1) * element] != canonical[i * element..(i + 1) * element]
        })
        .collect();
    let first = *diff.first()?;
    let word = |b: &[u8]| {
        b[first * element..(first + 1) * element]
            .iter()
            .rev()
            .map(|x| format!("{x:02x}"))
            .collect::<String>()
    };
    Some(format!(
        "{} of {elements} elements differ; first [{first}] client {} canonical {}",
        diff.len(),
        word(client),
        word(canonical)
    ))
}

#[test]
fn canonical_text_computes_bit_for_bit_what_the_clients_text_computes() {
    let dev = device();
    let mut r = rng();
    let (kernels, refused) = nvcc_ref::manifest();
    let by_name = |name: &str| kernels.iter().chain(&refused).find(|k| k.name == name);
    let root = nvcc_ref::corpus_root();
    let mut files = ptx_files(&root.join("ptx"));
    files.extend(ptx_files(&root.join("refused-ptx")));
    let g_files = ptx_files(&g_corpus_root().join("ptx"));
    assert!(
        !g_files.is_empty(),
        "no -G builds in {} (tests/corpus/nvcc_g/build.sh)",
        g_corpus_root().display()
    );
    files.extend(g_files);
    let (mut compared, mut refused_count, mut g_compared) = (0, 0, 0);
    let mut rows: Vec<String> = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let entries = match ptx::parse::parse(&text) {
            Ok(module) => module.functions.into_iter().map(|f| f.name).collect(),
            Err(_) => Vec::new(),
        };
        for symbol in entries {
            let canonical = match ptx::canonicalize(&text, &symbol, None) {
                Ok(c) => c,
                Err(_) => {
                    refused_count += 1;
                    continue;
                }
            };
            let ops = operands(&canonical.signature, by_name(&symbol), &mut r);
            let element = *canonical.signature.element_sizes.last().unwrap() as usize;
            let client = run_text(&dev, &text, &symbol, &canonical.signature, &ops);
            let ours = run_text(&dev, &canonical.text, &symbol, &canonical.signature, &ops);
            compared += 1;
            if name.contains(".G.") {
                g_compared += 1;
            }
            match (client, ours) {
                (Ok(a), Ok(b)) => {
                    if let Some(what) = differs(&a, &b, element) {
                        rows.push(format!("{name} {symbol}: {what}"));
                    }
                }
                (a, b) => rows.push(format!(
                    "{name} {symbol}: client {:?} canonical {:?}",
                    a.err(),
                    b.err()
                )),
            }
        }
    }
    eprintln!(
        "canonical vs client: {compared} accepted kernels compared ({g_compared} of -G builds), \
         {refused_count} entries refused, {} files, {} differ",
        files.len(),
        rows.len()
    );
    for row in &rows {
        eprintln!("  DIFFERS {row}");
    }
    assert!(compared > 100, "only {compared} kernels compared");
    assert!(
        rows.is_empty(),
        "{} kernels differ:\n{}",
        rows.len(),
        rows.join("\n")
    );
}
