//! ptxd as a daemon shared by several tenants (issue 9): the real binary on
//! the host backend, driven through the SDK over the Unix socket and over
//! TCP. No identity, no privilege over TCP; sessions bound to their opener;
//! per-uid quotas with reclamation of the tenant's own idle kernels; limits
//! on loaded artifact bytes; per-session, unguessable handles that answer
//! alike whether foreign or made up; the kernel cache scope; unverified
//! machine code refused unless trusted; and LaunchStreams that answer every
//! request they read when the daemon drains.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::{corpus, random_f32, Daemon};
use crate::support::{meta, reason};
use ptxd_client::{
    Artifact, Buffer, Client, DeclaredAbi, Error, HostShm, Kernel, Launch, LoadOptions, Session,
};

fn metadata(error: &Error) -> BTreeMap<String, String> {
    error
        .refusal()
        .map(|r| r.metadata().clone())
        .unwrap_or_default()
}

fn free_tcp_addr() -> String {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("127.0.0.1:{}", probe.local_addr().unwrap().port())
}

async fn unix(daemon: &Daemon) -> Client {
    Client::connect(&daemon.target()).await.unwrap()
}

async fn tcp(addr: &str) -> Client {
    Client::connect(&format!("http://{addr}")).await.unwrap()
}

/// The add kernel, made a distinct program (another canonical text, so
/// another content hash) by a dead write of `variant` to `%f3`, and padded
/// with more dead writes to a canonical size of at least `min_bytes`
/// (comments would not do: the cache key is the canonical text).
fn add_variant(variant: usize, min_bytes: usize) -> String {
    let original = corpus("add_f32_scalar.ptx");
    let anchor = "\tmov.u32 \t%r1, %ctaid.x;\n";
    let mut extra = format!("\tmov.b32 \t%f3, 0f{variant:08X};\n");
    // Each dead write prints as about 26 canonical bytes.
    for _ in 0..min_bytes / 20 {
        extra.push_str("\tmov.b32 \t%f3, 0f00000000;\n");
    }
    assert!(original.contains(anchor));
    original.replacen(anchor, &format!("{extra}{anchor}"), 1)
}

/// The bytes ptxd holds for a kernel: its canonical text.
fn canonical_len(text: &str) -> u64 {
    ptxd::ptx::canonicalize(text, "add_f32_scalar", None)
        .unwrap()
        .text
        .len() as u64
}

async fn load_add(session: &Session, variant: usize) -> Result<Kernel, Error> {
    session
        .load_ptx(
            0,
            add_variant(variant, 0),
            "add_f32_scalar",
            LoadOptions::default(),
        )
        .await
}

async fn f32_buffer(session: &Session, values: &[f32]) -> (HostShm, Buffer) {
    let mut shm = HostShm::create((values.len() * 4) as u64).unwrap();
    shm.write_f32(0, values).unwrap();
    let buffer = session.register_shm(&shm, None).await.unwrap();
    (shm, buffer)
}

/// Runs `add` over fresh random inputs and checks every element.
async fn add_runs(session: &Session, add: &Kernel) -> Result<(), Error> {
    let n = 257;
    let (a, b) = (random_f32(n), random_f32(n));
    let (_a, a_buf) = f32_buffer(session, &a).await;
    let (_b, b_buf) = f32_buffer(session, &b).await;
    let (out_shm, out) = f32_buffer(session, &vec![f32::NAN; n]).await;
    session
        .launch(
            add,
            &Launch::new([a_buf.operand(), b_buf.operand()], out.operand(), n as u64).sync(true),
        )
        .await?;
    let got = out_shm.read_f32(0, n).unwrap();
    for i in 0..n {
        assert_eq!(got[i].to_bits(), (a[i] + b[i]).to_bits(), "element {i}");
    }
    Ok(())
}

fn cubin_abi() -> DeclaredAbi {
    DeclaredAbi {
        inputs: 2,
        scalar_params: 0,
        element_size: 4,
    }
}

// ----- item 1: no identity, no privilege --------------------------------

#[tokio::test]
async fn a_tcp_caller_gets_no_identity_bound_privilege() {
    let addr = free_tcp_addr();
    // Even with everyone trusted, a caller without credentials is not.
    let trust = format!(
        "uid:{},gid:{}",
        nix::unistd::getuid(),
        nix::unistd::getgid()
    );
    let daemon = Daemon::start(&["--tcp", &addr, "--trust-unverified-artifacts", &trust]);
    let remote = tcp(&addr).await;
    let session = remote.open_session("tcp").await.unwrap();

    // A 0600 object of the daemon's own uid: the deputy could map it.
    let mut secret = HostShm::create(4096).unwrap();
    let poison = random_f32(1024);
    secret.write_f32(0, &poison).unwrap();
    let err = session.register_shm(&secret, None).await.unwrap_err();
    assert_eq!(reason(&err), "IDENTITY_REQUIRED");
    assert_eq!(err.refusal().unwrap().code(), tonic::Code::Unauthenticated);
    assert_eq!(meta(&err, "resource"), "host_shm");
    // By name too, whatever the object.
    let err = session
        .register_host_shm("/ptxd-no-such-object", 64, None)
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "IDENTITY_REQUIRED");
    // CUDA IPC memory and events: the executor would open them with the
    // daemon's rights, too.
    let err = session
        .register_cuda_ipc([7u8; 64], "HOST-0", 64)
        .await
        .unwrap_err();
    assert_eq!(
        (reason(&err), meta(&err, "resource")),
        ("IDENTITY_REQUIRED", "cuda_ipc")
    );
    let err = session
        .register_event([7u8; 64], "HOST-0", "e")
        .await
        .unwrap_err();
    assert_eq!(
        (reason(&err), meta(&err, "resource")),
        ("IDENTITY_REQUIRED", "ipc_event")
    );
    assert!(session.list_buffers().await.unwrap().is_empty());

    // Machine code is never trusted over TCP.
    for artifact in [
        Artifact::Cubin(vec![0x7f, b'E', b'L', b'F']),
        Artifact::Fatbin(vec![0x50, 0xed, 0x55, 0xba]),
    ] {
        let kind = match artifact {
            Artifact::Cubin(_) => "cubin",
            _ => "fatbin",
        };
        let options = LoadOptions {
            declared: Some(cubin_abi()),
            ..LoadOptions::default()
        };
        let err = session.load(0, artifact, "k", options).await.unwrap_err();
        assert_eq!(reason(&err), "UNVERIFIED_ARTIFACT", "{kind}");
        assert_eq!(meta(&err, "kind"), kind);
    }

    // What TCP may do: query and load verified PTX.
    assert_eq!(remote.info().await.unwrap().sessions, 1);
    load_add(&session, 0).await.unwrap();

    // The same object over the Unix socket, as its owner: allowed.
    let local = unix(&daemon).await.open_session("unix").await.unwrap();
    local.register_shm(&secret, None).await.unwrap();
    assert_eq!(secret.read_f32(0, 1024).unwrap(), poison, "untouched");
}

