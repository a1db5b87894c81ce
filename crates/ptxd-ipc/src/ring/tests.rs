//! Tests of the two sides together: over one mapping, over two mappings of
//! one object, against a hostile peer, asleep and awake.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::resource::{getrusage, UsageWho};
use nix::sys::time::TimeValLike;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::descriptor::tests::random_descriptor;
use super::layout::{
    completion_sequence, sequence_of, submission_sequence, with_sequence, ControlWord,
    COMPLETION_WORD, SUBMISSION_WORD,
};
use super::region::Region;
use super::*;

/// A descriptor determined by its ticket: counts, operands, scalars and
/// semaphores all vary with it.
fn payload(ticket: u64) -> Descriptor {
    let mut state = ticket.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let inputs: Vec<OperandRef> = (0..(ticket % 65))
        .map(|_| OperandRef {
            buffer: next() as u32,
            offset: next(),
        })
        .collect();
    let scalars: Vec<u32> = (0..(ticket / 3 % 65)).map(|_| next() as u32).collect();
    let output = OperandRef {
        buffer: next() as u32,
        offset: next(),
    };
    let mut descriptor = Descriptor::new(ticket, next() as u32, &inputs, output, next())
        .unwrap()
        .with_scalar_bits(&scalars)
        .unwrap()
        .with_sync(ticket.is_multiple_of(2));
    if ticket.is_multiple_of(3) {
        descriptor = descriptor
            .with_wait(SemaphoreOp {
                buffer: next() as u32,
                offset: next() / 8 * 8,
                value: next(),
                width: SemaphoreWidth::Bits64,
            })
            .unwrap();
    }
    if ticket.is_multiple_of(5) {
        descriptor = descriptor
            .with_signal(SemaphoreOp {
                buffer: next() as u32,
                offset: next() / 4 * 4,
                value: next() >> 32,
                width: SemaphoreWidth::Bits32,
            })
            .unwrap();
    }
    descriptor
}

/// What the server answers for a descriptor, so the client can check that
/// the server saw exactly what it sent.
fn digest(descriptor: &Descriptor) -> u64 {
    descriptor
        .encode()
        .chunks_exact(8)
        .fold(0xcbf2_9ce4_8422_2325u64, |hash, word| {
            let word = u64::from_le_bytes(word.try_into().unwrap());
            (hash ^ word).wrapping_mul(0x0100_0000_01b3)
        })
}

fn expect_launch(polled: Option<Polled>) -> Descriptor {
    match polled {
        Some(Polled::Launch(descriptor)) => descriptor,
        other => panic!("expected a launch, got {other:?}"),
    }
}

/// CPU time (user + system) this thread has used.
fn thread_cpu() -> Duration {
    let usage = getrusage(UsageWho::RUSAGE_THREAD).unwrap();
    let micros = usage.user_time().num_microseconds() + usage.system_time().num_microseconds();
    Duration::from_micros(micros as u64)
}

#[test]
fn a_submission_travels_between_two_mappings_and_back() {
    let mut client = Submitter::create(16).unwrap();
    let mut server = Server::open(client.name(), None).unwrap();
    assert_eq!(server.layout(), client.layout());
    assert!(
        !server.shrink_sealed(),
        "a POSIX shm object cannot be sealed"
    );
    assert_eq!(server.poll().unwrap(), None);
    let sent = payload(3);
    client.try_submit(&sent).unwrap();
    assert_eq!(client.outstanding(), 1);
    assert_eq!(expect_launch(server.poll().unwrap()), sent);
    assert_eq!(server.in_flight(), 1);
    assert_eq!(client.poll_completion().unwrap(), None);
    let posted = server
        .complete(CompletionStatus::Refused { reason: 9 }, 4)
        .unwrap();
    assert_eq!(
        posted,
        Completion {
            ticket: 3,
            status: CompletionStatus::Refused { reason: 9 },
            detail: 4
        }
    );
    assert_eq!(client.poll_completion().unwrap(), Some(posted));
    assert_eq!(client.outstanding(), 0);
    assert_eq!(
        server.complete(CompletionStatus::Ok, 0),
        Err(CompleteError::NothingInFlight)
    );
}

#[test]
fn wraparound_over_many_times_the_slot_count() {
    let mut rng = StdRng::seed_from_u64(0x3a9);
    // Counters that start near u64::MAX also cross the integer wrap.
    for start in [0, u64::MAX - 37] {
        let mut client = Submitter::create_starting_at(4, start).unwrap();
        let mut server = Server::open(client.name(), None).unwrap();
        let mut sent = VecDeque::new();
        let mut answered = 0;
        while answered < 400 {
            // Batches of 1..=4 submissions, answered in the same order.
            for _ in 0..rng.random_range(1..=4) {
                let descriptor = random_descriptor(&mut rng);
                match client.try_submit(&descriptor) {
                    Ok(()) => sent.push_back(descriptor),
                    Err(SubmitError::Full) => break,
                    Err(e) => panic!("{e}"),
                }
            }
            while let Some(polled) = server.poll().unwrap() {
                let descriptor = match polled {
                    Polled::Launch(descriptor) => descriptor,
                    other => panic!("{other:?}"),
                };
                server
                    .complete(CompletionStatus::Ok, digest(&descriptor))
                    .unwrap();
            }
            while let Some(completion) = client.poll_completion().unwrap() {
                let expected = sent.pop_front().unwrap();
                assert_eq!(completion.ticket, expected.ticket);
                assert_eq!(completion.detail, digest(&expected));
                answered += 1;
            }
        }
        assert!(sent.is_empty());
    }
}

#[test]
fn a_full_ring_pushes_back_on_both_sides() {
    let mut client = Submitter::create(8).unwrap();
    let mut server = Server::open(client.name(), None).unwrap();
    for ticket in 0..8 {
        client.try_submit(&payload(ticket)).unwrap();
    }
    assert_eq!(client.try_submit(&payload(8)), Err(SubmitError::Full));
    // Taking a submission does not free its slot; answering it does.
    for _ in 0..8 {
        expect_launch(server.poll().unwrap());
    }
    assert_eq!(client.try_submit(&payload(8)), Err(SubmitError::Full));
    server.complete(CompletionStatus::Ok, 0).unwrap();
    client.try_submit(&payload(8)).unwrap();
    assert_eq!(client.try_submit(&payload(9)), Err(SubmitError::Full));
    for _ in 0..7 {
        server.complete(CompletionStatus::Ok, 0).unwrap();
    }
    // The client reads no completions: 8 are unread and one launch waits,
    // so the server takes nothing (it could not answer it).
    for ticket in 9..16 {
        client.try_submit(&payload(ticket)).unwrap();
    }
    assert_eq!(server.poll().unwrap(), None);
    assert!(!server.wait(Duration::from_millis(20)).unwrap());
    // Reading one completion buys exactly one.
    assert_eq!(client.poll_completion().unwrap().unwrap().ticket, 0);
    assert_eq!(expect_launch(server.poll().unwrap()).ticket, 8);
    assert_eq!(server.poll().unwrap(), None);
    while client.poll_completion().unwrap().is_some() {}
    let mut taken = 0;
    while let Some(polled) = server.poll().unwrap() {
        expect_launch(Some(polled));
        taken += 1;
    }
    assert_eq!(
        taken, 7,
        "the remaining submissions, now that there is room"
    );
    assert_eq!(server.in_flight(), 8);
    assert_eq!(client.outstanding(), 8);
}

