//! The daemon's configuration: every `ptxd serve` flag, its `PTXD_*`
//! environment variable and its default.
// The doc comments of the clap types below are also the `--help` text,
// where `<uid>` and `<n>` are placeholders, not HTML.
#![allow(rustdoc::invalid_html_tags)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Which executor backend drives the devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendChoice {
    /// CUDA when libcuda is present and a device answers, else host.
    Auto,
    /// The CUDA executor (one child process per GPU).
    Cuda,
    /// The host (CPU) executor over POSIX shared memory.
    Host,
}

/// Where a compiled kernel may be shared from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CacheScope {
    /// Node-wide: one compile for every uid. A cache hit reveals that some
    /// session loaded the same artifact.
    Node,
    /// Only within a uid (all TCP callers count as one tenant).
    Uid,
}

/// A per-uid quota: an absolute count, or a percentage of the matching
/// daemon-wide limit (`25%`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Share {
    Absolute(u64),
    Percent(u8),
}

impl Share {
    /// The quota against a daemon-wide `total` (at least 1).
    pub fn of(self, total: u64) -> u64 {
        match self {
            Share::Absolute(n) => n,
            Share::Percent(p) => (total.saturating_mul(u64::from(p)) / 100).max(1),
        }
    }
}

fn parse_share(text: &str) -> Result<Share, String> {
    let text = text.trim();
    match text.strip_suffix('%') {
        Some(p) => match p.trim().parse::<u8>() {
            Ok(p) if (1..=100).contains(&p) => Ok(Share::Percent(p)),
            _ => Err(format!("{text:?}: a share is 1% to 100%")),
        },
        None => text
            .parse::<u64>()
            .ok()
            .filter(|n| *n > 0)
            .map(Share::Absolute)
            .ok_or_else(|| format!("{text:?}: give a positive count or a percentage like 25%")),
    }
}

/// Callers trusted with unverified machine code (cubin, fatbin), by peer
/// uid or primary gid (from SO_PEERCRED).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustList {
    pub uids: Vec<u32>,
    pub gids: Vec<u32>,
}

impl TrustList {
    pub fn trusts(&self, uid: u32, gid: u32) -> bool {
        self.uids.contains(&uid) || self.gids.contains(&gid)
    }

    pub fn is_empty(&self) -> bool {
        self.uids.is_empty() && self.gids.is_empty()
    }
}

