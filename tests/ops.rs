//! Operations, checked by the real tools: a scrape of the working daemon by
//! `promtool`, the systemd units by `systemd-analyze` and under
//! `systemd-socket-activate`, the Kubernetes manifests by
//! `kubernetes-validate`, the Dockerfile by `hadolint`, and every command line
//! the deploy files hold by the `ptxd` binary itself.
//!
//! Every external tool is required: a missing one fails the test with the
//! command that installs it (`bash deploy/ci-tools.sh`), it never skips.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

/// `ptxd device-plugin` against a fake kubelet.
#[path = "ops/device_plugin.rs"]
mod device_plugin;
#[path = "ops/exposition.rs"]
mod exposition;
#[path = "ops/promql.rs"]
mod promql;
mod support;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use exposition::Exposition;
use ptxd::metrics::Metrics;
use ptxd_client::{Client, HostShm, Launch, LoadOptions};
use rand::Rng;
use support::{corpus, random_f32, Daemon};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const PTXD: &str = env!("CARGO_BIN_EXE_ptxd");

fn deploy(path: &str) -> PathBuf {
    Path::new(ROOT).join("deploy").join(path)
}

/// The path of a required tool, or a failure that says how to install it.
fn tool(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join(name);
        if candidate
            .metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        {
            return candidate;
        }
    }
    panic!(
        "{name} is not installed, and this test needs it: run `bash deploy/ci-tools.sh` \
         (installs promtool, systemd-analyze, systemd-socket-activate, kubernetes-validate, hadolint)"
    );
}

fn text(output: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn run(command: &mut Command) -> Output {
    command
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"))
}

// ----- metrics ----------------------------------------------------------------

/// `promtool check metrics` on `exposition`: exit 0 and not a word of lint.
fn promtool_check(exposition: &str) {
    let mut child = Command::new(tool("promtool"))
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(exposition.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success() && output.stdout.is_empty() && output.stderr.is_empty(),
        "promtool check metrics: {}\n--- exposition ---\n{exposition}",
        text(&output)
    );
}

#[test]
fn promtool_rejects_what_it_should() {
    // The check below is only worth something if promtool does complain.
    let mut child = Command::new(tool("promtool"))
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"# HELP ptxd_loads x\n# TYPE ptxd_loads counter\nptxd_loads 1\n")
        .unwrap();
    assert!(!child.wait_with_output().unwrap().status.success());
}

#[test]
fn every_series_passes_promtool_with_values_in_it() {
    let mut rng = rand::rng();
    let metrics = Metrics::new(rng.random_range(1..100_000));
    for _ in 0..rng.random_range(10..100) {
        metrics.record_load(
            rng.random_bool(0.5),
            Duration::from_micros(rng.random_range(1..3_000_000)),
        );
        metrics.record_launch(
            rng.random_bool(0.5),
            Duration::from_nanos(rng.random_range(1..2_000_000_000)),
        );
    }
    for reason in ["STALE_KERNEL", "KERNEL_FAULT", "DRAINING"] {
        metrics.record_refusal(reason);
    }
    metrics.set_sessions(3);
    metrics.set_buffers(12, 3 << 30);
    metrics.set_slots_used(7);
    for device in ["GPU-8f0c2d1e-0000-1111-2222-333344445555", "HOST-0"] {
        metrics.set_generation(device, rng.random());
        metrics.record_executor_restart(device);
        metrics.record_kernel_fault(device);
    }
    let rendered = metrics.render();
    promtool_check(&rendered);
    Exposition::parse(&rendered).unwrap();
}

/// One scrape of `/metrics`: checks the status and content type, runs
/// promtool on the body and returns it parsed.
async fn scrape(port: u16) -> Exposition {
    let (head, body) = support::get_metrics(port).await;
    assert!(
        head.to_ascii_lowercase()
            .contains("\r\ncontent-type: text/plain; version=0.0.4"),
        "{head}"
    );
    promtool_check(&body);
    Exposition::parse(&body).unwrap_or_else(|e| panic!("{e}\n{body}"))
}

