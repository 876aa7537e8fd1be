//! What the machine offers, as ClickHouse would see it (cgroup limits included), for the
//! settings that are ratios of it.

use std::fs;

use sluice_sched::Machine;

/// Cores: the parallelism the process may use (Rust's `available_parallelism` honours cgroup
/// CPU quotas and affinity). Memory: physical memory, capped by a cgroup limit if one is set.
pub fn detect() -> Machine {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    Machine {
        cores,
        memory: detect_memory(),
    }
}

fn detect_memory() -> u64 {
    let physical = fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024);
    let cgroup = [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .filter_map(|p| fs::read_to_string(p).ok())
    .filter_map(|s| s.trim().parse::<u64>().ok())
    .min();
    match cgroup {
        Some(limit) if physical == 0 || limit < physical => limit,
        _ => physical,
    }
}