/// Parses `uid:0,gid:1001` (empty: nobody).
pub fn parse_trust_list(text: &str) -> Result<TrustList, String> {
    let mut list = TrustList::default();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (kind, id) = item
            .split_once(':')
            .ok_or_else(|| format!("{item:?}: write uid:N or gid:N"))?;
        let id: u32 = id
            .trim()
            .parse()
            .map_err(|_| format!("{item:?}: {id:?} is not a numeric id"))?;
        match kind.trim() {
            "uid" => list.uids.push(id),
            "gid" => list.gids.push(id),
            other => return Err(format!("{item:?}: {other:?} is neither uid nor gid")),
        }
    }
    Ok(list)
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// `ptxd serve` options.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeConfig {
    /// Unix socket to listen on [default: $XDG_RUNTIME_DIR/ptxd.sock, or
    /// /run/ptxd/ptxd.sock as root, else $TMPDIR/ptxd-<uid>/ptxd.sock]. A
    /// default path's directory is created with mode 0700 and refused when
    /// it is a symlink, is owned by another user, or is group- or
    /// world-writable without the sticky bit. Ignored under systemd socket
    /// activation.
    #[arg(long, env = "PTXD_SOCKET")]
    pub socket: Option<PathBuf>,

    /// Mode of the socket file, octal.
    #[arg(long, env = "PTXD_SOCKET_MODE", default_value = "660", value_parser = parse_mode)]
    pub socket_mode: u32,

    /// Also listen on TCP at ADDR (loopback only unless --tcp-allow-remote).
    /// TCP has no authentication (no mTLS) and no peer credentials, so a TCP
    /// caller gets no identity-bound privilege: it may query (GetInfo), open
    /// sessions (bound to its connection), load, list and unload verified
    /// PTX and launch; it may never register memory or events (host shared
    /// memory, CUDA IPC: the executor would open them with the daemon's
    /// rights) or load a cubin/fatbin. All TCP callers share one quota
    /// tenant.
    #[arg(long, env = "PTXD_TCP")]
    pub tcp: Option<SocketAddr>,

    /// Allow --tcp to bind a non-loopback address (no authentication!).
    #[arg(long, env = "PTXD_TCP_ALLOW_REMOTE", default_value_t = false)]
    pub tcp_allow_remote: bool,

    /// Executor backend.
    #[arg(long, env = "PTXD_BACKEND", value_enum, default_value_t = BackendChoice::Auto)]
    pub backend: BackendChoice,

    /// CUDA devices to serve: `all`, or a comma-separated list of UUIDs or
    /// ordinals.
    #[arg(long, env = "PTXD_DEVICES", default_value = "all")]
    pub devices: String,

    /// Number of host devices the host backend exposes (each its own executor
    /// process; more than one is useful for testing device checks).
    #[arg(long, env = "PTXD_HOST_DEVICES", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub host_devices: u32,

    /// CPU threads each host executor uses for one launch [default: all cores].
    #[arg(long, env = "PTXD_HOST_THREADS")]
    pub host_threads: Option<usize>,

    /// Bounds-check every memory access of host kernels (KERNEL_FAULT instead
    /// of memory corruption). Verified kernels cannot go out of range anyway.
    #[arg(long, env = "PTXD_HOST_CHECKED", default_value_t = true, action = clap::ArgAction::Set)]
    pub host_checked: bool,

    /// Slots in the kernel bank.
    #[arg(long, env = "PTXD_SLOTS", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub slots: u32,

    /// Largest artifact (PTX/cubin) accepted, in bytes.
    #[arg(long, env = "PTXD_MAX_ARTIFACT_BYTES", default_value_t = 16 << 20)]
    pub max_artifact_bytes: u64,

    /// Largest gRPC request message accepted, in bytes; checked on each
    /// message's header, before its body is read (LIMIT_EXCEEDED,
    /// limit=max_request_bytes).
    #[arg(long, env = "PTXD_MAX_REQUEST_BYTES", default_value_t = 32 << 20)]
    pub max_request_bytes: u64,

    /// Client connections at most, over all listeners [default: the
    /// descriptor limit (raised to the hard RLIMIT_NOFILE at start) minus 256
    /// descriptors kept for executor respawns, listeners and logs]. A
    /// connection over a cap is closed at once after an HTTP/2 GOAWAY
    /// naming the limit.
    #[arg(long, env = "PTXD_MAX_CONNECTIONS", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections: Option<u64>,

    /// Connections per peer uid at most (per address over TCP, which has no
    /// uid).
    #[arg(long, env = "PTXD_MAX_CONNECTIONS_PER_UID", default_value_t = 128, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections_per_uid: u64,

    /// A connection that has not sent the HTTP/2 preface and its first
    /// frame within this is closed.
    #[arg(long, env = "PTXD_HANDSHAKE_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub handshake_timeout: Duration,

    /// HTTP/2 keepalive: ping an idle connection this often...
    #[arg(long, env = "PTXD_KEEPALIVE_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub keepalive_interval: Duration,

    /// ...and close it when a ping is not answered within this.
    #[arg(long, env = "PTXD_KEEPALIVE_TIMEOUT", default_value = "20s", value_parser = parse_duration)]
    pub keepalive_timeout: Duration,

    /// Concurrent HTTP/2 streams (calls, session leases included) per
    /// connection.
    #[arg(long, env = "PTXD_MAX_CONCURRENT_STREAMS", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_concurrent_streams: u32,

    /// HTTP/2 flow-control window of one stream, in bytes: what a client may
    /// send on a call before ptxd reads it.
    #[arg(long, env = "PTXD_HTTP2_STREAM_WINDOW", default_value_t = 1 << 20, value_parser = clap::value_parser!(u32).range(65_535..=(i32::MAX as i64)))]
    pub http2_stream_window: u32,

    /// HTTP/2 flow-control window of one connection, in bytes.
    #[arg(long, env = "PTXD_HTTP2_CONNECTION_WINDOW", default_value_t = 2 << 20, value_parser = clap::value_parser!(u32).range(65_535..=(i32::MAX as i64)))]
    pub http2_connection_window: u32,

    /// Bytes of incomplete request messages held at once, over all clients.
    /// A message that would go over is refused (LIMIT_EXCEEDED) at once.
    #[arg(long, env = "PTXD_MAX_BUFFERED_REQUEST_BYTES", default_value_t = 512 << 20)]
    pub max_buffered_request_bytes: u64,

    /// Bytes of incomplete request messages held at once per peer uid (per
    /// address over TCP); at least --max-request-bytes.
    #[arg(long, env = "PTXD_MAX_BUFFERED_REQUEST_BYTES_PER_UID", default_value_t = 128 << 20)]
    pub max_buffered_request_bytes_per_uid: u64,

    /// A unary request's body must arrive (its message and its end) within
    /// this of the call's start, and each message of a streaming request
    /// within this of its first byte; else the call is refused
    /// (LIMIT_EXCEEDED, limit=request_read_timeout) and what it held is
    /// freed.
    #[arg(long, env = "PTXD_REQUEST_READ_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub request_read_timeout: Duration,

    /// Open sessions at most.
    #[arg(long, env = "PTXD_MAX_SESSIONS", default_value_t = 256)]
    pub max_sessions: u32,

    /// Registered buffers per session at most.
    #[arg(long, env = "PTXD_MAX_BUFFERS_PER_SESSION", default_value_t = 4096)]
    pub max_buffers_per_session: u32,

    /// Kernels held per session at most.
    #[arg(long, env = "PTXD_MAX_KERNELS_PER_SESSION", default_value_t = 512)]
    pub max_kernels_per_session: u32,

    /// Registered buffer bytes per session at most.
    #[arg(long, env = "PTXD_MAX_BUFFER_BYTES_PER_SESSION", default_value_t = 1 << 40)]
    pub max_buffer_bytes_per_session: u64,

    /// Registered buffer bytes in all sessions together at most: every
    /// registration is mapped into its executor's address space (128 TiB
    /// on x86-64), and a sparse memfd costs no memory, so without this a
    /// few users could take the address space from everyone else.
    #[arg(long, env = "PTXD_MAX_BUFFER_BYTES", default_value_t = 1 << 44)]
    pub max_buffer_bytes: u64,

    /// Registered buffer bytes one uid's sessions may hold: a count, or a
    /// percentage of --max-buffer-bytes.
    #[arg(long, env = "PTXD_MAX_BUFFER_BYTES_PER_UID", default_value = "25%", value_parser = parse_share)]
    pub max_buffer_bytes_per_uid: Share,

    /// Buffers passed by descriptor (posix_fd) in all sessions together at
    /// most; each holds a descriptor in the front and one in its executor
    /// [default: a quarter of the descriptor limit (raised to the hard
    /// RLIMIT_NOFILE at start) less the 256 kept for executor respawns,
    /// listeners and logs].
    #[arg(long, env = "PTXD_MAX_FD_BUFFERS", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_fd_buffers: Option<u64>,

    /// Buffers passed by descriptor one uid's sessions may hold: a count, or
    /// a percentage of --max-fd-buffers.
    #[arg(long, env = "PTXD_MAX_FD_BUFFERS_PER_UID", default_value = "25%", value_parser = parse_share)]
    pub max_fd_buffers_per_uid: Share,

    /// Registered events per session at most.
    #[arg(long, env = "PTXD_MAX_EVENTS_PER_SESSION", default_value_t = 1024)]
    pub max_events_per_session: u32,

    /// Open sessions per uid at most: a count, or a percentage of
    /// --max-sessions. TCP callers count as one tenant.
    #[arg(long, env = "PTXD_MAX_SESSIONS_PER_UID", default_value = "25%", value_parser = parse_share)]
    pub max_sessions_per_uid: Share,

    /// Slots one uid's sessions may hold at most: a count, or a percentage of
    /// --slots. A uid at its share first loses its own dead and idle slots.
    #[arg(long, env = "PTXD_MAX_SLOTS_PER_UID", default_value = "25%", value_parser = parse_share)]
    pub max_slots_per_uid: Share,

    /// Registered buffers per uid at most (over all its sessions).
    #[arg(long, env = "PTXD_MAX_BUFFERS_PER_UID", default_value_t = 16384)]
    pub max_buffers_per_uid: u32,

    /// Loaded artifact bytes in all executors together at most (executor
    /// memory grows with kernel size, not only with kernel count).
    #[arg(long, env = "PTXD_MAX_LOADED_BYTES", default_value_t = 2 << 30)]
    pub max_loaded_bytes: u64,

    /// Loaded artifact bytes one uid's sessions may hold: a count, or a
    /// percentage of --max-loaded-bytes.
    #[arg(long, env = "PTXD_MAX_LOADED_BYTES_PER_UID", default_value = "25%", value_parser = parse_share)]
    pub max_loaded_bytes_per_uid: Share,

    /// Loaded artifact bytes one session may hold (a cached kernel counts in
    /// full for each holder).
    #[arg(long, env = "PTXD_MAX_LOADED_BYTES_PER_SESSION", default_value_t = 256 << 20)]
    pub max_loaded_bytes_per_session: u64,

    /// A kernel not launched or loaded for this long is idle: a uid at its
    /// slot or loaded-byte share loses its own idle kernels (least recently
    /// used first) before it is refused. Their handles become STALE_KERNEL.
    #[arg(long, env = "PTXD_IDLE_RECLAIM_AFTER", default_value = "60s", value_parser = parse_duration)]
    pub idle_reclaim_after: Duration,

    /// Who may share a compiled kernel: `node` (everyone; a cache hit tells
    /// a session that someone loaded the same artifact) or `uid` (only the
    /// same uid).
    #[arg(long, env = "PTXD_KERNEL_CACHE_SCOPE", value_enum, default_value_t = CacheScope::Node)]
    pub kernel_cache_scope: CacheScope,

    /// Callers allowed to load unverified machine code (cubin, fatbin), as
    /// `uid:N` and `gid:N` items, comma-separated (e.g. `uid:0,gid:1001`),
    /// matched against the Unix socket peer's uid and primary gid. Default:
    /// nobody. A TCP caller is never trusted. A trusted caller's machine
    /// code runs unchecked and can read or write any tenant's GPU memory.
    #[arg(long, env = "PTXD_TRUST_UNVERIFIED_ARTIFACTS", default_value = "", value_parser = parse_trust_list)]
    pub trust_unverified_artifacts: TrustList,

    /// How long an executor may leave one request unanswered before it is
    /// pinged; if the ping is not answered within this time either, the
    /// executor is killed and restarted with a new generation (a hung
    /// driver must not hang its device). Launches are bounded by
    /// --max-kernel-time instead.
    #[arg(long, env = "PTXD_EXECUTOR_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub executor_timeout: Duration,

    /// How long an executor's request loop polls its channel for the next
    /// request before it sleeps (0: it sleeps at once). A session launching
    /// back to back then finds the executor awake: a unary launch does not
    /// pay for waking it (on an H200 the daemon's share of a unary launch
    /// went from 31 to 23 µs at the median). The executor spins at most this
    /// long after each request, yielding its core every microsecond or so,
    /// so an idle daemon costs nothing (BENCHMARKS.md).
    #[arg(long, env = "PTXD_EXECUTOR_SPIN", default_value = "200us", value_parser = parse_duration)]
    pub executor_spin: Duration,

    /// How long the front polls for what it expects next before its worker
    /// sleeps (0: at once): a fd socket connection's next call after a
    /// reply, and the executor's reply to a call. A session launching back
    /// to back then finds the front awake, and an executor reply is read by
    /// the call that waits for it, not handed over by a woken reader. Each
    /// wait spins at most this long, yielding its worker to other tasks
    /// between polls, and at most half as many waits as the machine has
    /// cores spin at once (the rest sleep at once), so an idle daemon costs
    /// nothing and a busy one keeps workers free (BENCHMARKS.md).
    #[arg(long, env = "PTXD_FRONT_SPIN", default_value = "200us", value_parser = parse_duration)]
    pub front_spin: Duration,

    /// Per-launch time budget (0: none). A host launch that runs longer is
    /// stopped and refused KERNEL_TIMEOUT, and its executor goes on; a CUDA
    /// kernel cannot be stopped, so its launch is refused KERNEL_TIMEOUT and
    /// the device's executor restarts (every session's kernels on that
    /// device go stale).
    #[arg(long, env = "PTXD_MAX_KERNEL_TIME", default_value = "10s", value_parser = parse_duration)]
    pub max_kernel_time: Duration,

    /// Launches of one session that may run past --max-kernel-time; the
    /// session's further launches are refused LIMIT_EXCEEDED
    /// (limit=max_kernel_timeouts_per_session).
    #[arg(long, env = "PTXD_MAX_KERNEL_TIMEOUTS_PER_SESSION", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_kernel_timeouts_per_session: u32,

    /// PTX verifications one uid may have running at once (TCP callers
    /// together are one tenant). Up to 16 times as many more wait in arrival
    /// order; one past that is refused LIMIT_EXCEEDED
    /// (limit=max_concurrent_verifications_per_uid) at once. Running ones
    /// share as many verifier threads as the machine has cores. A load answered from the verifier's memo (a text seen
    /// before, accepted or refused) does not count.
    #[arg(long, env = "PTXD_MAX_CONCURRENT_VERIFICATIONS_PER_UID", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_concurrent_verifications_per_uid: u32,

    /// How long the descriptor of a RegisterBuffer (posix_fd) may take to
    /// arrive on the fd socket before its token expires.
    #[arg(long, env = "PTXD_FD_TOKEN_TTL", default_value = "10s", value_parser = parse_duration)]
    pub fd_token_ttl: Duration,

    /// Connections the fd socket serves at once. When all are taken, a uid
    /// holding none still gets one: the idlest connection of the uid
    /// holding the most is ended to make room (LIMIT_EXCEEDED,
    /// limit=fd_socket_connections, in place of its next answer).
    #[arg(long, env = "PTXD_FD_SOCKET_MAX_CONNECTIONS", default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=65_536))]
    pub fd_socket_max_connections: u64,

    /// Connections one uid may hold on the fd socket at once (more are
    /// refused LIMIT_EXCEEDED, limit=fd_socket_connections_per_uid).
    #[arg(long, env = "PTXD_FD_SOCKET_MAX_CONNECTIONS_PER_UID", default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=65_536))]
    pub fd_socket_max_connections_per_uid: u64,

    /// A fd socket connection without a packet for this long (or with a
    /// reply it does not read) is closed.
    #[arg(long, env = "PTXD_FD_SOCKET_IDLE_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub fd_socket_idle_timeout: Duration,

    /// How long to wait for in-flight work on SIGTERM/SIGINT before failing it.
    #[arg(long, env = "PTXD_DRAIN_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub drain_timeout: Duration,

    /// Serve Prometheus metrics on ADDR (loopback unless --metrics-allow-remote).
    #[arg(long, env = "PTXD_METRICS")]
    pub metrics: Option<SocketAddr>,

    /// Allow --metrics to bind a non-loopback address.
    #[arg(long, env = "PTXD_METRICS_ALLOW_REMOTE", default_value_t = false)]
    pub metrics_allow_remote: bool,

    /// Log format.
    #[arg(long, env = "PTXD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Keep the machine code the CUDA driver's JIT compiles in this
    /// directory (created mode 0700; refused if another user owns it; the
    /// verifier's verdicts go in its `verdicts` subdirectory), so
    /// that a restarted executor or daemon loads a known kernel without
    /// compiling it again. Entries are keyed by the kernel text's hash, the
    /// device's architecture and the driver's version, and checked on read.
    /// Several daemons may share it. None: no persistent cache.
    #[arg(long, env = "PTXD_KERNEL_CACHE_DIR")]
    pub kernel_cache_dir: Option<PathBuf>,

    /// The size bound of the compiled kernels in the kernel cache
    /// directory; the least recently used entries are deleted beyond it
    /// (the `verdicts` subdirectory has its own bound,
    /// --verdict-cache-max-bytes).
    #[arg(long, env = "PTXD_KERNEL_CACHE_MAX_BYTES", default_value_t = 1 << 30)]
    pub kernel_cache_max_bytes: u64,

    /// The verdict cache's size bound: the verifier's accepted verdicts
    /// (canonical text and launch contract), kept in the `verdicts`
    /// subdirectory of --kernel-cache-dir (on whenever that is set) so that
    /// a restarted daemon does not verify a kernel it verified before; the
    /// least recently used entries are deleted beyond it.
    #[arg(long, env = "PTXD_VERDICT_CACHE_MAX_BYTES", default_value_t = 256 << 20)]
    pub verdict_cache_max_bytes: u64,

    /// Keep a second executor started per device (a hot spare), promoted
    /// at once when the serving one dies, so that a device recovers
    /// without starting a process (and, on CUDA, a context); the next
    /// spare then starts in the background. Costs one idle process per
    /// device (on CUDA, a context's device memory).
    #[arg(long, env = "PTXD_SPARE_EXECUTOR", default_value_t = false)]
    pub spare_executor: bool,
}