/// One submitter thread, one server thread, one mapping (the server shares
/// the client's), 1,000,000 submit → complete round trips, pipelined. Every
/// descriptor is checked field by field on the server and every completion's
/// ticket and digest on the client.
#[test]
fn a_million_round_trips_over_one_mapping() {
    const TOTAL: u64 = 1_000_000;
    // Payloads (ticket 0) and their digests, reused cyclically so that the
    // test's own bookkeeping stays cheap next to the ring's work.
    const KINDS: u64 = 997;
    let payloads: Arc<Vec<(Descriptor, u64)>> = Arc::new(
        (0..KINDS)
            .map(|kind| {
                let mut descriptor = payload(kind);
                descriptor.ticket = 0;
                let digest = digest(&descriptor);
                (descriptor, digest)
            })
            .collect(),
    );
    let mut client = Submitter::create(64).unwrap();
    let mut server = Server::attach(Arc::clone(client.region())).unwrap();
    let serving = {
        let payloads = Arc::clone(&payloads);
        thread::spawn(move || {
            let mut served = 0;
            while served < TOTAL {
                assert!(server.wait(Duration::from_secs(10)).unwrap(), "stalled");
                while let Some(polled) = server.poll().unwrap() {
                    let mut descriptor = expect_launch(Some(polled));
                    // Tickets come in order, each with its own payload.
                    assert_eq!(descriptor.ticket, served);
                    descriptor.ticket = 0;
                    let (expected, digest) = &payloads[(served % KINDS) as usize];
                    assert_eq!(&descriptor, expected, "ticket {served}");
                    server
                        .complete(CompletionStatus::Ok, digest ^ served)
                        .unwrap();
                    served += 1;
                }
            }
            server.stats()
        })
    };
    let mut next_ticket = 0;
    let mut answered = 0;
    let mut submission = payloads[0].0.clone();
    while answered < TOTAL {
        while next_ticket < TOTAL {
            submission.clone_from(&payloads[(next_ticket % KINDS) as usize].0);
            submission.ticket = next_ticket;
            match client.try_submit(&submission) {
                Ok(()) => next_ticket += 1,
                Err(SubmitError::Full) => break,
                Err(e) => panic!("{e}"),
            }
        }
        let completion = client
            .wait_completion(Duration::from_secs(10))
            .unwrap()
            .expect("no completion within 10 s");
        assert_eq!(completion.ticket, answered);
        assert_eq!(completion.status, CompletionStatus::Ok);
        assert_eq!(
            completion.detail,
            payloads[(answered % KINDS) as usize].1 ^ answered
        );
        answered += 1;
    }
    let server_stats = serving.join().unwrap();
    assert_eq!(client.poll_completion().unwrap(), None);
    assert_eq!(client.outstanding(), 0);
    println!(
        "1M round trips: client {:?}, server {server_stats:?}",
        client.stats()
    );
}

#[test]
fn a_malformed_submission_is_refused_under_its_ticket() {
    let mut client = Submitter::create(4).unwrap();
    let mut server = Server::open(client.name(), None).unwrap();
    client.try_submit(&payload(1)).unwrap();
    // Corrupt the published slot's input count behind the client's back
    // (the count shares the publication word with the sequence word).
    let slot = client.layout().submission_slot(0);
    client.region().scribble(
        slot + SUBMISSION_WORD,
        with_sequence(0xff, submission_sequence(0)),
    );
    match server.poll().unwrap() {
        Some(Polled::Malformed { ticket, error }) => {
            assert_eq!(ticket, 1);
            assert_eq!(error, DescriptorError::TooManyInputs { count: 255 });
        }
        other => panic!("{other:?}"),
    }
    server
        .complete(CompletionStatus::Refused { reason: 3 }, 0)
        .unwrap();
    let completion = client.poll_completion().unwrap().unwrap();
    assert_eq!(completion.ticket, 1);
    assert_eq!(completion.status, CompletionStatus::Refused { reason: 3 });
}

#[test]
fn a_completion_tail_that_moves_is_checked() {
    let mut client = Submitter::create(4).unwrap();
    let mut server = Server::open(client.name(), None).unwrap();
    for ticket in 0..4 {
        client.try_submit(&payload(ticket)).unwrap();
    }
    for _ in 0..4 {
        expect_launch(server.poll().unwrap());
        server.complete(CompletionStatus::Ok, 0).unwrap();
    }
    client.try_submit(&payload(4)).unwrap();
    // cq head is 4: a tail past it is out of range.
    client
        .region()
        .counter(ControlWord::CompletionTail)
        .store(5, Ordering::Release);
    assert_eq!(
        server.poll(),
        Err(RingError::CounterOutOfRange {
            counter: Counter::CompletionTail,
            value: 5,
            low: 0,
            high: 4
        })
    );
}

#[test]
fn the_client_checks_the_server_counters_and_records() {
    let mut client = Submitter::create(4).unwrap();
    for ticket in 0..4 {
        client.try_submit(&payload(ticket)).unwrap();
    }
    client
        .region()
        .counter(ControlWord::SubmissionTail)
        .store(9, Ordering::Release);
    assert_eq!(
        client.try_submit(&payload(4)),
        Err(SubmitError::Ring(RingError::CounterOutOfRange {
            counter: Counter::SubmissionTail,
            value: 9,
            low: 0,
            high: 4
        }))
    );

    // A record the server wrote for the client's one launch.
    let mut client = Submitter::create(4).unwrap();
    client.try_submit(&payload(0)).unwrap();
    let layout = client.layout();
    client.region().scribble(layout.completion_slot(0) + 8, 7);
    client.region().scribble(
        layout.completion_slot(0) + COMPLETION_WORD,
        completion_sequence(0),
    );
    assert_eq!(
        client.poll_completion(),
        Err(RingError::MalformedCompletion(
            CompletionError::UnknownStatus { status: 7 }
        ))
    );
}

#[test]
fn a_server_that_attaches_after_a_death_reports_the_orphans_first() {
    let mut client = Submitter::create(8).unwrap();
    let mut first = Server::open(client.name(), None).unwrap();
    for ticket in 0..5 {
        client.try_submit(&payload(ticket)).unwrap();
    }
    for _ in 0..3 {
        expect_launch(first.poll().unwrap());
    }
    first.complete(CompletionStatus::Ok, 0).unwrap();
    // The first server dies with tickets 1 and 2 taken, unanswered.
    drop(first);
    let mut second = Server::open(client.name(), None).unwrap();
    assert_eq!(second.orphans_pending(), 2);
    for ticket in 1..3 {
        match second.poll().unwrap() {
            Some(Polled::Orphan(descriptor)) => assert_eq!(descriptor, payload(ticket)),
            other => panic!("{other:?}"),
        }
        second
            .complete(CompletionStatus::Failed { reason: 14 }, 0)
            .unwrap();
    }
    for ticket in 3..5 {
        assert_eq!(expect_launch(second.poll().unwrap()).ticket, ticket);
        second.complete(CompletionStatus::Ok, 0).unwrap();
    }
    let answers: Vec<_> = std::iter::from_fn(|| client.poll_completion().unwrap())
        .map(|c| (c.ticket, c.status))
        .collect();
    let failed = CompletionStatus::Failed { reason: 14 };
    assert_eq!(
        answers,
        [
            (0, CompletionStatus::Ok),
            (1, failed),
            (2, failed),
            (3, CompletionStatus::Ok),
            (4, CompletionStatus::Ok)
        ]
    );
    // A third server finds nothing left over.
    drop(second);
    let third = Server::open(client.name(), None).unwrap();
    assert_eq!(third.orphans_pending(), 0);
}

