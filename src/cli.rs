//! The client subcommands of the `ptxd` binary: `info`, `kernels`,
//! `buffers`, `load`, `launch`, `health` and `bench`, written against the
//! SDK (`ptxd-client`) only, as any other session would be.
//!
//! Every failure prints one line, `REASON: message`, to stderr and exits
//! non-zero; REASON is the daemon's refusal reason (e.g. `STALE_KERNEL`) or
//! the kind of local failure (`TRANSPORT`, `IO`, `USAGE`, ...).
// The doc comments of the clap types below are also the `--help` text,
// where `<uid>` and `<n>` are placeholders, not HTML.
#![allow(rustdoc::invalid_html_tags)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use ptxd_client::{
    Artifact, Buffer, Client, DeclaredAbi, DeviceSelector, HostMemfd, HostShm, Kernel, Launch,
    LoadOptions, Session, SharedBytes,
};
use rand::{Rng, SeedableRng};

mod bench;
pub use bench::{BenchArgs, Figure, Report};
pub mod device_plugin;
pub use device_plugin::DevicePluginArgs;

/// How to reach the daemon.
#[derive(Debug, Clone, clap::Args)]
pub struct ClientOpts {
    /// The daemon's Unix socket [default: $XDG_RUNTIME_DIR/ptxd.sock, else
    /// /run/ptxd/ptxd.sock as root, else $TMPDIR/ptxd-<uid>/ptxd.sock; a
    /// default path is refused (UNSAFE_SOCKET_DIR) when its directory is a
    /// symlink, another user's, or writable by others without the sticky
    /// bit].
    #[arg(long, env = "PTXD_SOCKET", value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Connect over TCP instead (e.g. 127.0.0.1:50051 or
    /// http://127.0.0.1:50051); takes precedence over --socket.
    #[arg(long, env = "PTXD_TCP", value_name = "ADDR")]
    pub tcp: Option<String>,
}

/// The client subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum ClientCommand {
    /// Print the daemon's version, backend, devices, slot usage and limits.
    Info,
    /// List the kernels of a session. Sessions are private and end when the
    /// command exits, so this opens a fresh session whose list is always
    /// empty: it checks that sessions open and list, nothing more.
    Kernels,
    /// List the buffers of a session. As with `kernels`, this is a fresh
    /// session's list, so always empty.
    Buffers,
    /// Load a kernel (.ptx, .cubin or .fatbin) and print its handle,
    /// signature, cache hit and load time. The session, and with it the
    /// handle, ends when the command exits: the handle printed is for
    /// information only. The compiled kernel stays cached in the daemon.
    Load(LoadArgs),
    /// Run a kernel once on the host backend: load it, fill one POSIX
    /// shared-memory buffer of N random f32 values per input, launch
    /// synchronously and print the first elements of every operand. f32
    /// kernels (4-byte elements) only.
    Launch(LaunchArgs),
    /// Check grpc.health.v1 (exit 0 when SERVING): a liveness/readiness probe.
    Health(HealthArgs),
    /// Measure the running daemon: unary Launch round trip, LaunchStream
    /// per-launch cost, the launch ring's round trip and throughput, and a
    /// cache-hit LoadKernel, on its own session,
    /// kernel and buffers; a table, or one JSON object with --json.
    Bench(BenchArgs),
}

/// Arguments of `ptxd load`.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadArgs {
    /// The artifact: PTX text, or a cubin/fatbin by its extension.
    pub file: PathBuf,
    /// The kernel's entry symbol.
    #[arg(long)]
    pub symbol: String,
    /// The device: a UUID (GPU-…, HOST-<n>) or ptxd's ordinal.
    #[arg(long, default_value = "0")]
    pub device: String,
    /// Declared number of inputs (checked against the PTX; required for a
    /// cubin or fatbin).
    #[arg(long, requires = "params")]
    pub inputs: Option<u32>,
    /// Declared number of trailing f32 params.
    #[arg(long, requires = "inputs")]
    pub params: Option<u32>,
    /// Declared element size in bytes (cubin/fatbin only).
    #[arg(long, requires = "inputs")]
    pub element_size: Option<u32>,
}

