//! Connecting with the client library's autostart, and saying why when the daemon it started
//! did not come up: the daemon exits at once when it cannot play its NIC (its device's
//! address taken by another daemon, or on no interface of this host) and says so on its
//! standard error, which autostart writes to `daemon.log` beside the socket.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use softverbs::Introspect;

/// The most of a failed daemon's log an error quotes.
const QUOTED_LINES: usize = 5;

/// [`Introspect::connect_at`] (starting a daemon if none answers); on failure, the error and
/// what a daemon started meanwhile wrote to its log.
pub fn connect(socket: &Path) -> Result<Introspect, String> {
    connect_starting(socket, &[])
}

/// [`connect`] that gives a daemon it starts `daemon_args` too.
pub fn connect_starting(
    socket: &Path,
    daemon_args: &[std::ffi::OsString],
) -> Result<Introspect, String> {
    let log = softverbs::autostart_log(socket);
    let before = std::fs::metadata(&log).map_or(0, |m| m.len());
    Introspect::connect_starting(socket, daemon_args).map_err(|e| {
        let said = new_log_lines(&log, before);
        if said.is_empty() {
            format!("no daemon at {}: {e}", socket.display())
        } else {
            format!(
                "no daemon at {}: {e}; the daemon started for it said: {said} (log: {})",
                socket.display(),
                log.display()
            )
        }
    })
}

/// The last lines written to `log` past byte `from`, joined with " | ".
fn new_log_lines(log: &Path, from: u64) -> String {
    let mut text = String::new();
    if let Ok(mut f) = std::fs::File::open(log) {
        if f.seek(SeekFrom::Start(from)).is_ok() {
            let _ = f.read_to_string(&mut text);
        }
    }
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    lines[lines.len().saturating_sub(QUOTED_LINES)..].join(" | ")
}