#[test]
fn opening_checks_the_object() {
    let client = Submitter::create(4).unwrap();
    assert!(matches!(
        Server::open("no-slash", None),
        Err(OpenError::Name(_))
    ));
    assert!(matches!(
        Server::open("/ptxd-ring-test-does-not-exist", None),
        Err(OpenError::Os {
            call: "shm_open",
            errno: nix::errno::Errno::ENOENT
        })
    ));
    let uid = nix::unistd::getuid().as_raw();
    Server::open(client.name(), Some(uid)).unwrap();
    if uid != 0 {
        assert!(matches!(
            Server::open(client.name(), Some(uid + 1)),
            Err(OpenError::WrongOwner { .. })
        ));
    }
    let devnull = std::fs::File::open("/dev/null").unwrap();
    assert!(matches!(
        Server::from_fd(devnull.into(), None),
        Err(OpenError::NotRegularFile { .. })
    ));

    // A header that declares more slots than the object holds.
    let small = crate::shm::HostShm::create(4096).unwrap();
    let layout = RingLayout::new(64).unwrap();
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/dev/shm{}", small.name()))
        .unwrap();
    std::os::unix::fs::FileExt::write_all_at(&opened, &layout.header(), 0).unwrap();
    assert!(matches!(
        Server::from_fd(opened.into(), None),
        Err(OpenError::TooSmall { size: 4096, needed }) if needed == layout.total_len() as u64
    ));
    let tiny = crate::shm::HostShm::create(10).unwrap();
    assert!(matches!(
        Server::open(tiny.name(), None),
        Err(OpenError::TooSmall { size: 10, .. })
    ));
    // Garbage: a typed layout error.
    let zeros = crate::shm::HostShm::create(4096).unwrap();
    assert!(matches!(
        Server::open(zeros.name(), None),
        Err(OpenError::Layout(LayoutError::BadMagic { found: 0 }))
    ));

    // Counters that cannot belong to one ring: more claimed than a ring
    // of 4 slots can hold past its tail.
    client
        .region()
        .counter(ControlWord::SubmissionClaimed)
        .store(5, Ordering::Release);
    assert_eq!(
        Server::open(client.name(), None)
            .map(|_| ())
            .unwrap_err()
            .to_string(),
        RingError::CounterOutOfRange {
            counter: Counter::SubmissionClaimed,
            value: 5,
            low: 0,
            high: 4
        }
        .to_string()
    );
}

/// The variant of an error, with the counter for a counter error.
fn kind(error: &dyn std::fmt::Debug) -> String {
    let text = format!("{error:?}");
    let variant: String = text
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '(')
        .collect();
    match text.split("counter: ").nth(1) {
        Some(rest) => format!("{variant}{}", rest.split(',').next().unwrap_or("")),
        None => variant,
    }
}

