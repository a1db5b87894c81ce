//! `ptxd bench`: measures a running daemon from the outside, as a session
//! sees it, on whichever backend it runs, and prints one table (or one JSON
//! object with `--json`).
//!
//! It sets up what it measures itself: a session, the add kernel (embedded:
//! `tests/corpus/add_f32_scalar.ptx`), and three buffers of `--n` f32 values
//! (POSIX shared memory on the host backend; on the CUDA backend, device
//! memory exported by legacy CUDA IPC, which needs this binary built with the
//! `cuda-bench` feature). Every figure is a measurement of this run.
//!
//! Adding a figure is one [`Report::add`] line: its JSON key, the table's
//! words for it and its value.
// The doc comments of the clap types below are also the `--help` text,
// where `<uid>` and `<n>` are placeholders, not HTML.
#![allow(rustdoc::invalid_html_tags)]

use std::time::{Duration, Instant};

use ptxd_client::{Buffer, Client, HostShm, Kernel, Launch, LoadOptions, Session};

use super::{device_of, CliError};

/// The kernel every figure launches or loads: `out[i] = a[i] + b[i]`, the
/// scalar ABI (three pointers and a 64-bit count).
const ADD_PTX: &str = include_str!("../../tests/corpus/add_f32_scalar.ptx");
const ADD_SYMBOL: &str = "add_f32_scalar";

/// Launches in flight on the `LaunchStream` (the daemon runs up to
/// `transport::grpc::LAUNCH_STREAM_WINDOW` of them at once; the rest wait queued).
const STREAM_WINDOW: usize = 256;
/// The stream figure is a mean over this many times `--iterations`
/// launches: filling and draining the window must be small beside it.
const STREAM_MULTIPLIER: usize = 10;

/// Arguments of `ptxd bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Samples per figure: unary launches, cache-hit loads; the stream
    /// sends ten times as many launches.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u32).range(10..))]
    pub iterations: u32,
    /// Elements per launch (f32).
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..=(1 << 28)))]
    pub n: u64,
    /// The device: a UUID (GPU-…, HOST-<n>) or ptxd's ordinal.
    #[arg(long, default_value = "0")]
    pub device: String,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// How long a unary call on the fd socket polls for its reply before
    /// the client sleeps (the SDK's `Client::with_reply_spin`; 0: at once).
    #[arg(long, default_value = "200us", value_parser = crate::config::parse_duration)]
    pub reply_spin: std::time::Duration,
}

/// One measured figure.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// The JSON key (its unit is its suffix: `_us`, `_per_s`).
    pub key: &'static str,
    /// What was measured, as the table says it.
    pub what: &'static str,
    pub value: f64,
}

/// What `ptxd bench` prints: where it ran and every figure it measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub backend: String,
    pub device: String,
    /// Whether the device's executor runs as a CUDA MPS client (GetInfo).
    pub mps: bool,
    pub n: u64,
    pub iterations: u32,
    pub figures: Vec<Figure>,
}

impl Report {
    /// Adds a figure (rounded to 0.01 of its unit).
    pub fn add(&mut self, key: &'static str, what: &'static str, value: f64) {
        let value = (value * 100.0).round() / 100.0;
        self.figures.push(Figure { key, what, value });
    }

    /// The table: one row per figure, and a footer naming what is not
    /// measured yet.
    pub fn table(&self) -> String {
        let mut out = format!(
            "ptxd bench: backend {}, device {}, mps {}, n {}, {} iterations\n",
            self.backend,
            self.device,
            if self.mps { "on" } else { "off" },
            self.n,
            self.iterations
        );
        let width = self.figures.iter().map(|f| f.what.len()).max().unwrap_or(0);
        for figure in &self.figures {
            let unit = if figure.key.ends_with("_us") {
                "µs"
            } else if figure.key.ends_with("_per_s") {
                "/s"
            } else {
                ""
            };
            out.push_str(&format!(
                "  {:<width$}  {:>10.1} {:<2}  {}\n",
                figure.what, figure.value, unit, figure.key
            ));
        }
        out
    }

    /// One JSON object: `backend`, `device`, `mps`, `n`, `iterations` and every
    /// figure under its key.
    pub fn json(&self) -> String {
        let mut object = serde_json::Map::new();
        object.insert("backend".into(), self.backend.clone().into());
        object.insert("device".into(), self.device.clone().into());
        object.insert("mps".into(), self.mps.into());
        object.insert("n".into(), self.n.into());
        object.insert("iterations".into(), self.iterations.into());
        for figure in &self.figures {
            // A figure is a finite duration or rate; a NaN would be a bug
            // here, and JSON has no spelling for it: null then.
            object.insert(
                figure.key.into(),
                serde_json::Number::from_f64(figure.value)
                    .map_or(serde_json::Value::Null, serde_json::Value::Number),
            );
        }
        serde_json::Value::Object(object).to_string()
    }
}