/// The value of a series, 0 when it is absent.
fn value(scrape: &Exposition, name: &str, labels: &[(&str, &str)]) -> f64 {
    scrape.value(name, labels).unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_of_the_working_daemon_passes_promtool_and_counts_the_work() {
    let port = support::free_port();
    let metrics_addr = format!("127.0.0.1:{port}");
    let daemon = Daemon::start(&["--metrics", &metrics_addr, "--slots", "64"]);
    support::wait_for_port(port);

    let before = scrape(port).await;
    assert_eq!(before.value("ptxd_slots_capacity", &[]), Some(64.0));
    assert_eq!(before.value("ptxd_sessions", &[]), Some(0.0));

    let client = Client::connect_unix(&daemon.socket).await.unwrap();
    let info = client.info().await.unwrap();
    let session = client.open_session("ops-metrics").await.unwrap();

    let mut rng = rand::rng();
    let n: usize = rng.random_range(1000..5000);
    let (mut a, mut b, out) = (
        HostShm::create(n as u64 * 4).unwrap(),
        HostShm::create(n as u64 * 4).unwrap(),
        HostShm::create(n as u64 * 4).unwrap(),
    );
    let (a_values, b_values) = (random_f32(n), random_f32(n));
    a.write_f32(0, &a_values).unwrap();
    b.write_f32(0, &b_values).unwrap();
    let a_buf = session.register_shm(&a, None).await.unwrap();
    let b_buf = session.register_shm(&b, None).await.unwrap();
    let out_buf = session.register_shm(&out, None).await.unwrap();
    let registered_bytes = a.size() + b.size() + out.size();

    // Loads: the same PTX twice (compiled once: a miss, then a hit).
    let ptx = corpus("add_f32_scalar.ptx");
    let mut loads = BTreeMap::from([("hit", 0u64), ("miss", 0u64)]);
    let mut kernels = Vec::new();
    for _ in 0..2 {
        let kernel = session
            .load_ptx(0u32, ptx.clone(), "add_f32_scalar", LoadOptions::default())
            .await
            .unwrap();
        *loads
            .get_mut(if kernel.state().cache_hit {
                "hit"
            } else {
                "miss"
            })
            .unwrap() += 1;
        kernels.push(kernel);
    }
    assert_eq!(
        loads,
        BTreeMap::from([("hit", 1), ("miss", 1)]),
        "compile once per content"
    );

    // Launches: some async, then some sync (which also orders after them).
    let launch = Launch::new(
        [a_buf.operand(), b_buf.operand()],
        out_buf.operand(),
        n as u64,
    );
    // Different counts, so a mode mix-up cannot go unnoticed.
    let async_launches = rng.random_range(2..9u64);
    let sync_launches = async_launches + rng.random_range(1..5u64);
    for i in 0..async_launches {
        let kernel = &kernels[i as usize % 2];
        session
            .launch(kernel, &launch.clone().sync(false))
            .await
            .unwrap();
    }
    for i in 0..sync_launches {
        let kernel = &kernels[i as usize % 2];
        session
            .launch(kernel, &launch.clone().sync(true))
            .await
            .unwrap();
    }
    let sums = out.read_f32(0, n).unwrap();
    for (i, sum) in sums.iter().enumerate() {
        assert_eq!(
            sum.to_bits(),
            (a_values[i] + b_values[i]).to_bits(),
            "element {i}"
        );
    }

    // Refusals: each reason exactly as often as the daemon said it.
    let mut refusals = BTreeMap::<&'static str, u64>::new();
    let too_long = Launch::new(
        [a_buf.operand(), b_buf.operand()],
        out_buf.operand(),
        n as u64 + 1,
    );
    let overruns = rng.random_range(1..4);
    for _ in 0..overruns {
        let error = session.launch(&kernels[0], &too_long).await.unwrap_err();
        *refusals
            .entry(error.refusal().expect("a refusal").wire_name())
            .or_default() += 1;
    }
    let refused = session
        .load_ptx(
            0u32,
            corpus("nvcc/refused-ptx/grid_stride.sm_90.ptx"),
            "grid_stride_scale_f32",
            LoadOptions::default(),
        )
        .await
        .unwrap_err();
    *refusals
        .entry(refused.refusal().expect("a refusal").wire_name())
        .or_default() += 1;
    assert_eq!(
        refusals.get("BUFFER_TOO_SMALL"),
        Some(&overruns),
        "{refusals:?}"
    );
    assert_eq!(refusals.values().sum::<u64>(), overruns + 1);

    let info_now = client.info().await.unwrap();
    let after = scrape(port).await;
    let delta = |name: &str, labels: &[(&str, &str)]| {
        value(&after, name, labels) - value(&before, name, labels)
    };
    for (cache, count) in &loads {
        assert_eq!(
            delta("ptxd_loads_total", &[("cache", cache)]),
            *count as f64,
            "loads {cache}"
        );
        assert_eq!(
            delta("ptxd_load_duration_seconds_count", &[("cache", cache)]),
            *count as f64
        );
    }
    for (mode, count) in [("async", async_launches), ("sync", sync_launches)] {
        assert_eq!(
            delta("ptxd_launches_total", &[("mode", mode)]),
            count as f64,
            "launches {mode}"
        );
        assert_eq!(
            delta(
                "ptxd_launch_duration_seconds_bucket",
                &[("mode", mode), ("le", "+Inf")]
            ),
            count as f64
        );
        assert!(delta("ptxd_launch_duration_seconds_sum", &[("mode", mode)]) > 0.0);
    }
    // Every reason: the refused ones by their count, all others unmoved.
    for sample in after
        .samples
        .iter()
        .filter(|s| s.name == "ptxd_refusals_total")
    {
        let reason = sample.labels[0].1.as_str();
        let expected = refusals.get(reason).copied().unwrap_or(0);
        assert_eq!(
            delta("ptxd_refusals_total", &[("reason", reason)]),
            expected as f64,
            "refusals {reason}"
        );
    }
    for reason in refusals.keys() {
        assert!(
            after
                .value("ptxd_refusals_total", &[("reason", reason)])
                .is_some(),
            "{reason}"
        );
    }
    assert_eq!(after.value("ptxd_sessions", &[]), Some(1.0));
    assert_eq!(after.value("ptxd_buffers", &[]), Some(3.0));
    assert_eq!(
        after.value("ptxd_buffer_bytes", &[]),
        Some(registered_bytes as f64)
    );
    assert_eq!(
        after.value("ptxd_slots_used", &[]),
        Some(f64::from(info_now.slots_used))
    );
    assert_eq!(info_now.slots_used, 1, "both loads share one slot");
    // Loaded artifact bytes: the one shared slot's artifact, as GetInfo
    // reports it, against the configured limit.
    assert!(info_now.loaded_bytes > 0);
    assert_eq!(
        after.value("ptxd_loaded_artifact_bytes", &[]),
        Some(info_now.loaded_bytes as f64)
    );
    assert_eq!(
        after.value("ptxd_loaded_artifact_bytes_limit", &[]),
        Some(info.limits.max_loaded_bytes as f64)
    );
    assert_eq!(
        after.value("ptxd_slots_capacity", &[]),
        Some(f64::from(info.limits.slots))
    );
    for device in &info_now.devices {
        let labels = [("device", device.uuid.as_str())];
        assert_eq!(
            after.value("ptxd_device_generation", &labels),
            Some(device.generation as f64)
        );
        assert_eq!(
            after.value("ptxd_executor_restarts_total", &labels),
            Some(device.restarts as f64)
        );
        assert_eq!(after.value("ptxd_kernel_faults_total", &labels), Some(0.0));
    }

    // Closing the session empties the gauges; counters stay.
    session.close().await.unwrap();
    let closed = scrape(port).await;
    assert_eq!(closed.value("ptxd_sessions", &[]), Some(0.0));
    assert_eq!(closed.value("ptxd_buffers", &[]), Some(0.0));
    assert_eq!(closed.value("ptxd_buffer_bytes", &[]), Some(0.0));
    assert_eq!(closed.value("ptxd_loaded_artifact_bytes", &[]), Some(0.0));
    assert_eq!(
        closed.value("ptxd_launches_total", &[("mode", "sync")]),
        after.value("ptxd_launches_total", &[("mode", "sync")])
    );
    drop(daemon);
}

/// Every refusal is counted once, under its reason, however it reaches the
/// client: as a unary call's status, inside an OK `LaunchStream` message
/// (the stream goes on), or as the status of a request refused while it
/// was still being read (the request budget, before any handler ran).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_is_counted_once_however_it_reaches_the_client() {
    let port = support::free_port();
    let metrics_addr = format!("127.0.0.1:{port}");
    let max_request_bytes = 1 << 20;
    let daemon = Daemon::start(&[
        "--metrics",
        &metrics_addr,
        "--max-request-bytes",
        &max_request_bytes.to_string(),
    ]);
    support::wait_for_port(port);
    let before = scrape(port).await;

    let client = Client::connect_unix(&daemon.socket).await.unwrap();
    let session = client.open_session("ops-refusals").await.unwrap();
    let n = 256u64;
    let (input, output, small) = (
        HostShm::create(n * 4).unwrap(),
        HostShm::create(n * 4).unwrap(),
        HostShm::create(4).unwrap(),
    );
    let input = session.register_shm(&input, None).await.unwrap();
    let output = session.register_shm(&output, None).await.unwrap();
    let small = session.register_shm(&small, None).await.unwrap();
    let kernel = session
        .load_ptx(
            0u32,
            corpus("add_f32_scalar.ptx"),
            "add_f32_scalar",
            LoadOptions::default(),
        )
        .await
        .unwrap();
    let fits = Launch::new([input.operand(), input.operand()], output.operand(), n);
    let overruns = Launch::new([input.operand(), input.operand()], small.operand(), n);

    let mut refused = BTreeMap::<&'static str, u64>::new();
    let unary = rand::rng().random_range(1..4);
    for _ in 0..unary {
        let error = session.launch(&kernel, &overruns).await.unwrap_err();
        *refused.entry(error.reason_name()).or_default() += 1;
    }
    let mut stream = session.launch_stream().await.unwrap();
    let streamed = rand::rng().random_range(1..4);
    for _ in 0..streamed {
        stream.send(&kernel, &fits).await.unwrap();
        stream.send(&kernel, &overruns).await.unwrap();
    }
    for _ in 0..streamed * 2 {
        let reply = stream.next().await.unwrap().expect("a reply per request");
        if let Err(error) = reply.outcome {
            *refused.entry(error.reason_name()).or_default() += 1;
        }
    }
    drop(stream);
    let oversize = ".version 8.0\n".repeat(max_request_bytes / 8);
    let error = session
        .load_ptx(0u32, oversize, "add_f32_scalar", LoadOptions::default())
        .await
        .unwrap_err();
    *refused.entry(error.reason_name()).or_default() += 1;
    assert_eq!(
        refused,
        BTreeMap::from([
            ("BUFFER_TOO_SMALL", unary + streamed),
            ("LIMIT_EXCEEDED", 1)
        ]),
        "the refusals the client saw"
    );

    let after = scrape(port).await;
    for sample in after
        .samples
        .iter()
        .filter(|s| s.name == "ptxd_refusals_total")
    {
        let reason = sample.labels[0].1.as_str();
        let labels = [("reason", reason)];
        assert_eq!(
            value(&after, "ptxd_refusals_total", &labels)
                - value(&before, "ptxd_refusals_total", &labels),
            refused.get(reason).copied().unwrap_or(0) as f64,
            "refusals {reason}"
        );
    }
    session.close().await.unwrap();
    drop(daemon);
}

