//! TEMPORARY wiring of the executor subcommands (branch `cuda`), so the GPU
//! tests can spawn `ptxd executor --backend cuda --device UUID` and
//! `ptxd executor --backend cuda --probe` before the real CLI lands on main.
//! The lead's clap-based binary replaces this file.

use ptxd::executor::child::serve_stdio;
use ptxd::executor::protocol::write_frame;
use ptxd_proto::executor::{executor_message::Body, ExecutorMessage, Hello};

fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

fn main() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match (args.first().map(String::as_str), flag(&args, "--backend")) {
        (Some("executor"), Some("cuda")) if args.iter().any(|a| a == "--probe") => {
            match ptxd::executor::cuda::probe() {
                Ok(devices) => {
                    let hello = ExecutorMessage {
                        body: Some(Body::Hello(Hello {
                            backend: "cuda".into(),
                            devices,
                            pid: std::process::id(),
                        })),
                    };
                    match write_frame(&mut std::io::stdout().lock(), &hello) {
                        Ok(()) => 0,
                        Err(e) => {
                            eprintln!("ptxd: {e}");
                            1
                        }
                    }
                }
                Err(e) => {
                    eprintln!("ptxd: no CUDA: {e}");
                    2
                }
            }
        }
        (Some("executor"), Some("cuda")) => match flag(&args, "--device") {
            Some(uuid) => ptxd::executor::cuda::run_executor(uuid),
            None => {
                eprintln!("ptxd executor --backend cuda needs --device UUID or --probe");
                2
            }
        },
        (Some("executor"), Some("host")) => {
            let mut backend = ptxd::executor::host::HostBackend::new(0, 1, true);
            serve_stdio(&mut backend)
        }
        _ => {
            eprintln!("usage: ptxd executor --backend cuda|host [--device UUID | --probe]");
            2
        }
    };
    std::process::exit(code)
}
