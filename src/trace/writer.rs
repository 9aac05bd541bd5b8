//! Writing traces: [`TraceOp`]s back to JSON Lines.
//!
//! [`write_op`] writes the object of one op in the format's own order: `op` first, then the op's
//! fields as the format lists them (the schema of `trace/schema.rs`, which the reader's field
//! table comes from too), then `site`. Fields at their default are left out, and so is an
//! `offset` of 0; ids are always JSON strings, and a region is a bare id when it is the whole
//! buffer. What it writes, [`parse_line`](super::read::parse_line) reads back to an equal op,
//! on the reader's fast path.

use std::fmt::Write as _;
use std::io::{self, Write};

use super::schema::{Key, Need, Value};
use super::{Region, Site, TraceOp};

/// Appends the JSON object of `op` to `out`, without a newline.
///
/// ```
/// use streamsan::trace::{write_op, Id, Op, Region, TraceOp};
/// let op = TraceOp::from(Op::Memset { stream: Id::from("s1"), dst: Region::range("a", 0, 64) });
/// let mut line = String::new();
/// write_op(&op, &mut line);
/// assert_eq!(line, r#"{"op":"memset","stream":"s1","dst":{"buffer":"a","bytes":64}}"#);
/// ```
pub fn write_op(op: &TraceOp, out: &mut String) {
    out.push_str("{\"op\":\"");
    out.push_str(op.op.name());
    out.push('"');
    for field in op.op.kind().fields() {
        let Some(value) = op.op.value(field.key) else {
            continue;
        };
        if field.need == Need::Defaulted && value.is_default() {
            continue;
        }
        push_key(out, field.key.name());
        match value {
            Value::Id(id) => push_str(out, id.as_str()),
            Value::Int(n) => push_int(out, n),
            Value::Bool(b) => out.push_str(if b { "true" } else { "false" }),
            Value::Memory(memory) => push_str(out, memory.as_str()),
            Value::Region(region) => push_region(out, region),
            Value::Regions(regions) => {
                out.push('[');
                for (i, region) in regions.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    push_region(out, region);
                }
                out.push(']');
            }
            Value::Text(text) => push_str(out, text),
        }
    }
    match &op.site {
        None => {}
        Some(Site::Label(label)) => {
            push_key(out, Key::Site.name());
            push_str(out, label);
        }
        Some(Site::Stack(frames)) => {
            push_key(out, Key::Site.name());
            out.push('[');
            for (i, frame) in frames.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                push_str(out, frame);
            }
            out.push(']');
        }
    }
    out.push('}');
}

/// Appends `,"key":`.
fn push_key(out: &mut String, key: &str) {
    out.push_str(",\"");
    out.push_str(key);
    out.push_str("\":");
}

fn push_int(out: &mut String, n: u64) {
    // Writing to a String cannot fail.
    let _ = write!(out, "{n}");
}

/// Appends a region: a bare id for the whole buffer, else an object without `offset` when it
/// is 0 and without `bytes` when the region runs to the end of the buffer.
fn push_region(out: &mut String, region: &Region) {
    if region.is_whole() {
        push_str(out, region.buffer.as_str());
        return;
    }
    out.push_str("{\"buffer\":");
    push_str(out, region.buffer.as_str());
    if region.offset != 0 {
        out.push_str(",\"offset\":");
        push_int(out, region.offset);
    }
    if let Some(bytes) = region.bytes {
        out.push_str(",\"bytes\":");
        push_int(out, bytes);
    }
    out.push('}');
}

/// Appends `s` as a JSON string, escaped as serde_json escapes it.
fn push_str(out: &mut String, s: &str) {
    if !s.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') {
        out.push('"');
        out.push_str(s);
        out.push('"');
        return;
    }
    let mut sink = StringSink(out);
    if let Err(e) = serde_json::to_writer(&mut sink, s) {
        // A str always serializes and the sink never fails.
        debug_assert!(false, "serializing a string failed: {e}");
    }
}

/// An `io::Write` that appends to a `String` (serde_json writes UTF-8 text).
struct StringSink<'a>(&'a mut String);

impl Write for StringSink<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match std::str::from_utf8(buf) {
            Ok(s) => self.0.push_str(s),
            Err(_) => self.0.push_str(&String::from_utf8_lossy(buf)),
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Writes a trace: one op per line.
///
/// ```
/// use streamsan::trace::{Id, Op, TraceWriter};
/// let mut writer = TraceWriter::new(Vec::new());
/// writer.write(&Op::StreamSync { stream: Id::from("s1") }.into())?;
/// let bytes = writer.finish()?;
/// assert_eq!(bytes, b"{\"op\":\"stream_sync\",\"stream\":\"s1\"}\n");
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct TraceWriter<W: Write> {
    out: W,
    line: String,
}

impl<W: Write> TraceWriter<W> {
    /// A writer to `out`. Wrap files in a `BufWriter`: each op is one `write_all`.
    pub fn new(out: W) -> Self {
        TraceWriter {
            out,
            line: String::new(),
        }
    }

    /// Writes `op` as one line.
    pub fn write(&mut self, op: &TraceOp) -> io::Result<()> {
        self.line.clear();
        write_op(op, &mut self.line);
        self.line.push('\n');
        self.out.write_all(self.line.as_bytes())
    }

    /// Writes a comment line, `# ` and `text` with its control characters escaped
    /// ([`crate::text::escape`]: a newline in `text` cannot end the comment).
    pub fn comment(&mut self, text: &str) -> io::Result<()> {
        self.line.clear();
        self.line.push_str("# ");
        self.line.push_str(&crate::text::escape(text));
        self.line.push('\n');
        self.out.write_all(self.line.as_bytes())
    }

