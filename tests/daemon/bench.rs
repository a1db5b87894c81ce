//! `ptxd bench` against a real host-backend daemon: one JSON object whose
//! figures are all there, numeric and positive, p50 ≤ p99.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support::Daemon;

/// Every figure `ptxd bench` measures today.
const FIGURES: [&str; 11] = [
    "unary_p50_us",
    "unary_p99_us",
    "unary_daemon_p50_us",
    "unary_http2_p50_us",
    "unary_http2_p99_us",
    "stream_per_launch_us",
    "load_hit_p50_us",
    "load_hit_16k_p50_us",
    "ring_p50_us",
    "ring_p99_us",
    "ring_launches_per_s",
];

#[test]
fn bench_json_reports_every_figure() {
    let daemon = Daemon::start(&[]);
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ptxd"))
        .args(["bench", "--json", "--iterations", "200", "--socket"])
        .arg(&daemon.socket)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "ptxd bench failed: {}\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report["backend"], "host", "{report}");
    assert_eq!(report["iterations"], 200, "{report}");
    for key in FIGURES {
        let value = report[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key} is missing or not a number: {report}"));
        assert!(value > 0.0, "{key} = {value}: {report}");
    }
    let (p50, p99) = (
        report["unary_p50_us"].as_f64().unwrap(),
        report["unary_p99_us"].as_f64().unwrap(),
    );
    assert!(p50 <= p99, "unary p50 {p50} > p99 {p99}: {report}");
    let (p50, p99) = (
        report["ring_p50_us"].as_f64().unwrap(),
        report["ring_p99_us"].as_f64().unwrap(),
    );
    assert!(p50 <= p99, "ring p50 {p50} > p99 {p99}: {report}");
}

#[test]
fn bench_table_names_the_figures() {
    let daemon = Daemon::start(&[]);
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ptxd"))
        .args(["bench", "--iterations", "20", "--n", "64", "--socket"])
        .arg(&daemon.socket)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    for key in FIGURES {
        assert!(
            stdout.contains(key),
            "{key} missing from the table:\n{stdout}"
        );
    }
}
