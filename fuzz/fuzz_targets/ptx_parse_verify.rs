//! Any bytes: parsing, verifying and compiling for the host must return
//! (Ok or a typed error) without panicking, hanging or allocating without
//! bound; and whatever lowers round-trips through the canonical printer. Seed with `cp ../tests/corpus/*.ptx corpus/ptx_parse_verify/`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    // The first line may name the entry; otherwise try the usual corpus names.
    for symbol in ["add_f32_scalar", "add_kernel", "k"] {
        let _ = ptxd::ptx::verify(&text, symbol, None);
        let _ = ptxd::ptx::HostKernel::compile(&text, symbol);
        let _ = ptxd::ptx::canonicalize(&text, symbol, None);
        // Whatever lowers prints to a text that lowers to the same program.
        if let Ok(ir) = ptxd::ptx::lower(&text, symbol) {
            let printed = ptxd::ptx::print::print(&ir);
            match ptxd::ptx::lower(&printed, symbol) {
                Ok(again) => assert!(
                    ptxd::ptx::print::same_program(&ir, &again),
                    "round trip changed the program:\n{printed}"
                ),
                Err(e) => panic!("printed text does not lower: {e}\n{printed}"),
            }
        }
    }
});
