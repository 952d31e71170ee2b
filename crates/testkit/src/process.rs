//! Bounded waits for child processes: a hung program fails its test instead of hanging it.

use std::process::{Child, Output};
use std::time::{Duration, Instant};

use crate::WAIT;

/// An exit status with everything the program said, for assertion messages.
pub fn text(o: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Waits up to [`WAIT`] for a child and collects its output.
pub fn finish(c: Child, what: &str) -> Output {
    finish_within(c, what, WAIT)
}

/// [`finish`] for a child that may take longer than one step (a whole test suite).
pub fn finish_within(mut c: Child, what: &str, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    loop {
        if c.try_wait().expect("try_wait").is_some() {
            return c.wait_with_output().expect("wait");
        }
        if Instant::now() > deadline {
            let _ = c.kill();
            let o = c.wait_with_output().expect("wait");
            panic!("{what} did not finish within {limit:?}: {}", text(&o));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