/// A peer that writes garbage all over the object (counters, waiter words,
/// slots, now and then the header) while both sides work: every call
/// returns a value or a typed error, and a poisoned side is replaced by a
/// fresh attach, which validates the garbage counters in turn.
#[test]
fn a_hostile_peer_gets_typed_errors_never_a_panic() {
    let client = Submitter::create(8).unwrap();
    let name = client.name().to_owned();
    let layout = client.layout();
    let attacker = Arc::clone(client.region());
    let stop = Arc::new(AtomicBool::new(false));
    let scribbling = {
        let stop = Arc::clone(&stop);
        thread::spawn(move || {
            let mut rng = StdRng::seed_from_u64(0xbad);
            let mut writes = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let value: u64 = match rng.random_range(0..4) {
                    0 => rng.random(),
                    1 => rng.random_range(0..16),
                    2 => u64::MAX - rng.random_range(0..16),
                    _ => 0,
                };
                let offset = match rng.random_range(0..100) {
                    // Counters and waiter words, with plausible values too.
                    0..=4 => CONTROL_BLOCK * rng.random_range(1..6),
                    // The header, rarely: later attaches fail on the layout.
                    5 if rng.random_range(0..200) == 0 => 8 * rng.random_range(0..8),
                    // Slot bytes: mostly the descriptor's first words, where
                    // the counts, flags and semaphores are.
                    6..=50 => {
                        let slot = layout.submission_slot(rng.random());
                        slot + 8 * rng.random_range(0..12)
                    }
                    // Sequence words, with plausible sequences (the next
                    // laps' and the last laps'), publishing torn or stale
                    // slots and un-publishing live ones.
                    51..=60 => {
                        let position = rng.random_range(0..64u64);
                        if rng.random() {
                            let counts = rng.random_range(0..0x4141u64);
                            attacker.scribble(
                                layout.submission_slot(position) + SUBMISSION_WORD,
                                with_sequence(counts, submission_sequence(position)),
                            );
                        } else {
                            attacker.scribble(
                                layout.completion_slot(position) + COMPLETION_WORD,
                                completion_sequence(position),
                            );
                        }
                        writes += 1;
                        continue;
                    }
                    _ => 8 * rng.random_range(64..layout.total_len() / 8),
                };
                attacker.scribble(offset, value);
                writes += 1;
                if writes.is_multiple_of(16) {
                    thread::sleep(Duration::from_micros(20));
                }
            }
            writes
        })
    };
    // Repairs the object (header, counters, sequence words) as a client
    // that starts over with a fresh ring would, so that the run goes on.
    let fresh = |region: &Arc<Region>| {
        for (index, chunk) in layout.header().chunks_exact(8).enumerate() {
            region.scribble(8 * index, u64::from_ne_bytes(chunk.try_into().unwrap()));
        }
        for word in HEADER_LEN / 8..CONTROL_LEN / 8 {
            region.scribble(8 * word, 0);
        }
        for position in 0..u64::from(layout.slots()) {
            region.scribble(layout.submission_slot(position) + SUBMISSION_WORD, 0);
            region.scribble(layout.completion_slot(position) + COMPLETION_WORD, 0);
        }
        Submitter::over(Arc::clone(region))
    };
    let mut client = client;
    let mut server = Server::open(&name, None).ok();
    let (mut polled, mut ring_errors, mut open_errors, mut client_errors) = (0, 0, 0, 0);
    let mut kinds = std::collections::BTreeMap::<String, u64>::new();
    // At least 1.5 s of attack, and on until every kind of failure was met
    // and the server kept taking submissions: a loaded machine gives the
    // scribbler and this loop less of a core, and a fixed window then ends
    // before a rare header write (one in about 20,000) has come. A server
    // that stops taking submissions still fails, at `GIVE_UP`.
    const GIVE_UP: Duration = Duration::from_secs(60);
    let started = Instant::now();
    let done = |polled: u64, ring: u64, open: u64, client: u64| {
        let elapsed = started.elapsed();
        elapsed >= GIVE_UP
            || elapsed >= Duration::from_millis(1500)
                && ring > 0
                && open > 0
                && client > 0
                && polled > 1000
    };
    let mut ticket = 0;
    // Client steps in a row with a full ring and no completion: a garbage
    // sequence word un-published a submission (or a completion), and the
    // ring is stalled for good, as its client deserves.
    let mut stalled = 0;
    while !done(polled, ring_errors, open_errors, client_errors) {
        let Some(side) = server.as_mut() else {
            match Server::open(&name, None) {
                Ok(opened) => server = Some(opened),
                Err(error) => {
                    open_errors += 1;
                    *kinds.entry(format!("open {}", kind(&error))).or_default() += 1;
                    client = fresh(client.region());
                }
            }
            continue;
        };
        match side.poll() {
            Ok(Some(item)) => {
                polled += 1;
                let label = match item {
                    Polled::Launch(_) => "launch".to_owned(),
                    Polled::Orphan(_) => "orphan".to_owned(),
                    Polled::Malformed { error, .. } => format!("malformed {}", kind(&error)),
                };
                *kinds.entry(label).or_default() += 1;
                let _ = side.complete(CompletionStatus::Refused { reason: 1 }, 0);
            }
            Ok(None) => {
                let _ = side.wait(Duration::from_micros(50));
            }
            Err(error) => {
                ring_errors += 1;
                *kinds.entry(format!("poll {}", kind(&error))).or_default() += 1;
                server = None;
            }
        }
        // The client side faces the same garbage.
        ticket += 1;
        let submitted = client.try_submit(&payload(ticket));
        let completed = client.poll_completion();
        if let Err(SubmitError::Ring(error)) = submitted {
            *kinds.entry(format!("client {}", kind(&error))).or_default() += 1;
        }
        if let Err(error) = &completed {
            *kinds.entry(format!("client {}", kind(error))).or_default() += 1;
        }
        stalled = match (&submitted, &completed) {
            (Err(SubmitError::Full), Ok(None)) => stalled + 1,
            _ => 0,
        };
        let broken = submitted.is_err_and(|e| e != SubmitError::Full) || completed.is_err();
        if broken || stalled >= 100 {
            if broken {
                client_errors += 1;
            } else {
                *kinds.entry("stalled, started over".to_owned()).or_default() += 1;
            }
            stalled = 0;
            client = fresh(client.region());
            server = None;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let writes = scribbling.join().unwrap();
    println!(
        "hostile peer: {writes} garbage writes in {:?}; server took {polled} submissions, \
         {ring_errors} ring errors, {open_errors} failed re-attaches; {client_errors} \
         client errors",
        started.elapsed()
    );
    for (kind, count) in &kinds {
        println!("  {count:>7} {kind}");
    }
    assert!(ring_errors > 0 && open_errors > 0 && client_errors > 0);
    assert!(polled > 1000, "the server kept taking submissions");
}

/// One sleep per wait: a wake that lands between two bounded sleeps is
/// (correctly) skipped, which would make the wake counts below racy.
fn one_long_sleep() -> WaitConfig {
    WaitConfig {
        max_sleep: Duration::from_secs(60),
        ..WaitConfig::default()
    }
}

#[test]
fn an_idle_server_sleeps_and_a_submission_wakes_it() {
    let mut client = Submitter::create(8).unwrap();
    let mut server = Server::open(client.name(), None)
        .unwrap()
        .with_wait_config(one_long_sleep());
    let barrier = Arc::new(Barrier::new(2));
    let waiting = {
        let barrier = Arc::clone(&barrier);
        thread::spawn(move || {
            // Idle, nobody submits: it times out, asleep.
            let cpu = thread_cpu();
            let start = Instant::now();
            assert!(!server.wait(Duration::from_millis(300)).unwrap());
            let idle = (start.elapsed(), thread_cpu() - cpu);
            let sleeps = server.stats().sleeps;
            // Timed from before the barrier: the submission comes 300 ms
            // after it, so the wait cannot end sooner than that after this
            // (timed after the barrier, a waiter scheduled 50 ms late saw
            // it end early).
            let cpu = thread_cpu();
            let start = Instant::now();
            barrier.wait();
            assert!(server.wait(Duration::from_secs(10)).unwrap());
            let woken = (start.elapsed(), thread_cpu() - cpu);
            assert_eq!(expect_launch(server.poll().unwrap()).ticket, 7);
            (idle, sleeps, woken, server)
        })
    };
    barrier.wait();
    thread::sleep(Duration::from_millis(300));
    client.try_submit(&payload(7)).unwrap();
    let ((idle_wall, idle_cpu), sleeps, (woken_wall, woken_cpu), server) = waiting.join().unwrap();
    println!(
        "idle server: {idle_wall:?} waited, {idle_cpu:?} CPU, {sleeps} sleeps; \
         woken after {woken_wall:?} with {woken_cpu:?} CPU; client {:?}",
        client.stats()
    );
    assert!(idle_wall >= Duration::from_millis(300));
    assert!(idle_cpu < Duration::from_millis(60), "an idle server spun");
    assert_eq!(sleeps, 1, "an idle wait is one futex sleep");
    assert!(woken_wall >= Duration::from_millis(250) && woken_wall < Duration::from_secs(5));
    assert!(
        woken_cpu < Duration::from_millis(60),
        "a waiting server spun"
    );
    assert_eq!(
        client.stats().wakes,
        1,
        "the client woke the sleeping server"
    );
    drop(server);
}

#[test]
fn a_waiting_client_sleeps_and_a_completion_wakes_it() {
    let mut client = Submitter::create(8)
        .unwrap()
        .with_wait_config(one_long_sleep());
    let mut server = Server::open(client.name(), None).unwrap();
    client.try_submit(&payload(11)).unwrap();
    expect_launch(server.poll().unwrap());
    // Timed from before the spawn: the completion comes 300 ms after it,
    // however late the waiter starts.
    let start = Instant::now();
    let waiting = thread::spawn(move || {
        let cpu = thread_cpu();
        let completion = client.wait_completion(Duration::from_secs(10)).unwrap();
        (
            completion,
            start.elapsed(),
            thread_cpu() - cpu,
            client.stats(),
        )
    });
    thread::sleep(Duration::from_millis(300));
    server.complete(CompletionStatus::Ok, 5).unwrap();
    let (completion, wall, cpu, stats) = waiting.join().unwrap();
    println!("waiting client: woken after {wall:?} with {cpu:?} CPU, {stats:?}");
    assert_eq!(completion.unwrap().ticket, 11);
    assert!(wall >= Duration::from_millis(250) && wall < Duration::from_secs(5));
    assert!(cpu < Duration::from_millis(60), "a waiting client spun");
    assert_eq!(stats.sleeps, 1);
    assert_eq!(server.stats().wakes, 1);
}

/// Per-operation costs on one thread (no peer): what a round trip is made
/// of besides the cross-core traffic and the wakeups.
fn measure_operations() {
    let client = Submitter::create(8).unwrap();
    let region = Arc::clone(client.region());
    let descriptor = payload(10);
    let mut bytes = [0u8; DESCRIPTOR_SIZE];
    let rounds = if cfg!(debug_assertions) {
        2_000
    } else {
        200_000
    };
    let time = |f: &mut dyn FnMut()| {
        let start = Instant::now();
        for _ in 0..rounds {
            f();
        }
        start.elapsed() / rounds
    };
    let encode = time(&mut || descriptor.encode_into(&mut bytes));
    let store = time(&mut || region.store_submission(1, std::hint::black_box(&bytes)));
    let load = time(&mut || region.load_submission(1, std::hint::black_box(&mut bytes)));
    // The fast decode and the field-by-field one, alternated so that a
    // loaded machine slows both alike; the least of five runs each.
    let (mut decode, mut in_order) = (Duration::MAX, Duration::MAX);
    for _ in 0..5 {
        decode = decode.min(time(&mut || {
            std::hint::black_box(Descriptor::decode(std::hint::black_box(&bytes)).unwrap());
        }));
        in_order = in_order.min(time(&mut || {
            std::hint::black_box(
                Descriptor::decode_in_order(std::hint::black_box(&bytes)).unwrap(),
            );
        }));
    }
    // Polls a spin makes per microsecond (the clock is read every few).
    let how_long = Duration::from_millis(20);
    let mut polls = 0u64;
    let _ = futex::spin(how_long, || {
        polls += 1;
        Ok::<bool, ()>(false)
    });
    println!(
        "per operation ({} inputs, {} scalars): encode {encode:?}, copy in {store:?}, \
         copy out {load:?}, decode {decode:?} (field by field {in_order:?}); \
         a spin polls {:.0} times a µs",
        descriptor.inputs().len(),
        descriptor.scalar_bits().len(),
        polls as f64 / how_long.as_micros() as f64
    );
}

/// Ping-pong between two threads, each side on its own mapping of the
/// object: one submission, one completion, and back. Prints p50/p99 for a
/// spinning and for a sleeping (futex) consumer. Figures are meaningful in
/// a release build on an otherwise idle machine:
/// `cargo test -p ptxd-client --release ring::tests::measure -- --nocapture`.
#[test]
fn measure_round_trips() {
    measure_operations();
    let rounds = if cfg!(debug_assertions) {
        2_000
    } else {
        200_000
    };
    for (label, spin) in [
        ("spin", Duration::from_millis(100)),
        ("futex", Duration::ZERO),
    ] {
        let rounds = if spin.is_zero() { rounds / 10 } else { rounds };
        let config = WaitConfig {
            spin,
            ..WaitConfig::default()
        };
        let mut client = Submitter::create(8).unwrap().with_wait_config(config);
        let mut server = Server::open(client.name(), None)
            .unwrap()
            .with_wait_config(config);
        let serving = thread::spawn(move || {
            for _ in 0..rounds {
                assert!(server.wait(Duration::from_secs(10)).unwrap());
                let descriptor = expect_launch(server.poll().unwrap());
                server
                    .complete(CompletionStatus::Ok, descriptor.ticket)
                    .unwrap();
            }
            server.stats()
        });
        let descriptor = payload(10);
        let mut samples = Vec::with_capacity(rounds as usize);
        for ticket in 0..rounds {
            let start = Instant::now();
            client.try_submit(&descriptor).unwrap();
            let completion = client
                .wait_completion(Duration::from_secs(10))
                .unwrap()
                .unwrap();
            samples.push(start.elapsed());
            assert_eq!(completion.detail, 10, "round {ticket}");
        }
        let server_stats = serving.join().unwrap();
        samples.sort();
        let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
        println!(
            "{label} round trip over {rounds}: p50 {:?}, p99 {:?}, min {:?}; client {:?}, server {server_stats:?}",
            at(0.5),
            at(0.99),
            samples[0],
            client.stats()
        );
    }
}

#[test]
fn a_server_opened_before_its_predecessor_stopped_reattaches_to_what_it_left() {
    // The executor opens a replacement ring's server while the old ring's
    // thread may still answer; the new one re-reads the counters once the
    // old one is gone.
    let mut client = Submitter::create(8).unwrap();
    let mut old = Server::open(client.name(), None).unwrap();
    let early = Server::open(client.name(), None).unwrap();
    for ticket in 0..4 {
        client.try_submit(&payload(ticket)).unwrap();
    }
    for _ in 0..3 {
        expect_launch(old.poll().unwrap());
    }
    old.complete(CompletionStatus::Ok, 0).unwrap();
    drop(old);
    // Opened before: it would take ticket 0 again. Reattached: tickets 1
    // and 2 are the old server's orphans, then 3 is new.
    let mut new = early.reattach().unwrap();
    assert_eq!(new.orphans_pending(), 2);
    for ticket in 1..3 {
        match new.poll().unwrap() {
            Some(Polled::Orphan(descriptor)) => assert_eq!(descriptor.ticket, ticket),
            other => panic!("{other:?}"),
        }
        new.complete(CompletionStatus::Failed { reason: 14 }, 0)
            .unwrap();
    }
    assert_eq!(expect_launch(new.poll().unwrap()).ticket, 3);
    new.complete(CompletionStatus::Ok, 0).unwrap();
    let tickets: Vec<_> = std::iter::from_fn(|| client.poll_completion().unwrap())
        .map(|c| c.ticket)
        .collect();
    assert_eq!(tickets, [0, 1, 2, 3]);
}

#[test]
fn a_budgeted_spin_and_a_sleep_without_spin_see_a_submission() {
    let mut client = Submitter::create(8).unwrap();
    let mut server = Server::open(client.name(), None).unwrap();
    // Nothing there: a zero spin looks once, a sleep times out.
    assert!(!server.spin_for(Duration::ZERO).unwrap());
    let started = Instant::now();
    assert!(!server.sleep(Duration::from_millis(30)).unwrap());
    assert!(started.elapsed() >= Duration::from_millis(25));
    client.try_submit(&payload(7)).unwrap();
    assert!(server.spin_for(Duration::ZERO).unwrap());
    assert!(server.sleep(Duration::from_millis(30)).unwrap());
    assert_eq!(expect_launch(server.poll().unwrap()).ticket, 7);
    // A submission during a sleep wakes it well before its timeout.
    let waker = thread::spawn(move || {
        thread::sleep(Duration::from_millis(20));
        client.try_submit(&payload(8)).unwrap();
        client
    });
    let started = Instant::now();
    assert!(server.sleep(Duration::from_secs(5)).unwrap());
    assert!(started.elapsed() < Duration::from_secs(2));
    drop(waker.join().unwrap());
}

/// Answers posted without a flush are invisible to the client (no
/// completion, no freed slot, no wake); one flush publishes all of them,
/// in order, under their tickets.
#[test]
fn posted_answers_are_published_together_by_one_flush() {
    let mut rng = StdRng::seed_from_u64(rand::random());
    let mut client = Submitter::create(8).unwrap();
    let mut server = Server::open(client.name(), None).unwrap();
    for round in 0..50u64 {
        let count = rng.random_range(1..=8u64);
        let sent: Vec<u64> = (0..count).map(|i| round * 100 + i).collect();
        for ticket in &sent {
            client.try_submit(&payload(*ticket)).unwrap();
        }
        let mut posted = Vec::new();
        for ticket in &sent {
            assert_eq!(expect_launch(server.poll().unwrap()).ticket, *ticket);
            let detail = rng.random::<u64>();
            posted.push(server.post(CompletionStatus::Ok, detail).unwrap());
            assert_eq!(client.poll_completion().unwrap(), None);
        }
        assert_eq!(server.unpublished(), count);
        assert_eq!(server.in_flight(), 0);
        // The client's slots are not free until the flush: a full ring
        // stays full.
        if count == 8 {
            assert!(matches!(
                client.try_submit(&payload(9999)),
                Err(SubmitError::Full)
            ));
        }
        server.flush();
        assert_eq!(server.unpublished(), 0);
        let got: Vec<Completion> =
            std::iter::from_fn(|| client.poll_completion().unwrap()).collect();
        assert_eq!(got, posted);
        assert_eq!(client.outstanding(), 0);
        // A second flush publishes nothing.
        server.flush();
        assert_eq!(client.poll_completion().unwrap(), None);
    }
}

/// The client cannot claim to have read an answer the server has posted
/// but not published.
#[test]
fn a_completion_tail_past_the_published_head_is_refused() {
    let mut client = Submitter::create(4).unwrap();
    let mut server = Server::open(client.name(), None).unwrap();
    for ticket in 0..4 {
        client.try_submit(&payload(ticket)).unwrap();
    }
    for _ in 0..2 {
        expect_launch(server.poll().unwrap());
        server.complete(CompletionStatus::Ok, 0).unwrap();
    }
    for _ in 0..2 {
        expect_launch(server.poll().unwrap());
        server.post(CompletionStatus::Ok, 0).unwrap();
    }
    // Published head 2, posted 4: a tail of 3 reads an unpublished answer.
    client
        .region()
        .counter(ControlWord::CompletionTail)
        .store(3, Ordering::Release);
    // The credit is spent (4 unread of 4 slots), so the next poll reads the
    // tail.
    client.try_submit(&payload(4)).unwrap();
    assert_eq!(
        server.poll(),
        Err(RingError::CounterOutOfRange {
            counter: Counter::CompletionTail,
            value: 3,
            low: 0,
            high: 2
        })
    );
}

/// The client stores only the words of a slot that changed since it last
/// wrote that slot: every descriptor still arrives exactly as sent, whatever
/// came before it in the same slot (longer or shorter operand lists, present
/// or absent semaphores), and in a second mapping too.
#[test]
fn a_slot_rewritten_with_only_its_changed_words_reads_back_exactly() {
    let mut rng = StdRng::seed_from_u64(rand::random());
    for slots in [1u32, 2, 8] {
        let mut client = Submitter::create(slots).unwrap();
        let mut server = Server::open(client.name(), None).unwrap();
        for round in 0..600u64 {
            let mut sent = random_descriptor(&mut rng);
            sent.ticket = round;
            // Now and then the same descriptor twice: nothing changes but
            // the ticket.
            let again = round % 7 == 0;
            client.try_submit(&sent).unwrap();
            assert_eq!(expect_launch(server.poll().unwrap()), sent);
            server.complete(CompletionStatus::Ok, 0).unwrap();
            assert_eq!(client.poll_completion().unwrap().unwrap().ticket, round);
            if again {
                sent.ticket = round + 1_000_000;
                client.try_submit(&sent).unwrap();
                assert_eq!(expect_launch(server.poll().unwrap()), sent);
                server.complete(CompletionStatus::Ok, 0).unwrap();
                client.poll_completion().unwrap().unwrap();
            }
        }
    }
}

/// A writer thread stores a slot and a reader thread copies it out, in
/// turn, over and over: storing only the changed words (the submitter's
/// way) against storing all 2048 bytes (the way before), in one run.
/// `cargo test -p ptxd-ipc --release ring::tests::measure_changed -- --ignored --nocapture`
#[test]
#[ignore = "a measurement: run with --release --ignored --nocapture"]
fn measure_changed_word_stores_against_full_stores() {
    let rounds = if cfg!(debug_assertions) {
        2_000u64
    } else {
        200_000
    };
    let run = |changed_only: bool| {
        let client = Submitter::create(1).unwrap();
        let region = Arc::clone(client.region());
        let turn = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (reader_region, reader_turn) = (Arc::clone(&region), Arc::clone(&turn));
        let reader = thread::spawn(move || {
            let mut out = [0u8; DESCRIPTOR_SIZE];
            let mut sum = 0u64;
            for round in 0..rounds {
                while reader_turn.load(Ordering::Acquire) != 2 * round + 1 {
                    std::hint::spin_loop();
                }
                reader_region.load_submission(0, &mut out);
                sum = sum.wrapping_add(Descriptor::ticket_of(&out));
                reader_turn.store(2 * round + 2, Ordering::Release);
            }
            sum
        });
        let mut shadow = [0u8; DESCRIPTOR_SIZE];
        let mut bytes = [0u8; DESCRIPTOR_SIZE];
        let mut descriptor = payload(10);
        let start = Instant::now();
        for round in 0..rounds {
            while turn.load(Ordering::Acquire) != 2 * round {
                std::hint::spin_loop();
            }
            descriptor.ticket = round;
            descriptor.encode_into(&mut bytes);
            if changed_only {
                region.store_submission_changed(0, &bytes, &mut shadow);
            } else {
                region.store_submission(0, &bytes);
            }
            turn.store(2 * round + 1, Ordering::Release);
        }
        let sum = reader.join().unwrap();
        assert_eq!(sum, (0..rounds).sum::<u64>());
        start.elapsed() / u32::try_from(rounds).unwrap()
    };
    let (mut full, mut changed) = (Duration::MAX, Duration::MAX);
    for _ in 0..5 {
        full = full.min(run(false));
        changed = changed.min(run(true));
    }
    println!(
        "slot hand-over between two threads ({} inputs, {} scalars), best of 5: \
         all words {full:?}, changed words {changed:?}, ratio {:.2}x",
        payload(10).inputs().len(),
        payload(10).scalar_bits().len(),
        full.as_secs_f64() / changed.as_secs_f64()
    );
}

/// A slot is taken only once its sequence word says so. A writer thread
/// stores a fresh descriptor's words one at a time, in a random order with
/// pauses, then the publication word (Release); a reader thread polls all
/// along. It must find nothing until the publication (the writer's step,
/// read after a poll that found the slot, is the publication's) and then
/// exactly the descriptor, once.
#[test]
fn a_slot_is_taken_only_after_its_sequence_word() {
    const PUBLISHED: u64 = u64::MAX;
    let mut rng = StdRng::seed_from_u64(rand::random());
    let client = Submitter::create(4).unwrap();
    let region = Arc::clone(client.region());
    let layout = client.layout();
    let mut server = Server::attach(Arc::clone(&region)).unwrap();
    let step = Arc::new(std::sync::atomic::AtomicU64::new(0));
    for position in 0..40u64 {
        let mut sent = random_descriptor(&mut rng);
        sent.ticket = position;
        let bytes = sent.encode();
        let mut order: Vec<usize> = (0..DESCRIPTOR_SIZE / 8)
            .filter(|index| *index != SUBMISSION_WORD / 8)
            .collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.random_range(0..=i));
        }
        let pauses: Vec<bool> = order.iter().map(|_| rng.random_range(0..16) == 0).collect();
        let word =
            |index: usize| u64::from_ne_bytes(bytes[8 * index..8 * index + 8].try_into().unwrap());
        let got = thread::scope(|scope| {
            let writer = scope.spawn(|| {
                let slot = layout.submission_slot(position);
                for (n, index) in order.iter().enumerate() {
                    step.store(n as u64, Ordering::Release);
                    region.scribble(slot + 8 * index, word(*index));
                    if pauses[n] {
                        thread::sleep(Duration::from_micros(50));
                    }
                }
                step.store(PUBLISHED, Ordering::Release);
                region.submission_word(position).store(
                    with_sequence(word(SUBMISSION_WORD / 8), submission_sequence(position)),
                    Ordering::Release,
                );
            });
            let taken = loop {
                if let Some(polled) = server.poll().unwrap() {
                    assert_eq!(
                        step.load(Ordering::Acquire),
                        PUBLISHED,
                        "position {position}: taken before its sequence word"
                    );
                    break polled;
                }
                std::hint::spin_loop();
            };
            writer.join().unwrap();
            taken
        });
        assert_eq!(expect_launch(Some(got)), sent, "position {position}");
        assert_eq!(server.poll().unwrap(), None, "taken twice");
        server.complete(CompletionStatus::Ok, 0).unwrap();
        // The submission was written by hand, not by `client` (which takes
        // no answer to a launch it did not submit): the answer is read from
        // its slot, and the slot handed back, as a client does.
        assert_eq!(
            region.completion_word(position).load(Ordering::Acquire),
            completion_sequence(position)
        );
        let mut answer = [0u8; COMPLETION_SIZE];
        region.load_completion_published(position, &mut answer);
        assert_eq!(Completion::decode(&answer).unwrap().ticket, position);
        region
            .counter(ControlWord::CompletionTail)
            .store(position + 1, Ordering::Release);
    }
}

