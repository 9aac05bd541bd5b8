//! Trace export: recorded ops as JSON Lines (the trace format, version 1).
//!
//! Ids are written as strings and every field as the format names it, `"op"` first, so the
//! output reads like the conformance traces. Optional fields at their default are left out,
//! except `stream` of an `alloc` (always given: it is the owner).

use std::fmt::Write as _;

use crate::trace::{MemoryKind, Op, Region, Site, TraceOp};

/// Appends `s` as a JSON string.
fn string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn key(out: &mut String, k: &str) {
    out.push(',');
    string(out, k);
    out.push(':');
}

fn field_str(out: &mut String, k: &str, v: &str) {
    key(out, k);
    string(out, v);
}

fn field_u64(out: &mut String, k: &str, v: u64) {
    key(out, k);
    let _ = write!(out, "{v}");
}

fn field_bool(out: &mut String, k: &str, v: bool) {
    key(out, k);
    out.push_str(if v { "true" } else { "false" });
}

fn region(out: &mut String, r: &Region) {
    if r.is_whole() {
        string(out, r.buffer.as_str());
        return;
    }
    out.push_str("{\"buffer\":");
    string(out, r.buffer.as_str());
    if r.offset != 0 {
        field_u64(out, "offset", r.offset);
    }
    if let Some(b) = r.bytes {
        field_u64(out, "bytes", b);
    }
    out.push('}');
}

fn field_region(out: &mut String, k: &str, r: &Region) {
    key(out, k);
    region(out, r);
}

fn field_regions(out: &mut String, k: &str, rs: &[Region]) {
    key(out, k);
    out.push('[');
    for (i, r) in rs.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        region(out, r);
    }
    out.push(']');
}

/// Appends `op` as one line of JSON, with its newline.
pub(crate) fn write_op(op: &TraceOp, out: &mut String) {
    out.push_str("{\"op\":");
    string(out, op.op.name());
    match &op.op {
        Op::StreamCreate {
            stream,
            device,
            blocking,
        } => {
            field_str(out, "stream", stream.as_str());
            if *device != 0 {
                field_u64(out, "device", *device);
            }
            if *blocking {
                field_bool(out, "blocking", true);
            }
        }
        Op::Alloc {
            buffer,
            bytes,
            stream,
            memory,
            addr,
        } => {
            field_str(out, "buffer", buffer.as_str());
            field_u64(out, "bytes", *bytes);
            if let Some(s) = stream {
                field_str(out, "stream", s.as_str());
            }
            if *memory != MemoryKind::Device {
                field_str(out, "memory", memory.as_str());
            }
            if let Some(a) = addr {
                field_u64(out, "addr", *a);
            }
        }
        Op::Free { buffer, stream } => {
            field_str(out, "buffer", buffer.as_str());
            if let Some(s) = stream {
                field_str(out, "stream", s.as_str());
            }
        }
        Op::RecordStream { buffer, stream } => {
            field_str(out, "buffer", buffer.as_str());
            field_str(out, "stream", stream.as_str());
        }
        Op::Launch {
            stream,
            name,
            reads,
            writes,
        } => {
            field_str(out, "stream", stream.as_str());
            if let Some(n) = name {
                field_str(out, "name", n);
            }
            if !reads.is_empty() {
                field_regions(out, "reads", reads);
            }
            if !writes.is_empty() {
                field_regions(out, "writes", writes);
            }
        }
        Op::Copy { stream, src, dst } => {
            field_str(out, "stream", stream.as_str());
            field_region(out, "src", src);
            field_region(out, "dst", dst);
        }
        Op::Memset { stream, dst } => {
            field_str(out, "stream", stream.as_str());
            field_region(out, "dst", dst);
        }
        Op::HostRead { buffer } | Op::HostWrite { buffer } => field_region(out, "buffer", buffer),
        Op::EventCreate { event } | Op::EventDestroy { event } | Op::EventSync { event } => {
            field_str(out, "event", event.as_str())
        }
        Op::EventRecord { event, stream } | Op::EventWait { stream, event } => {
            field_str(out, "event", event.as_str());
            field_str(out, "stream", stream.as_str());
        }
        Op::EventQuery { event, complete } => {
            field_str(out, "event", event.as_str());
            field_bool(out, "complete", *complete);
        }
        Op::StreamSync { stream } => field_str(out, "stream", stream.as_str()),
        Op::StreamQuery { stream, complete } => {
            field_str(out, "stream", stream.as_str());
            field_bool(out, "complete", *complete);
        }
        Op::DeviceSync { device } => {
            if *device != 0 {
                field_u64(out, "device", *device);
            }
        }
        Op::GraphBegin {
            graph,
            stream,
            pool,
        } => {
            field_str(out, "graph", graph.as_str());
            field_str(out, "stream", stream.as_str());
            if let Some(pool) = pool {
                field_str(out, "pool", pool.as_str());
            }
        }
        Op::GraphEnd { graph } => field_str(out, "graph", graph.as_str()),
        Op::GraphLaunch { graph, stream } => {
            field_str(out, "graph", graph.as_str());
            field_str(out, "stream", stream.as_str());
        }
    }
    match &op.site {
        None => {}
        Some(Site::Label(s)) => field_str(out, "site", s),
        Some(Site::Stack(frames)) => {
            key(out, "site");
            out.push('[');
            for (i, f) in frames.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                string(out, f);
            }
            out.push(']');
        }
    }
    out.push_str("}\n");
}