impl ServeConfig {
    /// The socket path to bind.
    pub fn socket_path(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(ptxd_ipc::socket_dir::default_socket_path)
    }
}

fn parse_mode(text: &str) -> Result<u32, String> {
    let mode = u32::from_str_radix(text.trim_start_matches("0o"), 8)
        .map_err(|e| format!("not an octal mode: {e}"))?;
    if mode > 0o777 {
        return Err("a socket mode is at most 777".into());
    }
    Ok(mode)
}

/// The longest duration a flag takes: `u32::MAX` seconds (about 136
/// years), far past any timeout, TTL or spin, and short enough that every
/// `Instant::now() + duration` the daemon computes from one (a token's
/// deadline, a spin's end) stays inside `Instant`'s range: a longer one
/// would panic there, at a request, long after the daemon started.
pub const MAX_DURATION: Duration = Duration::from_secs(u32::MAX as u64);

/// Parses `50us`, `250ms`, `5s`, `2m` or a bare number of seconds, at most
/// [`MAX_DURATION`].
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => text.split_at(i),
        None => (text, "s"),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("not a duration: {text:?}"))?;
    let seconds = match unit {
        "us" => value / 1_000_000.0,
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        _ => {
            return Err(format!(
                "unknown duration unit {unit:?} (use us, ms, s or m)"
            ))
        }
    };
    let duration =
        Duration::try_from_secs_f64(seconds).map_err(|e| format!("bad duration {text:?}: {e}"))?;
    if duration > MAX_DURATION {
        return Err(format!(
            "duration {text:?} is longer than the longest a flag takes, {} s",
            MAX_DURATION.as_secs()
        ));
    }
    Ok(duration)
}