/// A client that publishes a slot before writing its body hands over the
/// bytes that were there when the server copied it, once: the server
/// decodes its one copy, and the body written afterwards (and the same
/// sequence word stored again) is never taken, nor read into that copy.
#[test]
fn a_sequence_word_stored_before_its_body_hands_over_one_copy() {
    let mut rng = StdRng::seed_from_u64(rand::random());
    for _ in 0..50 {
        let mut client = Submitter::create(4).unwrap();
        let region = Arc::clone(client.region());
        let layout = client.layout();
        let mut server = Server::open(client.name(), None).unwrap();
        // One honest round first, so slot 1 is still zero-filled.
        client.try_submit(&payload(1)).unwrap();
        expect_launch(server.poll().unwrap());
        server.complete(CompletionStatus::Ok, 0).unwrap();
        let mut late = random_descriptor(&mut rng);
        late.ticket = rng.random();
        let bytes = late.encode();
        let word =
            |index: usize| u64::from_ne_bytes(bytes[8 * index..8 * index + 8].try_into().unwrap());
        // The publication word first: the counts of `late`, this lap's
        // sequence, over a zero body.
        let publication = with_sequence(word(SUBMISSION_WORD / 8), submission_sequence(1));
        region
            .submission_word(1)
            .store(publication, Ordering::Release);
        let mut torn = [0u8; DESCRIPTOR_SIZE];
        torn[SUBMISSION_WORD..SUBMISSION_WORD + 8]
            .copy_from_slice(&with_sequence(publication, 0).to_ne_bytes());
        let expected = match Descriptor::decode(&torn) {
            Ok(descriptor) => Polled::Launch(descriptor),
            Err(error) => Polled::Malformed { ticket: 0, error },
        };
        assert_eq!(server.poll().unwrap(), Some(expected));
        // The body arrives late, and the word is stored again.
        for index in (0..DESCRIPTOR_SIZE / 8).filter(|i| *i != SUBMISSION_WORD / 8) {
            region.scribble(layout.submission_slot(1) + 8 * index, word(index));
        }
        region
            .submission_word(1)
            .store(publication, Ordering::Release);
        assert_eq!(server.poll().unwrap(), None, "the slot was taken twice");
        assert_eq!(server.in_flight(), 1);
        server.complete(CompletionStatus::Ok, 0).unwrap();
        // The ring goes on from the next position.
        let _ = client.poll_completion().unwrap();
        let _ = client.poll_completion().unwrap();
        client.try_submit(&payload(2)).unwrap();
        assert_eq!(
            server.poll().unwrap(),
            None,
            "the client wrote position 1 again"
        );
    }
}

