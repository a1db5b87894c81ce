//! A daemon's processes and descriptors, as the recovery tests count them
//! (on both backends: `tests/daemon/recovery.rs`, `tests/gpu/fault_memory.rs`).
#![allow(dead_code, clippy::unwrap_used)]

use std::time::Duration;

/// The live child processes of `pid` (its executors, serving and spare):
/// a zombie not yet reaped is not counted.
pub fn children(pid: i32) -> Vec<u32> {
    let mut found = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return found;
    };
    for task in tasks.flatten() {
        let listed = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        found.extend(
            listed
                .split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
    }
    found.sort_unstable();
    found.dedup();
    found.retain(|p| alive(*p));
    found
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.split_whitespace().nth(2).is_some_and(|s| s != "Z"))
}

/// How many descriptors `pid` has open.
pub fn open_fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// CPU time (user + system) process `pid` has used so far, its exited
/// threads' included (`/proc/<pid>/stat`, in clock ticks: 10 ms steps).
pub fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // utime and stime are fields 14 and 15: the 12th and 13th after the
    // command's closing parenthesis and the state.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { nix::libc::sysconf(nix::libc::_SC_CLK_TCK) } as u64;
    Duration::from_millis(ticks * 1000 / hz.max(1))
}

/// The sum of the first `fields` fields of every live thread's
/// `/proc/<pid>/task/*/schedstat`, in nanoseconds: the scheduler's own
/// counts (field 1: time on a CPU; field 2: time waiting in a run queue).
fn schedstat(pid: u32, fields: usize) -> Duration {
    let mut ns = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let stat =
            std::fs::read_to_string(task.unwrap().path().join("schedstat")).unwrap_or_default();
        ns += stat
            .split_whitespace()
            .take(fields)
            .filter_map(|f| f.parse::<u64>().ok())
            .sum::<u64>();
    }
    Duration::from_nanos(ns)
}

/// CPU time process `pid`'s live threads have run so far, in nanoseconds
/// ([`cpu_time`]'s ticks are 10 ms, too coarse for an idle process).
pub fn on_cpu_time(pid: u32) -> Duration {
    schedstat(pid, 1)
}

/// How long process `pid`'s live threads have been runnable so far: on a
/// CPU or waiting in a run queue for one. A spinning thread is runnable
/// all along however little CPU a loaded machine gives it; a sleeping one
/// is not.
pub fn runnable_time(pid: u32) -> Duration {
    schedstat(pid, 2)
}
