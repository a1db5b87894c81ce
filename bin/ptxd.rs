//! The `ptxd` binary: the daemon (`ptxd serve`), its executor children
//! (`ptxd executor`, internal) and client commands for manual use.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ptxd::cli::{
    BenchArgs, ClientCommand, ClientOpts, DevicePluginArgs, HealthArgs, LaunchArgs, LoadArgs,
};
use ptxd::config::{LogFormat, ServeConfig};
use ptxd::executor::child::{ExecutorArgs, ExecutorBackend};

#[derive(Debug, Parser)]
#[command(
    name = "ptxd",
    version,
    about = "Out-of-process CUDA kernel-loader daemon"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the daemon.
    Serve(Box<ServeConfig>),
    /// Internal: run one executor child (spawned by `ptxd serve`, with a
    /// command line from `ExecutorArgs::to_args`).
    #[command(name = ExecutorArgs::SUBCOMMAND, hide = true)]
    Executor(ExecutorArgs),
    /// Print the daemon's version, backend, devices, slot usage and limits.
    Info {
        #[command(flatten)]
        opts: ClientOpts,
    },
    /// List the kernels of a fresh session (always empty: sessions are
    /// private and end when the command exits; checks that sessions work).
    Kernels {
        #[command(flatten)]
        opts: ClientOpts,
    },
    /// List the buffers of a fresh session (always empty, as `kernels`).
    Buffers {
        #[command(flatten)]
        opts: ClientOpts,
    },
    /// Load a kernel (.ptx, .cubin or .fatbin) and print its handle,
    /// signature, cache hit and load time. The handle ends with the command.
    Load {
        #[command(flatten)]
        opts: ClientOpts,
        #[command(flatten)]
        args: LoadArgs,
    },
    /// Check grpc.health.v1 and exit 0 when SERVING (for probes).
    Health {
        #[command(flatten)]
        opts: ClientOpts,
        #[command(flatten)]
        args: HealthArgs,
    },
    /// Run an f32 kernel once on the host backend over random shared-memory
    /// inputs and print the first elements of every operand.
    Launch {
        #[command(flatten)]
        opts: ClientOpts,
        #[command(flatten)]
        args: LaunchArgs,
    },
    /// Measure the running daemon as a session sees it: unary Launch round
    /// trip (p50, p99), LaunchStream per-launch cost, the launch ring's
    /// round trip and throughput, and a cache-hit LoadKernel, on the
    /// daemon's backend; a table, or one JSON object
    /// with --json. On the CUDA backend it needs the cuda-bench feature.
    Bench {
        #[command(flatten)]
        opts: ClientOpts,
        #[command(flatten)]
        args: BenchArgs,
    },
    /// Run a Kubernetes device plugin beside ptxd: advertise --count devices
    /// of --resource (ptxd.dev/session), healthy while ptxd serves, and mount
    /// ptxd's socket directory into the containers that request one.
    DevicePlugin(DevicePluginArgs),
    /// Verify a PTX file offline, as LoadKernel would (no daemon needed):
    /// print the signature, or the refusal with its sub_reason and line;
    /// with --print, the canonical PTX ptxd would compile. Exit 0 when
    /// accepted, 1 when refused.
    Verify {
        /// The PTX file.
        file: std::path::PathBuf,
        /// The entry to verify.
        #[arg(long)]
        symbol: String,
        /// Print the canonical text instead of the signature.
        #[arg(long)]
        print: bool,
    },
}

fn verify_file(file: &std::path::Path, symbol: &str, print: bool) -> ExitCode {
    let text = match std::fs::read(file) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) => {
            eprintln!("ptxd verify: {}: {e}", file.display());
            return ExitCode::from(2);
        }
    };
    use std::fmt::Write as _;
    let mut out = String::new();
    let code = match ptxd::ptx::canonicalize(&text, symbol, None) {
        Ok(canonical) if print => {
            out = canonical.text;
            ExitCode::SUCCESS
        }
        Ok(canonical) => {
            let s = canonical.signature;
            let _ = writeln!(
                out,
                "accepted: {symbol}: {} inputs, element sizes {:?}, {}{}{}",
                s.inputs,
                s.element_sizes,
                scalars_shown(&canonical.contract),
                s.reqntid
                    .map(|r| format!(", .reqntid {r}"))
                    .unwrap_or_default(),
                s.maxntid
                    .map(|m| format!(", .maxntid {m}"))
                    .unwrap_or_default(),
            );
            let _ = writeln!(out, "contract: {}", canonical.contract);
            ExitCode::SUCCESS
        }
        Err(e) => {
            let _ = writeln!(out, "refused: {e}");
            for (k, v) in e.metadata() {
                let _ = writeln!(out, "  {k}: {v}");
            }
            ExitCode::FAILURE
        }
    };
    // A reader that stopped early (`| head -1`) is no failure of the
    // verdict: `print!` would panic on the closed pipe.
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            eprintln!("ptxd verify: writing the verdict: {e}");
            ExitCode::from(2)
        }
        _ => code,
    }
}