/// Sequence words from anywhere but this lap publish nothing: a client that
/// stores an old slot's word again (with a new body), the next lap's word,
/// the last lap's, or garbage, in the slot the server polls next or in
/// any other, gets nothing taken; the same on the client's side for
/// completion words. An honest submission then goes through exactly once.
#[test]
fn only_this_laps_sequence_word_publishes_a_slot() {
    let mut rng = StdRng::seed_from_u64(rand::random());
    let mut client = Submitter::create(4).unwrap();
    let region = Arc::clone(client.region());
    let layout = client.layout();
    let mut server = Server::open(client.name(), None).unwrap();
    let mut sent = 0u64;
    for round in 0..200u64 {
        let next = sent;
        // Hostile words: every slot but with a sequence other than this
        // lap's for the server's next position.
        for _ in 0..8 {
            let position = next.wrapping_add(rng.random_range(0..4u64));
            let sequence = match rng.random_range(0..5) {
                // A slot already taken, published again.
                0 => submission_sequence(next.wrapping_sub(rng.random_range(1..=4u64))),
                // A future lap.
                1 => submission_sequence(next.wrapping_add(4 * rng.random_range(1..4u64))),
                // The last lap's.
                2 => submission_sequence(position.wrapping_sub(4)),
                // Garbage, and zero.
                3 => rng.random(),
                _ => 0,
            };
            if sequence == submission_sequence(position) {
                continue;
            }
            // A whole new body under the word, now and then.
            let mut before = [0u8; DESCRIPTOR_SIZE];
            region.load_submission(position, &mut before);
            let junk = rng
                .random::<bool>()
                .then(|| random_descriptor(&mut rng).encode());
            let body = |bytes: &[u8; DESCRIPTOR_SIZE]| {
                for index in (0..DESCRIPTOR_SIZE / 8).filter(|i| *i != SUBMISSION_WORD / 8) {
                    let value =
                        u64::from_ne_bytes(bytes[8 * index..8 * index + 8].try_into().unwrap());
                    region.scribble(layout.submission_slot(position) + 8 * index, value);
                }
            };
            if let Some(junk) = &junk {
                body(junk);
            }
            let counts = rng.random_range(0..0x4141u64);
            region
                .submission_word(position)
                .store(with_sequence(counts, sequence), Ordering::Release);
            assert_eq!(
                server.poll().unwrap(),
                None,
                "round {round}: {sequence:#x} in {position}"
            );
            // Put the body back: the client writes only the words that
            // changed since it last wrote the slot (so scribbled bodies
            // would spoil its later descriptors, a documented cost to the
            // scribbler); the sequence word it always writes.
            if junk.is_some() {
                body(&before);
            }
            // The client's side: completion words of other laps.
            let cq = next;
            let bad = match rng.random_range(0..3) {
                0 => completion_sequence(cq.wrapping_sub(4)),
                1 => completion_sequence(cq.wrapping_add(4)),
                _ => rng.random(),
            };
            if bad != completion_sequence(cq) {
                region.completion_word(cq).store(bad, Ordering::Release);
                assert_eq!(client.poll_completion().unwrap(), None);
            }
        }
        let mut descriptor = random_descriptor(&mut rng);
        descriptor.ticket = round;
        client.try_submit(&descriptor).unwrap();
        sent += 1;
        assert_eq!(expect_launch(server.poll().unwrap()), descriptor);
        assert_eq!(server.poll().unwrap(), None, "round {round}: a second take");
        server.complete(CompletionStatus::Ok, round).unwrap();
        let completion = client.poll_completion().unwrap().unwrap();
        assert_eq!((completion.ticket, completion.detail), (round, round));
        assert_eq!(client.poll_completion().unwrap(), None);
    }
}

