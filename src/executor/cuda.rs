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

/// `ptxd executor --backend cuda --probe`: writes one Hello frame listing
/// every device on stdout (empty when CUDA is unavailable) and exits.
pub fn probe_stdio() -> i32 {
    let devices = match probe() {
        Ok(devices) => devices,
        Err(reason) => {
            tracing::info!(%reason, "CUDA probe found no usable driver");
            Vec::new()
        }
    };
    let hello = ptxd_proto::executor::ExecutorMessage {
        body: Some(ptxd_proto::executor::executor_message::Body::Hello(
            ptxd_proto::executor::Hello {
                backend: "cuda".into(),
                devices,
                pid: std::process::id(),
            },
        )),
    };
    match super::protocol::write_frame(&mut std::io::stdout().lock(), &hello) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}
