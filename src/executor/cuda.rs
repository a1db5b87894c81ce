//! The CUDA executor backend, driven through cudarc.
//!
//! PLACEHOLDER until the CUDA executor lands (issue 4): it reports that CUDA
//! is unavailable, so `--backend auto` falls back to the host backend.

use ptxd_proto::executor::DeviceDesc;

/// Looks for libcuda and a working driver without panicking; returns the
/// devices it can see.
pub fn probe() -> Result<Vec<DeviceDesc>, String> {
    Err("the CUDA executor is not built yet".into())
}

/// Runs a CUDA executor process for the device with `uuid`. Returns the
/// process exit code.
pub fn run_executor(uuid: &str) -> i32 {
    tracing::error!(uuid, "the CUDA executor is not built yet");
    2
}
