//! Through the real daemon (host backend): the executor runs the canonical
//! text, the cache key is the canonical text (two spellings of one kernel
//! share one compiled slot), and LoadKernel reports the block the kernel
//! really runs with.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support::{corpus, random_f32, Daemon};
use ptxd_client::{Client, HostShm, Launch, LoadOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spellings_share_one_canonical_kernel_and_the_block_is_the_one_that_runs() {
    let daemon = Daemon::start(&[]);
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("canonical").await.unwrap();
    let original = corpus("add_f32_scalar.ptx");
    // Same program, other text: comments, debug lines, another register
    // naming is not needed: the canonical text is what is hashed.
    let respelled = format!(
        "// a comment\n{}",
        original.replace("\tret;", "\t.loc 1 2 3\n\tret; // done")
    );
    let first = session
        .load_ptx(
            0,
            original.clone(),
            "add_f32_scalar",
            LoadOptions::default(),
        )
        .await
        .unwrap();
    let second = session
        .load_ptx(0, respelled, "add_f32_scalar", LoadOptions::default())
        .await
        .unwrap();
    assert!(!first.state().cache_hit);
    assert!(
        second.state().cache_hit,
        "the respelled kernel was compiled again"
    );
    assert_eq!(first.signature().block_size, 256);

    // `.maxntid 1`: the engine runs blocks of one thread, and says so.
    let one = original.replace(")\n{", ")\n.maxntid 1, 1, 1\n{");
    assert_ne!(one, original);
    let narrow = session
        .load_ptx(0, one, "add_f32_scalar", LoadOptions::default())
        .await
        .unwrap();
    assert_eq!(narrow.signature().maxntid, 1);
    assert_eq!(narrow.signature().block_size, 1);

    let n = 777;
    let (a, b) = (random_f32(n), random_f32(n));
    let mut shms = Vec::new();
    let mut bufs = Vec::new();
    for v in [Some(&a), Some(&b), None] {
        let mut shm = HostShm::create((n * 4) as u64).unwrap();
        match v {
            Some(v) => shm.write_f32(0, v).unwrap(),
            None => shm.write_f32(0, &vec![f32::NAN; n]).unwrap(),
        }
        bufs.push(session.register_shm(&shm, None).await.unwrap());
        shms.push(shm);
    }
    session
        .launch(
            &narrow,
            &Launch::new(
                [bufs[0].operand(), bufs[1].operand()],
                bufs[2].operand(),
                n as u64,
            )
            .sync(true),
        )
        .await
        .unwrap();
    let out = shms[2].read_f32(0, n).unwrap();
    for i in 0..n {
        assert_eq!(out[i].to_bits(), (a[i] + b[i]).to_bits(), "element {i}");
    }
}

/// The canonical memo is keyed by the client's bytes and looked up before
/// any UTF-8 check: a text one byte away from an accepted one, made
/// invalid UTF-8, must still be refused as not UTF-8, not served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_one_byte_from_an_accepted_one_is_checked_again() {
    let daemon = Daemon::start(&[]);
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("utf8").await.unwrap();
    let original = corpus("add_f32_scalar.ptx");
    let accepted = session
        .load_ptx(
            0,
            original.clone(),
            "add_f32_scalar",
            LoadOptions::default(),
        )
        .await
        .unwrap();
    assert!(!accepted.state().cache_hit);
    // The same text again is a hit, through the raw RPC too.
    let request = |artifact: Vec<u8>| ptxd_proto::v1::LoadKernelRequest {
        session: session.id().to_string(),
        device: None,
        kind: ptxd_proto::v1::ArtifactKind::Ptx as i32,
        artifact,
        symbol: "add_f32_scalar".into(),
        label: String::new(),
        declared: None,
    };
    let again = client
        .raw()
        .load_kernel(request(original.clone().into_bytes()))
        .await
        .unwrap()
        .into_inner();
    assert!(again.cache_hit);
    // A comment byte turned into a lone continuation byte: same length,
    // not UTF-8.
    let mut bytes = original.into_bytes();
    let at = bytes
        .windows(2)
        .position(|w| w == b"//")
        .expect("the corpus kernel has a comment")
        + 2;
    bytes[at] = 0x80;
    let status = client.raw().load_kernel(request(bytes)).await.unwrap_err();
    let refusal = ptxd_client::Error::from(status);
    assert_eq!(refusal.reason_name(), "INVALID_ARTIFACT");
    assert!(refusal.to_string().contains("not UTF-8"), "{refusal}");
}
