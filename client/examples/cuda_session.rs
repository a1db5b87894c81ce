//! A complete CUDA session against a `ptxd serve --backend cuda` daemon:
//! allocate IPC-exportable device memory, upload, register it, load the
//! corpus kernel `add_f32_scalar`, order the launch after this process's own
//! stream with an IPC event, let ptxd signal a second event when the kernel is
//! done, wait on it, read back and check every element.
//!
//! ```text
//! ptxd serve --backend cuda --socket /tmp/ptxd.sock &
//! PTXD_SOCKET=/tmp/ptxd.sock cargo run -p ptxd-client --features cuda \
//!     --example cuda_session -- tests/corpus/add_f32_scalar.ptx [N]
//! ```

use std::process::ExitCode;

use ptxd_client::cuda::CudaDevice;
use ptxd_client::{Client, Launch, LoadOptions};

type AnyError = Box<dyn std::error::Error + Send + Sync>;

async fn run(ptx_path: &str, n: usize) -> Result<(), AnyError> {
    let ptx = std::fs::read_to_string(ptx_path)?;
    let client = Client::connect_default().await?;
    let session = client.open_session("cuda_session example").await?;

    // Our own device memory: plain cuMemAlloc, so it can be exported.
    let device = CudaDevice::open(0)?;
    let bytes = n.checked_mul(4).ok_or("N is too large")?;
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..n).map(|i| 0.25 * i as f32).collect();
    let (a_mem, b_mem, out_mem) = (
        device.alloc(bytes)?,
        device.alloc(bytes)?,
        device.alloc(bytes)?,
    );
    a_mem.upload(0, &a)?;
    b_mem.upload(0, &b)?;
    out_mem.upload(0, &vec![f32::NAN; n])?;

    // ptxd maps each allocation once, here, by its IPC handle and UUID.
    let uuid = device.uuid();
    let a_buf = session
        .register_cuda_ipc(a_mem.ipc_handle()?, uuid, bytes as u64)
        .await?;
    let b_buf = session
        .register_cuda_ipc(b_mem.ipc_handle()?, uuid, bytes as u64)
        .await?;
    let out_buf = session
        .register_cuda_ipc(out_mem.ipc_handle()?, uuid, bytes as u64)
        .await?;

    let kernel = session
        .load_ptx(uuid, ptx, "add_f32_scalar", LoadOptions::default())
        .await?;
    println!(
        "loaded {} (cache hit: {})",
        kernel.handle(),
        kernel.state().cache_hit
    );

    // Order ptxd's launch after our stream's work, and our read after it,
    // without a host synchronization in between.
    let (ready, done) = (device.ipc_event()?, device.ipc_event()?);
    let ready_event = session
        .register_event(ready.ipc_handle()?, uuid, "inputs ready")
        .await?;
    let done_event = session
        .register_event(done.ipc_handle()?, uuid, "output done")
        .await?;
    let stream = device.stream()?;
    stream.record(&ready)?;
    let launch = Launch::new(
        [a_buf.operand(), b_buf.operand()],
        out_buf.operand(),
        n as u64,
    )
    .sync(false)
    .wait_event(&ready_event)
    .signal_event(&done_event);
    session.launch(&kernel, &launch).await?;
    stream.wait(&done)?;
    stream.synchronize()?;

    let mut out = vec![0f32; n];
    out_mem.download(0, &mut out)?;
    let wrong = (0..n)
        .filter(|&i| out[i].to_bits() != (a[i] + b[i]).to_bits())
        .count();
    // Release the registrations before the allocations are freed.
    for buffer in [&a_buf, &b_buf, &out_buf] {
        session.release_buffer(buffer).await?;
    }
    session.close().await?;
    if wrong > 0 {
        return Err(format!("{wrong} of {n} sums are wrong").into());
    }
    println!("all {n} sums match");
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(ptx_path) = args.next() else {
        eprintln!("usage: cuda_session PATH/TO/add_f32_scalar.ptx [N]");
        return ExitCode::from(2);
    };
    let n = match args.next().map(|s| s.parse::<usize>()) {
        None => 1 << 20,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("N must be a positive integer");
            return ExitCode::from(2);
        }
    };
    match run(&ptx_path, n).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cuda_session: {e}");
            ExitCode::FAILURE
        }
    }
}
