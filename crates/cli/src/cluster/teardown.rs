//! Taking a cluster apart: every process on its hosts, its links, namespaces and state, all
//! found by name (state.rs), so that it works after a crash as after `up`.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use super::{net, state, Cluster};

/// How long `down` waits for a process to exit after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// The namespaces and links of this machine named as cluster `name`'s.
pub fn leftovers(name: &str) -> Vec<String> {
    net::namespaces()
        .into_iter()
        .chain(net::links())
        .filter(|n| state::is_member(name, n))
        .collect()
}

/// Stops every process in cluster `name`'s namespaces and every daemon on its sockets,
/// removes its namespaces and links and its state directory; returns what it did.
pub fn remove(name: &str) -> String {
    let mut report = String::new();
    let dir = Cluster::dir_of(name);
    let namespaces: Vec<String> = net::namespaces()
        .into_iter()
        .filter(|n| state::is_member(name, n))
        .collect();
    let mut pids: Vec<i32> = namespaces.iter().flat_map(|n| net::pids_in(n)).collect();
    // Daemons whose namespace is already gone (found by their socket path).
    pids.extend(processes_mentioning(&dir));
    pids.sort_unstable();
    pids.dedup();
    pids.retain(|&p| p != std::process::id() as i32);
    let stopped = stop(&pids);
    if stopped > 0 {
        let _ = writeln!(report, "  stopped {stopped} processes");
    }
    // The links first: deleting a veth end deletes its pair at once, while a deleted
    // namespace frees its devices later, in the kernel's cleanup work.
    for l in net::links()
        .into_iter()
        .filter(|l| state::is_member(name, l))
    {
        match net::del_link(&l) {
            Ok(()) => {
                let _ = writeln!(report, "  removed link {l}");
            }
            Err(e) if net::links().contains(&l) => {
                let _ = writeln!(report, "  {e}");
            }
            Err(_) => {}
        }
    }
    for n in &namespaces {
        match net::del_namespace(n) {
            Ok(()) => {
                let _ = writeln!(report, "  removed namespace {n}");
            }
            Err(e) => {
                let _ = writeln!(report, "  {e}");
            }
        }
    }
    if dir.exists() {
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {
                let _ = writeln!(report, "  removed {}", dir.display());
            }
            Err(e) => {
                let _ = writeln!(report, "  {}: {e}", dir.display());
            }
        }
    }
    report
}

/// Pids whose command line names a path under `dir` (the host daemons: `--socket DIR/...`).
fn processes_mentioning(dir: &Path) -> Vec<i32> {
    let needle = format!("{}/", dir.display());
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .filter_map(|e| {
            let pid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            text.contains(&needle).then_some(pid)
        })
        .collect()
}

/// SIGTERM, then SIGKILL for whoever is still there after [`STOP_GRACE`]; returns how many
/// processes there were.
fn stop(pids: &[i32]) -> usize {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let alive = |p: i32| kill(Pid::from_raw(p), None).is_ok() && !is_zombie(p);
    let pids: Vec<i32> = pids.iter().copied().filter(|&p| alive(p)).collect();
    for &p in &pids {
        let _ = kill(Pid::from_raw(p), Signal::SIGTERM);
    }
    let deadline = Instant::now() + STOP_GRACE;
    while pids.iter().any(|&p| alive(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    for &p in pids.iter().filter(|&&p| alive(p)) {
        let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
    }
    pids.len()
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.starts_with('Z')))
        .unwrap_or(true)
}
