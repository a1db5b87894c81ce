//! The `ptxd` binary: the daemon (`ptxd serve`), its executor children
//! (`ptxd executor`, internal) and client commands for manual use.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ptxd::config::{LogFormat, ServeConfig};

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
    Serve(ServeConfig),
    /// Internal: run one executor child (spawned by `ptxd serve`).
    #[command(hide = true)]
    Executor(ExecutorArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ExecutorBackend {
    Host,
    Cuda,
}

#[derive(Debug, clap::Args)]
struct ExecutorArgs {
    #[arg(long, value_enum)]
    backend: ExecutorBackend,
    /// Host device index.
    #[arg(long, default_value_t = 0)]
    index: u32,
    /// Host threads per launch.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Host checked mode.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    checked: bool,
    /// CUDA device UUID.
    #[arg(long)]
    device: Option<String>,
    /// Report every CUDA device in a Hello frame and exit.
    #[arg(long)]
    probe: bool,
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
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
    let code = match (args.backend, args.probe, args.device) {
        (ExecutorBackend::Host, _, _) => {
            let mut backend =
                ptxd::executor::host::HostBackend::new(args.index, args.threads, args.checked);
            ptxd::executor::child::serve_stdio(&mut backend)
        }
        (ExecutorBackend::Cuda, true, _) => ptxd::executor::cuda::probe_stdio(),
        (ExecutorBackend::Cuda, false, Some(uuid)) => ptxd::executor::cuda::run_executor(&uuid),
        (ExecutorBackend::Cuda, false, None) => {
            eprintln!("ptxd executor --backend cuda needs --device UUID or --probe");
            2
        }
    };
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Executor(args) => run_executor(args),
        Command::Serve(config) => {
            init_logging(config.log_format);
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("ptxd: cannot start the async runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(ptxd::server::serve(config)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, "ptxd failed");
                    eprintln!("ptxd: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