/// The configured limits.
#[derive(Debug, Clone)]
pub struct Limits {
    pub slots: u32,
    pub max_artifact_bytes: u64,
    pub max_request_bytes: u64,
    pub max_sessions: u32,
    pub max_buffers_per_session: u32,
    pub max_kernels_per_session: u32,
    pub max_buffer_bytes_per_session: u64,
    pub max_events_per_session: u32,
    pub max_sessions_per_uid: u32,
    pub max_slots_per_uid: u32,
    pub max_buffers_per_uid: u32,
    pub max_loaded_bytes: u64,
    pub max_loaded_bytes_per_uid: u64,
    pub max_loaded_bytes_per_session: u64,
    /// How long an fd token waits for its descriptor.
    pub fd_token_ttl: Duration,
    /// Registered buffer bytes, in all and per uid.
    pub max_buffer_bytes: u64,
    pub max_buffer_bytes_per_uid: u64,
    /// Buffers passed by descriptor, in all and per uid.
    pub max_fd_buffers: u64,
    pub max_fd_buffers_per_uid: u64,
}

impl Limits {
    /// The limits `config` sets, with per-uid shares resolved.
    pub fn from_config(config: &ServeConfig) -> Limits {
        let max_fd_buffers = config.max_fd_buffers.unwrap_or_else(|| {
            let fd_limit = crate::connections::current_fd_limit();
            crate::connections::fd_budget(fd_limit, config.fd_socket_max_connections).fd_buffers
        });
        Limits {
            slots: config.slots,
            max_artifact_bytes: config.max_artifact_bytes,
            max_request_bytes: config.max_request_bytes,
            max_sessions: config.max_sessions,
            max_buffers_per_session: config.max_buffers_per_session,
            max_kernels_per_session: config.max_kernels_per_session,
            max_buffer_bytes_per_session: config.max_buffer_bytes_per_session,
            max_events_per_session: config.max_events_per_session,
            max_sessions_per_uid: clamp_u32(
                config
                    .max_sessions_per_uid
                    .of(config.max_sessions.into())
                    .min(config.max_sessions.into()),
            ),
            max_slots_per_uid: clamp_u32(
                config
                    .max_slots_per_uid
                    .of(config.slots.into())
                    .min(config.slots.into()),
            ),
            max_buffers_per_uid: config.max_buffers_per_uid,
            max_loaded_bytes: config.max_loaded_bytes,
            max_loaded_bytes_per_uid: config
                .max_loaded_bytes_per_uid
                .of(config.max_loaded_bytes)
                .min(config.max_loaded_bytes),
            max_loaded_bytes_per_session: config.max_loaded_bytes_per_session,
            fd_token_ttl: config.fd_token_ttl,
            max_buffer_bytes: config.max_buffer_bytes,
            max_buffer_bytes_per_uid: config
                .max_buffer_bytes_per_uid
                .of(config.max_buffer_bytes)
                .min(config.max_buffer_bytes),
            max_fd_buffers,
            max_fd_buffers_per_uid: config
                .max_fd_buffers_per_uid
                .of(max_fd_buffers)
                .min(max_fd_buffers),
        }
    }
}