#[test]
fn a_remote_metrics_address_is_refused_without_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    // A daemon that does not refuse would serve forever: bound the wait.
    let output = support::run_to_exit(
        support::serve_command(
            "host",
            &dir.path().join("ptxd.sock"),
            &["--metrics", "0.0.0.0:9464"],
        ),
        Duration::from_secs(15),
    );
    assert!(!output.status.success(), "{}", text(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("--metrics-allow-remote"),
        "{}",
        text(&output)
    );
    assert!(
        !dir.path().join("ptxd.sock").exists(),
        "refused before binding the socket"
    );
}

// ----- dashboard and alerts -------------------------------------------------------

/// `promtool check rules` on the alert file, and its unit tests
/// (`promtool test rules`): each alert fires on the series meant to fire it
/// and stays quiet on a near miss. A rule with a PromQL error fails the check.
#[test]
fn the_alert_rules_pass_promtool_check_and_their_unit_tests() {
    let output = run(Command::new(tool("promtool"))
        .args(["check", "rules"])
        .arg(deploy("prometheus/alerts.yml")));
    assert!(
        output.status.success() && text(&output).contains("SUCCESS: 6 rules found"),
        "{}",
        text(&output)
    );
    let output = run(Command::new(tool("promtool"))
        .args(["test", "rules"])
        .arg(deploy("prometheus/alerts.test.yml")));
    assert!(output.status.success(), "{}", text(&output));

    let dir = tempfile::tempdir().unwrap();
    let broken = std::fs::read_to_string(deploy("prometheus/alerts.yml"))
        .unwrap()
        .replace(
            "ptxd_slots_used / ptxd_slots_capacity > 0.9",
            "ptxd_slots_used / (ptxd_slots_capacity > 0.9",
        );
    let path = dir.path().join("alerts.yml");
    std::fs::write(&path, broken).unwrap();
    let output = run(Command::new(tool("promtool"))
        .args(["check", "rules"])
        .arg(&path));
    assert!(
        !output.status.success(),
        "a broken rule passed: {}",
        text(&output)
    );
}

/// Every PromQL expression of the Grafana dashboard (panel targets, in rows
/// too, and the templating queries), as (where, expr).
fn dashboard_queries() -> Vec<(String, String)> {
    fn panels(list: &serde_json::Value, out: &mut Vec<(String, String)>) {
        for panel in list.as_array().into_iter().flatten() {
            let title = panel["title"].as_str().unwrap_or("?");
            for target in panel["targets"].as_array().into_iter().flatten() {
                let expr = target["expr"].as_str().unwrap_or_else(|| {
                    panic!("panel {title:?} has a target without an expr: {target}")
                });
                out.push((format!("panel {title:?}"), expr.to_owned()));
            }
            panels(&panel["panels"], out);
        }
    }
    let text = std::fs::read_to_string(deploy("grafana/ptxd.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut out = Vec::new();
    panels(&dashboard["panels"], &mut out);
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if variable["type"] == "query" {
            let query = variable["query"]["query"]
                .as_str()
                .or(variable["query"].as_str())
                .unwrap();
            out.push((format!("variable {}", variable["name"]), query.to_owned()));
        }
    }
    out
}

/// Every alert's and recording rule's expression, as (where, expr), read
/// with PyYAML.
fn alert_queries() -> Vec<(String, String)> {
    let output = run(Command::new(python_with_yaml())
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))",
        ])
        .arg(deploy("prometheus/alerts.yml")));
    assert!(output.status.success(), "{}", text(&output));
    let rules: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let mut out = Vec::new();
    for group in rules["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let name = rule["alert"].as_str().or(rule["record"].as_str()).unwrap();
            out.push((
                format!("rule {name}"),
                rule["expr"].as_str().unwrap().to_owned(),
            ));
        }
    }
    out
}