/// A completion published for a launch the client never submitted (this
/// lap's sequence word and a well-formed body in the slot the next
/// submission's answer will use) is not taken: the client has nothing
/// outstanding, and its count does not wrap. Once it submits, the server's
/// own answer comes through.
#[test]
fn a_completion_for_a_launch_never_submitted_is_not_taken() {
    let mut rng = StdRng::seed_from_u64(rand::random());
    let slots = 1u32 << rng.random_range(0..4);
    let mut client = Submitter::create(slots).unwrap();
    let region = Arc::clone(client.region());
    let mut server = Server::open(client.name(), None).unwrap();
    for round in 0..3 * u64::from(slots) {
        let cq = round;
        let forged = Completion {
            ticket: rng.random(),
            status: CompletionStatus::Ok,
            detail: rng.random(),
        };
        region.store_completion(cq, &forged.encode());
        let before = region.completion_word(cq).load(Ordering::Relaxed);
        region
            .completion_word(cq)
            .store(completion_sequence(cq), Ordering::Release);
        assert_eq!(client.poll_completion().unwrap(), None, "round {round}");
        assert_eq!(
            client.wait_completion(Duration::from_millis(1)).unwrap(),
            None
        );
        assert_eq!(client.outstanding(), 0, "round {round}");
        // The word as it was, then one real round trip.
        region.completion_word(cq).store(before, Ordering::Release);
        let mut descriptor = random_descriptor(&mut rng);
        descriptor.ticket = round;
        client.try_submit(&descriptor).unwrap();
        assert_eq!(expect_launch(server.poll().unwrap()), descriptor);
        server.complete(CompletionStatus::Ok, round).unwrap();
        let completion = client.poll_completion().unwrap().unwrap();
        assert_eq!((completion.ticket, completion.detail), (round, round));
        assert_eq!(client.outstanding(), 0);
    }
}

/// A slot still holding the last lap's sequence word is not published:
/// over many laps of 1, 2 and 8 slots, from counters at 0, near the u32
/// wrap of the sequence word and near the u64 wrap, the server finds
/// nothing before each submission (while the slot holds the word of
/// `position - slots`) and the client finds no completion before each
/// flush.
#[test]
fn the_last_laps_sequence_word_is_not_published() {
    let mut rng = StdRng::seed_from_u64(rand::random());
    for slots in [1u32, 2, 8] {
        for start in [0, (1u64 << 32) - 13, u64::MAX - 21] {
            let mut client = Submitter::create_starting_at(slots, start).unwrap();
            let region = Arc::clone(client.region());
            let mut server = Server::open(client.name(), None).unwrap();
            for step in 0..40u64 {
                let position = start.wrapping_add(step);
                let before = position.wrapping_sub(u64::from(slots));
                let held = region.submission_word(position).load(Ordering::Relaxed);
                if step >= u64::from(slots) || start != 0 {
                    assert_eq!(sequence_of(held), submission_sequence(before));
                }
                assert_eq!(server.poll().unwrap(), None, "position {position:#x}");
                let mut sent = random_descriptor(&mut rng);
                sent.ticket = position;
                client.try_submit(&sent).unwrap();
                assert_eq!(expect_launch(server.poll().unwrap()), sent);
                server.post(CompletionStatus::Ok, step).unwrap();
                if step >= u64::from(slots) || start != 0 {
                    assert_eq!(
                        region.completion_word(position).load(Ordering::Relaxed),
                        completion_sequence(before)
                    );
                }
                assert_eq!(client.poll_completion().unwrap(), None);
                server.flush();
                let completion = client.poll_completion().unwrap().unwrap();
                assert_eq!((completion.ticket, completion.detail), (position, step));
            }
        }
    }
}

