//! The host's resources as ppp measures them before a VM starts: read by
//! the request (the default memory) and by the machine step (what the
//! running sandboxes already hold), so it lives below both.

use std::time::Duration;

use crate::exec::{self, Invocation};

/// The host's memory as ppp measures it before a VM starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostMemory {
    /// All of it: Linux `MemTotal` (/proc/meminfo), macOS `hw.memsize`.
    pub total_mib: u64,
    /// What can be given out now without swapping: Linux `MemAvailable`
    /// (the kernel's own estimate, page cache it can drop included), macOS
    /// `vm_stat`'s free, inactive and speculative pages.
    pub available_mib: u64,
}

/// Measure the host's memory; `None` where it cannot be read.
pub fn host_memory() -> Option<HostMemory> {
    if cfg!(target_os = "linux") {
        parse_meminfo(&std::fs::read_to_string("/proc/meminfo").ok()?)
    } else {
        let run = |inv: Invocation| exec::run(&inv.timeout(Duration::from_secs(5))).ok().map(|o| o.stdout);
        let total = run(Invocation::new("sysctl").args(["-n", "hw.memsize"]))?.trim().parse::<u64>().ok()?;
        let available = parse_vm_stat(&run(Invocation::new("vm_stat"))?)?;
        Some(HostMemory { total_mib: total >> 20, available_mib: available >> 20 })
    }
}

/// `MemTotal` and `MemAvailable` of /proc/meminfo (kB, as the kernel
/// writes them), in MiB.
pub fn parse_meminfo(text: &str) -> Option<HostMemory> {
    let field = |name: &str| -> Option<u64> {
        text.lines().find_map(|l| l.strip_prefix(name))?.trim().trim_end_matches("kB").trim().parse::<u64>().ok()
    };
    let total = field("MemTotal:")?;
    // Kernels before 3.14 have no MemAvailable: MemFree is less, never more.
    let available = field("MemAvailable:").or_else(|| field("MemFree:"))?;
    Some(HostMemory { total_mib: total / 1024, available_mib: available / 1024 })
}

/// Bytes free to give out in `vm_stat`'s output (macOS): free, inactive
/// and speculative pages, of the page size its first line names.
pub fn parse_vm_stat(text: &str) -> Option<u64> {
    let page: u64 = text.lines().next()?.split("page size of ").nth(1)?.split_whitespace().next()?.parse().ok()?;
    let pages = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches('.').parse().ok())
            .unwrap_or(0)
    };
    Some((pages("Pages free:") + pages("Pages inactive:") + pages("Pages speculative:")) * page)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_memory_is_read_per_os() {
        let linux = "MemTotal:       24683584 kB\nMemFree:         9681992 kB\nMemAvailable:   20021524 kB\n";
        assert_eq!(parse_meminfo(linux), Some(HostMemory { total_mib: 24105, available_mib: 19552 }));
        let old = "MemTotal: 2048000 kB\nMemFree: 1024000 kB\n";
        assert_eq!(parse_meminfo(old), Some(HostMemory { total_mib: 2000, available_mib: 1000 }));
        assert_eq!(parse_meminfo("nothing"), None);
        let mac = "Mach Virtual Memory Statistics: (page size of 16384 bytes)\nPages free:        1000.\n\
                   Pages active:     5000.\nPages inactive:    3000.\nPages speculative:  100.\n";
        assert_eq!(parse_vm_stat(mac), Some(4100 * 16384));
        assert!(host_memory().is_some(), "this host's memory can be read");
    }
}