/// The names each query reads that `scrape` lacks, as "where: name" lines;
/// a query that reads no metric at all is reported too.
fn missing_names(queries: &[(String, String)], scrape: &Exposition) -> Vec<String> {
    let mut missing = Vec::new();
    for (place, expr) in queries {
        let names = promql::metric_names(expr).unwrap_or_else(|e| panic!("{place}: {e}: {expr}"));
        if names.is_empty() {
            missing.push(format!("{place}: reads no metric: {expr}"));
        }
        for name in names {
            // A family with no series yet counts; a histogram's bare name is
            // no series at all.
            let exposed = scrape.samples.iter().any(|s| s.name == name)
                || scrape.kind(&name).is_some_and(|kind| kind != "histogram");
            if !exposed {
                missing.push(format!("{place}: {name}"));
            }
        }
    }
    missing
}

/// The dashboard and the alerts read only series a running daemon serves:
/// every metric name of every panel, variable and rule is in a real scrape
/// (a histogram's `_bucket`, `_sum` and `_count` as samples). The dashboard
/// covers what operators look for, and the check does catch a name the
/// daemon lacks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_and_alerts_read_is_in_the_exposition() {
    let port = support::free_port();
    let metrics_addr = format!("127.0.0.1:{port}");
    let _daemon = Daemon::start(&["--metrics", &metrics_addr]);
    support::wait_for_port(port);
    let scrape = scrape(port).await;

    let dashboard = dashboard_queries();
    let alerts = alert_queries();
    assert!(dashboard.len() >= 15, "{dashboard:?}");
    assert_eq!(alerts.len(), 6, "{alerts:?}");
    let missing = missing_names(&dashboard, &scrape);
    assert!(
        missing.is_empty(),
        "the dashboard reads series ptxd lacks: {missing:#?}"
    );
    let missing = missing_names(&alerts, &scrape);
    assert!(
        missing.is_empty(),
        "the alerts read series ptxd lacks: {missing:#?}"
    );

    let read: std::collections::BTreeSet<String> = dashboard
        .iter()
        .flat_map(|(_, expr)| promql::metric_names(expr).unwrap())
        .collect();
    for wanted in [
        "ptxd_launches_total",
        "ptxd_launch_duration_seconds_bucket",
        "ptxd_loads_total",
        "ptxd_load_duration_seconds_bucket",
        "ptxd_refusals_total",
        "ptxd_executor_restarts_total",
        "ptxd_device_generation",
        "ptxd_kernel_faults_total",
        "ptxd_sessions",
        "ptxd_slots_used",
        "ptxd_slots_capacity",
        "ptxd_loaded_artifact_bytes",
        "ptxd_loaded_artifact_bytes_limit",
        "ptxd_buffers",
        "ptxd_buffer_bytes",
    ] {
        assert!(read.contains(wanted), "no panel shows {wanted}: {read:?}");
    }

    // A misspelt name (the family without `_total`, a histogram without
    // `_bucket`) and a query with no metric are caught.
    let wrong = [
        ("a".to_owned(), "rate(ptxd_launches[5m])".to_owned()),
        (
            "b".to_owned(),
            "histogram_quantile(0.9, rate(ptxd_launch_duration_seconds{mode=\"sync\"}[5m]))"
                .to_owned(),
        ),
        ("c".to_owned(), "vector(1)".to_owned()),
    ];
    assert_eq!(
        missing_names(&wrong, &scrape),
        [
            "a: ptxd_launches",
            "b: ptxd_launch_duration_seconds",
            "c: reads no metric: vector(1)"
        ]
    );
}

// ----- systemd ----------------------------------------------------------------

/// The units copied into a temporary directory with ExecStart pointing at the
/// built binary (systemd-analyze checks that the binary exists).
fn units_in_tempdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for unit in ["ptxd.socket", "ptxd.service"] {
        let text = std::fs::read_to_string(deploy(&format!("systemd/{unit}"))).unwrap();
        let text = text.replace(
            "ExecStart=/usr/local/bin/ptxd ",
            &format!("ExecStart={PTXD} "),
        );
        std::fs::write(dir.path().join(unit), text).unwrap();
    }
    dir
}

fn systemd_analyze_verify(dir: &Path, units: &[&str]) -> Output {
    run(Command::new(tool("systemd-analyze"))
        .arg("verify")
        .args(units.iter().map(|u| dir.join(u)))
        .env("SYSTEMD_LOG_COLOR", "0"))
}

#[test]
fn the_systemd_units_pass_systemd_analyze_without_a_warning() {
    let dir = units_in_tempdir();
    let service = std::fs::read_to_string(dir.path().join("ptxd.service")).unwrap();
    assert!(
        service.contains(&format!("ExecStart={PTXD} serve ")),
        "ExecStart not rewritten"
    );
    let output = systemd_analyze_verify(dir.path(), &["ptxd.socket", "ptxd.service"]);
    assert!(
        output.status.success() && output.stdout.is_empty() && output.stderr.is_empty(),
        "{}",
        text(&output)
    );

    // The same check catches a mistake (so the silence above means something).
    let broken = service.replace("DevicePolicy=closed", "DevicePolicy=clsed");
    std::fs::write(dir.path().join("ptxd.service"), broken).unwrap();
    let output = systemd_analyze_verify(dir.path(), &["ptxd.socket", "ptxd.service"]);
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("clsed"),
        "{}",
        text(&output)
    );
}