/// Durations of one figure's samples.
struct Samples(Vec<Duration>);

impl Samples {
    /// The `q` quantile (nearest rank), in microseconds.
    fn quantile_us(&mut self, q: f64) -> f64 {
        self.0.sort_unstable();
        let last = self.0.len().saturating_sub(1);
        let rank = (last as f64 * q).round() as usize;
        self.0
            .get(rank.min(last))
            .map_or(0.0, |d| d.as_secs_f64() * 1e6)
    }
}

/// The three operands' memory, as the backend wants it.
enum Operands {
    Host([HostShm; 3]),
    #[cfg(feature = "cuda-bench")]
    Cuda([ptxd_client::cuda::DeviceAllocation; 3]),
}

/// Input values whose sums are exact in f32.
fn inputs(n: usize) -> (Vec<f32>, Vec<f32>) {
    let a = (0..n).map(|i| (i % 4096) as f32).collect();
    let b = (0..n).map(|i| (i % 7) as f32 * 0.5).collect();
    (a, b)
}

impl Operands {
    fn create(backend: &str, device_uuid: &str, n: usize) -> Result<Operands, CliError> {
        let (a, b) = inputs(n);
        let out = vec![f32::NAN; n];
        let bytes = n as u64 * 4;
        match backend {
            "host" => {
                let mut shm = [
                    HostShm::create(bytes)?,
                    HostShm::create(bytes)?,
                    HostShm::create(bytes)?,
                ];
                for (memory, values) in shm.iter_mut().zip([&a, &b, &out]) {
                    memory.write_f32(0, values)?;
                }
                Ok(Operands::Host(shm))
            }
            #[cfg(feature = "cuda-bench")]
            "cuda" => {
                let cuda = |e: ptxd_client::cuda::CudaError| CliError::Check(format!("CUDA: {e}"));
                let device = ptxd_client::cuda::CudaDevice::by_uuid(device_uuid).map_err(cuda)?;
                let alloc = || device.alloc(n * 4).map_err(cuda);
                let memory = [alloc()?, alloc()?, alloc()?];
                for (allocation, values) in memory.iter().zip([&a, &b, &out]) {
                    allocation.upload(0, values).map_err(cuda)?;
                }
                Ok(Operands::Cuda(memory))
            }
            other => Err(CliError::Usage(format!(
                "`ptxd bench` cannot allocate memory for the {other} backend \
                 (device {device_uuid}){}",
                if other == "cuda" {
                    ": this ptxd was built without the cuda-bench feature"
                } else {
                    ""
                }
            ))),
        }
    }

    async fn register(
        &self,
        session: &Session,
        device_uuid: &str,
    ) -> Result<Vec<Buffer>, CliError> {
        let mut buffers = Vec::with_capacity(3);
        match self {
            Operands::Host(shm) => {
                for memory in shm {
                    buffers.push(session.register_shm(memory, Some(device_uuid)).await?);
                }
            }
            #[cfg(feature = "cuda-bench")]
            Operands::Cuda(memory) => {
                for allocation in memory {
                    let handle = allocation
                        .ipc_handle()
                        .map_err(|e| CliError::Check(format!("CUDA: {e}")))?;
                    buffers.push(
                        session
                            .register_cuda_ipc(handle, device_uuid, allocation.size() as u64)
                            .await?,
                    );
                }
            }
        }
        Ok(buffers)
    }

    /// The output operand's values, read back.
    fn output(&self, n: usize) -> Result<Vec<f32>, CliError> {
        match self {
            Operands::Host(shm) => Ok(shm[2].read_f32(0, n)?),
            #[cfg(feature = "cuda-bench")]
            Operands::Cuda(memory) => {
                let mut out = vec![0f32; n];
                memory[2]
                    .download(0, &mut out)
                    .map_err(|e| CliError::Check(format!("CUDA: {e}")))?;
                Ok(out)
            }
        }
    }
}

/// The embedded add kernel, loaded in `session` on `device`.
async fn load_add(session: &Session, device: &str) -> Result<Kernel, CliError> {
    Ok(session
        .load_ptx(
            device_of(device)?,
            ADD_PTX,
            ADD_SYMBOL,
            LoadOptions::default(),
        )
        .await?)
}

