//! The `streamsan` command on hostile input and around output files: over-long lines, huge
//! numbers, control characters in ids, outputs that are links, FIFOs, devices or the input
//! itself, signals while standard input is spooled, and a reader that closes the pipe.
//!
//! Each test runs the binary in a directory of its own under the system's temporary directory,
//! and waits for it with a deadline (`common/child.rs`): a child that hangs is killed and the
//! test fails.

#[path = "common/child.rs"]
mod child;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use child::{Running, DEADLINE};

use streamsan::trace::{TraceOp, TraceWriter};
use streamsan::workload::Pipeline;

fn bin() -> Option<PathBuf> {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_streamsan"));
    bin.exists().then_some(bin)
}

/// A fresh directory for one test, removed when dropped.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let dir =
            std::env::temp_dir().join(format!("streamsan-hardening-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        Dir(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, text).expect("write");
        p
    }

    /// The names in the directory, sorted.
    fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.0)
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn run(dir: &Dir, args: &[&str]) -> Output {
    let bin = bin().expect("the binary");
    child::output(
        Command::new(bin)
            .args(args)
            .current_dir(&dir.0)
            .env_remove("NO_COLOR"),
        Stdio::null(),
    )
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A data race: `x` written on s1, read on s2.
const RACE: &str = r#"{"op":"alloc","buffer":"x","bytes":64,"stream":"s1"}
{"op":"launch","stream":"s1","name":"produce","writes":["x"]}
{"op":"launch","stream":"s2","name":"consume","reads":["x"]}
"#;

/// The clean pipeline of `bench`, with every `every`-th `event_wait` left out (0: none): a trace
/// whose report or fixed trace is far longer than a pipe's buffer.
fn pipeline(ops: u64, every: usize) -> String {
    let mut out = TraceWriter::new(Vec::new());
    let mut waits = 0;
    Pipeline {
        ops,
        ..Pipeline::default()
    }
    .generate(|op: TraceOp| {
        if op.op.name() == "event_wait" {
            waits += 1;
            if every > 0 && waits % every == 0 {
                return;
            }
        }
        out.write(&op).expect("write");
    });
    String::from_utf8(out.finish().expect("finish")).expect("UTF-8")
}

// ---------------------------------------------------------------------------------------------
// Item 7: input limits.

#[cfg(unix)]
#[test]
fn an_endless_line_is_bad_input_at_once() {
    let Some(bin) = bin() else { return };
    let limit = streamsan::trace::MAX_LINE_BYTES;
    let want = format!(
        "/dev/zero:1:{}: the line is longer than {limit} bytes",
        limit + 1
    );
    for args in [
        &["check", "/dev/zero"][..],
        &["check", "--format", "json", "/dev/zero"],
        &["fix", "/dev/zero"],
    ] {
        let start = Instant::now();
        let o = child::output(Command::new(&bin).args(args), Stdio::null());
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(stderr(&o).contains(&want), "{args:?}: {}", stderr(&o));
        assert!(o.stdout.is_empty());
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{args:?} took {:?}",
            start.elapsed()
        );
    }
    // From standard input.
    let o = child::output(
        Command::new(&bin).args(["check", "-"]),
        std::fs::File::open("/dev/zero").expect("/dev/zero").into(),
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains(&format!("<stdin>:1:{}: the line is longer", limit + 1)));
}