#[test]
fn the_service_sandbox_stays_tight_and_keeps_namespaces_shared() {
    let dir = units_in_tempdir();
    // Overall exposure at most 3.5 of 10 ("OK"): hardening may not erode.
    let output = run(Command::new(tool("systemd-analyze"))
        .args(["security", "--offline=yes", "--threshold=35", "--no-pager"])
        .arg(dir.path().join("ptxd.service")));
    assert!(output.status.success(), "{}", text(&output));

    let service = std::fs::read_to_string(deploy("systemd/ptxd.service")).unwrap();
    let socket = std::fs::read_to_string(deploy("systemd/ptxd.socket")).unwrap();
    let settings = |unit: &str| -> Vec<(String, String)> {
        unit.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
            .collect()
    };
    let service = settings(&service);
    let socket = settings(&socket);
    let has = |unit: &[(String, String)], key: &str, value: &str| {
        unit.iter().any(|(k, v)| k == key && v == value)
    };
    for (key, value) in [
        ("ListenStream", "/run/ptxd/ptxd.sock"),
        ("SocketMode", "0660"),
        ("SocketUser", "ptxd"),
        ("SocketGroup", "ptxd"),
        ("Accept", "no"),
    ] {
        assert!(has(&socket, key, value), "ptxd.socket lacks {key}={value}");
    }
    for (key, value) in [
        ("User", "ptxd"),
        ("LimitNOFILE", "524288"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("PrivateDevices", "no"),
        ("DevicePolicy", "closed"),
        ("DeviceAllow", "char-nvidia-frontend rw"),
        ("DeviceAllow", "char-nvidia-uvm rw"),
        ("DeviceAllow", "/dev/nvidiactl rw"),
        ("DeviceAllow", "/dev/nvidia-uvm rw"),
        // ptxd binds ptxd.sock.fds beside the activated socket: /run/ptxd
        // must be writable to it (ProtectSystem=strict), and must outlive a
        // stop of the service (ptxd.socket's socket is in it).
        ("RuntimeDirectory", "ptxd"),
        ("RuntimeDirectoryMode", "0755"),
        ("RuntimeDirectoryPreserve", "yes"),
    ] {
        assert!(
            has(&service, key, value),
            "ptxd.service lacks {key}={value}"
        );
    }
    // CUDA IPC needs the clients' PID namespace and /dev/shm.
    for key in [
        "PrivatePIDs",
        "PrivateIPC",
        "ProtectProc",
        "ProcSubset",
        "PrivateNetwork",
    ] {
        assert!(
            !service.iter().any(|(k, _)| k == key),
            "ptxd.service must not set {key}="
        );
    }
}

/// The optional MPS configuration (issue 22): `ptxd-mps.service` runs the
/// MPS control daemon, and the drop-in makes ptxd its client, ordered after
/// it and with the same pipe directory. Both pass `systemd-analyze verify`
/// (the drop-in as systemd reads it: appended to ptxd.service), and a
/// mistake in either is caught.
#[test]
fn the_mps_unit_and_its_drop_in_pass_systemd_analyze_and_agree() {
    let dir = units_in_tempdir();
    // systemd-analyze checks that ExecStart's binary exists; the GPU
    // machine's nvidia-cuda-mps-control is not here.
    let mps = std::fs::read_to_string(deploy("systemd/ptxd-mps.service")).unwrap();
    let control = "/usr/bin/nvidia-cuda-mps-control";
    assert!(mps.contains(&format!("ExecStart={control} -d")), "{mps}");
    let here = mps.replace(control, "/bin/true");
    std::fs::write(dir.path().join("ptxd-mps.service"), &here).unwrap();
    let drop_in = std::fs::read_to_string(deploy("systemd/ptxd.service.d/mps.conf")).unwrap();
    let service = std::fs::read_to_string(dir.path().join("ptxd.service")).unwrap();
    std::fs::write(
        dir.path().join("ptxd.service"),
        format!("{service}\n{drop_in}"),
    )
    .unwrap();
    let units = ["ptxd.socket", "ptxd.service", "ptxd-mps.service"];
    let output = systemd_analyze_verify(dir.path(), &units);
    assert!(
        output.status.success() && output.stdout.is_empty() && output.stderr.is_empty(),
        "{}",
        text(&output)
    );
    // The pipe directory the control daemon makes is the one ptxd joins.
    let pipe = "CUDA_MPS_PIPE_DIRECTORY=/run/ptxd-mps/pipe";
    assert!(mps.contains(&format!("Environment={pipe}")));
    assert!(drop_in.contains(&format!("Environment={pipe}")));
    for line in [
        "Requires=ptxd-mps.service",
        "After=ptxd-mps.service",
        "ReadWritePaths=/run/ptxd-mps",
    ] {
        assert!(drop_in.lines().any(|l| l == line), "mps.conf lacks {line}");
    }
    // The check catches a mistake in the MPS unit too.
    std::fs::write(
        dir.path().join("ptxd-mps.service"),
        here.replace("Type=forking", "Type=forkin"),
    )
    .unwrap();
    let output = systemd_analyze_verify(dir.path(), &units);
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("forkin"),
        "{}",
        text(&output)
    );
}