/// Servers die at random points (between a take and its answer, between a
/// post and its flush, in the middle of a flush) and new ones attach to
/// the ring mid-way: no submission is launched twice or taken as new after
/// a server took it, and the client gets exactly one answer per
/// submission, in order; an answer is `Ok` only from the server that
/// launched it.
#[test]
fn a_server_reattaching_mid_ring_takes_each_submission_exactly_once() {
    let mut rng = StdRng::seed_from_u64(rand::random());
    for start in [0, u64::MAX - 50] {
        let mut client = Submitter::create_starting_at(8, start).unwrap();
        let region = Arc::clone(client.region());
        let mut server = Server::attach(Arc::clone(&region)).unwrap();
        // Per ticket: launches seen, and whether any server took it.
        let mut launched = std::collections::HashMap::<u64, u32>::new();
        let mut taken = std::collections::HashSet::<u64>::new();
        let mut in_flight = VecDeque::new();
        let mut answers = Vec::new();
        let (mut next_ticket, mut deaths) = (0u64, 0);
        let drain = |client: &mut Submitter, answers: &mut Vec<Completion>| {
            while let Some(completion) = client.poll_completion().unwrap() {
                answers.push(completion);
            }
        };
        for _ in 0..4000 {
            match rng.random_range(0..40) {
                0..=11 => match client.try_submit(&payload(next_ticket)) {
                    Ok(()) => next_ticket += 1,
                    Err(SubmitError::Full) => {}
                    Err(e) => panic!("{e}"),
                },
                12..=20 => match server.poll().unwrap() {
                    Some(Polled::Launch(descriptor)) => {
                        assert!(
                            taken.insert(descriptor.ticket),
                            "ticket {} taken again",
                            descriptor.ticket
                        );
                        *launched.entry(descriptor.ticket).or_default() += 1;
                        in_flight.push_back((descriptor.ticket, CompletionStatus::Ok));
                    }
                    Some(Polled::Orphan(descriptor)) => {
                        assert!(
                            taken.contains(&descriptor.ticket),
                            "an orphan no server took"
                        );
                        let failed = CompletionStatus::Failed { reason: 14 };
                        in_flight.push_back((descriptor.ticket, failed));
                    }
                    Some(other) => panic!("{other:?}"),
                    None => {}
                },
                21..=29 => {
                    if let Some((ticket, status)) = in_flight.pop_front() {
                        let posted = server.post(status, ticket).unwrap();
                        assert_eq!(posted.ticket, ticket);
                    }
                }
                30..=34 => server.flush(),
                35..=37 => drain(&mut client, &mut answers),
                _ => {
                    // A death, then a new server on the same object.
                    deaths += 1;
                    let published = rng.random_range(0..=server.unpublished());
                    match rng.random_range(0..3) {
                        0 => drop(server),
                        1 => server.die_mid_flush(published),
                        _ => {
                            server.flush();
                            drop(server);
                        }
                    }
                    in_flight.clear();
                    server = Server::attach(Arc::clone(&region)).unwrap();
                }
            }
        }
        // The last server answers everything.
        while answers.len() < next_ticket as usize {
            while let Some(polled) = server.poll().unwrap() {
                let (ticket, status) = match polled {
                    Polled::Launch(d) => {
                        assert!(taken.insert(d.ticket), "ticket {} taken again", d.ticket);
                        *launched.entry(d.ticket).or_default() += 1;
                        (d.ticket, CompletionStatus::Ok)
                    }
                    Polled::Orphan(d) => (d.ticket, CompletionStatus::Failed { reason: 14 }),
                    other => panic!("{other:?}"),
                };
                in_flight.push_back((ticket, status));
            }
            while let Some((ticket, status)) = in_flight.pop_front() {
                server.post(status, ticket).unwrap();
            }
            server.flush();
            drain(&mut client, &mut answers);
        }
        assert!(deaths > 20, "{deaths} deaths");
        assert!(launched.values().all(|count| *count == 1));
        let tickets: Vec<u64> = answers.iter().map(|c| c.ticket).collect();
        assert_eq!(
            tickets,
            (0..next_ticket).collect::<Vec<_>>(),
            "one answer each, in order"
        );
        let mut failed = 0;
        for completion in &answers {
            assert_eq!(completion.detail, completion.ticket);
            match completion.status {
                CompletionStatus::Ok => assert_eq!(launched.get(&completion.ticket), Some(&1)),
                _ => failed += 1,
            }
        }
        println!("{next_ticket} submissions, {deaths} server deaths, {failed} answered as orphans");
        assert!(failed > 0 && failed < next_ticket);
    }
}

/// A [`Waker`] ends a server's sleep at once, wherever the wake lands
/// around the sleep's last check (the lost-wake window), makes the next
/// sleep return at once when none is in progress, carries over a
/// reattach, and does nothing once the ring's servers are gone.
#[test]
fn a_waker_ends_a_server_sleep_at_once() {
    let client = Submitter::create(4).unwrap();
    let mut server = Server::open(client.name(), None)
        .unwrap()
        .with_wait_config(WaitConfig {
            spin: Duration::ZERO,
            max_sleep: Duration::from_secs(60),
        });
    let waker = server.waker();
    // Woken in the middle of a long sleep. Timed from before the spawn:
    // the wake comes 100 ms after it, however late the sleeper starts.
    let start = Instant::now();
    let sleeping = thread::spawn(move || {
        let woken = server.sleep(Duration::from_secs(30)).unwrap();
        (server, woken, start.elapsed())
    });
    thread::sleep(Duration::from_millis(100));
    waker.wake();
    let (mut server, woken, took) = sleeping.join().unwrap();
    assert!(woken);
    assert!(
        took >= Duration::from_millis(90) && took < Duration::from_secs(5),
        "{took:?}"
    );
    // A wake with no sleep in progress ends the next one at once, and
    // only that one.
    waker.wake();
    let start = Instant::now();
    assert!(server.sleep(Duration::from_secs(30)).unwrap());
    assert!(start.elapsed() < Duration::from_secs(5));
    let start = Instant::now();
    assert!(!server.sleep(Duration::from_millis(30)).unwrap());
    assert!(start.elapsed() >= Duration::from_millis(25));
    // Wakes that land anywhere around the sleep's start: none is lost (a
    // lost one costs the whole 20 s sleep).
    let mut slowest = Duration::ZERO;
    let mut rng = StdRng::seed_from_u64(rand::random());
    for _ in 0..300 {
        let delay = Duration::from_nanos(rng.random_range(0..60_000));
        let woke = thread::scope(|scope| {
            let waking = scope.spawn(|| {
                let until = Instant::now() + delay;
                while Instant::now() < until {
                    std::hint::spin_loop();
                }
                waker.wake();
            });
            let start = Instant::now();
            let woken = server.sleep(Duration::from_secs(20)).unwrap();
            waking.join().unwrap();
            (woken, start.elapsed())
        });
        assert!(woke.0);
        slowest = slowest.max(woke.1);
        // A wake that landed after its sleep ended leaves the next one
        // short: take it.
        let _ = server.sleep(Duration::ZERO);
    }
    println!("300 wakes around a sleep's start: the slowest ended it after {slowest:?}");
    assert!(slowest < Duration::from_secs(5), "{slowest:?}");
    // A reattached server keeps its wakers.
    let server = server.reattach().unwrap();
    let sleeping = thread::spawn(move || {
        let mut server = server;
        let start = Instant::now();
        assert!(server.sleep(Duration::from_secs(30)).unwrap());
        (server, start.elapsed())
    });
    thread::sleep(Duration::from_millis(50));
    waker.wake();
    let (server, took) = sleeping.join().unwrap();
    assert!(took < Duration::from_secs(5), "{took:?}");
    // Gone: a wake touches nothing (the object is unmapped) and is no
    // error; one server left is enough to be woken.
    let second = server.waker();
    drop(server);
    drop(client);
    waker.wake();
    second.wake();
}

/// A client that read answer `p` may reuse submission slot `p` at once: the
/// server publishes its answers before its tail word (a server killed
/// between the two leaves answers published and the tail behind), and an
/// answer is posted only after its submission was copied out. Found on the
/// H200: a Python client launching back to back read every answer of a
/// full ring and was refused "the ring is full" because the tail word had
/// not moved yet.
#[test]
fn a_slot_whose_answer_the_client_read_is_free_before_the_tail_moves() {
    for slots in [1u32, 2, 4, 8] {
        let mut client = Submitter::create(slots).unwrap();
        let mut rng = StdRng::seed_from_u64(u64::from(slots));
        let mut server = Server::open(client.name(), None).unwrap();
        for _ in 0..slots {
            client.try_submit(&random_descriptor(&mut rng)).unwrap();
        }
        assert!(matches!(
            client.try_submit(&random_descriptor(&mut rng)),
            Err(SubmitError::Full)
        ));
        for _ in 0..slots {
            assert!(server.poll().unwrap().is_some());
            server.post(CompletionStatus::Ok, 0).unwrap();
        }
        // Every answer published, the tail word not stored.
        server.die_mid_flush(u64::from(slots));
        let mut read = 0;
        while client.poll_completion().unwrap().is_some() {
            read += 1;
        }
        assert_eq!(read, slots);
        for _ in 0..slots {
            client.try_submit(&random_descriptor(&mut rng)).unwrap();
        }
        assert!(matches!(
            client.try_submit(&random_descriptor(&mut rng)),
            Err(SubmitError::Full)
        ));
    }
}