#[tokio::test]
async fn a_session_is_bound_to_the_caller_that_opened_it() {
    let addr = free_tcp_addr();
    let daemon = Daemon::start(&["--tcp", &addr]);
    let first = tcp(&addr).await;
    let second = tcp(&addr).await;
    let local = unix(&daemon).await;
    let session = first.open_session("bound").await.unwrap();
    let list = |client: &Client| {
        let mut raw = client.raw();
        let session = session.id().to_string();
        async move {
            raw.list_buffers(ptxd_proto::v1::ListBuffersRequest { session })
                .await
                .map_err(Error::from)
        }
    };
    list(&first).await.unwrap();
    for (who, client) in [("the Unix socket", &local), ("another connection", &second)] {
        let err = list(client).await.unwrap_err();
        assert_eq!(reason(&err), "NOT_OWNER", "{who}");
        // Names the session only: never a uid.
        assert_eq!(
            metadata(&err).keys().collect::<Vec<_>>(),
            vec!["session"],
            "{who}"
        );
    }
    // And the other way: a Unix session over TCP.
    let unix_session = local.open_session("unix").await.unwrap();
    let err = first
        .raw()
        .list_kernels(ptxd_proto::v1::ListKernelsRequest {
            session: unix_session.id().to_string(),
        })
        .await
        .map_err(Error::from)
        .unwrap_err();
    assert_eq!(reason(&err), "NOT_OWNER");
    assert_eq!(metadata(&err).keys().collect::<Vec<_>>(), vec!["session"]);
}

// ----- item 7: per-uid quotas --------------------------------------------

/// Runs only as the child process of
/// `one_uid_cannot_take_every_session_or_slot`, under another uid.
#[tokio::test]
async fn other_uid_process_main() {
    let Ok(target) = std::env::var("PTXD_TEST_OTHER_UID_TARGET") else {
        return;
    };
    let client = Client::connect(&target).await.unwrap();
    let session = client.open_session("other uid").await.unwrap();
    let kernel = load_add(&session, 1000).await.unwrap();
    let info = client.info().await.unwrap();
    println!(
        "SERVED cache_hit={} sessions={} slots={}",
        kernel.state().cache_hit,
        info.caller_usage.sessions,
        info.caller_usage.slots
    );
}