/// An async launch of the add kernel over the three `buffers` (a, b, out).
fn add_launch(buffers: &[Buffer], n: u64) -> Launch {
    Launch::new(
        [buffers[0].operand(), buffers[1].operand()],
        buffers[2].operand(),
        n,
    )
    .sync(false)
}

/// `iterations` async launches after a warm-up: each round trip, and the
/// daemon's own time for it.
async fn unary_launches(
    session: &Session,
    kernel: &Kernel,
    launch: &Launch,
    iterations: usize,
) -> Result<(Samples, Samples), CliError> {
    for _ in 0..(iterations / 10).max(10) {
        session.launch(kernel, launch).await?;
    }
    let mut round_trips = Samples(Vec::with_capacity(iterations));
    let mut inside = Samples(Vec::with_capacity(iterations));
    for _ in 0..iterations {
        let started = Instant::now();
        let launched = session.launch(kernel, launch).await?;
        round_trips.0.push(started.elapsed());
        inside.0.push(Duration::from_micros(launched.micros));
    }
    Ok((round_trips, inside))
}

/// Runs the bench and prints its report.
pub(super) async fn bench(client: &Client, args: BenchArgs) -> Result<(), CliError> {
    let client = client.clone().with_reply_spin(args.reply_spin);
    let report = measure(&client, &args).await?;
    if args.json {
        println!("{}", report.json());
    } else {
        print!("{}", report.table());
    }
    Ok(())
}

async fn measure(client: &Client, args: &BenchArgs) -> Result<Report, CliError> {
    let iterations = args.iterations as usize;
    let n = usize::try_from(args.n)
        .map_err(|_| CliError::Usage(format!("--n {} does not fit this machine", args.n)))?;
    let info = client.info().await?;
    let session = client.open_session("ptxd bench").await?;
    let kernel = load_add(&session, &args.device).await?;
    let device_uuid = kernel.state().device_uuid;
    let operands = Operands::create(&info.backend, &device_uuid, n)?;
    let buffers = operands.register(&session, &device_uuid).await?;
    let launch = add_launch(&buffers, args.n);

    let mps = info
        .devices
        .iter()
        .any(|d| d.uuid == device_uuid && d.mps_enabled);
    let mut report = Report {
        backend: info.backend,
        device: device_uuid.clone(),
        mps,
        n: args.n,
        iterations: args.iterations,
        figures: Vec::new(),
    };

    // Unary Launch, async: the round trip as a client sees it, on the SDK's
    // own choice of path (on a Unix socket a packet on the fd socket), then
    // on HTTP/2 alone (a second session of a client without the fd lane).
    let (mut unary, mut inside) = unary_launches(&session, &kernel, &launch, iterations).await?;
    check_sums(&session, &kernel, &launch, &operands, n).await?;
    let http2 = client.clone().without_fd_lane();
    let http2_session = http2.open_session("ptxd bench (HTTP/2)").await?;
    let http2_kernel = load_add(&http2_session, &args.device).await?;
    let http2_buffers = operands.register(&http2_session, &device_uuid).await?;
    let http2_launch = add_launch(&http2_buffers, args.n);
    let (mut unary_http2, _) =
        unary_launches(&http2_session, &http2_kernel, &http2_launch, iterations).await?;
    http2_session.close().await?;
    report.add(
        "unary_p50_us",
        "unary Launch round trip, async, p50",
        unary.quantile_us(0.5),
    );
    report.add(
        "unary_p99_us",
        "unary Launch round trip, async, p99",
        unary.quantile_us(0.99),
    );
    report.add(
        "unary_daemon_p50_us",
        "  of which the daemon's launch (checks + executor), p50",
        inside.quantile_us(0.5),
    );
    report.add(
        "unary_http2_p50_us",
        "unary Launch round trip over HTTP/2 only, async, p50",
        unary_http2.quantile_us(0.5),
    );
    report.add(
        "unary_http2_p99_us",
        "unary Launch round trip over HTTP/2 only, async, p99",
        unary_http2.quantile_us(0.99),
    );

    let streamed = iterations * STREAM_MULTIPLIER;
    let took = stream(&session, &kernel, &launch, streamed).await?;
    report.add(
        "stream_per_launch_us",
        "LaunchStream pipelined, per launch (mean)",
        took.as_secs_f64() * 1e6 / streamed as f64,
    );

    // The launch ring: submit → completion round trip, then throughput
    // with the ring kept full.
    let mut ring = session.open_ring(256, device_of(&args.device)?).await?;
    let ins = [(&buffers[0], 0u64), (&buffers[1], 0u64)];
    let mut round = Samples(Vec::with_capacity(iterations));
    for i in 0..iterations + (iterations / 10).max(10) {
        let started = Instant::now();
        ring.launch(&kernel, &ins, (&buffers[2], 0), args.n, &[])?;
        ring_completion(&mut ring)?;
        if i >= (iterations / 10).max(10) {
            round.0.push(started.elapsed());
        }
    }
    report.add(
        "ring_p50_us",
        "ring submit → completion, async, p50",
        round.quantile_us(0.5),
    );
    report.add(
        "ring_p99_us",
        "ring submit → completion, async, p99",
        round.quantile_us(0.99),
    );
    let total = iterations * STREAM_MULTIPLIER;
    let (mut sent, mut answered) = (0usize, 0usize);
    let started = Instant::now();
    while answered < total {
        while sent < total
            && ring
                .launch(&kernel, &ins, (&buffers[2], 0), args.n, &[])
                .is_ok()
        {
            sent += 1;
        }
        ring_completion(&mut ring)?;
        answered += 1;
        while let Some(done) = ring.poll()? {
            done.outcome
                .map_err(|r| CliError::Usage(format!("a ring launch failed: {r}")))?;
            answered += 1;
        }
    }
    report.add(
        "ring_launches_per_s",
        "ring throughput, one client, 256 in flight",
        total as f64 / started.elapsed().as_secs_f64(),
    );
    drop(ring);
    check_sums(&session, &kernel, &launch, &operands, n).await?;

    let mut hits = load_hits(client, &args.device, ADD_PTX, ADD_SYMBOL, iterations).await?;
    report.add(
        "load_hit_p50_us",
        "LoadKernel cache hit (second session), p50",
        hits.quantile_us(0.5),
    );
    // The same for a 16 KiB module of 13 entries: a hit must not cost more
    // for a larger module (the text is hashed, not verified again).
    let (big, big_symbol) = thirteen_entry_module();
    let holder = client.open_session("ptxd bench (16 KiB module)").await?;
    holder
        .load_ptx(
            device_of(&args.device)?,
            big.clone(),
            &big_symbol,
            LoadOptions::default(),
        )
        .await?;
    let mut big_hits = load_hits(client, &args.device, &big, &big_symbol, iterations).await?;
    holder.close().await?;
    report.add(
        "load_hit_16k_p50_us",
        "LoadKernel cache hit, 16 KiB module of 13 entries, p50",
        big_hits.quantile_us(0.5),
    );

    session.close().await?;
    Ok(report)
}