/// Appends every op, one line each.
pub(crate) fn write_trace(ops: &[TraceOp], out: &mut String) {
    for op in ops {
        write_op(op, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(op: Op, site: Option<Site>) -> String {
        let mut s = String::new();
        write_op(&TraceOp { op, site }, &mut s);
        s
    }

    #[test]
    fn ops_are_json_lines() {
        assert_eq!(
            line(
                Op::Launch {
                    stream: "s1".into(),
                    name: Some("k\"1".into()),
                    reads: vec![Region::whole("a")],
                    writes: vec![Region::range("b", 8, 16)],
                },
                Some(Site::Label("src/x.rs:1:2".into()))
            ),
            "{\"op\":\"launch\",\"stream\":\"s1\",\"name\":\"k\\\"1\",\"reads\":[\"a\"],\
             \"writes\":[{\"buffer\":\"b\",\"offset\":8,\"bytes\":16}],\"site\":\"src/x.rs:1:2\"}\n"
        );
        assert_eq!(
            line(
                Op::Alloc {
                    buffer: "p1".into(),
                    bytes: 64,
                    stream: None,
                    memory: MemoryKind::Pinned,
                    addr: Some(4096),
                },
                None
            ),
            "{\"op\":\"alloc\",\"buffer\":\"p1\",\"bytes\":64,\"memory\":\"pinned\",\"addr\":4096}\n"
        );
        assert_eq!(
            line(
                Op::EventQuery {
                    event: "e1".into(),
                    complete: false
                },
                Some(Site::Stack(vec!["a".into(), "b\n".into()]))
            ),
            "{\"op\":\"event_query\",\"event\":\"e1\",\"complete\":false,\"site\":[\"a\",\"b\\n\"]}\n"
        );
        assert_eq!(
            line(Op::DeviceSync { device: 0 }, None),
            "{\"op\":\"device_sync\"}\n"
        );
    }

    #[test]
    fn every_line_parses_as_json() {
        let ops = [
            Op::StreamCreate {
                stream: "s".into(),
                device: 0,
                blocking: true,
            },
            Op::Free {
                buffer: "b".into(),
                stream: Some("s".into()),
            },
            Op::RecordStream {
                buffer: "b".into(),
                stream: "s".into(),
            },
            Op::Copy {
                stream: "s".into(),
                src: Region::whole("a"),
                dst: Region::range("b", 0, 4),
            },
            Op::Memset {
                stream: "s".into(),
                dst: Region::whole("\u{1}"),
            },
            Op::HostWrite {
                buffer: Region::whole("p"),
            },
            Op::EventWait {
                stream: "s".into(),
                event: "e".into(),
            },
            Op::StreamQuery {
                stream: "s".into(),
                complete: true,
            },
        ];
        for op in ops {
            let name = op.name();
            let s = line(op, None);
            let v: serde_json::Value = serde_json::from_str(&s).expect("valid JSON");
            assert_eq!(v["op"], name);
        }
    }
}
