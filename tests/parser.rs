//! The trace reader on whole files: op indices, line numbers, errors, and arbitrary bytes.

use std::io::BufReader;

use proptest::prelude::*;
use streamsan::trace::arbitrary::arb_trace_op;
use streamsan::trace::{
    parse_line_bytes, write_op, Field, Id, Op, ParseError, Region, Spans, TraceOp, TraceReader,
};

const TRACE: &str = "\
# two streams and an event
{\"op\":\"stream_create\",\"stream\":\"s1\"}

{\"op\":\"alloc\",\"buffer\":\"a\",\"bytes\":4096,\"stream\":\"s1\"}
   # the kernel
{\"op\":\"launch\",\"stream\":\"s1\",\"name\":\"fill\",\"writes\":[\"a\"],\"site\":\"main.rs:9\"}
{ \"op\": \"event_record\", \"event\": 1, \"stream\": \"s1\" }
{\"op\":\"event_wait\",\"stream\":\"s2\",\"event\":\"1\"}
{\"stream\":\"s2\",\"reads\":[{\"buffer\":\"a\",\"offset\":1024}],\"op\":\"launch\"}
";

fn read_all(text: &str) -> Result<Vec<(u64, u64, TraceOp)>, ParseError> {
    let mut reader = TraceReader::new(text.as_bytes(), "trace.jsonl");
    let mut ops = Vec::new();
    while let Some((op, spans)) = reader.next_op()? {
        let line = spans.line();
        ops.push((reader.ops_read() - 1, line, op));
    }
    Ok(ops)
}

#[test]
fn ops_are_numbered_and_located() {
    let ops = read_all(TRACE).unwrap();
    let found: Vec<(u64, u64, &str)> = ops
        .iter()
        .map(|(i, l, op)| (*i, *l, op.op.name()))
        .collect();
    assert_eq!(
        found,
        [
            (0, 2, "stream_create"),
            (1, 4, "alloc"),
            (2, 6, "launch"),
            (3, 7, "event_record"),
            (4, 8, "event_wait"),
            (5, 9, "launch"),
        ]
    );
    assert_eq!(
        ops[3].2.op,
        Op::EventRecord {
            event: Id::from("1"),
            stream: Id::from("s1")
        }
    );
    assert_eq!(
        ops[5].2.op,
        Op::Launch {
            stream: Id::from("s2"),
            name: None,
            reads: vec![Region {
                buffer: Id::from("a"),
                offset: 1024,
                bytes: None
            }],
            writes: vec![],
        }
    );
}

#[test]
fn spans_locate_later_errors() {
    let mut reader = TraceReader::new(TRACE.as_bytes(), "trace.jsonl");
    let mut last = None;
    while let Some((op, spans)) = reader.next_op().unwrap() {
        if op.op.name() == "launch" {
            last = Some(spans.clone());
        }
    }
    let spans = last.unwrap();
    assert_eq!(spans.locate(Field::Read(0)), (9, 25));
    let e = ParseError::at(
        "trace.jsonl",
        spans.locate(Field::Read(0)),
        "region past the end",
        None,
    );
    assert_eq!(e.to_string(), "trace.jsonl:9:25: region past the end");
}

#[test]
fn spans_are_those_of_their_own_line() {
    let line = r#"{"op":"launch","stream":"s","reads":["a","b"]}"#;
    let text = format!("{line}\n{line}\n");
    let mut reader = TraceReader::new(text.as_bytes(), "t");
    for n in 1..=2 {
        let (_, spans) = reader.next_op().unwrap().unwrap();
        assert_eq!(spans.line(), n);
        assert_eq!(spans.locate(Field::Read(1)), (n, 42));
        assert_eq!(spans.column(Field::Read(2)), None);
    }
}

#[test]
fn an_error_names_its_line() {
    let text = TRACE.replace("\"event_wait\"", "\"event_wiat\"");
    let e = read_all(&text).unwrap_err();
    assert_eq!((e.file.as_str(), e.line, e.column), ("trace.jsonl", 8, 7));
    assert!(e
        .to_string()
        .starts_with("trace.jsonl:8:7: unknown op \"event_wiat\"; expected one of"));

    let text = TRACE.replace("\"bytes\":4096", "\"bytes\":-4096");
    let e = read_all(&text).unwrap_err();
    assert_eq!(
        e.to_string(),
        "trace.jsonl:4:36: field \"bytes\" is negative (-4096); expected an integer from 0 to \
         18446744073709551615"
    );
}

#[test]
fn a_last_line_without_newline() {
    let ops = read_all("{\"op\":\"device_sync\"}\n{\"op\":\"device_sync\",\"device\":1}").unwrap();
    assert_eq!(ops.len(), 2);
    assert_eq!(ops[1].2.op, Op::DeviceSync { device: 1 });
    assert!(read_all("").unwrap().is_empty());
    assert!(read_all("\n\n# only comments\n").unwrap().is_empty());
}

#[test]
fn read_errors_are_reported_at_the_line_being_read() {
    struct Failing;
    impl std::io::Read for Failing {
        fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("disk on fire"))
        }
    }
    let mut reader = TraceReader::new(BufReader::new(Failing), "t.jsonl");
    let e = reader.next_op().map(|_| ()).unwrap_err();
    assert_eq!(e.to_string(), "t.jsonl:1:1: cannot read: disk on fire");
}

/// An arbitrary op as the writer writes it.
fn written_line() -> impl Strategy<Value = Vec<u8>> {
    arb_trace_op().prop_map(|op| {
        let mut line = String::new();
        write_op(&op, &mut line);
        line.into_bytes()
    })
}

/// Lines of a trace: valid ones, and bytes that are nearly JSON, nearly UTF-8, or anything.
fn trace_bytes() -> impl Strategy<Value = Vec<u8>> {
    let tokens = b"{}[]\",:0123456789-.eE \\u\"op\"launch\"host\r\n\xef\xbb\xbf\xff".to_vec();
    let line = prop_oneof![
        Just(b"{\"op\":\"launch\",\"stream\":\"s\",\"reads\":[\"a\",{\"buffer\":\"b\",\"offset\":1}]}".to_vec()),
        Just(b"{\"op\":\"alloc\",\"buffer\":7,\"bytes\":16,\"memory\":\"pinned\"}".to_vec()),
        Just(b"# comment".to_vec()),
        prop::collection::vec(any::<u8>(), 0..40),
        prop::collection::vec(prop::sample::select(tokens), 0..60),
        written_line(),
        // A written line with one byte changed.
        (written_line(), any::<prop::sample::Index>(), any::<u8>()).prop_map(|(mut line, i, b)| {
            if !line.is_empty() {
                let i = i.index(line.len());
                line[i] = b;
            }
            line
        }),
    ];
    prop::collection::vec(line, 0..8).prop_map(|lines| lines.join(&b'\n'))
}

/// What a line gave: the op and the columns of its fields, or the error.
type Outcome = Result<(TraceOp, Vec<Option<u64>>), String>;

fn columns(spans: &Spans) -> Vec<Option<u64>> {
    let mut fields = vec![
        Field::Op,
        Field::Stream,
        Field::Event,
        Field::Buffer,
        Field::Bytes,
        Field::Addr,
        Field::Memory,
        Field::Device,
        Field::Blocking,
        Field::Src,
        Field::Dst,
    ];
    fields.extend((0..4).flat_map(|i| [Field::Read(i), Field::Write(i)]));
    fields.into_iter().map(|f| spans.column(f)).collect()
}

/// The reader's outcomes for `bytes`, with the line of each.
fn read_outcomes(bytes: &[u8], capacity: usize) -> Vec<(u64, Outcome)> {
    let mut reader = TraceReader::new(BufReader::with_capacity(capacity, bytes), "f");
    let mut outcomes = Vec::new();
    loop {
        match reader.next_op() {
            Ok(Some((op, spans))) => outcomes.push((spans.line(), Ok((op, columns(spans))))),
            Ok(None) => return outcomes,
            Err(e) => outcomes.push((e.line, Err(format!("{}: {}", e.column, e.message)))),
        }
    }
}

/// The same, line by line through `parse_line_bytes`.
fn line_outcomes(bytes: &[u8]) -> Vec<(u64, Outcome)> {
    let mut lines: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
    if bytes.ends_with(b"\n") {
        lines.pop();
    }
    let mut outcomes = Vec::new();
    for (i, mut line) in lines.into_iter().enumerate() {
        if i == 0 {
            line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
        }
        line = line.strip_suffix(b"\r").unwrap_or(line);
        let n = i as u64 + 1;
        match parse_line_bytes(line) {
            Ok(Some((op, spans))) => outcomes.push((n, Ok((op, columns(&spans))))),
            Ok(None) => {}
            Err(e) => outcomes.push((n, Err(format!("{}: {}", e.column, e.message)))),
        }
    }
    outcomes
}

proptest! {
    /// Reading a file gives what parsing its lines one by one gives, however the reader's buffer
    /// cuts them.
    #[test]
    fn the_reader_agrees_with_parse_line(bytes in trace_bytes(), capacity in 1usize..64) {
        prop_assert_eq!(read_outcomes(&bytes, capacity), line_outcomes(&bytes));
        prop_assert_eq!(read_outcomes(&bytes, 8192), line_outcomes(&bytes));
    }

    /// Arbitrary bytes never make the reader panic, and it always gets to the end.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in trace_bytes(), capacity in 1usize..64) {
        let mut reader = TraceReader::new(BufReader::with_capacity(capacity, &bytes[..]), "fuzz");
        let mut steps = 0;
        loop {
            steps += 1;
            prop_assert!(steps <= bytes.len() + 2);
            match reader.next_op() {
                Ok(Some((_, spans))) => prop_assert!(spans.line() >= 1),
                Ok(None) => break,
                Err(e) => {
                    prop_assert!(e.line >= 1 && e.column >= 1);
                    prop_assert!(!e.message.is_empty());
                }
            }
        }
        for line in bytes.split(|&b| b == b'\n') {
            let _ = parse_line_bytes(line);
        }
    }

    #[test]
    fn arbitrary_lines_never_panic(line in prop::collection::vec(any::<u8>(), 0..200)) {
        if let Err(e) = parse_line_bytes(&line) {
            prop_assert!(e.column >= 1 && e.column <= line.len() as u64 + 1);
        }
    }
}