/// The next ring completion, which must be a success.
fn ring_completion(ring: &mut ptxd_client::LaunchRing) -> Result<(), CliError> {
    let done = ring
        .wait(Duration::from_secs(10))?
        .ok_or_else(|| CliError::Usage("no ring completion within 10 s".into()))?;
    done.outcome
        .map_err(|r| CliError::Usage(format!("a ring launch failed: {r}")))
}

/// One synchronous launch (so that every launch before it has finished),
/// then the output must be the sums.
async fn check_sums(
    session: &Session,
    kernel: &Kernel,
    launch: &Launch,
    operands: &Operands,
    n: usize,
) -> Result<(), CliError> {
    session.launch(kernel, &launch.clone().sync(true)).await?;
    let (a, b) = inputs(n);
    let out = operands.output(n)?;
    match (0..n).find(|&i| out[i].to_bits() != (a[i] + b[i]).to_bits()) {
        None => Ok(()),
        Some(i) => Err(CliError::Check(format!(
            "the add kernel's output is wrong at element {i}: {} + {} gave {}",
            a[i], b[i], out[i]
        ))),
    }
}

/// Sends `count` launches on one `LaunchStream`, at most [`STREAM_WINDOW`]
/// unanswered; returns the time from the first send to the last reply.
async fn stream(
    session: &Session,
    kernel: &Kernel,
    launch: &Launch,
    count: usize,
) -> Result<Duration, CliError> {
    let mut stream = session.launch_stream().await?;
    let mut in_flight = 0usize;
    let mut answered = 0usize;
    let started = Instant::now();
    for _ in 0..count {
        if in_flight == STREAM_WINDOW {
            next_reply(&mut stream).await?;
            in_flight -= 1;
            answered += 1;
        }
        stream.send(kernel, launch).await?;
        in_flight += 1;
    }
    while in_flight > 0 {
        next_reply(&mut stream).await?;
        in_flight -= 1;
        answered += 1;
    }
    let took = started.elapsed();
    debug_assert_eq!(answered, count);
    Ok(took)
}