    /// Flushes and returns the underlying writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }

    /// The underlying writer, without flushing it.
    pub fn into_inner(self) -> W {
        self.out
    }

    /// The underlying writer.
    pub fn get_ref(&self) -> &W {
        &self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{parse_line, Id, MemoryKind, Op};

    fn line(op: impl Into<TraceOp>) -> String {
        let mut out = String::new();
        write_op(&op.into(), &mut out);
        out
    }

    #[test]
    fn defaults_are_left_out() {
        let op = Op::StreamCreate {
            stream: Id::from("s"),
            device: 0,
            blocking: false,
        };
        assert_eq!(line(op), r#"{"op":"stream_create","stream":"s"}"#);
        let op = Op::StreamCreate {
            stream: Id::from("s"),
            device: 1,
            blocking: true,
        };
        assert_eq!(
            line(op),
            r#"{"op":"stream_create","stream":"s","device":1,"blocking":true}"#
        );
        let op = Op::Alloc {
            buffer: Id::from("a"),
            bytes: 4096,
            stream: None,
            memory: MemoryKind::Device,
            addr: None,
            pool: None,
        };
        assert_eq!(line(op), r#"{"op":"alloc","buffer":"a","bytes":4096}"#);
        let op = Op::Alloc {
            buffer: Id::from("a"),
            bytes: 0,
            stream: Some(Id::from("default")),
            memory: MemoryKind::Managed,
            addr: Some(u64::MAX),
            pool: None,
        };
        assert_eq!(
            line(op),
            r#"{"op":"alloc","buffer":"a","bytes":0,"stream":"default","memory":"managed","addr":18446744073709551615}"#
        );
        // `pool` comes last, after `addr`, and only when given.
        let op = Op::Alloc {
            buffer: Id::from("t"),
            bytes: 512,
            stream: Some(Id::from("s")),
            memory: MemoryKind::Device,
            addr: None,
            pool: Some(Id::from("g")),
        };
        assert_eq!(
            line(op.clone()),
            r#"{"op":"alloc","buffer":"t","bytes":512,"stream":"s","pool":"g"}"#
        );
        assert_eq!(parse_line(&line(op.clone())).unwrap().unwrap().0.op, op);
        let op = Op::Launch {
            stream: Id::from("s"),
            name: None,
            reads: vec![],
            writes: vec![],
        };
        assert_eq!(line(op), r#"{"op":"launch","stream":"s"}"#);
        assert_eq!(
            line(Op::DeviceSync { device: 0 }),
            r#"{"op":"device_sync"}"#
        );
        assert_eq!(
            line(Op::DeviceSync { device: 3 }),
            r#"{"op":"device_sync","device":3}"#
        );
        let op = Op::EventQuery {
            event: Id::from("e"),
            complete: false,
        };
        assert_eq!(
            line(op),
            r#"{"op":"event_query","event":"e","complete":false}"#
        );
    }

    #[test]
    fn regions_and_sites() {
        let op = TraceOp {
            op: Op::Launch {
                stream: Id::from(7),
                name: Some("gemm".into()),
                reads: vec![Region::whole("a"), Region::range("b", 0, 16)],
                writes: vec![Region {
                    buffer: Id::from("c"),
                    offset: 8,
                    bytes: None,
                }],
            },
            site: Some(Site::Stack(vec!["f.rs:1".to_owned(), "g.rs:2".to_owned()])),
        };
        assert_eq!(
            line(op),
            r#"{"op":"launch","stream":"7","name":"gemm","reads":["a",{"buffer":"b","bytes":16}],"writes":[{"buffer":"c","offset":8}],"site":["f.rs:1","g.rs:2"]}"#
        );
        let op = TraceOp {
            op: Op::HostWrite {
                buffer: Region::whole("p"),
            },
            site: Some(Site::Label("x".to_owned())),
        };
        assert_eq!(line(op), r#"{"op":"host_write","buffer":"p","site":"x"}"#);
        let op = TraceOp {
            op: Op::EventSync {
                event: Id::from("e"),
            },
            site: Some(Site::Stack(vec![])),
        };
        assert_eq!(line(op), r#"{"op":"event_sync","event":"e","site":[]}"#);
    }

    #[test]
    fn strings_are_escaped_as_serde_json_does() {
        for text in [
            "plain",
            "",
            "a\"b",
            "back\\slash",
            "new\nline",
            "\u{1}\u{1f}\u{7f}",
            "é😀\u{2028}",
        ] {
            let op = Op::EventSync {
                event: Id::from(text),
            };
            let written = line(op.clone());
            let expected = format!(
                r#"{{"op":"event_sync","event":{}}}"#,
                serde_json::to_string(text).unwrap()
            );
            assert_eq!(written, expected);
            assert_eq!(parse_line(&written).unwrap().unwrap().0, op.into());
        }
    }

    #[test]
    fn writer_writes_lines() {
        let mut writer = TraceWriter::new(Vec::new());
        writer.comment("recorded\nby a test").unwrap();
        writer
            .write(
                &Op::EventCreate {
                    event: Id::from("e"),
                }
                .into(),
            )
            .unwrap();
        writer
            .write(
                &Op::EventSync {
                    event: Id::from("e"),
                }
                .into(),
            )
            .unwrap();
        assert_eq!(writer.get_ref().len(), 88);
        let bytes = writer.finish().unwrap();
        assert_eq!(
            String::from_utf8(bytes).unwrap(),
            "# recorded\\nby a test\n{\"op\":\"event_create\",\"event\":\"e\"}\n{\"op\":\"event_sync\",\"event\":\"e\"}\n"
        );
    }
}