/// The kernel's by-value scalar params by their kinds, in order
/// (`2 scalar params: f32 scale, f32 shift`; the Strided family's shapes
/// and strides are `u64`, not floats).
fn scalars_shown(contract: &ptxd::ptx::contract::LaunchContract) -> String {
    use ptxd::ptx::contract::ParamKind;
    let scalars: Vec<String> = contract
        .params
        .iter()
        .filter_map(|p| match p.kind {
            ParamKind::Scalar(ty) => Some(format!("{} {}", ty.as_str(), p.name)),
            _ => None,
        })
        .collect();
    match scalars.len() {
        0 => "no scalar params".to_string(),
        1 => format!("1 scalar param: {}", scalars.join("")),
        k => format!("{k} scalar params: {}", scalars.join(", ")),
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour codes only on a terminal: a log file or the journal gets plain
    // text, so an escape sequence in a log is never ptxd's own.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

fn run_executor(args: ExecutorArgs) -> ExitCode {
    // The executor's stdout is its channel to the front: logs go to stderr.
    let format = match std::env::var("PTXD_LOG_FORMAT").as_deref() {
        Ok("json") => LogFormat::Json,
        _ => LogFormat::Text,
    };
    init_logging(format);
    ptxd::executor::child::ignore_termination_signals();
    args.install_spin_bound();
    let budget = (args.max_kernel_time_ms > 0)
        .then(|| std::time::Duration::from_millis(args.max_kernel_time_ms));
    let spin = args.channel_spin();
    let fd_inbox = if args.fd_inbox {
        ptxd::executor::fd_inbox::FdInbox::inherited()
    } else {
        None
    };
    let kernel_cache = args.kernel_cache();
    let code = match (args.backend, args.probe, args.device) {
        (ExecutorBackend::Host, _, _) => {
            match ptxd::executor::host::HostBackend::new(
                args.index,
                args.threads,
                args.checked,
                budget,
                fd_inbox,
            ) {
                Ok(mut backend) => ptxd::executor::child::serve_stdio(&mut backend, spin),
                Err(e) => {
                    tracing::error!(error = %e, "cannot install the SIGBUS handler");
                    2
                }
            }
        }
        (ExecutorBackend::Cuda, true, _) => ptxd::executor::cuda::probe_stdio(),
        (ExecutorBackend::Cuda, false, Some(uuid)) => {
            ptxd::executor::cuda::run_executor(&uuid, budget, fd_inbox, spin, kernel_cache)
        }
        (ExecutorBackend::Cuda, false, None) => {
            eprintln!("ptxd executor --backend cuda needs --device UUID or --probe");
            2
        }
    };
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// Which async runtime a command runs on.
#[derive(Debug, Clone, Copy)]
enum Flavor {
    /// The daemon: one worker per core, so sessions are served in parallel.
    Daemon,
    /// A client command: one session's calls, one after another. On one
    /// thread the SDK's tasks (the connection's, the lane's) and the caller
    /// wake each other without crossing threads; `ptxd bench` measured a
    /// unary launch's round trip shorter so (BENCHMARKS.md).
    Client,
}

fn runtime(flavor: Flavor) -> Option<tokio::runtime::Runtime> {
    let mut builder = match flavor {
        Flavor::Daemon => tokio::runtime::Builder::new_multi_thread(),
        Flavor::Client => tokio::runtime::Builder::new_current_thread(),
    };
    match builder.enable_all().build() {
        Ok(runtime) => Some(runtime),
        Err(e) => {
            eprintln!("ptxd: cannot start the async runtime: {e}");
            None
        }
    }
}

fn serve(config: ServeConfig) -> ExitCode {
    init_logging(config.log_format);
    // Before any other thread exists: this removes LISTEN_* from the
    // environment so executor children never see them.
    let activated = match ptxd::activation::take_activated_unix_listener() {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("ptxd: socket activation: {e}");
            return ExitCode::FAILURE;
        }
    };
    let Some(runtime) = runtime(Flavor::Daemon) else {
        return ExitCode::FAILURE;
    };
    match runtime.block_on(ptxd::server::serve(config, activated)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "ptxd failed");
            eprintln!("ptxd: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (opts, command) = match cli.command {
        Command::Executor(args) => return run_executor(args),
        Command::Serve(config) => return serve(*config),
        Command::DevicePlugin(args) => {
            return match runtime(Flavor::Client) {
                Some(runtime) => runtime.block_on(ptxd::cli::device_plugin::run(args)),
                None => ExitCode::FAILURE,
            }
        }
        Command::Info { opts } => (opts, ClientCommand::Info),
        Command::Kernels { opts } => (opts, ClientCommand::Kernels),
        Command::Buffers { opts } => (opts, ClientCommand::Buffers),
        Command::Load { opts, args } => (opts, ClientCommand::Load(args)),
        Command::Launch { opts, args } => (opts, ClientCommand::Launch(args)),
        Command::Health { opts, args } => (opts, ClientCommand::Health(args)),
        Command::Bench { opts, args } => (opts, ClientCommand::Bench(args)),
        Command::Verify {
            file,
            symbol,
            print,
        } => return verify_file(&file, &symbol, print),
    };
    match runtime(Flavor::Client) {
        Some(runtime) => runtime.block_on(ptxd::cli::run(opts, command)),
        None => ExitCode::FAILURE,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    /// The command lines the daemon spawns its executors with are ones this
    /// binary parses back to the same values.
    #[test]
    fn executor_command_lines_parse_back_to_their_values() {
        let budget = Some(std::time::Duration::from_millis(1500));
        for args in [
            ExecutorArgs::host(0, 1, true),
            ExecutorArgs::host(3, 16, false).with_max_kernel_time(budget),
            ExecutorArgs::cuda("GPU-8d3f0c7e-1b2a-4c5d-9e8f-0a1b2c3d4e5f"),
            ExecutorArgs::cuda("GPU-0").with_max_kernel_time(budget),
            ExecutorArgs::cuda_probe(),
        ] {
            let argv = std::iter::once("ptxd".to_owned()).chain(args.to_args());
            match Cli::try_parse_from(argv).unwrap().command {
                Command::Executor(parsed) => assert_eq!(parsed, args),
                other => panic!("{:?} parsed as {other:?}", args.to_args()),
            }
        }
    }
}