fn clamp_u32(value: u64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_modes_parse() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("200us").unwrap(), Duration::from_micros(200));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert!(parse_duration("5h").is_err());
        assert!(parse_duration("-1s").is_err());
        assert_eq!(parse_duration(&u32::MAX.to_string()).unwrap(), MAX_DURATION);
        assert_eq!(parse_mode("660").unwrap(), 0o660);
        assert!(parse_mode("999").is_err());
    }

    /// A duration `Instant::now() + d` cannot hold (a token TTL, a spin)
    /// is refused when the flag is parsed, not met by a panic at the first
    /// request that adds it to the clock; every accepted one adds.
    #[test]
    fn a_duration_past_what_the_clock_can_add_is_refused() {
        use rand::Rng;
        let mut rng = rand::rng();
        let longest = u64::from(u32::MAX);
        for _ in 0..100 {
            let seconds = rng.random_range(longest + 1..=u64::MAX / 2);
            for text in [
                format!("{seconds}"),
                format!("{seconds}s"),
                format!("{}m", seconds / 60 + 1),
            ] {
                let refused = parse_duration(&text).unwrap_err();
                assert!(
                    refused.contains("longer than the longest a flag takes"),
                    "{refused}"
                );
            }
            let accepted = parse_duration(&rng.random_range(0..=longest).to_string()).unwrap();
            assert!(std::time::Instant::now().checked_add(accepted).is_some());
        }
        // 1e19 s: a Duration, and one `Instant + Duration` panics on.
        let far = "10000000000000000000";
        assert!(std::time::Instant::now()
            .checked_add(Duration::from_secs(10_000_000_000_000_000_000))
            .is_none());
        assert!(parse_duration(far)
            .unwrap_err()
            .contains("longer than the longest a flag takes"));
    }

    #[test]
    fn shares_and_trust_lists_parse() {
        assert_eq!(parse_share("25%").unwrap().of(256), 64);
        assert_eq!(parse_share("1%").unwrap().of(10), 1, "never zero");
        assert_eq!(parse_share("7").unwrap().of(256), 7);
        for bad in ["0", "0%", "101%", "x", "-1", ""] {
            assert!(parse_share(bad).is_err(), "{bad:?}");
        }
        let list = parse_trust_list("uid:0, gid:1001,uid:42").unwrap();
        assert_eq!(list.uids, vec![0, 42]);
        assert_eq!(list.gids, vec![1001]);
        assert!(list.trusts(42, 5) && list.trusts(7, 1001) && !list.trusts(7, 5));
        assert!(parse_trust_list("").unwrap().is_empty());
        for bad in ["root", "uid:x", "user:1", "uid:-1"] {
            assert!(parse_trust_list(bad).is_err(), "{bad:?}");
        }
    }
}