async fn next_reply(stream: &mut ptxd_client::LaunchStream) -> Result<(), CliError> {
    match stream.next().await? {
        Some(reply) => reply.outcome.map(drop).map_err(CliError::from),
        None => Err(CliError::Check(
            "the launch stream ended before every launch was answered".into(),
        )),
    }
}

/// A module of 13 renamed copies of the add kernel, padded with a comment
/// to 16 KiB, and the symbol of its last entry.
fn thirteen_entry_module() -> (String, String) {
    let body_start = ADD_PTX.find(".visible .entry").unwrap_or(0);
    let (header, body) = ADD_PTX.split_at(body_start);
    let mut module = header.to_owned();
    for k in 0..13 {
        module.push_str(&body.replace(ADD_SYMBOL, &format!("{ADD_SYMBOL}_{k}")));
        module.push('\n');
    }
    let pad = 16 * 1024usize;
    if module.len() + 4 < pad {
        module.push_str("// ");
        module.push_str(&"x".repeat(pad - module.len() - 1));
        module.push('\n');
    }
    (module, format!("{ADD_SYMBOL}_12"))
}

/// Loads the kernel again from a second session (the first still holds it,
/// so each load must be a cache hit), `count` times; each load is unloaded
/// again untimed, so the session never nears its kernel quota.
async fn load_hits(
    client: &Client,
    device: &str,
    ptx: &str,
    symbol: &str,
    count: usize,
) -> Result<Samples, CliError> {
    let session = client.open_session("ptxd bench (cache hits)").await?;
    let mut samples = Samples(Vec::with_capacity(count));
    for k in 0..count + (count / 10).max(5) {
        let started = Instant::now();
        let kernel = session
            .load_ptx(device_of(device)?, ptx, symbol, LoadOptions::default())
            .await?;
        let took = started.elapsed();
        if !kernel.state().cache_hit {
            return Err(CliError::Check(
                "a load of a kernel another session holds did not report cache_hit".into(),
            ));
        }
        // The first tenth warms up.
        if k >= (count / 10).max(5) {
            samples.0.push(took);
        }
        session.unload(&kernel).await?;
    }
    session.close().await?;
    Ok(samples)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn report() -> Report {
        let mut report = Report {
            backend: "host".into(),
            device: "HOST-0".into(),
            mps: false,
            n: 4096,
            iterations: 200,
            figures: Vec::new(),
        };
        report.add("unary_p50_us", "unary p50", 41.234);
        report.add("stream_per_launch_us", "stream", 7.0);
        report
    }

    #[test]
    fn json_has_every_figure_under_its_key() {
        let value: serde_json::Value = serde_json::from_str(&report().json()).unwrap();
        assert_eq!(value["backend"], "host");
        assert_eq!(value["mps"], false);
        assert_eq!(value["n"], 4096);
        assert_eq!(value["unary_p50_us"], 41.23);
        assert_eq!(value["stream_per_launch_us"], 7.0);
    }

    #[test]
    fn the_table_names_each_key() {
        let table = report().table();
        assert!(table.contains("unary_p50_us"), "{table}");
        assert!(table.contains("41.2 µs"), "{table}");
        assert!(table.contains("stream_per_launch_us"), "{table}");
        assert_eq!(table.lines().count(), 3, "{table}");
        assert!(table.contains("mps off"), "{table}");
        let on = Report {
            mps: true,
            ..report()
        };
        assert!(on.table().contains("mps on"), "{}", on.table());
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&on.json()).unwrap()["mps"],
            true
        );
    }

    #[test]
    fn the_large_module_has_thirteen_verifiable_entries_in_16_kib() {
        let (module, symbol) = thirteen_entry_module();
        assert!(
            module.len() >= 16 * 1024 && module.len() <= 16 * 1024 + 8,
            "{}",
            module.len()
        );
        assert_eq!(module.matches(".visible .entry").count(), 13);
        for k in [0, 6, 12] {
            crate::ptx::canonicalize(&module, &format!("{ADD_SYMBOL}_{k}"), None).unwrap();
        }
        assert_eq!(symbol, format!("{ADD_SYMBOL}_12"));
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let mut samples = Samples((1..=100).map(Duration::from_micros).collect());
        assert_eq!(samples.quantile_us(0.5), 51.0);
        assert_eq!(samples.quantile_us(0.99), 99.0);
        assert_eq!(Samples(Vec::new()).quantile_us(0.5), 0.0);
    }
}
