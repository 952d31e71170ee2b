//! What a write to a closed pipe does to this process (signal(7), pipe(7)).
//!
//! The Rust runtime ignores SIGPIPE before `main`, so a write to a closed pipe fails with
//! `EPIPE` — and `println!` panics on it. Commands that only print (`status`, `devices`,
//! `resources`, `--help`, …) take SIGPIPE's default action instead, as C tools do:
//! `softverbs status | head -n 1` ends silently, killed by SIGPIPE (status 141 in a shell).
//! The daemon and the commands that talk to processes they start through pipes keep it
//! ignored, so that a peer that went away is an error they handle, not their death; their
//! output goes through [`line`] and [`text`], which never panic.
//!
//! A disposition survives exec(2) (signal(7), "Signal dispositions"), and std's `Command`
//! sets SIGPIPE back to the default in every child it starts; so the daemon sets its own
//! ([`ignore`]) whoever started it — autostart from a client with SIGPIPE at its default
//! included.

use std::io::Write;

use nix::sys::signal::{signal, SigHandler, Signal};

/// SIGPIPE ends this process (SIG_DFL), as it ends a C program.
#[allow(unsafe_code)]
pub fn default_action() {
    // SAFETY: SIG_DFL installs no handler, so no code of ours runs in signal context; the
    // call only sets the process's disposition (signal(2)). It cannot fail for SIGPIPE.
    let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) };
}

/// A write to a closed pipe fails with EPIPE instead of ending this process (SIG_IGN).
#[allow(unsafe_code)]
pub fn ignore() {
    // SAFETY: SIG_IGN installs no handler (signal(2)); see `default_action`.
    let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigIgn) };
}

/// Writes formatted output to stdout without panicking: when stdout is a closed pipe (SIGPIPE
/// ignored), the rest of the output is dropped and the command goes on to finish its work and
/// clean up what it started; any other error is said once on stderr.
pub fn text(args: std::fmt::Arguments<'_>) {
    write(args, false);
}

/// [`text`] and a newline: `println!` that never panics (used through `outln!`).
pub fn line(args: std::fmt::Arguments<'_>) {
    write(args, true);
}

fn write(args: std::fmt::Arguments<'_>, newline: bool) {
    use std::sync::atomic::{AtomicBool, Ordering};
    static SAID: AtomicBool = AtomicBool::new(false);
    let mut out = std::io::stdout().lock();
    let r = out.write_fmt(args).and_then(|()| {
        if newline {
            out.write_all(b"\n")
        } else {
            Ok(())
        }
    });
    match r {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        Err(e) => {
            if !SAID.swap(true, Ordering::Relaxed) {
                eprintln!("softverbs: writing to stdout: {e}");
            }
        }
    }
}