/// Arguments of `ptxd launch`.
#[derive(Debug, Clone, clap::Args)]
pub struct LaunchArgs {
    /// The PTX file.
    pub file: PathBuf,
    /// The kernel's entry symbol.
    #[arg(long)]
    pub symbol: String,
    /// Number of elements.
    #[arg(long)]
    pub n: u64,
    /// The kernel's f32 params, comma-separated (e.g. --params 2.0,-1.5).
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true)]
    pub params: Vec<f64>,
    /// The device: a host device UUID (HOST-<n>) or ptxd's ordinal.
    #[arg(long, default_value = "0")]
    pub device: String,
    /// Seed of the random inputs (random when absent; printed either way).
    #[arg(long)]
    pub seed: Option<u64>,
    /// How many leading elements of each operand to print.
    #[arg(long, default_value_t = 8)]
    pub show: usize,
    /// Pass the buffers as sealed memfds over the fd socket instead of
    /// shared-memory names (works from another PID, IPC or mount
    /// namespace; host backend).
    #[arg(long)]
    pub memfd: bool,
}

/// A host buffer of `ptxd launch`: a named object or a memfd.
enum HostBuffer {
    Shm(HostShm),
    Memfd(HostMemfd),
}

impl HostBuffer {
    fn create(bytes: u64, memfd: bool) -> Result<Self, CliError> {
        Ok(if memfd {
            HostBuffer::Memfd(HostMemfd::create(bytes)?)
        } else {
            HostBuffer::Shm(HostShm::create(bytes)?)
        })
    }

    async fn register(&self, session: &Session, device: Option<&str>) -> Result<Buffer, CliError> {
        Ok(match self {
            HostBuffer::Shm(shm) => session.register_shm(shm, device).await?,
            HostBuffer::Memfd(memfd) => session.register_memfd(memfd, device).await?,
        })
    }
}

impl std::ops::Deref for HostBuffer {
    type Target = SharedBytes;
    fn deref(&self) -> &SharedBytes {
        match self {
            HostBuffer::Shm(shm) => shm,
            HostBuffer::Memfd(memfd) => memfd,
        }
    }
}

impl std::ops::DerefMut for HostBuffer {
    fn deref_mut(&mut self) -> &mut SharedBytes {
        match self {
            HostBuffer::Shm(shm) => shm,
            HostBuffer::Memfd(memfd) => memfd,
        }
    }
}

/// Why a client command failed.
#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error("cannot connect to {target}")]
    Connect {
        target: String,
        #[source]
        source: ptxd_client::Error,
    },
    #[error(transparent)]
    Sdk(#[from] ptxd_client::Error),
    #[error(transparent)]
    Shm(#[from] ptxd_client::ShmError),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    NotServing(String),
    /// A measurement's own check failed (wrong sums, a load that should
    /// have hit the cache did not).
    #[error("{0}")]
    Check(String),
}

impl CliError {
    /// The REASON printed before the message.
    fn reason(&self) -> &'static str {
        match self {
            CliError::Connect { source, .. } | CliError::Sdk(source) => source.reason_name(),
            CliError::Shm(_) => "SHM",
            CliError::Io { .. } => "IO",
            CliError::Usage(_) => "USAGE",
            CliError::NotServing(_) => "NOT_SERVING",
            CliError::Check(_) => "CHECK_FAILED",
        }
    }

    /// One line: the error and its causes; a refusal's own Display already
    /// starts with its reason, which is not repeated.
    fn line(&self) -> String {
        let mut text = match self {
            CliError::Sdk(ptxd_client::Error::Refused(refusal)) => return refusal.to_string(),
            other => format!("{}: {other}", other.reason()),
        };
        let mut source = std::error::Error::source(self);
        while let Some(cause) = source {
            // Some causes repeat their own source in their message.
            let cause_text = cause.to_string();
            if !text.ends_with(&cause_text) {
                text.push_str(": ");
                text.push_str(&cause_text);
            }
            source = cause.source();
        }
        text
    }
}

/// Runs a client subcommand; prints `REASON: message` and returns a failure
/// code on any error.
pub async fn run(opts: ClientOpts, cmd: ClientCommand) -> ExitCode {
    match execute(&opts, cmd).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{}", error.line());
            ExitCode::FAILURE
        }
    }
}