/// The pids of `pid`'s children.
fn children_of(pid: u32) -> Vec<u32> {
    let mut children = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.flatten() {
            let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            children.extend(
                list.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
    }
    children
}

/// The `socket:[inode]` targets of a process's open fds.
fn socket_fds(pid: u32) -> BTreeMap<i32, String> {
    let mut sockets = BTreeMap::new();
    if let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for fd in fds.flatten() {
            if let (Ok(target), Ok(number)) = (
                std::fs::read_link(fd.path()),
                fd.file_name().to_string_lossy().parse::<i32>(),
            ) {
                let target = target.to_string_lossy().into_owned();
                if target.starts_with("socket:") {
                    sockets.insert(number, target);
                }
            }
        }
    }
    sockets
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_socket_activation_ptxd_serves_the_passed_socket_and_binds_only_the_fd_socket() {
    let dir = tempfile::tempdir().unwrap();
    let activated = dir.path().join("activated.sock");
    let ignored = dir.path().join("ignored.sock");
    // As systemd does: the activator binds, ptxd gets fd 3 and LISTEN_FDS=1.
    let mut activator = Command::new(tool("systemd-socket-activate"));
    activator
        .arg("--listen")
        .arg(&activated)
        // systemd-socket-activate passes only the variables it is told to.
        .arg("--setenv=RUST_LOG=warn")
        .arg("--")
        .arg(PTXD)
        .args(["serve", "--backend", "host", "--socket"])
        .arg(&ignored)
        .stdin(Stdio::null());
    // Answers once the activator has bound; the activator then execs ptxd
    // in its own process.
    let mut daemon = Daemon::spawn(activator, activated.clone(), dir);
    let pid = daemon.pid() as u32;

    // The first connection may wait for ptxd to start: it queues in the
    // backlog of the socket systemd-socket-activate holds.
    let client = tokio::time::timeout(Duration::from_secs(30), Client::connect_unix(&activated))
        .await
        .expect("connect within 30 s")
        .unwrap();
    let info = tokio::time::timeout(Duration::from_secs(30), client.info())
        .await
        .expect("GetInfo within 30 s: does ptxd take the socket from LISTEN_FDS?")
        .unwrap();
    assert_eq!(info.backend, "host");
    let session = client.open_session("activated").await.unwrap();
    assert!(!session.id().is_empty());

    assert!(
        !ignored.exists(),
        "ptxd bound --socket although it was socket-activated"
    );
    // The fd socket is ptxd's own, beside the activated socket (where a
    // client looks for it), never beside --socket; ptxd.service gives ptxd
    // the directory for it (RuntimeDirectory=).
    let fd_socket = ptxd_ipc::packet::fd_socket_path(&activated);
    assert!(
        std::fs::symlink_metadata(&fd_socket).is_ok_and(|m| {
            use std::os::unix::fs::FileTypeExt;
            m.file_type().is_socket()
        }),
        "no fd socket at {}",
        fd_socket.display()
    );
    assert!(!ptxd_ipc::packet::fd_socket_path(&ignored).exists());
    // systemd-socket-activate execs ptxd in its own process: fd 3 is the
    // listener, and no executor child inherited it (close-on-exec) or the
    // LISTEN_* variables.
    let sockets = socket_fds(pid);
    let listener = sockets
        .get(&3)
        .cloned()
        .expect("fd 3 is the activated socket");
    let executors = children_of(pid);
    assert!(!executors.is_empty(), "no executor children found");
    for child in executors {
        assert!(
            !socket_fds(child).values().any(|s| *s == listener),
            "executor {child} inherited the listening socket"
        );
        let environ = std::fs::read(format!("/proc/{child}/environ")).unwrap_or_default();
        for variable in environ.split(|&b| b == 0) {
            assert!(
                !variable.starts_with(b"LISTEN_PID=") && !variable.starts_with(b"LISTEN_FDS="),
                "executor {child} inherited {}",
                String::from_utf8_lossy(variable)
            );
        }
    }

    session.close().await.unwrap();
    drop(client);
    let status = daemon.terminate();
    assert!(
        status.success(),
        "ptxd exited with {status}\n{}",
        daemon.stderr()
    );
    assert!(!fd_socket.exists(), "ptxd left its fd socket behind");
}

#[test]
fn the_health_probe_command_answers_for_a_live_daemon_only() {
    let daemon = Daemon::start(&[]);
    let socket = daemon.socket.to_str().unwrap().to_owned();
    for service in ["", "ptxd.v1.Ptxd"] {
        let output =
            run(Command::new(PTXD).args(["health", "--socket", &socket, "--service", service]));
        assert!(
            output.status.success(),
            "service {service:?}: {}",
            text(&output)
        );
    }
    let output = run(Command::new(PTXD).args([
        "health",
        "--socket",
        &socket,
        "--service",
        "no.such.Service",
    ]));
    assert!(!output.status.success(), "{}", text(&output));
    let missing = daemon.dir.path().join("missing.sock");
    let output = run(Command::new(PTXD)
        .arg("health")
        .arg("--socket")
        .arg(&missing));
    assert!(!output.status.success(), "{}", text(&output));
}

// ----- the deploy files' command lines ------------------------------------------

/// Runs `ptxd ARGS --help`: clap parses (and validates) every argument before
/// the trailing --help, so success means the command line is one this binary
/// accepts.
fn assert_ptxd_accepts(origin: &str, args: &[String]) {
    assert!(!args.is_empty(), "{origin}: no arguments found");
    let output = run(Command::new(PTXD).args(args).arg("--help"));
    assert!(
        output.status.success(),
        "{origin}: ptxd {args:?} is refused:\n{}",
        text(&output)
    );
}

#[test]
fn the_parse_check_refuses_a_bad_command_line() {
    let bad = ["serve", "--backend", "gpu"].map(String::from);
    let output = run(Command::new(PTXD).args(&bad).arg("--help"));
    assert!(!output.status.success(), "{}", text(&output));
}

#[test]
fn every_command_line_in_deploy_is_one_ptxd_accepts() {
    // systemd: ExecStart=/usr/local/bin/ptxd ARGS
    let service = std::fs::read_to_string(deploy("systemd/ptxd.service")).unwrap();
    let exec = service
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart=/usr/local/bin/ptxd "))
        .expect("ExecStart=/usr/local/bin/ptxd ...");
    assert_ptxd_accepts(
        "ptxd.service",
        &exec
            .split_whitespace()
            .map(String::from)
            .collect::<Vec<_>>(),
    );

    // Dockerfile: CMD ["serve", ...] after ENTRYPOINT ["/usr/local/bin/ptxd"].
    let dockerfile = std::fs::read_to_string(deploy("container/Dockerfile")).unwrap();
    let json_array = |prefix: &str| -> Vec<String> {
        let line = dockerfile
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no {prefix}"));
        line.trim()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .split(',')
            .map(|s| s.trim().trim_matches('"').to_owned())
            .collect()
    };
    assert_eq!(json_array("ENTRYPOINT "), ["/usr/local/bin/ptxd"]);
    assert_ptxd_accepts("Dockerfile CMD", &json_array("CMD "));

    // Kubernetes: the container args and every probe's exec command.
    for (origin, args) in kubernetes_command_lines() {
        assert_ptxd_accepts(&origin, &args);
    }
}

/// (where, args after the binary) for the ptxd container's args and probes
/// of every DaemonSet, read with PyYAML (which kubernetes-validate brings).
fn kubernetes_command_lines() -> Vec<(String, Vec<String>)> {
    let script = r#"
import sys, yaml
ds = yaml.safe_load(open(sys.argv[1]))
c = ds["spec"]["template"]["spec"]["containers"][0]
print("args\t" + "\t".join(c["args"]))
for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
    command = c[probe]["exec"]["command"]
    assert command[0] == "/usr/local/bin/ptxd", command
    print(probe + "\t" + "\t".join(command[1:]))
for other in ds["spec"]["template"]["spec"]["containers"][1:]:
    print(other["name"] + " args\t" + "\t".join(other["args"]))
"#;
    let daemonsets = kubernetes_manifests()
        .into_iter()
        .filter(|m| {
            std::fs::read_to_string(m)
                .unwrap()
                .lines()
                .any(|l| l == "kind: DaemonSet")
        })
        .collect::<Vec<_>>();
    assert_eq!(
        daemonsets,
        [
            deploy("kubernetes/daemonset-device-plugin.yaml"),
            deploy("kubernetes/daemonset-fd-only.yaml"),
            deploy("kubernetes/daemonset-mps.yaml"),
            deploy("kubernetes/daemonset.yaml")
        ]
    );
    let mut lines = Vec::new();
    for daemonset in daemonsets {
        let output = run(Command::new(python_with_yaml())
            .arg("-c")
            .arg(script)
            .arg(&daemonset));
        assert!(output.status.success(), "{}", text(&output));
        let file = daemonset
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        lines.extend(
            String::from_utf8(output.stdout)
                .unwrap()
                .lines()
                .map(|line| {
                    let mut fields = line.split('\t').map(String::from);
                    let origin = format!("{file} {}", fields.next().unwrap());
                    (origin, fields.collect())
                }),
        );
    }
    lines
}

/// The Python that runs kubernetes-validate (it has PyYAML).
fn python_with_yaml() -> String {
    tool("kubernetes-validate");
    let output = run(Command::new("python3").args(["-c", "import yaml"]));
    assert!(
        output.status.success(),
        "python3 cannot import yaml; `bash deploy/ci-tools.sh` installs kubernetes-validate, which brings it"
    );
    "python3".into()
}

// ----- Kubernetes ---------------------------------------------------------------

fn kubernetes_manifests() -> Vec<PathBuf> {
    let mut manifests: Vec<PathBuf> = std::fs::read_dir(deploy("kubernetes"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    manifests.sort();
    for expected in [
        "namespace.yaml",
        "daemonset.yaml",
        "example-inference-pod.yaml",
        "daemonset-fd-only.yaml",
        "example-inference-pod-fd-only.yaml",
        "daemonset-device-plugin.yaml",
        "example-inference-pod-device-plugin.yaml",
        "namespace-inference.yaml",
    ] {
        assert!(
            manifests.contains(&deploy(&format!("kubernetes/{expected}"))),
            "{expected} missing from {manifests:?}"
        );
    }
    manifests
}

#[test]
fn the_kubernetes_manifests_pass_kubernetes_validate_strictly() {
    for manifest in kubernetes_manifests() {
        let output = run(Command::new(tool("kubernetes-validate"))
            .arg("--strict")
            .arg(&manifest));
        assert!(
            output.status.success(),
            "{}: {}",
            manifest.display(),
            text(&output)
        );
        assert!(
            String::from_utf8_lossy(&output.stdout).contains("passed"),
            "{}",
            text(&output)
        );
    }
    // A misspelt field fails the same check (hostPid for hostPID).
    let dir = tempfile::tempdir().unwrap();
    let broken = std::fs::read_to_string(deploy("kubernetes/daemonset.yaml"))
        .unwrap()
        .replace("hostPID: true", "hostPid: true");
    let path = dir.path().join("daemonset.yaml");
    std::fs::write(&path, broken).unwrap();
    let output = run(Command::new(tool("kubernetes-validate"))
        .arg("--strict")
        .arg(&path));
    assert!(
        !output.status.success(),
        "a misspelt field passed: {}",
        text(&output)
    );
}

/// The MPS DaemonSet (issue 22): the control daemon is a native sidecar
/// (an init container that keeps running, probed before ptxd starts), it
/// and ptxd name the same pipe directory, that directory is the node's
/// /run/ptxd-mps (so inference pods can join the same server), and the rest
/// of the pod is daemonset.yaml's.
#[test]
fn the_mps_daemonset_runs_the_control_daemon_beside_ptxd() {
    let script = r#"
import sys, yaml
mps = yaml.safe_load(open(sys.argv[1]))
plain = yaml.safe_load(open(sys.argv[2]))
spec = mps["spec"]["template"]["spec"]
inits = {c["name"]: c for c in spec["initContainers"]}
sidecar = inits["mps-control"]
assert sidecar.get("restartPolicy") == "Always", "not a native sidecar"
assert sidecar["command"] == ["nvidia-cuda-mps-control", "-f"], sidecar["command"]
assert "startupProbe" in sidecar, "ptxd would start before the control daemon answers"
names = [c["name"] for c in spec["initContainers"]]
assert names.index("socket-dir-owner") < names.index("mps-control"), names
env = lambda c: {e["name"]: e.get("value") for e in c.get("env", [])}
ptxd = spec["containers"][0]
for var in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
    assert env(sidecar)[var] == env(ptxd)[var], var
    assert env(ptxd)[var].startswith("/run/ptxd-mps/"), env(ptxd)[var]
mounts = lambda c: {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
assert mounts(sidecar)["mps-dir"] == mounts(ptxd)["mps-dir"] == "/run/ptxd-mps"
volumes = {v["name"]: v for v in spec["volumes"]}
assert volumes["mps-dir"]["hostPath"]["path"] == "/run/ptxd-mps"
# Apart from MPS, the same pod as daemonset.yaml.
base = plain["spec"]["template"]["spec"]
strip_env = lambda c: [e for e in c.get("env", []) if not e["name"].startswith("CUDA_MPS_")]
assert strip_env(ptxd) == base["containers"][0]["env"]
assert ptxd["args"] == base["containers"][0]["args"]
assert [m for m in ptxd["volumeMounts"] if m["name"] != "mps-dir"] == base["containers"][0]["volumeMounts"]
print("checked")
"#;
    let output = run(Command::new(python_with_yaml())
        .arg("-c")
        .arg(script)
        .arg(deploy("kubernetes/daemonset-mps.yaml"))
        .arg(deploy("kubernetes/daemonset.yaml")));
    assert!(
        output.status.success() && text(&output).contains("checked"),
        "{}",
        text(&output)
    );
}

/// tests/ops/kubernetes.py: the checks a schema cannot make. Both
/// deployments: ptxd's socket and the clients' PTXD_SOCKET lie in the mounted
/// node /run/ptxd (so ptxd.sock.fds does too), ptxd claims no GPU, probes,
/// metrics, the socket directory handed to uid 65532. The shared one keeps
/// hostPID and hostIPC on ptxd and its client; the fd-only one has neither
/// (nor hostNetwork) and is the shared one less those two fields. Pod
/// Security (a subset of the controls, see the script): all four pods need
/// `privileged`; without the hostPath, the fd-only client would be
/// `restricted` and the fd-only DaemonSet `baseline`; the namespace enforces
/// exactly the level its pods need.
#[test]
fn the_daemonsets_and_their_clients_share_what_their_buffers_need() {
    let script = Path::new(ROOT).join("tests/ops/kubernetes.py");
    let output = run(Command::new(python_with_yaml())
        .arg(&script)
        .arg(deploy("kubernetes/namespace.yaml"))
        .arg(deploy("kubernetes/daemonset.yaml"))
        .arg(deploy("kubernetes/example-inference-pod.yaml"))
        .arg(deploy("kubernetes/daemonset-fd-only.yaml"))
        .arg(deploy("kubernetes/example-inference-pod-fd-only.yaml"))
        .arg(deploy("kubernetes/daemonset-device-plugin.yaml"))
        .arg(deploy(
            "kubernetes/example-inference-pod-device-plugin.yaml",
        ))
        .arg(deploy("kubernetes/namespace-inference.yaml")));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.trim() == "checked",
        "{}",
        text(&output)
    );

    // The same script fails a client of the fd-only variant given hostPID.
    let dir = tempfile::tempdir().unwrap();
    let pod = std::fs::read_to_string(deploy("kubernetes/example-inference-pod-fd-only.yaml"))
        .unwrap()
        .replace("spec:\n", "spec:\n  hostPID: true\n");
    let broken = dir.path().join("example-inference-pod-fd-only.yaml");
    std::fs::write(&broken, pod).unwrap();
    let output = run(Command::new(python_with_yaml())
        .arg(&script)
        .arg(deploy("kubernetes/namespace.yaml"))
        .arg(deploy("kubernetes/daemonset.yaml"))
        .arg(deploy("kubernetes/example-inference-pod.yaml"))
        .arg(deploy("kubernetes/daemonset-fd-only.yaml"))
        .arg(&broken));
    assert!(
        String::from_utf8_lossy(&output.stdout)
            .contains("FAIL example-inference-pod-fd-only.yaml has no hostPID"),
        "{}",
        text(&output)
    );

    // And a device-plugin client given a hostPath is no longer restricted.
    let pod = std::fs::read_to_string(deploy("kubernetes/example-inference-pod-device-plugin.yaml"))
        .unwrap()
        .replace(
            "          memory: 16Gi\n      securityContext:",
            "          memory: 16Gi\n      volumeMounts:\n        - name: s\n          mountPath: /run/ptxd\n      securityContext:",
        )
        + "  volumes:\n    - name: s\n      hostPath:\n        path: /run/ptxd\n";
    assert!(pod.contains("mountPath: /run/ptxd"), "{pod}");
    let broken = dir.path().join("example-inference-pod-device-plugin.yaml");
    std::fs::write(&broken, pod).unwrap();
    let output = run(Command::new(python_with_yaml())
        .arg(&script)
        .arg(deploy("kubernetes/namespace.yaml"))
        .arg(deploy("kubernetes/daemonset.yaml"))
        .arg(deploy("kubernetes/example-inference-pod.yaml"))
        .arg(deploy("kubernetes/daemonset-fd-only.yaml"))
        .arg(deploy("kubernetes/example-inference-pod-fd-only.yaml"))
        .arg(deploy("kubernetes/daemonset-device-plugin.yaml"))
        .arg(&broken)
        .arg(deploy("kubernetes/namespace-inference.yaml")));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("FAIL example-inference-pod-device-plugin.yaml has no hostPath")
            && stdout.contains(
                "FAIL example-inference-pod-device-plugin.yaml meets restricted (it meets privileged)"
            ),
        "{}",
        text(&output)
    );
}

// ----- container ----------------------------------------------------------------

#[test]
fn the_dockerfile_passes_hadolint_and_builds_what_the_docs_run() {
    let output = run(Command::new(tool("hadolint")).arg(deploy("container/Dockerfile")));
    assert!(output.status.success(), "{}", text(&output));

    let dockerfile = std::fs::read_to_string(deploy("container/Dockerfile")).unwrap();
    assert!(dockerfile.contains(" AS build"), "multi-stage");
    assert!(
        dockerfile
            .lines()
            .any(|l| l.starts_with("FROM nvidia/cuda:") && l.contains("-base-")),
        "CUDA base runtime"
    );
    // Everything the build stage copies exists (the context is the repo root).
    for line in dockerfile
        .lines()
        .filter(|l| l.starts_with("COPY ") && !l.contains("--from"))
    {
        let mut parts: Vec<&str> = line.split_whitespace().skip(1).collect();
        parts.pop(); // destination
        for source in parts {
            assert!(
                Path::new(ROOT).join(source).exists(),
                "Dockerfile copies missing {source}"
            );
        }
    }
    // The documented run line carries the namespace flags CUDA IPC needs.
    let operations = std::fs::read_to_string(Path::new(ROOT).join("docs/operations.md")).unwrap();
    let run_line = operations
        .lines()
        .skip_while(|l| !l.contains("docker run"))
        .take_while(|l| !l.trim().is_empty() && !l.starts_with("```"))
        .collect::<String>();
    for flag in [
        "--gpus all",
        "--pid=host",
        "--ipc=host",
        "-v /run/ptxd:/run/ptxd",
    ] {
        assert!(
            run_line.contains(flag),
            "the documented docker run lacks {flag}: {run_line}"
        );
    }
}

#[test]
fn ci_tools_script_is_valid_bash() {
    let output = run(Command::new("bash").arg("-n").arg(deploy("ci-tools.sh")));
    assert!(output.status.success(), "{}", text(&output));
}