#[tokio::test]
async fn one_uid_cannot_take_every_session_or_slot() {
    use std::os::unix::fs::PermissionsExt;
    let addr = free_tcp_addr();
    // 25% of 8 sessions and of 8 slots: 2 each per uid.
    let daemon = Daemon::start(&[
        "--tcp",
        &addr,
        "--max-sessions",
        "8",
        "--slots",
        "8",
        "--socket-mode",
        "666",
    ]);
    let local = unix(&daemon).await;
    let s1 = local.open_session("one").await.unwrap();
    let s2 = local.open_session("two").await.unwrap();
    let err = local.open_session("three").await.unwrap_err();
    assert_eq!(
        (reason(&err), meta(&err, "limit"), meta(&err, "value")),
        ("LIMIT_EXCEEDED", "max_sessions_per_uid", "2")
    );
    let k1 = load_add(&s1, 1).await.unwrap();
    let _k2 = load_add(&s1, 2).await.unwrap();
    // The share is the uid's, over all its sessions.
    let err = load_add(&s2, 3).await.unwrap_err();
    assert_eq!(
        (reason(&err), meta(&err, "limit"), meta(&err, "value")),
        ("LIMIT_EXCEEDED", "max_slots_per_uid", "2")
    );
    // A cache hit on a slot the uid already holds costs it nothing.
    let again = load_add(&s2, 1).await.unwrap();
    assert!(again.state().cache_hit);
    add_runs(&s2, &again).await.unwrap();
    let info = local.info().await.unwrap();
    assert_eq!(info.limits.max_slots_per_uid, 2);
    assert_eq!(info.limits.max_sessions_per_uid, 2);
    assert_eq!(
        (info.caller_usage.sessions, info.caller_usage.slots),
        (2, 2)
    );

    // Another tenant is still served: every TCP caller together...
    let remote = tcp(&addr).await;
    let t1 = remote.open_session("tcp").await.unwrap();
    let theirs = load_add(&t1, 4).await.unwrap();
    assert!(!theirs.state().cache_hit);
    // ...and another uid, when this test may switch to one.
    if nix::unistd::getuid().is_root() {
        std::fs::set_permissions(daemon.dir.path(), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        let output = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                crate::support::test_name(module_path!(), "other_uid_process_main").as_str(),
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env("PTXD_TEST_OTHER_UID_TARGET", daemon.target())
            .env_remove("PTXD_TEST_LOG")
            .current_dir("/")
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            stdout.contains("SERVED cache_hit=false sessions=1 slots=1"),
            "uid 65534 was not served: {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    } else {
        eprintln!("not root: the second-uid half of this test ran over TCP only");
    }
    add_runs(&s1, &k1).await.unwrap();
}

use std::os::unix::process::CommandExt;

#[tokio::test]
async fn a_uid_at_its_share_loses_its_own_idle_kernels_first() {
    // The idle time bounds the checks that nothing is idle yet: each runs
    // within it of the kernels' last use, a few calls that a loaded 2-core
    // machine (a debug daemon, verifying each load) has taken more than
    // 400 ms for. The test sleeps past it once.
    let idle_after = Duration::from_secs(2);
    let addr = free_tcp_addr();
    let daemon = Daemon::start(&["--tcp", &addr, "--slots", "8", "--idle-reclaim-after", "2s"]);
    let local = unix(&daemon).await;
    let session = local.open_session("busy").await.unwrap();
    let remote = tcp(&addr).await;
    let bystander = remote.open_session("bystander").await.unwrap();
    let theirs = load_add(&bystander, 9).await.unwrap();

    let loaded = std::time::Instant::now();
    let idle = load_add(&session, 1).await.unwrap();
    let busy = load_add(&session, 2).await.unwrap();
    let err = load_add(&session, 3).await.unwrap_err();
    let first_window = loaded.elapsed();
    assert_eq!(
        meta(&err, "limit"),
        "max_slots_per_uid",
        "nothing idle yet ({first_window:?} after the first load)"
    );
    tokio::time::sleep(idle_after + Duration::from_millis(200)).await;
    add_runs(&session, &busy).await.unwrap();
    // Both are past the idle time of their load, but `busy` just ran: the
    // least recently used one goes.
    let third = load_add(&session, 3).await.unwrap();
    let used = std::time::Instant::now();
    add_runs(&session, &third).await.unwrap();
    add_runs(&session, &busy).await.unwrap();
    let err = add_runs(&session, &idle).await.unwrap_err();
    assert_eq!(reason(&err), "STALE_KERNEL");
    // Another tenant's idle kernel is never taken.
    let kept = bystander.list_kernels().await.unwrap();
    assert_eq!(kept.len(), 1);
    assert!(kept[0].live && kept[0].handle == theirs.handle());
    let err = load_add(&session, 4).await.unwrap_err();
    let second_window = used.elapsed();
    eprintln!(
        "checks that nothing was idle ran {first_window:?} and {second_window:?} \
         after the kernels' use (idle after {idle_after:?})"
    );
    assert_eq!(
        meta(&err, "limit"),
        "max_slots_per_uid",
        "nothing idle again ({second_window:?} after the last uses)"
    );
    assert_eq!(local.info().await.unwrap().slots_used, 3);
}

// ----- item 8: loaded artifact bytes --------------------------------------

async fn load(session: &Session, variant: usize) -> Result<(), Error> {
    session
        .load_ptx(
            0,
            add_variant(variant, 40_000),
            "add_f32_scalar",
            LoadOptions::default(),
        )
        .await
        .map(|_| ())
}

#[tokio::test]
async fn loaded_artifact_bytes_are_bounded_per_session_uid_and_in_total() {
    let addr = free_tcp_addr();
    let size = canonical_len(&add_variant(0, 40_000));
    assert!(size >= 40_000);
    for variant in 1..6 {
        assert_eq!(canonical_len(&add_variant(variant, 40_000)), size);
    }
    let (per_session, per_uid, total) = (2 * size + 7, 3 * size + 7, 4 * size + 7);
    let daemon = Daemon::start(&[
        "--tcp",
        &addr,
        "--max-loaded-bytes-per-session",
        &per_session.to_string(),
        "--max-loaded-bytes-per-uid",
        &per_uid.to_string(),
        "--max-loaded-bytes",
        &total.to_string(),
    ]);
    let local = unix(&daemon).await;
    let (a, b) = (
        local.open_session("a").await.unwrap(),
        local.open_session("b").await.unwrap(),
    );
    let remote = tcp(&addr).await;
    let c = remote.open_session("c").await.unwrap();
    load(&a, 1).await.unwrap();
    load(&a, 2).await.unwrap();
    let limit = |e: Error| (meta(&e, "limit").to_string(), meta(&e, "value").to_string());
    assert_eq!(
        limit(load(&a, 3).await.unwrap_err()),
        (
            "max_loaded_bytes_per_session".into(),
            per_session.to_string()
        )
    );
    load(&b, 3).await.unwrap();
    assert_eq!(
        limit(load(&b, 4).await.unwrap_err()),
        ("max_loaded_bytes_per_uid".into(), per_uid.to_string())
    );
    load(&c, 4).await.unwrap();
    assert_eq!(
        limit(load(&c, 5).await.unwrap_err()),
        ("max_loaded_bytes".into(), total.to_string())
    );

    let info = local.info().await.unwrap();
    assert_eq!(info.loaded_bytes, 4 * size);
    assert_eq!(info.caller_usage.loaded_bytes, 3 * size);
    assert_eq!(
        (
            info.limits.max_loaded_bytes,
            info.limits.max_loaded_bytes_per_uid,
            info.limits.max_loaded_bytes_per_session
        ),
        (total, per_uid, per_session)
    );
    assert_eq!(remote.info().await.unwrap().caller_usage.loaded_bytes, size);
    // Unloading gives the room back.
    b.close().await.unwrap();
    load(&c, 5).await.unwrap();
    assert_eq!(local.info().await.unwrap().loaded_bytes, 4 * size);
}

// ----- item 12: existence and identity leaks -------------------------------

/// `text` with its first hex field (the token) replaced by a random one.
fn made_up(text: &str) -> String {
    let (prefix, rest) = text.split_at(4);
    let (_, tail) = rest.split_once('-').unwrap();
    format!("{prefix}{:016x}-{tail}", rand::random::<u64>())
}

/// A refusal with the handle that was sent taken out of its metadata and
/// message, to compare two refusals for different handles.
fn shape(error: &Error, handle: &str) -> (tonic::Code, String, String, BTreeMap<String, String>) {
    let refusal = error.refusal().expect("a refusal");
    let mut metadata = refusal.metadata().clone();
    for value in metadata.values_mut() {
        *value = value.replace(handle, "<handle>");
    }
    (
        refusal.code(),
        refusal.wire_name().to_string(),
        refusal.message().replace(handle, "<handle>"),
        metadata,
    )
}

#[tokio::test]
async fn another_sessions_handle_and_a_made_up_one_get_one_answer() {
    let daemon = Daemon::start(&[]);
    let client = unix(&daemon).await;
    let mine = client.open_session("mine").await.unwrap();
    let theirs = client.open_session("theirs").await.unwrap();
    let their_kernel = load_add(&theirs, 0).await.unwrap();
    let my_kernel = load_add(&mine, 0).await.unwrap();
    assert!(my_kernel.state().cache_hit);
    assert_ne!(
        my_kernel.handle(),
        their_kernel.handle(),
        "a cache hit is a new handle"
    );
    let (_t, their_buffer) = f32_buffer(&theirs, &[1.0; 64]).await;
    let (_x, x) = f32_buffer(&mine, &[1.0; 64]).await;
    let (_y, y) = f32_buffer(&mine, &[1.0; 64]).await;
    let handle_text = |b: &Buffer| b.operand().buffer.clone();
    // Not sequential: the buffer handles of one session share nothing.
    let (hx, hy) = (handle_text(&x), handle_text(&y));
    assert_eq!(
        hx.len(),
        "buf-".len() + 16 + 1 + hx.rsplit('-').next().unwrap().len()
    );
    assert_ne!(hx[4..20], hy[4..20]);

    let mut raw = mine.raw();
    let launch = |kernel: String, input: String| ptxd_proto::v1::LaunchRequest {
        session: mine.id().to_string(),
        kernel,
        inputs: vec![
            ptxd_proto::v1::Operand {
                buffer: input,
                offset: 0,
            },
            ptxd_proto::v1::Operand {
                buffer: hy.clone(),
                offset: 0,
            },
        ],
        output: Some(ptxd_proto::v1::Operand {
            buffer: hy.clone(),
            offset: 0,
        }),
        n: 16,
        sync: true,
        ..Default::default()
    };
    // Kernels.
    let foreign = their_kernel.handle();
    let invented = made_up(&foreign);
    let mut answers = Vec::new();
    for kernel in [&foreign, &invented] {
        let err = Error::from(
            raw.launch(launch(kernel.clone(), hx.clone()))
                .await
                .unwrap_err(),
        );
        answers.push(shape(&err, kernel));
        let err = Error::from(
            raw.unload_kernel(ptxd_proto::v1::UnloadKernelRequest {
                session: mine.id().to_string(),
                kernel: kernel.clone(),
            })
            .await
            .unwrap_err(),
        );
        answers.push(shape(&err, kernel));
    }
    assert_eq!(answers[0].1, "STALE_KERNEL");
    assert_eq!(answers[0], answers[2], "launch: foreign vs made up");
    assert_eq!(answers[1], answers[3], "unload: foreign vs made up");
    // Buffers.
    let foreign = handle_text(&their_buffer);
    let invented = made_up(&foreign);
    let mut answers = Vec::new();
    for buffer in [&foreign, &invented] {
        let err = Error::from(
            raw.launch(launch(my_kernel.handle(), buffer.clone()))
                .await
                .unwrap_err(),
        );
        answers.push(shape(&err, buffer));
        let err = Error::from(
            raw.release_buffer(ptxd_proto::v1::ReleaseBufferRequest {
                session: mine.id().to_string(),
                buffer: buffer.clone(),
            })
            .await
            .unwrap_err(),
        );
        answers.push(shape(&err, buffer));
    }
    assert_eq!(answers[0].1, "STALE_BUFFER");
    assert_eq!(answers[0], answers[2], "launch: foreign vs made up");
    assert_eq!(answers[1], answers[3], "release: foreign vs made up");
    // The owner's objects are untouched and still work.
    let listed = theirs.list_buffers().await.unwrap();
    assert!(listed.iter().any(|b| b.handle == foreign), "{listed:?}");
    add_runs(&theirs, &their_kernel).await.unwrap();
}

#[tokio::test]
async fn the_kernel_cache_is_shared_node_wide_or_per_uid() {
    for (scope, tcp_hit) in [("node", true), ("uid", false)] {
        let addr = free_tcp_addr();
        let daemon = Daemon::start(&["--tcp", &addr, "--kernel-cache-scope", scope]);
        let local = unix(&daemon).await;
        let remote = tcp(&addr).await;
        let sessions = [
            local.open_session("1").await.unwrap(),
            local.open_session("2").await.unwrap(),
            remote.open_session("3").await.unwrap(),
        ];
        let first = load_add(&sessions[0], 0).await.unwrap();
        let same_uid = load_add(&sessions[1], 0).await.unwrap();
        let other_tenant = load_add(&sessions[2], 0).await.unwrap();
        assert!(!first.state().cache_hit, "{scope}");
        assert!(same_uid.state().cache_hit, "{scope}: same uid shares");
        assert_eq!(other_tenant.state().cache_hit, tcp_hit, "{scope}");
        let info = local.info().await.unwrap();
        assert_eq!(info.kernel_cache_scope, scope);
        assert_eq!(info.slots_used, if tcp_hit { 1 } else { 2 });
    }
}

// ----- issue 8: unverified machine code -------------------------------------

#[tokio::test]
async fn machine_code_is_refused_unless_the_caller_is_trusted() {
    let (uid, gid) = (nix::unistd::getuid(), nix::unistd::getgid());
    let cubin = || Artifact::Cubin(vec![0x7f, b'E', b'L', b'F', 2, 1, 1]);
    let fatbin = || Artifact::Fatbin(vec![0x50, 0xed, 0x55, 0xba, 1, 0]);
    let options = || LoadOptions {
        declared: Some(cubin_abi()),
        ..LoadOptions::default()
    };
    for (trust, trusted) in [
        (String::new(), false),
        (format!("uid:{}", uid.as_raw() + 1), false),
        (format!("gid:{}", gid.as_raw() + 1), false),
        (format!("uid:{uid}"), true),
        (format!("uid:{},gid:{gid}", uid.as_raw() + 1), true),
    ] {
        let mut flags = vec![];
        if !trust.is_empty() {
            flags = vec!["--trust-unverified-artifacts", trust.as_str()];
        }
        let daemon = Daemon::start(&flags);
        let session = unix(&daemon).await.open_session("mc").await.unwrap();
        for (artifact, kind) in [(cubin(), "cubin"), (fatbin(), "fatbin")] {
            let err = session.load(0, artifact, "k", options()).await.unwrap_err();
            if trusted {
                // Past the trust check; the host executor runs PTX only.
                assert_eq!(reason(&err), "UNSUPPORTED_ARTIFACT", "{trust:?} {kind}");
                assert!(err.to_string().contains("PTX only"), "{err}");
            } else {
                assert_eq!(reason(&err), "UNVERIFIED_ARTIFACT", "{trust:?} {kind}");
                assert_eq!(err.refusal().unwrap().code(), tonic::Code::PermissionDenied);
                assert_eq!(meta(&err, "kind"), kind);
            }
        }
        // PTX is verified, so it needs no trust.
        load_add(&session, 0).await.unwrap();
        assert_eq!(unix(&daemon).await.info().await.unwrap().slots_used, 1);
    }
}

// ----- item 14: one check / call / re-check / commit-or-undo path -----------

#[tokio::test]
async fn racing_registrations_at_the_limit_leave_nothing_open_in_the_executor() {
    let daemon = Daemon::start(&["--max-buffers-per-session", "3"]);
    let client = unix(&daemon).await;
    let pid = client
        .raw()
        .get_info(ptxd_proto::v1::GetInfoRequest {})
        .await
        .unwrap()
        .into_inner()
        .devices[0]
        .executor_pid;
    let session = client.open_session("race").await.unwrap();
    let tag = format!("ptxd-race-{}", std::process::id());
    let objects: Vec<HostShm> = (0..24)
        .map(|i| HostShm::create_named(&format!("/{tag}-{i}"), 4096).unwrap())
        .collect();
    let results =
        futures_util::future::join_all(objects.iter().map(|shm| session.register_shm(shm, None)))
            .await;
    let won = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(won, 3, "{results:?}");
    for err in results.iter().filter_map(|r| r.as_ref().err()) {
        assert_eq!(meta(err, "limit"), "max_buffers_per_session", "{err}");
    }
    // Every registration that lost the race was undone in the executor.
    crate::support::wait_until("undone mappings", Duration::from_secs(5), || {
        crate::support::shm_mappings(pid, &tag) == 3
    });
    assert_eq!(session.list_buffers().await.unwrap().len(), 3);
}

// ----- item 13: drain answers what it read ----------------------------------

/// A stream client's tasks: the sender (how many it sent), the receiver
/// (every answer in order, and how the stream ended), and how many launches
/// were answered done so far.
type StreamClient = (
    tokio::task::JoinHandle<u64>,
    tokio::task::JoinHandle<(Vec<(u64, Result<(), String>)>, String)>,
    std::sync::Arc<std::sync::atomic::AtomicU64>,
);

/// One pipelined LaunchStream client: at most `WINDOW` launches
/// unanswered; it stops sending at its first DRAINING answer but keeps its
/// stream open, as a long-lived client waiting for more work does. Launch
/// `tag` writes `tag` at element `tag` of `out` (y = 1 * tag + 0).
async fn pipelined_client(
    session: &Session,
    affine: &Kernel,
    x: &Buffer,
    out: &Buffer,
    cap: u64,
) -> StreamClient {
    stream_client(session, affine, x, out, cap, false).await
}

/// [`pipelined_client`], which with `keep_sending` goes on sending after
/// its first DRAINING answer, until a send fails.
async fn stream_client(
    session: &Session,
    affine: &Kernel,
    x: &Buffer,
    out: &Buffer,
    cap: u64,
    keep_sending: bool,
) -> StreamClient {
    const WINDOW: usize = 32;
    let (mut sender, mut receiver) = session.launch_stream().await.unwrap().split();
    let window = std::sync::Arc::new(tokio::sync::Semaphore::new(WINDOW));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ended = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let (affine, x, out) = (affine.clone(), x.clone(), out.clone());
    let (send_window, send_stop, send_ended) = (window.clone(), stop.clone(), ended.clone());
    let send = tokio::spawn(async move {
        let mut sent = 0u64;
        for tag in 1..cap {
            let permit = send_window.acquire().await.unwrap();
            permit.forget();
            if send_stop.load(std::sync::atomic::Ordering::SeqCst) && !keep_sending
                || send_ended.load(std::sync::atomic::Ordering::SeqCst)
            {
                break;
            }
            let launch = Launch::new([x.operand()], out.at(tag * 4), 1)
                .params([tag as f64, 0.0])
                .sync(true);
            match sender.send(&affine, &launch).await {
                Ok(t) => {
                    assert_eq!(t, tag);
                    sent = tag;
                }
                Err(_) => break,
            }
        }
        // Keep the stream open until the daemon ends it.
        let _ = done_rx.await;
        drop(sender);
        sent
    });
    let ran = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = ran.clone();
    let receive = tokio::spawn(async move {
        let mut answers = Vec::new();
        let end = loop {
            match receiver.next().await {
                Ok(Some(reply)) => {
                    let outcome = reply
                        .outcome
                        .map(|_| ())
                        .map_err(|e| reason(&e).to_string());
                    if outcome.is_err() {
                        stop.store(true, std::sync::atomic::Ordering::SeqCst);
                    } else {
                        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    answers.push((reply.tag, outcome));
                    window.add_permits(1);
                }
                Ok(None) => break "closed".to_string(),
                Err(e) => break format!("{}: {e}", reason(&e)),
            }
        };
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        ended.store(true, std::sync::atomic::Ordering::SeqCst);
        window.add_permits(WINDOW);
        let _ = done_tx.send(());
        (answers, end)
    });
    (send, receive, ran)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drain_answers_every_launch_stream_request_and_ends_the_streams_with_a_status() {
    const STREAMS: usize = 4;
    const CAP: usize = 1 << 18;
    let drain_timeout = Duration::from_secs(4);
    let mut daemon = Daemon::start(&["--drain-timeout", "4s"]);
    let client = unix(&daemon).await;
    let session = client.open_session("drain").await.unwrap();
    let affine = session
        .load_ptx(
            0,
            corpus("affine_f32_scalar.ptx"),
            "affine_f32_scalar",
            LoadOptions::default(),
        )
        .await
        .unwrap();
    let (_x, x) = f32_buffer(&session, &[1.0]).await;
    let mut outputs = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..STREAMS {
        let (shm, out) = f32_buffer(&session, &vec![f32::NAN; CAP]).await;
        outputs.push(shm);
        tasks.push(pipelined_client(&session, &affine, &x, &out, CAP as u64).await);
    }
    // Every stream has had launches run before the drain (a fixed pause
    // guessed it; a loaded machine may not have answered one yet).
    crate::support::wait_until_async(
        "a launch of every stream to run",
        Duration::from_secs(30),
        || {
            tasks
                .iter()
                .all(|(_, _, ran)| ran.load(std::sync::atomic::Ordering::SeqCst) > 0)
        },
    )
    .await;
    let started = std::time::Instant::now();
    let status = tokio::task::spawn_blocking(move || daemon.terminate())
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(status.success(), "{status}");
    assert!(
        took < drain_timeout,
        "the streams were cut off at the drain timeout ({took:?})"
    );
    for (index, (send, receive, _)) in tasks.into_iter().enumerate() {
        let (answers, end) = receive.await.unwrap();
        let sent = send.await.unwrap();
        let out = outputs[index].read_f32(0, CAP).unwrap();
        let ran = answers.iter().filter(|(_, r)| r.is_ok()).count();
        let draining = answers
            .iter()
            .filter(|(_, r)| r.as_ref().err().map(String::as_str) == Some("DRAINING"))
            .count();
        eprintln!(
            "stream {index}: sent {sent}, answered {} ({ran} done, {draining} DRAINING), end: {end}",
            answers.len()
        );
        assert!(
            end.starts_with("DRAINING:"),
            "stream {index} ended with a DRAINING status, not a reset: {end}"
        );
        assert_eq!(
            answers.len() as u64,
            sent,
            "stream {index}: every request answered"
        );
        assert!(ran > 0 && draining > 0, "stream {index}");
        assert_eq!(ran + draining, answers.len(), "only done or DRAINING");
        for (i, (tag, _)) in answers.iter().enumerate() {
            assert_eq!(*tag, i as u64 + 1, "stream {index}: in order");
        }
        // What ran is exactly what was answered done.
        for (tag, outcome) in &answers {
            let value = out[*tag as usize];
            match outcome {
                Ok(()) => assert_eq!(value, *tag as f32, "stream {index} tag {tag}"),
                Err(_) => assert!(value.is_nan(), "stream {index}: refused tag {tag} ran"),
            }
        }
        assert!(out[sent as usize + 1..].iter().all(|v| v.is_nan()));
    }
}

/// LaunchStream clients that keep sending after their first DRAINING
/// answer: each stream still ends with a DRAINING status, not a reset or a
/// broken pipe; what was answered done ran, what was refused did not, and
/// nothing unanswered ran after the stream stopped reading.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "was flaky on CI (about one run in twenty: a stream ended with an h2 'error reading a body from connection' instead of its DRAINING status); the likely cause, a connection closed with the client's unread bytes in it (a reset), is fixed by the lingering close (connections.rs), but the flake never reproduced here, so the fix is unproven on CI: run with --ignored"]
async fn launch_streams_that_keep_sending_through_a_drain_end_with_a_status() {
    const STREAMS: usize = 3;
    const CAP: usize = 1 << 18;
    // Grace (half the drain timeout) for the streams, and as much again for
    // what they read to be answered before the executors stop: a loaded
    // 2-core CI machine needs the margin.
    let mut daemon = Daemon::start(&["--drain-timeout", "4s"]);
    let client = unix(&daemon).await;
    let session = client.open_session("drain").await.unwrap();
    let affine = session
        .load_ptx(
            0,
            corpus("affine_f32_scalar.ptx"),
            "affine_f32_scalar",
            LoadOptions::default(),
        )
        .await
        .unwrap();
    let (_x, x) = f32_buffer(&session, &[1.0]).await;
    let mut outputs = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..STREAMS {
        let (shm, out) = f32_buffer(&session, &vec![f32::NAN; CAP]).await;
        outputs.push(shm);
        tasks.push(stream_client(&session, &affine, &x, &out, CAP as u64, true).await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (daemon, status) = tokio::task::spawn_blocking(move || {
        let status = daemon.terminate();
        (daemon, status)
    })
    .await
    .unwrap();
    assert!(status.success(), "{status}\n{}", daemon.stderr());
    for (index, (send, receive, _)) in tasks.into_iter().enumerate() {
        let (answers, end) = receive.await.unwrap();
        let sent = send.await.unwrap();
        let ran = answers.iter().filter(|(_, r)| r.is_ok()).count();
        eprintln!(
            "stream {index}: sent {sent}, answered {} ({ran} done), end: {end}",
            answers.len()
        );
        assert!(
            end.starts_with("DRAINING:"),
            "stream {index} ended with {end}; the daemon's log:\n{}",
            daemon.stderr()
        );
        assert!(ran > 0 && ran < answers.len(), "stream {index}");
        let out = outputs[index].read_f32(0, CAP).unwrap();
        for (tag, outcome) in &answers {
            let value = out[*tag as usize];
            match outcome {
                Ok(()) => assert_eq!(value, *tag as f32, "stream {index} tag {tag}"),
                Err(reason) => {
                    assert_eq!(reason, "DRAINING", "stream {index} tag {tag}");
                    assert!(value.is_nan(), "stream {index}: refused tag {tag} ran");
                }
            }
        }
        assert!(
            out[answers.len() + 1..].iter().all(|v| v.is_nan()),
            "stream {index}: an unanswered launch ran"
        );
    }
}

/// A SIGTERM to the whole process group (systemd's default KillMode, a
/// terminal's ^C) reaches the executors too: ptxd drains and stops without
/// restarting them.
#[test]
fn sigterm_to_the_process_group_drains_without_restarting_executors() {
    let mut daemon = Daemon::start_with(
        &[
            "--host-devices",
            "4",
            "--drain-timeout",
            "1s",
            "--log-format",
            "text",
        ],
        |command| {
            command
                .env("RUST_LOG", "ptxd=info")
                .stdout(std::process::Stdio::null())
                .process_group(0);
        },
    );
    let group = nix::unistd::Pid::from_raw(-daemon.pid());
    nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = daemon.wait(Duration::from_secs(20));
    let log = daemon.stderr();
    assert!(status.success(), "{status}\n{log}");
    assert!(log.contains("ptxd stopped"), "{log}");
    assert!(
        !log.contains("executor died; restarting") && !log.contains("executor restarted"),
        "an executor was restarted during shutdown:\n{log}"
    );
}

// ----- issue 24, finding 10: a foreign shm object's owner stays unnamed ----

/// Runs only as the child process of
/// `another_users_shm_object_is_refused_not_owner_without_its_uid`, under
/// uid 65534: registers the object named in the environment and prints the
/// refusal.
#[tokio::test]
async fn foreign_shm_process_main() {
    let (Ok(target), Ok(name)) = (
        std::env::var("PTXD_TEST_FOREIGN_SHM_TARGET"),
        std::env::var("PTXD_TEST_FOREIGN_SHM_NAME"),
    ) else {
        return;
    };
    let client = Client::connect(&target).await.unwrap();
    let session = client.open_session("foreign shm").await.unwrap();
    match session.register_host_shm(&name, 4096, None).await {
        Ok(_) => println!("REGISTERED"),
        Err(err) => println!(
            "REFUSED reason={} message={} metadata={:?}",
            reason(&err),
            err.refusal()
                .map(|r| r.message().to_string())
                .unwrap_or_default(),
            metadata(&err)
        ),
    }
}

#[tokio::test]
async fn another_users_shm_object_is_refused_not_owner_without_its_uid() {
    use std::os::unix::fs::PermissionsExt;
    if !nix::unistd::getuid().is_root() {
        panic!("this test switches a child to another uid and must run as root");
    }
    let daemon = Daemon::start(&["--socket-mode", "666"]);
    std::fs::set_permissions(daemon.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // The object belongs to an unusual uid, so that any mention of it shows.
    let owner: u32 = 40_000 + rand::random::<u32>() % 20_000;
    let mut shm = HostShm::create(4096).unwrap();
    let secret = random_f32(1024);
    shm.write_f32(0, &secret).unwrap();
    let path = format!("/dev/shm{}", shm.name());
    std::os::unix::fs::chown(&path, Some(owner), Some(owner)).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();

    // A bystander registers and launches throughout.
    let client = unix(&daemon).await;
    let bystander = client.open_session("bystander").await.unwrap();
    let add = load_add(&bystander, 24).await.unwrap();
    add_runs(&bystander, &add).await.unwrap();

    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            crate::support::test_name(module_path!(), "foreign_shm_process_main").as_str(),
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("PTXD_TEST_FOREIGN_SHM_TARGET", daemon.target())
        .env("PTXD_TEST_FOREIGN_SHM_NAME", shm.name())
        .env_remove("PTXD_TEST_LOG")
        .current_dir("/")
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    // The harness prints the test's name before its output.
    let line = stdout
        .lines()
        .find_map(|l| {
            l.find("REFUSED ")
                .or_else(|| l.find("REGISTERED"))
                .map(|at| &l[at..])
        })
        .unwrap_or_else(|| {
            panic!(
                "the child did not answer: {stdout}\n{}",
                String::from_utf8_lossy(&output.stderr)
            )
        });
    assert!(line.starts_with("REFUSED reason=NOT_OWNER "), "{line}");
    assert!(
        !line.contains(&owner.to_string()),
        "the refusal names the owner's uid: {line}"
    );
    assert!(line.contains(shm.name()), "it names the object: {line}");
    assert_eq!(shm.read_f32(0, 1024).unwrap(), secret, "untouched");
    add_runs(&bystander, &add).await.unwrap();
}

// ----- issue 24, finding 9: what the drain deadline cuts off ----------------

/// Launches queued behind a long one on a session's stream when the drain
/// timeout ends never ran, and are answered `DRAINING`, never
/// `EXECUTOR_UNAVAILABLE` (which says nothing about whether they ran). The
/// running launch may get either `KERNEL_TIMEOUT` or `EXECUTOR_UNAVAILABLE`.
/// A bystander session's launches before the drain are exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn launches_queued_at_the_drain_deadline_are_answered_draining() {
    const QUEUED: u64 = 64;
    let mut daemon = Daemon::start(&["--drain-timeout", "1s", "--max-kernel-time", "8s"]);
    let client = unix(&daemon).await;
    let bystander = client.open_session("bystander").await.unwrap();
    let add = load_add(&bystander, 9).await.unwrap();
    add_runs(&bystander, &add).await.unwrap();

    let session = std::sync::Arc::new(client.open_session("queued").await.unwrap());
    let spin = session
        .load_ptx(
            0,
            corpus("spin_f32.ptx"),
            "spin_f32",
            LoadOptions::default(),
        )
        .await
        .unwrap();
    let affine = session
        .load_ptx(
            0,
            corpus("affine_f32_scalar.ptx"),
            "affine_f32_scalar",
            LoadOptions::default(),
        )
        .await
        .unwrap();
    let (_x, x) = f32_buffer(&session, &[1.0; 64]).await;
    let (_y, y) = f32_buffer(&session, &[0.0; 64]).await;
    let (out_shm, out) = f32_buffer(&session, &vec![f32::NAN; QUEUED as usize + 1]).await;
    let executor = crate::support::executor_pid(&client, 0).await;
    let cpu = crate::support::processes::cpu_time(executor);
    // The long launch first, then the queue behind it on the same stream.
    let running = {
        let session = session.clone();
        tokio::spawn(async move {
            session
                .launch(
                    &spin,
                    &Launch::new([x.operand()], y.operand(), 64).sync(true),
                )
                .await
        })
    };
    // Running, not merely sent, before the queue and the drain: a launch
    // the daemon had not read at the drain would be refused DRAINING.
    crate::support::wait_until_running(executor, cpu, Duration::from_millis(50)).await;
    let (_one, one) = f32_buffer(&session, &[1.0]).await;
    let mut queued = Vec::new();
    for tag in 1..=QUEUED {
        let session = session.clone();
        let (affine, one, out) = (affine.clone(), one.clone(), out.clone());
        queued.push(tokio::spawn(async move {
            let launch = Launch::new([one.operand()], out.at(tag * 4), 1)
                .params([tag as f64, 0.0])
                .sync(true);
            (tag, session.launch(&affine, &launch).await)
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let status = tokio::task::spawn_blocking(move || daemon.terminate())
        .await
        .unwrap();
    assert!(status.success(), "{status}");
    let running = running.await.unwrap().unwrap_err();
    assert!(
        ["KERNEL_TIMEOUT", "EXECUTOR_UNAVAILABLE"].contains(&reason(&running)),
        "{running}"
    );
    let values = out_shm.read_f32(0, QUEUED as usize + 1).unwrap();
    for task in queued {
        let (tag, answer) = task.await.unwrap();
        match answer {
            Ok(_) => assert_eq!(values[tag as usize], tag as f32, "tag {tag}"),
            Err(err) => {
                assert_eq!(reason(&err), "DRAINING", "tag {tag}: {err}");
                assert!(values[tag as usize].is_nan(), "refused tag {tag} ran");
            }
        }
    }
}