#[test]
fn echoed_values_are_clipped_and_escaped() {
    if bin().is_none() {
        return;
    }
    let dir = Dir::new("clip");
    let long = "q".repeat(100_000);
    // An unknown op, a huge number, a long id in the checker's "already allocated" error.
    let cases = [
        format!(r#"{{"op":"{long}"}}"#),
        format!(r#"{{"op":"device_sync","device":{}}}"#, "9".repeat(100_000)),
        format!(
            "{{\"op\":\"alloc\",\"buffer\":\"{long}\\u001b[2J\",\"bytes\":8}}\n{{\"op\":\"alloc\",\"buffer\":\"{long}\\u001b[2J\",\"bytes\":8}}"
        ),
        format!(r#"{{"op":"stream_create","stream":"{long}","device":1}}{}"#, "\n")
            + &format!(r#"{{"op":"stream_create","stream":"{long}","device":2}}"#),
    ];
    for (i, text) in cases.iter().enumerate() {
        let name = format!("case{i}.jsonl");
        dir.write(&name, text);
        let o = run(&dir, &["check", &name]);
        assert_eq!(o.status.code(), Some(2));
        let e = stderr(&o);
        assert!(e.len() < 1_500, "case {i}: {} bytes of error", e.len());
        assert!(e.contains('…'), "case {i}: {e}");
        assert!(!e.contains('\u{1b}'), "case {i}: {e}");
        assert_eq!(e.lines().count(), 1, "case {i}: {e}");
    }
    let e = stderr(&run(&dir, &["check", "case2.jsonl"]));
    assert!(e.contains("\\u{1b}[2J\" is already allocated"), "{e}");
}

#[cfg(unix)]
#[test]
fn bench_with_the_largest_op_count_runs_in_flat_memory() {
    let Some(bin) = bin() else { return };
    let mut bench = Running::spawn(
        Command::new(&bin)
            .args(["bench", "--ops", "18446744073709551615"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
        "bench --ops u64::MAX",
    );
    let rss = |pid: u32| -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    let pid = bench.child().id();
    std::thread::sleep(Duration::from_millis(1500));
    let first = rss(pid);
    std::thread::sleep(Duration::from_millis(1500));
    let second = rss(pid);
    let running = bench.child().try_wait().expect("try_wait").is_none();
    bench.kill();
    let mut err = String::new();
    let _ = bench
        .child()
        .stderr
        .take()
        .map(|mut e| std::io::Read::read_to_string(&mut e, &mut err));
    assert!(running, "bench ended: {err}");
    assert!(!err.contains("panicked"), "{err}");
    if first > 0 {
        assert!(
            second < first + 16 * 1024,
            "RSS grew from {first} KB to {second} KB"
        );
        assert!(second < 200 * 1024, "RSS {second} KB");
    }
    // A finite count still reports what it measured.
    let o = child::output(
        Command::new(&bin).args(["bench", "--ops", "5000", "--json"]),
        Stdio::null(),
    );
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(v["ops"], 5000);
    assert_eq!(v["hazards"], 0);
}

// ---------------------------------------------------------------------------------------------
// Items 8 and 9: output files.

#[cfg(unix)]
#[test]
fn outputs_write_through_symlinks_and_keep_them() {
    if bin().is_none() {
        return;
    }
    let dir = Dir::new("symlink");
    dir.write("race.jsonl", RACE);
    std::fs::create_dir(dir.path("real")).unwrap();
    for (i, args) in [
        &["fix", "race.jsonl", "-o"][..],
        &["check", "race.jsonl", "-o"],
        &["check", "--format", "html", "race.jsonl", "-o"],
        &["check", "--format", "sarif", "race.jsonl", "-o"],
    ]
    .iter()
    .enumerate()
    {
        let target = dir.path(&format!("real/target{i}"));
        std::fs::write(&target, "old content\n").unwrap();
        let link = dir.path(&format!("link{i}"));
        // A relative link, resolved from the link's directory.
        std::os::unix::fs::symlink(format!("real/target{i}"), &link).unwrap();
        let mut a = args.to_vec();
        let l = format!("link{i}");
        a.push(&l);
        let o = run(&dir, &a);
        assert!(
            o.status.code().is_some_and(|c| c <= 1),
            "{a:?}: {}",
            stderr(&o)
        );
        let meta = std::fs::symlink_metadata(&link).unwrap();
        assert!(
            meta.file_type().is_symlink(),
            "{a:?}: the link was replaced"
        );
        let written = std::fs::read_to_string(&target).unwrap();
        assert!(!written.contains("old content"), "{a:?}");
        assert!(written.len() > 20, "{a:?}: {written:?}");
    }
    // A dangling link creates the file it names.
    std::os::unix::fs::symlink("real/new.jsonl", dir.path("dangling")).unwrap();
    let o = run(&dir, &["fix", "race.jsonl", "-o", "dangling"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(dir.path("real/new.jsonl").is_file());
    // No temporary is left anywhere.
    let leftovers: Vec<String> = dir
        .names()
        .into_iter()
        .chain(
            std::fs::read_dir(dir.path("real"))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned()),
        )
        .filter(|n| n.contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[cfg(unix)]
#[test]
fn replaced_outputs_keep_their_permissions() {
    use std::os::unix::fs::PermissionsExt;
    if bin().is_none() {
        return;
    }
    let dir = Dir::new("perms");
    dir.write("race.jsonl", RACE);
    let out = dir.write("out.jsonl", "old\n");
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o640)).unwrap();
    let o = run(&dir, &["fix", "race.jsonl", "-o", "out.jsonl"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o640);
    assert!(std::fs::read_to_string(&out)
        .unwrap()
        .contains("event_wait"));
}

#[cfg(unix)]
#[test]
fn fifos_and_devices_are_written_in_place() {
    if bin().is_none() {
        return;
    }
    let dir = Dir::new("fifo");
    dir.write("race.jsonl", RACE);
    let fifo = dir.path("pipe");
    let path = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(fifo.as_os_str()))
        .expect("a path without NUL");
    // SAFETY: `mkfifo` with a NUL-terminated path that lives across the call.
    if unsafe { libc::mkfifo(path.as_ptr(), 0o600) } != 0 {
        println!("skipped: mkfifo: {}", std::io::Error::last_os_error());
        return;
    }
    for args in [
        &["fix", "race.jsonl", "-o", "pipe"][..],
        &["check", "race.jsonl", "-o", "pipe"],
    ] {
        let f = fifo.clone();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || tx.send(std::fs::read_to_string(f)));
        let o = run(&dir, args);
        // The reader blocks until a writer opens the FIFO: bounded, in case none ever does (the
        // thread is then left blocked, and ends with the test executable).
        let got = rx
            .recv_timeout(DEADLINE)
            .unwrap_or_else(|_| panic!("{args:?}: nothing opened the FIFO: {}", stderr(&o)))
            .unwrap();
        assert!(
            o.status.code().is_some_and(|c| c <= 1),
            "{args:?}: {}",
            stderr(&o)
        );
        assert!(
            got.contains("consume") || got.contains("event_wait"),
            "{args:?}: {got}"
        );
        let meta = std::fs::symlink_metadata(&fifo).unwrap();
        assert!(
            std::os::unix::fs::FileTypeExt::is_fifo(&meta.file_type()),
            "{args:?}: the FIFO was replaced"
        );
    }
    // /dev/null stays a character device (it is one only root could replace, but the rule is
    // the same for every device).
    let o = run(&dir, &["fix", "race.jsonl", "-o", "/dev/null"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let meta = std::fs::symlink_metadata("/dev/null").unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_char_device(
        &meta.file_type()
    ));
    // A directory is refused.
    std::fs::create_dir(dir.path("d")).unwrap();
    let o = run(&dir, &["check", "race.jsonl", "-o", "d"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("d: cannot write: is a directory"),
        "{}",
        stderr(&o)
    );
    assert_eq!(dir.names(), ["d", "pipe", "race.jsonl"]);
}

#[test]
fn the_output_cannot_overwrite_the_input() {
    if bin().is_none() {
        return;
    }
    let dir = Dir::new("same");
    dir.write("race.jsonl", RACE);
    let mut aliases = vec!["race.jsonl".to_string(), "./race.jsonl".to_string()];
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink("race.jsonl", dir.path("alias.jsonl")).unwrap();
        std::fs::hard_link(dir.path("race.jsonl"), dir.path("hard.jsonl")).unwrap();
        aliases.push("alias.jsonl".into());
        aliases.push("hard.jsonl".into());
    }
    for cmd in [&["check"][..], &["check", "--format", "sarif"], &["fix"]] {
        for input in &aliases {
            for out in &aliases {
                let mut args = cmd.to_vec();
                args.extend([input.as_str(), "-o", out.as_str()]);
                let o = run(&dir, &args);
                assert_eq!(o.status.code(), Some(2), "{args:?}");
                assert!(
                    stderr(&o).contains("the output would overwrite the trace being"),
                    "{args:?}: {}",
                    stderr(&o)
                );
                assert_eq!(
                    std::fs::read_to_string(dir.path("race.jsonl")).unwrap(),
                    RACE
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Item 10: the spool of standard input is removed on SIGINT and SIGTERM.

#[cfg(unix)]
#[test]
fn the_spool_is_removed_on_signals() {
    let Some(bin) = bin() else { return };
    use std::os::unix::process::CommandExt;
    for signal in [libc::SIGINT, libc::SIGTERM] {
        let dir = Dir::new(&format!("signal{signal}"));
        let mut cmd = Command::new(&bin);
        cmd.args(["check", "-"])
            .env("TMPDIR", &dir.0)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // The child gets the default disposition of both signals: ignored ones are inherited
        // (`nohup`, a non-interactive shell's background job), and streamsan keeps an ignored
        // signal ignored, as it should.
        // SAFETY: between fork and exec, only `signal`, which is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                for s in [libc::SIGINT, libc::SIGTERM] {
                    if libc::signal(s, libc::SIG_DFL) == libc::SIG_ERR {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let mut child = Running::spawn(&mut cmd, format!("check - (signal {signal})"));
        let mut stdin = child.child().stdin.take().unwrap();
        stdin.write_all(RACE.as_bytes()).unwrap();
        stdin.flush().unwrap();
        // Wait for the spool to appear.
        let start = Instant::now();
        while !dir
            .names()
            .iter()
            .any(|n| n.starts_with("streamsan-input-"))
        {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "no spool appeared"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // SAFETY: `kill` on the pid of a child of this process, not yet reaped.
        assert_eq!(
            unsafe { libc::kill(child.child().id() as libc::pid_t, signal) },
            0
        );
        let status = child.wait(Duration::from_secs(60));
        drop(stdin);
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(signal), "{status:?}");
        assert_eq!(dir.names(), Vec::<String>::new(), "signal {signal}");
    }
}

/// The waits above are bounded: a child still running at its deadline is killed and the test
/// fails, saying so.
#[cfg(unix)]
#[test]
fn a_child_past_its_deadline_is_killed() {
    use std::os::unix::process::ExitStatusExt;
    let mut sleeper = Running::spawn(
        Command::new("sleep").arg("600").stdin(Stdio::null()),
        "sleep 600",
    );
    let start = Instant::now();
    let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        sleeper.wait(Duration::from_millis(200))
    }))
    .expect_err("the wait fails at its deadline");
    let message = failed.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        message.contains("sleep 600: still running after"),
        "{message}"
    );
    assert!(start.elapsed() < Duration::from_secs(60));
    let status = sleeper.child().try_wait().expect("try_wait");
    assert_eq!(status.and_then(|s| s.signal()), Some(libc::SIGKILL));
}

// ---------------------------------------------------------------------------------------------
// Item 11: control characters never reach the terminal.

#[test]
fn control_characters_in_ids_are_escaped() {
    if bin().is_none() {
        return;
    }
    let dir = Dir::new("escape");
    // A stream id that would print a fake summary line, a buffer id that clears the screen, a
    // kernel name that sets the terminal's title, a site that moves the cursor, a C1 CSI and a
    // bidirectional override.
    dir.write(
        "evil.jsonl",
        r#"{"op":"alloc","buffer":"b\u001b[2J","bytes":64,"stream":"s\nstreamsan: no hazards in 3 ops\n"}
{"op":"launch","stream":"s\nstreamsan: no hazards in 3 ops\n","name":"k\u001b]0;title\u0007","writes":["b\u001b[2J"],"site":"a.py:1\u001b[1A"}
{"op":"launch","stream":"t\u009b31m","reads":["b\u001b[2J"],"site":["x\u202e.py:3","y.py:4"]}
"#,
    );
    let unsafe_chars = |s: &str| {
        s.chars()
            .filter(|&c| streamsan::text::is_unsafe(c) && c != '\n')
            .count()
    };
    for color in ["never", "always"] {
        let o = run(&dir, &["check", "--color", color, "evil.jsonl"]);
        assert_eq!(o.status.code(), Some(1));
        let out = String::from_utf8(o.stdout).unwrap();
        // The only ESCs are the colours' own `ESC [ … m`.
        let plain = strip_colours(&out);
        assert!(!plain.contains('\u{1b}'), "{color}: {plain}");
        assert_eq!(unsafe_chars(&plain), 0, "{color}: {plain}");
        // Each report line starts as the renderer wrote it: no id starts a line of its own.
        assert!(
            !plain
                .lines()
                .any(|l| l.starts_with("streamsan: no hazards")),
            "{plain}"
        );
        assert!(plain.contains(r"data race on b\u{1b}[2J"), "{plain}");
        assert!(
            plain.contains(r"stream s\nstreamsan: no hazards in 3 ops\n at op 1"),
            "{plain}"
        );
        assert!(plain.contains(r"kernel `k\u{1b}]0;title\u{7}`"), "{plain}");
        assert!(plain.contains(r"a.py:1\u{1b}[1A"), "{plain}");
        assert!(plain.contains(r"t\u{9b}31m"), "{plain}");
        assert!(plain.contains(r"x\u{202e}.py:3"), "{plain}");
        assert!(plain.contains("why:\n  - stream s\\n"), "{plain}");
        assert!(plain.contains("help: record an event on s\\n"), "{plain}");
    }
    // fix: the comments and the summary on standard error; the copied lines are JSON.
    let o = run(&dir, &["fix", "evil.jsonl"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = String::from_utf8(o.stdout.clone()).unwrap();
    let comment = out.lines().find(|l| l.starts_with('#')).expect("a comment");
    assert!(comment.contains(r"data-race on b\u{1b}[2J"), "{comment}");
    assert!(!out.contains('\u{1b}'));
    assert_eq!(
        out.lines().filter(|l| l.starts_with("# ")).count(),
        1,
        "{out}"
    );
    assert_eq!(unsafe_chars(&stderr(&o)), 0);
    // The JSON report keeps the ids exactly (serde_json escapes them).
    let o = run(&dir, &["check", "--format", "json", "evil.jsonl"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["hazards"][0]["buffer"], "b\u{1b}[2J");
    // An error message with an id.
    dir.write(
        "twice.jsonl",
        "{\"op\":\"alloc\",\"buffer\":\"x\\u001b[2J\\n\",\"bytes\":8}\n{\"op\":\"alloc\",\"buffer\":\"x\\u001b[2J\\n\",\"bytes\":8}\n",
    );
    let e = stderr(&run(&dir, &["check", "--color", "never", "twice.jsonl"]));
    assert_eq!(unsafe_chars(e.trim_end()), 0, "{e}");
    assert!(
        e.contains(r#"buffer "x\u{1b}[2J\n" is already allocated"#),
        "{e}"
    );
}

/// `s` without the colour sequences the renderer writes (`ESC [ digits ; … m`).
fn strip_colours(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find("\u{1b}[") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let end = after
            .find(|c: char| !(c.is_ascii_digit() || c == ';'))
            .unwrap_or(after.len());
        if after[end..].starts_with('m') {
            rest = &after[end + 1..];
        } else {
            out.push('\u{1b}');
            rest = &rest[i + 1..];
        }
    }
    out.push_str(rest);
    out
}

// ---------------------------------------------------------------------------------------------
// Item 12: a closed standard output; the column of a conflicting stream_create.

/// Runs `args` with `input` as a file, reads one line of standard output and closes it.
fn head_1(dir: &Dir, args: &[&str]) -> (Option<i32>, String, String) {
    let bin = bin().expect("the binary");
    let mut child = Running::spawn(
        Command::new(bin)
            .args(args)
            .current_dir(&dir.0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
        format!("{args:?}"),
    );
    // The pipes are read on threads, so that a child that never writes its line cannot block
    // the test: the wait below is bounded, and a child killed there closes its pipes.
    let out = child.child().stdout.take().unwrap();
    let line = std::thread::spawn(move || {
        let mut line = String::new();
        BufReader::new(out).read_line(&mut line).unwrap();
        line
        // Standard output is closed here.
    });
    let mut err = child.child().stderr.take().unwrap();
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut err, &mut s).unwrap();
        s
    });
    let status = child.wait(DEADLINE);
    (
        status.code(),
        line.join().expect("the line"),
        err.join().expect("standard error"),
    )
}

#[test]
fn a_closed_standard_output_is_not_an_error() {
    if bin().is_none() {
        return;
    }
    let dir = Dir::new("head");
    // Reports and fixed traces far longer than a pipe's buffer.
    dir.write("racy.jsonl", &pipeline(60_000, 50));
    dir.write("clean.jsonl", &pipeline(60_000, 0));
    let (code, line, err) = head_1(&dir, &["check", "racy.jsonl"]);
    assert_eq!((code, err.as_str()), (Some(1), ""), "{line}");
    assert!(line.starts_with("error[data-race]"), "{line}");
    let (code, line, err) = head_1(&dir, &["fix", "racy.jsonl"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(line.starts_with("{\"op\":\"stream_create\""), "{line}");
    assert!(err.contains("the written trace checks clean"), "{err}");
    assert!(
        !err.contains("went away") && !err.contains("cannot write"),
        "{err}"
    );
    let (code, _, err) = head_1(&dir, &["check", "--format", "json", "clean.jsonl"]);
    assert_eq!((code, err.as_str()), (Some(0), ""));
    let (code, _, err) = head_1(&dir, &["fix", "clean.jsonl"]);
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn a_conflicting_stream_create_is_located_at_its_value() {
    if bin().is_none() {
        return;
    }
    let dir = Dir::new("redeclared");
    let cases = [
        // device differs: at the second line's device value
        (
            "{\"op\":\"stream_create\",\"stream\":\"s\",\"device\":0}\n{\"op\":\"stream_create\",\"stream\":\"s\",\"device\":1}\n",
            "2:45:",
        ),
        // blocking differs
        (
            "{\"op\":\"stream_create\",\"stream\":\"s\"}\n{\"op\":\"stream_create\", \"stream\":\"s\", \"blocking\":true}\n",
            "2:49:",
        ),
        // implicit first use on device 0, then declared on device 1
        (
            "{\"op\":\"stream_sync\",\"stream\":\"s\"}\n{\"op\":\"stream_create\",\"stream\":\"s\",\"device\":1}\n",
            "2:45:",
        ),
        // declared on device 1, then declared with the default device: at the stream's name
        (
            "{\"op\":\"stream_create\",\"stream\":\"s\",\"device\":1}\n  {\"op\":\"stream_create\",\"stream\":\"s\"}\n",
            "2:34:",
        ),
    ];
    for (i, (text, at)) in cases.iter().enumerate() {
        let name = format!("s{i}.jsonl");
        dir.write(&name, text);
        for cmd in ["check", "fix"] {
            let o = run(&dir, &[cmd, &name]);
            assert_eq!(o.status.code(), Some(2));
            let e = stderr(&o);
            assert!(
                e.starts_with(&format!(
                    "streamsan: {name}:{at} stream \"s\" already exists"
                )),
                "{cmd} case {i}: {e}"
            );
        }
    }
}

/// Counterexamples of `fuzz` go through the same output helper: a run with counterexamples is
/// not needed to test it, but a run writes its summary and leaves no temporary behind.
#[test]
fn fuzz_leaves_no_temporaries() {
    if bin().is_none() {
        return;
    }
    let dir = Dir::new("fuzz");
    let o = run(
        &dir,
        &[
            "fuzz",
            "--cases",
            "20",
            "--keep-unconfirmed",
            "3",
            "--out-dir",
            "cx",
            "--json",
        ],
    );
    assert!(o.status.code().is_some_and(|c| c <= 1), "{}", stderr(&o));
    if dir.path("cx").exists() {
        let names: Vec<String> = std::fs::read_dir(dir.path("cx"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names
                .iter()
                .all(|n| n.ends_with(".jsonl") && !n.starts_with('.')),
            "{names:?}"
        );
    }
}
