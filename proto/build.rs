//! Generates the Rust code for ptxd's wire format from `proto/` with protox, a
//! pure-Rust protobuf compiler, so building needs no system `protoc` and the
//! generated code cannot drift from the `.proto` files: it is rebuilt from them
//! on every change.

use std::path::PathBuf;

use prost::Message;

const API: &str = "ptxd/v1/ptxd.proto";
const EXECUTOR: &str = "ptxd/executor/v1/executor.proto";
const ERROR_DETAILS: &str = "google/rpc/error_details.proto";
/// The kubelet's device-plugin API, vendored (see the file's header).
const DEVICE_PLUGIN: &str = "k8s/deviceplugin/v1beta1/api.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    for file in [API, EXECUTOR, ERROR_DETAILS, DEVICE_PLUGIN] {
        println!("cargo:rerun-if-changed={}", root.join(file).display());
    }

    let codegen = protox::compile([API, EXECUTOR, DEVICE_PLUGIN], [&root])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(codegen)?;

    // The reflection set: the public API plus google.rpc's error details, so
    // that grpcurl decodes the ErrorInfo of a refusal. The executor protocol is
    // internal and stays out of it.
    let reflection = protox::compile([API, ERROR_DETAILS], [&root])?;
    std::fs::write(out.join("ptxd_reflection.bin"), reflection.encode_to_vec())?;
    Ok(())
}
