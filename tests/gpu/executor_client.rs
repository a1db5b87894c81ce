//! A test-side front for one executor process: spawns `ptxd executor`,
//! speaks the framed executor protocol over its stdin/stdout, and matches
//! replies to requests by id (they may arrive out of order).
//!
//! Shared by `tests/gpu.rs` and `benches/cuda_launch.rs` (`#[path]`-included,
//! beside `tests/support/daemon.rs` as `daemon_support`).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::io::{BufReader, BufWriter};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};

use ptxd::executor::protocol::{read_frame, write_frame, ProtocolError};
use ptxd_proto::executor::{
    executor_message::Body, open_buffer::Source, reply, request::Op, ArtifactKind, ExecutorMessage,
    Failure, FailureKind, Fault, Hello, Launch, LaunchOperand, LoadModule, OpenBuffer, OpenEvent,
    Request,
};

/// The ptxd binary, as the daemon helper finds it (both includers of this
/// file include `tests/support/daemon.rs` as `daemon_support`).
pub use crate::daemon_support::ptxd_bin;

/// The directory holding the PTX corpus and the GPU-built artifacts.
pub fn corpus_dir() -> PathBuf {
    std::env::var_os("PTXD_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/corpus")))
}

pub fn corpus(name: &str) -> Vec<u8> {
    let path = corpus_dir().join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

pub struct Executor {
    child: Child,
    stdin: BufWriter<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
    stash: HashMap<u64, reply::Result>,
    pub hello: Hello,
    pub fault: Option<Fault>,
}

impl Executor {
    /// Spawns `ptxd executor --backend cuda --device UUID` and reads its Hello.
    pub fn spawn_cuda(uuid: &str) -> Self {
        let mut child = Command::new(ptxd_bin())
            .args(ptxd::executor::child::ExecutorArgs::cuda(uuid).to_args())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawning ptxd executor");
        let stdin = BufWriter::new(child.stdin.take().unwrap());
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let first: ExecutorMessage = read_frame(&mut stdout).expect("reading Hello");
        let Some(Body::Hello(hello)) = first.body else {
            panic!("the executor's first message is not Hello: {first:?}");
        };
        Executor {
            child,
            stdin,
            stdout,
            next_id: 1,
            stash: HashMap::new(),
            hello,
            fault: None,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a request without waiting; returns its id.
    pub fn send(&mut self, op: Op) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        write_frame(&mut self.stdin, &Request { id, op: Some(op) }).expect("writing a request");
        id
    }

    /// Reads until the reply to `id` arrives; None if the executor closed
    /// the channel first (a Fault seen on the way is kept in `fault`).
    pub fn reply(&mut self, id: u64) -> Option<reply::Result> {
        if let Some(r) = self.stash.remove(&id) {
            return Some(r);
        }
        loop {
            let message: ExecutorMessage = match read_frame(&mut self.stdout) {
                Ok(m) => m,
                Err(ProtocolError::Closed) => return None,
                Err(e) => panic!("executor channel broke: {e}"),
            };
            match message.body {
                Some(Body::Reply(r)) if r.id == id => return r.result,
                Some(Body::Reply(r)) => {
                    if let Some(result) = r.result {
                        self.stash.insert(r.id, result);
                    }
                }
                Some(Body::Fault(f)) => self.fault = Some(f),
                other => panic!("unexpected executor message {other:?}"),
            }
        }
    }

    pub fn call(&mut self, op: Op) -> reply::Result {
        let id = self.send(op);
        self.reply(id).expect("the executor closed the channel")
    }

    /// Reads to the end of the channel and waits for the process.
    pub fn wait_exit(mut self) -> (ExitStatus, Option<Fault>) {
        while let Ok(message) = read_frame::<ExecutorMessage>(&mut self.stdout) {
            if let Some(Body::Fault(f)) = message.body {
                self.fault = Some(f);
            }
        }
        let status = self.child.wait().expect("waiting for the executor");
        (status, self.fault.take())
    }

    /// Asks the executor to shut down and checks it exits cleanly.
    pub fn shutdown(mut self) {
        let r = self.call(Op::Shutdown(Default::default()));
        expect_ok(r);
        let (status, fault) = self.wait_exit();
        assert!(status.success(), "executor exited with {status}");
        assert!(fault.is_none());
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn expect_ok(result: reply::Result) {
    match result {
        reply::Result::Ok(_) => {}
        other => panic!("expected Ok, got {other:?}"),
    }
}

pub fn expect_failure(result: reply::Result, kind: FailureKind) -> Failure {
    match result {
        reply::Result::Failure(f) if f.kind == kind as i32 => f,
        other => panic!("expected failure {kind:?}, got {other:?}"),
    }
}

pub fn load_op(
    module_id: u64,
    kind: ArtifactKind,
    artifact: Vec<u8>,
    symbol: &str,
    inputs: u32,
    scalar_params: u32,
    element_size: u32,
) -> Op {
    Op::LoadModule(LoadModule {
        module_id,
        kind: kind as i32,
        artifact,
        symbol: symbol.into(),
        inputs,
        scalar_params,
        element_sizes: vec![element_size; inputs as usize + 1],
        reqntid: 0,
        maxntid: 0,
        ..Default::default()
    })
}

/// Loads and returns the block size.
pub fn load(exec: &mut Executor, op: Op) -> u32 {
    match exec.call(op) {
        reply::Result::LoadModule(ok) => ok.block_size,
        other => panic!("load failed: {other:?}"),
    }
}

pub fn open_ipc_op(buffer_id: u64, handle: [u8; 64], size: u64, device: &str) -> Op {
    Op::OpenBuffer(OpenBuffer {
        buffer_id,
        source: Some(Source::CudaIpc(handle.to_vec())),
        size,
        claimed_device_uuid: device.into(),
        owner_uid: None,
        offset: 0,
        allocation_size: 0,
    })
}

pub fn open_buffer(exec: &mut Executor, buffer_id: u64, handle: [u8; 64], size: u64, device: &str) {
    match exec.call(open_ipc_op(buffer_id, handle, size, device)) {
        reply::Result::OpenBuffer(ok) => assert_eq!(ok.device_uuid, device),
        other => panic!("open buffer failed: {other:?}"),
    }
}

pub fn open_event_op(event_id: u64, handle: [u8; 64]) -> Op {
    Op::OpenEvent(OpenEvent {
        event_id,
        handle: handle.to_vec(),
    })
}

pub fn operand(buffer_id: u64, offset: u64) -> LaunchOperand {
    LaunchOperand { buffer_id, offset }
}

#[allow(clippy::too_many_arguments)]
pub fn launch_op(
    module_id: u64,
    inputs: Vec<LaunchOperand>,
    output: LaunchOperand,
    n: u64,
    params: Vec<f32>,
    stream: u64,
    sync: bool,
) -> Op {
    Op::Launch(Launch {
        module_id,
        inputs,
        output: Some(output),
        n,
        params,
        stream,
        wait_event: 0,
        signal_event: 0,
        sync,
        ..Default::default()
    })
}
