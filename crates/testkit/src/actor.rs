//! A client process that a test drives one line at a time: commands go to its stdin, and every
//! line it prints on stdout is read as it comes (by a thread, so a test waits on a line with a
//! bound instead of blocking on the pipe).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::WAIT;

/// A running client process, killed on drop.
pub struct Actor {
    /// The process.
    pub child: Child,
    /// Its stdin, until [`Actor::close_stdin`].
    pub stdin: Option<ChildStdin>,
    /// Its stdout, line by line.
    pub lines: Receiver<String>,
    /// What the test calls it in messages.
    pub name: String,
}

impl Actor {
    /// Starts `cmd` with piped stdin and stdout (stderr is the test's).
    pub fn spawn(name: &str, mut cmd: Command) -> Actor {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {name} ({cmd:?}): {e}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        Actor {
            child,
            stdin,
            lines: rx,
            name: name.to_string(),
        }
    }

    /// The next line, waiting at most `t`.
    pub fn line_within(&self, t: Duration) -> String {
        self.lines.recv_timeout(t).unwrap_or_else(|_| {
            panic!(
                "{} (pid {}) said nothing within {t:?}",
                self.name,
                self.child.id()
            )
        })
    }

    /// The next line, waiting at most [`WAIT`].
    pub fn line(&self) -> String {
        self.line_within(WAIT)
    }

    /// The next line, which must start with `prefix`.
    pub fn expect(&self, prefix: &str) -> String {
        let l = self.line();
        assert!(
            l.starts_with(prefix),
            "{} (pid {}) said {l:?}, expected {prefix}…",
            self.name,
            self.child.id()
        );
        l
    }

    /// [`Actor::expect`], returning what follows `prefix`, trimmed.
    pub fn expect_rest(&self, prefix: &str) -> String {
        self.expect(prefix)[prefix.len()..].trim().to_string()
    }

    /// Writes `line` to the process's stdin.
    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin still open");
        writeln!(stdin, "{line}").expect("write to the actor");
        stdin.flush().expect("flush");
    }

    /// Sends `cmd` and returns the answer.
    pub fn cmd(&mut self, cmd: &str) -> String {
        self.send(cmd);
        self.line()
    }

    /// Sends `cmd` and insists on an `OK` answer.
    pub fn ok(&mut self, cmd: &str) -> String {
        let l = self.cmd(cmd);
        assert!(l.starts_with("OK"), "{}: {cmd} -> {l}", self.name);
        l
    }

    /// Closes its stdin (it reads end of file).
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Its process id, as `softverbs resources --json` lists it.
    pub fn pid(&self) -> u64 {
        u64::from(self.child.id())
    }

    /// SIGKILL, and reap it: no cleanup code of its own runs.
    pub fn kill9(&mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reap");
    }

    /// Waits for it to exit, which it must do with status 0.
    pub fn exits_zero(&mut self) {
        let st = self.child.wait().expect("wait");
        assert!(st.success(), "{} exited with {st}", self.name);
    }

    /// Closes stdin, reads what the process still says until it closes stdout (at most
    /// [`WAIT`]), and reaps it.
    pub fn finish(mut self) -> (Vec<String>, ExitStatus) {
        self.close_stdin();
        let deadline = Instant::now() + WAIT;
        let mut said = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => said.push(l),
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => panic!(
                    "{} (pid {}) did not finish within {WAIT:?}; it said:\n{}",
                    self.name,
                    self.child.id(),
                    said.join("\n")
                ),
            }
        }
        let st = self.child.wait().expect("wait");
        (said, st)
    }
}

impl Drop for Actor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
