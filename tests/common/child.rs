//! Child processes of a test, waited for with a deadline: no test hangs on a child.
//!
//! Every wait polls [`Child::try_wait`] until the deadline; a child still running then is killed
//! (`SIGKILL`, which no disposition can ignore), reaped, and the test fails saying what it waited
//! for. A [`Running`] child still running when it is dropped (a test that failed before waiting)
//! is killed and reaped too. Suites include this file with
//! `#[path = "common/child.rs"] mod child;`.

#![allow(dead_code)]

use std::io::Read;
use std::process::{Child, ChildStderr, ChildStdout, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// The longest a test waits for one child.
pub const DEADLINE: Duration = Duration::from_secs(300);

/// A running child, killed and reaped if dropped while it runs.
pub struct Running {
    child: Child,
    what: String,
}

impl Running {
    /// Spawns `cmd`; `what` names it in failures.
    pub fn spawn(cmd: &mut Command, what: impl Into<String>) -> Running {
        let what = what.into();
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("{what}: cannot spawn: {e}"));
        Running { child, what }
    }

    /// The child, for its pipes and its id.
    pub fn child(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Waits for the child at most `limit`: past it the child is killed and the test fails.
    pub fn wait(&mut self, limit: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return status,
                Ok(None) if start.elapsed() >= limit => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    panic!("{}: still running after {limit:?}; killed it", self.what);
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                Err(e) => panic!("{}: cannot wait: {e}", self.what),
            }
        }
    }

    /// Kills the child if it still runs, and reaps it.
    pub fn kill(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Reads a pipe to its end on a thread of its own.
fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut buf);
        }
        buf
    })
}

/// Runs `cmd` to its end, as [`Command::output`] does (standard output and error captured,
/// standard input `stdin`), waiting at most [`DEADLINE`].
pub fn output(cmd: &mut Command, stdin: Stdio) -> Output {
    output_within(cmd, stdin, DEADLINE)
}

/// [`output`] with a deadline of `limit`.
pub fn output_within(cmd: &mut Command, stdin: Stdio, limit: Duration) -> Output {
    let what = format!("{cmd:?}");
    let mut run = Running::spawn(
        cmd.stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
        what,
    );
    let out: std::thread::JoinHandle<Vec<u8>> = drain::<ChildStdout>(run.child.stdout.take());
    let err: std::thread::JoinHandle<Vec<u8>> = drain::<ChildStderr>(run.child.stderr.take());
    // A child killed at the deadline closes its pipes, which ends both readers.
    let status = run.wait(limit);
    Output {
        status,
        stdout: out.join().expect("the reader of standard output"),
        stderr: err.join().expect("the reader of standard error"),
    }
}