async fn execute(opts: &ClientOpts, cmd: ClientCommand) -> Result<(), CliError> {
    let client = connect(opts).await?;
    match cmd {
        ClientCommand::Info => info(&client).await,
        ClientCommand::Kernels => kernels(&client).await,
        ClientCommand::Buffers => buffers(&client).await,
        ClientCommand::Load(args) => load(&client, args).await,
        ClientCommand::Launch(args) => launch(&client, args).await,
        ClientCommand::Health(args) => health(&client, args).await,
        ClientCommand::Bench(args) => bench::bench(&client, args).await,
    }
}

/// Arguments of `ptxd health`.
#[derive(Debug, Clone, clap::Args)]
pub struct HealthArgs {
    /// The service to check: empty for the daemon as a whole, or
    /// `ptxd.v1.Ptxd` (NOT_SERVING while any device's executor is down).
    #[arg(long, default_value = "")]
    pub service: String,
}

/// `grpc.health.v1.Health/Check`: exit 0 when SERVING, non-zero otherwise
/// (a probe for systemd, Kubernetes exec probes and scripts).
async fn health(client: &Client, args: HealthArgs) -> Result<(), CliError> {
    use tonic_health::pb::{
        health_check_response::ServingStatus, health_client::HealthClient, HealthCheckRequest,
    };
    let response = HealthClient::new(client.channel())
        .check(HealthCheckRequest {
            service: args.service.clone(),
        })
        .await
        .map_err(|status| {
            CliError::NotServing(format!("{:?}: {}", status.code(), status.message()))
        })?;
    let status =
        ServingStatus::try_from(response.into_inner().status).unwrap_or(ServingStatus::Unknown);
    let name = if args.service.is_empty() {
        "ptxd"
    } else {
        args.service.as_str()
    };
    if status == ServingStatus::Serving {
        println!("{name}: SERVING");
        Ok(())
    } else {
        Err(CliError::NotServing(format!(
            "{name}: {}",
            status.as_str_name()
        )))
    }
}

async fn connect(opts: &ClientOpts) -> Result<Client, CliError> {
    let (target, connected) = match (&opts.tcp, &opts.socket) {
        (Some(tcp), _) => (tcp.clone(), Client::connect(tcp).await),
        (None, socket) => {
            // An explicit path is the user's choice; the default one's
            // directory must be safe to trust.
            let path = match socket {
                Some(path) => path.clone(),
                None => {
                    ptxd_client::checked_default_socket_path().map_err(ptxd_client::Error::from)?
                }
            };
            let target = format!("unix:{}", path.display());
            (target, Client::connect_unix(path).await)
        }
    };
    connected.map_err(|source| CliError::Connect { target, source })
}

async fn info(client: &Client) -> Result<(), CliError> {
    let info = client.info().await?;
    println!(
        "ptxd {} (backend {}, boot {})",
        info.version, info.backend, info.boot_id
    );
    println!(
        "sessions {}, slots {} of {} in use",
        info.sessions, info.slots_used, info.limits.slots
    );
    println!("devices:");
    if info.devices.is_empty() {
        println!("  (none)");
    }
    for d in &info.devices {
        println!(
            "  {:>2}  {}  {}  sm_{}{}  generation {}  memory {} B  {}  restarts {}",
            d.ordinal,
            d.uuid,
            d.name,
            d.compute_major,
            d.compute_minor,
            d.generation,
            d.total_memory,
            if d.available {
                "available"
            } else {
                "unavailable"
            },
            d.restarts
        );
    }
    let l = info.limits;
    println!(
        "limits: slots {}, max_artifact_bytes {}, max_request_bytes {}, max_sessions {}, \
         per session: buffers {}, kernels {}, buffer_bytes {}, events {}",
        l.slots,
        l.max_artifact_bytes,
        l.max_request_bytes,
        l.max_sessions,
        l.max_buffers_per_session,
        l.max_kernels_per_session,
        l.max_buffer_bytes_per_session,
        l.max_events_per_session
    );
    Ok(())
}

async fn kernels(client: &Client) -> Result<(), CliError> {
    let session = client.open_session("ptxd kernels").await?;
    let kernels = session.list_kernels().await?;
    if kernels.is_empty() {
        println!("(no kernels: this is a fresh session; sessions are private to their client)");
    }
    for k in &kernels {
        println!(
            "{}  {}  {}  generation {}  {}  refs {}  {}",
            k.handle,
            k.symbol,
            k.device_uuid,
            k.generation,
            if k.live { "live" } else { "stale" },
            k.references,
            k.label
        );
    }
    session.close().await?;
    Ok(())
}

