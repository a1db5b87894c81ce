//! A host-backend round trip: create POSIX shared memory, register it, load
//! the corpus kernel `add_f32_scalar`, launch it, read the sums back and
//! check every element.
//!
//! ```text
//! ptxd serve --backend host &      # a daemon on the host (CPU) backend
//! cargo run -p ptxd-client --example host_add -- tests/corpus/add_f32_scalar.ptx [N]
//! ```
//!
//! Connects to `$PTXD_SOCKET`, else to the default socket path. Not over
//! TCP: a TCP caller has no identity, so ptxd refuses to register its shared
//! memory (`IDENTITY_REQUIRED`).

use std::process::ExitCode;

use ptxd_client::{Client, HostShm, Launch, LoadOptions};
use rand::Rng;

type AnyError = Box<dyn std::error::Error + Send + Sync>;

async fn connect() -> Result<Client, ptxd_client::Error> {
    match std::env::var_os("PTXD_SOCKET") {
        Some(path) => Client::connect_unix(path).await,
        None => Client::connect_default().await,
    }
}

async fn run(ptx_path: &str, n: usize) -> Result<(), AnyError> {
    let ptx = std::fs::read_to_string(ptx_path)?;
    let client = connect().await?;
    let info = client.info().await?;
    let device = info
        .devices
        .iter()
        .find(|d| d.available)
        .ok_or("the daemon reports no available device")?;
    println!(
        "ptxd {} ({} backend), device {} ({})",
        info.version, info.backend, device.uuid, device.name
    );

    let session = client.open_session("host_add example").await?;
    let kernel = session
        .load_ptx(
            device.uuid.as_str(),
            ptx,
            "add_f32_scalar",
            LoadOptions::default(),
        )
        .await?;
    let state = kernel.state();
    println!(
        "loaded {} -> {} (cache hit: {}, {} us), signature {:?}",
        kernel.symbol(),
        state.handle,
        state.cache_hit,
        state.load_micros,
        state.signature
    );

    let bytes = n.checked_mul(4).ok_or("N is too large")? as u64;
    let mut rng = rand::rng();
    let a: Vec<f32> = (0..n).map(|_| rng.random_range(-1000.0..1000.0)).collect();
    let b: Vec<f32> = (0..n).map(|_| rng.random_range(-1000.0..1000.0)).collect();
    let mut a_shm = HostShm::create(bytes)?;
    let mut b_shm = HostShm::create(bytes)?;
    let mut out_shm = HostShm::create(bytes)?;
    a_shm.write_f32(0, &a)?;
    b_shm.write_f32(0, &b)?;
    // Poison the output so an element the kernel never wrote cannot pass.
    out_shm.write_f32(0, &vec![f32::NAN; n])?;

    let device_uuid = Some(state.device_uuid.as_str());
    let a_buf = session.register_shm(&a_shm, device_uuid).await?;
    let b_buf = session.register_shm(&b_shm, device_uuid).await?;
    let out_buf = session.register_shm(&out_shm, device_uuid).await?;

    let launch = Launch::new(
        [a_buf.operand(), b_buf.operand()],
        out_buf.operand(),
        n as u64,
    );
    let launched = session.launch(&kernel, &launch).await?;
    println!("launched over {n} elements in {} us", launched.micros);

    let out = out_shm.read_f32(0, n)?;
    let wrong: Vec<usize> = (0..n)
        .filter(|&i| out[i].to_bits() != (a[i] + b[i]).to_bits())
        .collect();
    for i in 0..n.min(4) {
        println!("  {} + {} = {}", a[i], b[i], out[i]);
    }
    let report = session.close().await?;
    println!(
        "session closed: released {} buffers, {} kernels",
        report.buffers_released, report.kernels_released
    );
    if let Some(&first) = wrong.first() {
        return Err(format!(
            "{} of {n} sums are wrong; first at {first}: {} + {} gave {}",
            wrong.len(),
            a[first],
            b[first],
            out[first]
        )
        .into());
    }
    println!("all {n} sums match");
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(ptx_path) = args.next() else {
        eprintln!("usage: host_add PATH/TO/add_f32_scalar.ptx [N]");
        return ExitCode::from(2);
    };
    let n = match args.next().map(|s| s.parse::<usize>()) {
        None => 100_000,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("N must be a positive integer");
            return ExitCode::from(2);
        }
    };
    match run(&ptx_path, n).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            let mut message = error.to_string();
            let mut source = error.source();
            while let Some(cause) = source {
                message.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            eprintln!("host_add: {message}");
            ExitCode::FAILURE
        }
    }
}