async fn buffers(client: &Client) -> Result<(), CliError> {
    let session = client.open_session("ptxd buffers").await?;
    let buffers = session.list_buffers().await?;
    if buffers.is_empty() {
        println!("(no buffers: this is a fresh session; sessions are private to their client)");
    }
    for b in &buffers {
        println!(
            "{}  {}  {}  {} B  generation {}  {}  {}",
            b.handle,
            b.kind,
            b.device_uuid,
            b.size,
            b.generation,
            if b.live { "live" } else { "stale" },
            b.label
        );
    }
    session.close().await?;
    Ok(())
}

fn read_file(path: &Path) -> Result<Vec<u8>, CliError> {
    std::fs::read(path).map_err(|source| CliError::Io {
        path: path.to_owned(),
        source,
    })
}

/// The artifact in `path`, by its extension: `.cubin`, `.fatbin`, else PTX.
fn artifact_of(path: &Path, bytes: Vec<u8>) -> Result<Artifact, CliError> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("cubin") => Ok(Artifact::Cubin(bytes)),
        Some("fatbin") => Ok(Artifact::Fatbin(bytes)),
        _ => String::from_utf8(bytes).map(Artifact::Ptx).map_err(|_| {
            CliError::Usage(format!(
                "{} is not UTF-8 PTX (name a cubin or fatbin by its extension)",
                path.display()
            ))
        }),
    }
}

fn device_of(text: &str) -> Result<DeviceSelector, CliError> {
    Ok(text.parse::<DeviceSelector>()?)
}

fn print_kernel(kernel: &Kernel) {
    let state = kernel.state();
    let s = &state.signature;
    println!("kernel     {}", state.handle);
    println!("symbol     {}", kernel.symbol());
    println!(
        "device     {} (generation {})",
        state.device_uuid, state.generation
    );
    println!(
        "signature  {} inputs, element sizes {:?} B, {} scalar params, block {}",
        s.inputs, s.element_sizes, s.scalar_params, s.block_size
    );
    // Each scalar's kind (f32, or a Strided kernel's u64 shapes) is in the
    // contract's params.
    println!("contract   {}", s.contract);
    println!("cache_hit  {}", state.cache_hit);
    println!("load_time  {} us", state.load_micros);
}

async fn load(client: &Client, args: LoadArgs) -> Result<(), CliError> {
    let artifact = artifact_of(&args.file, read_file(&args.file)?)?;
    let declared = args.inputs.map(|inputs| DeclaredAbi {
        inputs,
        scalar_params: args.params.unwrap_or(0),
        element_size: args.element_size.unwrap_or(0),
    });
    let options = LoadOptions {
        label: args.file.display().to_string(),
        declared,
    };
    let session = client.open_session("ptxd load").await?;
    let kernel = session
        .load(device_of(&args.device)?, artifact, &args.symbol, options)
        .await?;
    print_kernel(&kernel);
    println!("(the handle ends with this command's session)");
    session.close().await?;
    Ok(())
}

/// A quiet NaN with a payload no arithmetic produces: an output element
/// still holding it after the launch was never written.
const POISON: f32 = f32::from_bits(0x7fc0_0bad);

async fn launch(client: &Client, args: LaunchArgs) -> Result<(), CliError> {
    let LaunchArgs {
        file,
        symbol,
        n,
        params,
        device,
        seed,
        show,
        memfd,
    } = args;
    let ptx = String::from_utf8(read_file(&file)?)
        .map_err(|_| CliError::Usage(format!("{} is not UTF-8 PTX", file.display())))?;
    let elements = usize::try_from(n)
        .ok()
        .filter(|n| n.checked_mul(4).is_some() && *n > 0)
        .ok_or_else(|| CliError::Usage(format!("--n {n} must be between 1 and usize::MAX / 4")))?;
    let bytes = elements as u64 * 4;

    let session = client.open_session("ptxd launch").await?;
    let kernel = session
        .load_ptx(device_of(&device)?, ptx, &symbol, LoadOptions::default())
        .await?;
    print_kernel(&kernel);
    let state = kernel.state();
    if state.signature.element_sizes.iter().any(|size| *size != 4) {
        return Err(CliError::Usage(format!(
            "`ptxd launch` runs f32 kernels only; {symbol} has element sizes {:?}",
            state.signature.element_sizes
        )));
    }

    let seed = seed.unwrap_or_else(|| rand::rng().random());
    println!("inputs     seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut inputs: Vec<(HostBuffer, Vec<f32>)> = Vec::new();
    for _ in 0..state.signature.inputs {
        let values: Vec<f32> = (0..elements)
            .map(|_| rng.random_range(-100.0f32..100.0))
            .collect();
        let mut buffer = HostBuffer::create(bytes, memfd)?;
        buffer.write_f32(0, &values)?;
        inputs.push((buffer, values));
    }
    let mut output = HostBuffer::create(bytes, memfd)?;
    output.write_f32(0, &vec![POISON; elements])?;

    let device_uuid = Some(state.device_uuid.as_str());
    let mut input_buffers: Vec<Buffer> = Vec::new();
    for (buffer, _) in &inputs {
        input_buffers.push(buffer.register(&session, device_uuid).await?);
    }
    let output_buffer = output.register(&session, device_uuid).await?;

    let request = Launch::new(
        input_buffers.iter().map(Buffer::operand),
        output_buffer.operand(),
        n,
    )
    .params(params)
    .sync(true);
    let launched = session.launch(&kernel, &request).await?;
    println!("launched   {n} elements in {} us", launched.micros);

    let shown = elements.min(show);
    for (i, (_, values)) in inputs.iter().enumerate() {
        println!("in{i}[..{shown}]  {:?}", &values[..shown]);
    }
    let out = output.read_f32(0, elements)?;
    println!("out[..{shown}]  {:?}", &out[..shown]);
    let unwritten = out
        .iter()
        .filter(|v| v.to_bits() == POISON.to_bits())
        .count();
    println!("unwritten  {unwritten} of {elements} output elements");
    session.close().await?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        opts: ClientOpts,
        #[command(subcommand)]
        cmd: ClientCommand,
    }

    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn launch_arguments_parse() {
        let cli = Cli::try_parse_from([
            "ptxd",
            "--tcp",
            "127.0.0.1:1",
            "launch",
            "k.ptx",
            "--symbol",
            "affine",
            "--n",
            "10",
            "--params",
            "2.5,-1",
        ])
        .unwrap();
        assert_eq!(cli.opts.tcp.as_deref(), Some("127.0.0.1:1"));
        let ClientCommand::Launch(args) = cli.cmd else {
            unreachable!("parsed as another command")
        };
        assert_eq!(args.params, vec![2.5, -1.0]);
        assert_eq!(args.n, 10);
        assert_eq!(args.device, "0");
    }

    #[test]
    fn declared_counts_come_in_pairs() {
        let half = Cli::try_parse_from(["ptxd", "load", "k.ptx", "--symbol", "s", "--inputs", "2"]);
        assert!(half.is_err());
        let both = Cli::try_parse_from([
            "ptxd", "load", "k.ptx", "--symbol", "s", "--inputs", "2", "--params", "0",
        ]);
        assert!(both.is_ok());
    }

    #[test]
    fn artifacts_are_chosen_by_extension() {
        let ptx = artifact_of(Path::new("a.ptx"), b".version 8.0".to_vec()).unwrap();
        assert_eq!(ptx, Artifact::Ptx(".version 8.0".into()));
        let cubin = artifact_of(Path::new("a.cubin"), vec![0x7f, b'E']).unwrap();
        assert_eq!(cubin, Artifact::Cubin(vec![0x7f, b'E']));
        assert!(matches!(
            artifact_of(Path::new("a.ptx"), vec![0xff, 0xfe]),
            Err(CliError::Usage(_))
        ));
    }

    #[tokio::test]
    async fn a_missing_daemon_prints_one_transport_line() {
        let dir = tempfile::tempdir().unwrap();
        let opts = ClientOpts {
            socket: Some(dir.path().join("none.sock")),
            tcp: None,
        };
        let error = execute(&opts, ClientCommand::Info).await.unwrap_err();
        let line = error.line();
        assert!(
            line.starts_with("TRANSPORT: cannot connect to unix:"),
            "{line}"
        );
        assert!(line.contains("No such file"), "{line}");
        assert!(!line.contains('\n'));
        assert_eq!(line.matches("No such file").count(), 1, "{line}");
    }
}
