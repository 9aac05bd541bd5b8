//! The reader's tests: every op and field, every error in its place, both paths agreeing.

use super::fast::KEY_LITERALS;
use super::fields::{key_from_name, kind_from_word, pack, short};
use super::*;
use crate::trace::arbitrary::arb_trace_op;
use crate::trace::schema::REGION;
use crate::trace::{write_op, Field, Id, MemoryKind, Op, Region};
use proptest::prelude::*;
use std::io::{BufRead, BufReader};

const OPS: &str = "one of stream_create, alloc, free, record_stream, launch, copy, memset, \
                   host_read, host_write, event_create, event_destroy, event_record, \
                   event_wait, event_sync, event_query, stream_sync, stream_query, device_sync, \
                   graph_begin, graph_end, graph_launch";
const INT: &str = "expected an integer from 0 to 18446744073709551615";

fn op(line: &str) -> TraceOp {
    match parse_line(line) {
        Ok(Some((op, _))) => op,
        other => panic!("{line}: {other:?}"),
    }
}

fn spans(line: &str) -> Spans {
    match parse_line(line) {
        Ok(Some((_, spans))) => spans,
        other => panic!("{line}: {other:?}"),
    }
}

/// The error of `line` as `COL: MESSAGE; expected …`.
fn err(line: &str) -> String {
    match parse_line(line) {
        Err(e) => e.to_string(),
        Ok(ok) => panic!("{line}: parsed as {ok:?}"),
    }
}

/// The general scanner alone, without the fast path.
fn general(line: &str) -> Result<Option<(TraceOp, Spans)>, LineError> {
    let mut spans = Spans {
        line: 1,
        ..Spans::default()
    };
    Ok(parse_into(line, &mut spans, false)?.map(|op| (op, spans)))
}

fn read_all(text: &[u8]) -> (Vec<(u64, TraceOp)>, Option<String>) {
    let mut reader = TraceReader::new(text, "t.jsonl");
    let mut ops = Vec::new();
    loop {
        match reader.next_op() {
            Ok(Some((op, spans))) => ops.push((spans.line(), op)),
            Ok(None) => return (ops, None),
            Err(e) => return (ops, Some(e.to_string())),
        }
    }
}

#[test]
fn a_typical_launch() {
    let line = r#"{"op":"launch","stream":"s3","name":"k","reads":["b12",{"buffer":"t5","offset":0,"bytes":4096}],"writes":["b13"]}"#;
    let expected = Op::Launch {
        stream: Id::from("s3"),
        name: Some("k".into()),
        reads: vec![Region::whole("b12"), Region::range("t5", 0, 4096)],
        writes: vec![Region::whole("b13")],
    };
    assert_eq!(op(line), TraceOp::from(expected));
    let s = spans(line);
    assert_eq!(s.locate(Field::Op), (1, 1));
    assert_eq!(s.locate(Field::Stream), (1, 25));
    assert_eq!(s.locate(Field::Read(0)), (1, 50));
    assert_eq!(s.locate(Field::Read(1)), (1, 56));
    assert_eq!(s.locate(Field::Write(0)), (1, 107));
    // Absent fields fall back to the object.
    assert_eq!(s.column(Field::Event), None);
    assert_eq!(s.locate(Field::Event), (1, 1));
    assert_eq!(s.locate(Field::Read(2)), (1, 1));
    assert_eq!(general(line), parse_line(line));
}

#[test]
fn every_op_with_every_field() {
    let lines = [
        r#"{"op":"stream_create","stream":"s","device":1,"blocking":true,"site":"a.rs:1"}"#,
        r#"{"op":"alloc","buffer":"a","bytes":16,"stream":"s","memory":"pinned","addr":4096}"#,
        r#"{"op":"alloc","buffer":"t","bytes":16,"stream":"s","addr":8192,"pool":"p"}"#,
        r#"{"op":"free","buffer":"a","stream":"s"}"#,
        r#"{"op":"record_stream","buffer":"a","stream":"s"}"#,
        r#"{"op":"copy","stream":"s","src":"a","dst":{"buffer":"b","offset":8}}"#,
        r#"{"op":"memset","stream":"s","dst":{"buffer":"b","bytes":8}}"#,
        r#"{"op":"host_read","buffer":{"buffer":"p","offset":1,"bytes":2}}"#,
        r#"{"op":"host_write","buffer":"p"}"#,
        r#"{"op":"event_create","event":"e"}"#,
        r#"{"op":"event_destroy","event":"e"}"#,
        r#"{"op":"event_record","event":"e","stream":"s"}"#,
        r#"{"op":"event_wait","stream":"s","event":"e"}"#,
        r#"{"op":"event_sync","event":"e"}"#,
        r#"{"op":"event_query","event":"e","complete":false}"#,
        r#"{"op":"stream_sync","stream":"s"}"#,
        r#"{"op":"stream_query","stream":"s","complete":true}"#,
        r#"{"op":"device_sync","device":2,"site":["f","g"]}"#,
        r#"{"op":"graph_begin","graph":"g","stream":"s","pool":"p"}"#,
        r#"{"op":"graph_end","graph":"g"}"#,
        r#"{"op":"graph_launch","graph":"g","stream":"s","site":"run.py:3"}"#,
    ];
    for line in lines {
        let parsed = parse_line(line);
        assert!(matches!(parsed, Ok(Some(_))), "{line}: {parsed:?}");
        assert_eq!(general(line), parsed, "{line}");
        let mut written = String::new();
        write_op(&op(line), &mut written);
        assert_eq!(written, line);
    }
    assert_eq!(
        op(r#"{"op":"alloc","buffer":"a","bytes":16}"#).op,
        Op::Alloc {
            buffer: Id::from("a"),
            bytes: 16,
            stream: None,
            memory: MemoryKind::Device,
            addr: None,
            pool: None,
        }
    );
    assert_eq!(
        op(r#"{"op":"alloc","buffer":"t","bytes":16,"stream":"s","pool":"p"}"#).op,
        Op::Alloc {
            buffer: Id::from("t"),
            bytes: 16,
            stream: Some(Id::from("s")),
            memory: MemoryKind::Device,
            addr: None,
            pool: Some(Id::from("p")),
        }
    );
    // Any order of the fields, the general scanner's: the same op, `pool` located.
    let line = r#"{"pool":"p","op":"alloc","bytes":16,"buffer":"t","stream":"s"}"#;
    assert_eq!(
        general(line).map(|o| o.map(|(op, _)| op.op)),
        Ok(Some(
            op(r#"{"op":"alloc","buffer":"t","bytes":16,"stream":"s","pool":"p"}"#).op
        ))
    );
    assert_eq!(spans(line).locate(Field::Pool), (1, 9));
    assert_eq!(
        spans(r#"{"op":"alloc","buffer":"t","bytes":16,"pool":"p"}"#).locate(Field::Pool),
        (1, 46)
    );
    assert_eq!(
        op(r#"{"op":"device_sync"}"#).op,
        Op::DeviceSync { device: 0 }
    );
    assert_eq!(
        op(r#"{"op":"stream_create","stream":"s"}"#).op,
        Op::StreamCreate {
            stream: Id::from("s"),
            device: 0,
            blocking: false
        }
    );
    assert_eq!(
        op(r#"{"op":"launch","stream":"s"}"#).op,
        Op::Launch {
            stream: Id::from("s"),
            name: None,
            reads: vec![],
            writes: vec![]
        }
    );
    assert_eq!(
        op(r#"{"op":"graph_begin","graph":7,"stream":"s"}"#).op,
        Op::GraphBegin {
            graph: Id::from("7"),
            stream: Id::from("s"),
            pool: None
        }
    );
}

#[test]
fn graph_ops_and_their_errors() {
    let line = r#"{"op":"graph_begin","graph":"g","stream":"s","pool":"p"}"#;
    let s = spans(line);
    assert_eq!(s.locate(Field::Graph), (1, 29));
    assert_eq!(s.locate(Field::Stream), (1, 42));
    assert_eq!(s.locate(Field::Pool), (1, 53));
    let spaced = r#"{ "pool" : 3, "stream":"s", "op":"graph_begin", "graph":"g" }"#;
    assert_eq!(
        op(spaced),
        op(r#"{"op":"graph_begin","graph":"g","stream":"s","pool":"3"}"#)
    );
    assert_eq!(spans(spaced).locate(Field::Pool), (1, 12));
    assert_eq!(
        err(r#"{"op":"graph_begin","stream":"s"}"#),
        "1: missing field \"graph\" for op \"graph_begin\"; expected a graph id"
    );
    assert_eq!(
        err(r#"{"op":"graph_launch","graph":"g"}"#),
        "1: missing field \"stream\" for op \"graph_launch\"; expected a stream id"
    );
    assert_eq!(
        err(r#"{"op":"graph_end","graph":"g","stream":"s"}"#),
        "31: unknown field \"stream\" for op \"graph_end\"; expected one of graph, site"
    );
    assert_eq!(
        err(r#"{"op":"graph_launch","graph":"g","stream":"s","pool":"p"}"#),
        "47: unknown field \"pool\" for op \"graph_launch\"; expected one of graph, stream, site"
    );
    assert_eq!(
        err(r#"{"op":"graph_begin","graph":"g","stream":"host"}"#),
        "42: field \"stream\" is \"host\", the reserved name of the CPU thread; expected a \
         stream id other than \"host\""
    );
    assert_eq!(
        err(r#"{"op":"graph_end","graph":true}"#),
        "27: field \"graph\" is a boolean; expected a string or an integer from 0 to \
         18446744073709551615"
    );
    assert_eq!(
        err(r#"{"op":"graph_begin","graph":"g","stream":"s","pool":-1}"#),
        "53: field \"pool\" is negative (-1); expected a string or an integer from 0 to \
         18446744073709551615"
    );
    assert_eq!(
        err(r#"{"op":"graph_end","graph":"a","graph":"b"}"#),
        "31: duplicate field \"graph\"; expected each field at most once"
    );
}

#[test]
fn whitespace_order_and_escapes() {
    let compact = op(r#"{"op":"copy","stream":"s","src":"a","dst":{"buffer":"b","offset":8}}"#);
    let spaced = " { \"dst\" : { \"offset\" : 8 , \"buffer\" : \"b\" } ,\t\"src\":\"a\", \
                  \"op\" : \"copy\" , \"stream\" : \"s\" } \r\n";
    assert_eq!(op(spaced), compact);
    let s = spans(spaced);
    assert_eq!(s.locate(Field::Op), (1, 2));
    assert_eq!(s.locate(Field::Dst), (1, 12));
    assert_eq!(s.locate(Field::Stream), (1, 86));
    let escaped = op(r#"{"\u006fp":"stream_sync","stream":"a\"b\\c\u00e9\n"}"#);
    assert_eq!(
        escaped.op,
        Op::StreamSync {
            stream: Id::from("a\"b\\cé\n")
        }
    );
    assert_eq!(
        op(r#"{"op":"event_sync","event":"été"}"#).op,
        Op::EventSync {
            event: Id::from("été")
        }
    );
}

#[test]
fn integer_and_string_ids_are_the_same() {
    assert_eq!(
        op(r#"{"op":"event_record","event":7,"stream":0}"#),
        op(r#"{"op":"event_record","event":"7","stream":"0"}"#)
    );
    let max = op(r#"{"op":"memset","stream":18446744073709551615,"dst":12}"#);
    assert_eq!(
        max.op,
        Op::Memset {
            stream: Id::from(u64::MAX),
            dst: Region::whole("12")
        }
    );
}

#[test]
fn integer_edges() {
    let device = |text: &str| format!(r#"{{"op":"device_sync","device":{text}}}"#);
    assert_eq!(op(&device("0")).op, Op::DeviceSync { device: 0 });
    let max = op(&device("18446744073709551615"));
    assert_eq!(max.op, Op::DeviceSync { device: u64::MAX });
    assert_eq!(
        err(&device("18446744073709551616")),
        format!("30: field \"device\" is too large (18446744073709551616); {INT}")
    );
    assert_eq!(
        err(&device("99999999999999999999999")),
        format!("30: field \"device\" is too large (99999999999999999999999); {INT}")
    );
    assert_eq!(
        err(&device("-1")),
        format!("30: field \"device\" is negative (-1); {INT}")
    );
    assert_eq!(
        err(&device("1.0")),
        format!("30: field \"device\" has a fraction (1.0); {INT}")
    );
    assert_eq!(
        err(&device("1e3")),
        format!("30: field \"device\" has an exponent (1e3); {INT}")
    );
    assert_eq!(
        err(&device("1E+3")),
        format!("30: field \"device\" has an exponent (1E+3); {INT}")
    );
    // Not JSON at all: serde_json's word.
    assert_eq!(err(&device("01")), "31: invalid JSON: invalid number");
    assert_eq!(err(&device("-")), "31: invalid JSON: invalid number");
    // Ids follow the same rule.
    assert_eq!(
        err(r#"{"op":"event_sync","event":-3}"#),
        "28: field \"event\" is negative (-3); expected a string or an integer from 0 to \
         18446744073709551615"
    );
    assert_eq!(
        err(r#"{"op":"event_sync","event":1.5}"#),
        "28: field \"event\" has a fraction (1.5); expected a string or an integer from 0 \
         to 18446744073709551615"
    );
}

#[test]
fn sums_that_overflow() {
    let ok = r#"{"op":"memset","stream":"s","dst":{"buffer":"a","offset":0,"bytes":18446744073709551615}}"#;
    assert_eq!(
        op(ok).op,
        Op::Memset {
            stream: Id::from("s"),
            dst: Region::range("a", 0, u64::MAX)
        }
    );
    let line = r#"{"op":"memset","stream":"s","dst":{"buffer":"a","offset":1,"bytes":18446744073709551615}}"#;
    assert_eq!(
        err(line),
        "35: region \"dst\" ends past 2^64 - 1 (offset 1 + bytes 18446744073709551615); \
         expected offset + bytes at most 18446744073709551615"
    );
    let line = r#"{"op":"launch","stream":"s","writes":["a",{"buffer":"b","offset":18446744073709551615,"bytes":1}]}"#;
    assert_eq!(
        err(line),
        "43: region \"writes[1]\" ends past 2^64 - 1 (offset 18446744073709551615 + bytes 1); \
         expected offset + bytes at most 18446744073709551615"
    );
    let line = r#"{"op":"alloc","buffer":"a","bytes":2,"addr":18446744073709551615}"#;
    assert_eq!(
        err(line),
        "45: alloc ends past 2^64 - 1 (addr 18446744073709551615 + bytes 2); expected addr \
         + bytes at most 18446744073709551615"
    );
    let line = r#"{"op":"alloc","buffer":"a","bytes":0,"addr":18446744073709551615}"#;
    assert!(matches!(
        op(line).op,
        Op::Alloc {
            addr: Some(u64::MAX),
            ..
        }
    ));
}

#[test]
fn op_errors() {
    assert_eq!(
        err(r#"{"op":"lanch","stream":"s"}"#),
        format!("7: unknown op \"lanch\"; expected {OPS}")
    );
    assert_eq!(
        err(r#"{"stream":"s"}"#),
        format!("1: missing field \"op\"; expected {OPS}")
    );
    assert_eq!(
        err("  {}"),
        format!("3: missing field \"op\"; expected {OPS}")
    );
    assert_eq!(
        err(r#"{"op":5}"#),
        format!("7: field \"op\" is a number; expected {OPS}")
    );
    // The op need not come first.
    assert_eq!(
        op(r#"{"stream":"s","op":"stream_sync"}"#).op,
        Op::StreamSync {
            stream: Id::from("s")
        }
    );
    assert_eq!(
        err(r#"{"stream":"s","op":"lanch"}"#),
        format!("20: unknown op \"lanch\"; expected {OPS}")
    );
    assert_eq!(
        err(r#"{"stream":"host","op":"stream_sync"}"#),
        "11: field \"stream\" is \"host\", the reserved name of the CPU thread; expected a \
         stream id other than \"host\""
    );
    assert_eq!(
        err("[1,2]"),
        "1: the line is an array; expected a JSON object"
    );
    assert_eq!(
        err("  42"),
        "3: the line is a number; expected a JSON object"
    );
    assert_eq!(
        err(r#""op""#),
        "1: the line is a string; expected a JSON object"
    );
}

#[test]
fn field_errors() {
    assert_eq!(
        err(r#"{"op":"stream_sync","stream":"s","bogus":1}"#),
        "34: unknown field \"bogus\" for op \"stream_sync\"; expected one of stream, site"
    );
    assert_eq!(
        err(r#"{"op":"launch","stream":"s","event":"e"}"#),
        "29: unknown field \"event\" for op \"launch\"; expected one of stream, name, reads, \
         writes, site"
    );
    assert_eq!(
        err(r#"{"op":"stream_sync","stream":"a","stream":"b"}"#),
        "34: duplicate field \"stream\"; expected each field at most once"
    );
    assert_eq!(
        err(r#"{"op":"stream_sync","op":"stream_sync","stream":"a"}"#),
        "21: duplicate field \"op\"; expected each field at most once"
    );
    assert_eq!(
        err(r#"{"op":"launch"}"#),
        "1: missing field \"stream\" for op \"launch\"; expected a stream id"
    );
    assert_eq!(
        err(r#"{"op":"copy","stream":"s","dst":"a"}"#),
        format!("1: missing field \"src\" for op \"copy\"; expected {REGION}")
    );
    assert_eq!(
        err(r#"{"op":"event_query","event":"e"}"#),
        "1: missing field \"complete\" for op \"event_query\"; expected a boolean"
    );
    assert_eq!(
        err(r#"{"op":"alloc","buffer":"a","bytes":"4"}"#),
        format!("36: field \"bytes\" is a string; {INT}")
    );
    assert_eq!(
        err(r#"{"op":"alloc","buffer":{"buffer":"a"},"bytes":4}"#),
        "24: field \"buffer\" is an object; expected a string or an integer from 0 to \
         18446744073709551615"
    );
    assert_eq!(
        err(r#"{"op":"alloc","buffer":"a","bytes":1,"memory":"gpu"}"#),
        "47: field \"memory\" is \"gpu\"; expected one of device, pinned, managed"
    );
    assert_eq!(
        err(r#"{"op":"alloc","buffer":"a","bytes":1,"memory":null}"#),
        "47: field \"memory\" is null; expected one of device, pinned, managed"
    );
    assert_eq!(
        err(r#"{"op":"device_sync","site":5}"#),
        "28: field \"site\" is a number; expected a string or an array of strings"
    );
    assert_eq!(
        err(r#"{"op":"device_sync","site":["a",5]}"#),
        "33: field \"site[1]\" is a number; expected a string"
    );
    assert_eq!(
        err(r#"{"op":"launch","stream":"s","name":7}"#),
        "36: field \"name\" is a number; expected a string"
    );
    assert_eq!(
        err(r#"{"op":"event_query","event":"e","complete":"yes"}"#),
        "44: field \"complete\" is a string; expected true or false"
    );
    assert_eq!(
        err(r#"{"op":"stream_create","stream":"s","blocking":1}"#),
        "47: field \"blocking\" is a number; expected true or false"
    );
    assert_eq!(
        err(r#"{"op":"stream_sync","stream":[1]}"#),
        "30: field \"stream\" is an array; expected a string or an integer from 0 to \
         18446744073709551615"
    );
    assert_eq!(
        err(r#"{"op":"launch","stream":"s","reads":["a",true]}"#),
        format!("42: field \"reads[1]\" is a boolean; expected {REGION}")
    );
    assert_eq!(
        err(r#"{"op":"launch","stream":"s","reads":"a"}"#),
        "37: field \"reads\" is a string; expected an array of regions"
    );
    assert_eq!(
        err(r#"{"op":"memset","stream":"s","dst":{"buffer":"a","offest":1}}"#),
        "49: unknown field \"offest\" in region \"dst\"; expected one of buffer, offset, bytes"
    );
    assert_eq!(
        err(r#"{"op":"memset","stream":"s","dst":{"bytes":1,"bytes":2,"buffer":"a"}}"#),
        "46: duplicate field \"bytes\" in region \"dst\"; expected each field at most once"
    );
    assert_eq!(
        err(r#"{"op":"memset","stream":"s","dst":{"bytes":1}}"#),
        "35: missing field \"buffer\" in region \"dst\"; expected a buffer id"
    );
    assert_eq!(
        err(r#"{"op":"memset","stream":"s","dst":{"buffer":"a","offset":-1}}"#),
        format!("58: field \"dst.offset\" is negative (-1); {INT}")
    );
    assert_eq!(
        err(r#"{"op":"host_read","buffer":{"buffer":"a","bytes":true}}"#),
        format!("50: field \"buffer.bytes\" is a boolean; {INT}")
    );
}

#[test]
fn host_is_not_a_stream() {
    let expected = "the reserved name of the CPU thread; expected a stream id other than \
                    \"host\"";
    assert_eq!(
        err(r#"{"op":"stream_sync","stream":"host"}"#),
        format!("30: field \"stream\" is \"host\", {expected}")
    );
    assert_eq!(
        err(r#"{"op":"free","buffer":"a","stream":"host"}"#),
        format!("36: field \"stream\" is \"host\", {expected}")
    );
    assert_eq!(
        err(r#"{"op":"alloc","buffer":"a","bytes":1,"stream":"h\u006fst"}"#),
        format!("47: field \"stream\" is \"host\", {expected}")
    );
    // Other ids may be "host".
    assert_eq!(
        op(r#"{"op":"event_sync","event":"host"}"#).op,
        Op::EventSync {
            event: Id::from("host")
        }
    );
}

#[test]
fn malformed_json() {
    assert_eq!(
        err(r#"{"op":"launch","stream":}"#),
        "25: invalid JSON: expected value"
    );
    assert_eq!(
        err(r#"{"op":"launch""#),
        "14: invalid JSON: EOF while parsing an object"
    );
    assert_eq!(
        err(r#"{"op":"device_sync"} x"#),
        "22: invalid JSON: trailing characters"
    );
    assert_eq!(
        err(r#"{"op":"device_sync",}"#),
        "21: invalid JSON: key must be a string"
    );
    assert_eq!(
        err("{\"op\":\"device_sync\",\"site\":\"a\tb\"}"),
        "29: invalid JSON: control character (\\u0000-\\u001F) found while parsing a string"
    );
    // A syntax error anywhere wins over an earlier bad value.
    assert_eq!(
        err(r#"{"op":"lanch","stream":}"#),
        "24: invalid JSON: expected value"
    );
    assert_eq!(err("hello"), "1: invalid JSON: expected value");
    // A lone surrogate is valid JSON but not a string.
    assert_eq!(
        err(r#"{"op":"stream_sync","stream":"\ud800"}"#),
        "37: invalid string: unexpected end of hex escape"
    );
}

#[test]
fn deep_nesting_is_an_error_not_a_crash() {
    let open = "[".repeat(100_000);
    assert_eq!(err(&open), "100000: invalid JSON: EOF while parsing a list");
    let line = format!(r#"{{"op":"launch","stream":{open}"#);
    assert!(err(&line).contains("invalid JSON: EOF while parsing a list"));
    // Closed, it is valid JSON but a wrong value.
    let deep = format!("{open}{}", "]".repeat(100_000));
    let line = format!(r#"{{"op":"launch","stream":"s","reads":{deep}}}"#);
    assert_eq!(
        err(&line),
        format!("38: field \"reads[0]\" is an array; expected {REGION}")
    );
    let line = format!(r#"{{"x":{deep},"op":"device_sync"}}"#);
    assert_eq!(
        err(&line),
        "2: unknown field \"x\" for op \"device_sync\"; expected one of device, site"
    );
}

#[test]
fn invalid_utf8() {
    let line = b"{\"op\":\"launch\",\"stream\":\"\xff\"}";
    let e = parse_line_bytes(line).map(|_| ()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "26: invalid UTF-8 (byte 0xff); expected UTF-8 text"
    );
    let line = b"{\"op\":\"launch\",\"stream\":\"caf\xc3\"}";
    let e = parse_line_bytes(line).map(|_| ()).unwrap_err();
    assert_eq!(e.column, 29);
    let (ops, e) = read_all(b"{\"op\":\"device_sync\"}\n# caf\xe9\n");
    assert_eq!(ops.len(), 1);
    assert_eq!(
        e.as_deref(),
        Some("t.jsonl:2:6: invalid UTF-8 (byte 0xe9); expected UTF-8 text")
    );
}

#[test]
fn reader_lines_comments_and_errors() {
    let text = "# a trace\n\n{\"op\":\"stream_sync\",\"stream\":\"a\"}\n   \n  # indented\n\
                \t{\"op\":\"device_sync\"}\n{\"op\":\"event_sync\",\"event\":7}";
    let mut reader = TraceReader::new(text.as_bytes(), "t.jsonl");
    assert_eq!(reader.line(), 0);
    let (op, spans) = reader.next_op().unwrap().unwrap();
    assert_eq!(
        (op.op.name(), spans.line(), reader.ops_read()),
        ("stream_sync", 3, 1)
    );
    let (op, spans) = reader.next_op().unwrap().unwrap();
    assert_eq!(
        (op.op.name(), spans.locate(Field::Op)),
        ("device_sync", (6, 2))
    );
    let (op, spans) = reader.next_op().unwrap().unwrap();
    assert_eq!(
        (op.op.name(), spans.line(), reader.ops_read()),
        ("event_sync", 7, 3)
    );
    assert!(reader.next_op().unwrap().is_none());
    assert!(reader.next_op().unwrap().is_none());
    assert_eq!((reader.line(), reader.ops_read()), (7, 3));

    let text = "{\"op\":\"device_sync\"}\n# c\n{\"op\":\"lanch\"}\n{\"op\":\"device_sync\"}\n";
    let mut reader = TraceReader::new(text.as_bytes(), "trace.jsonl");
    assert!(reader.next_op().unwrap().is_some());
    let e = reader.next_op().map(|_| ()).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("trace.jsonl:3:7: unknown op \"lanch\"; expected {OPS}")
    );
    assert_eq!((e.file.as_str(), e.line, e.column), ("trace.jsonl", 3, 7));
    // The reader goes on after an error; the bad line is not an op.
    let (_, spans) = reader.next_op().unwrap().unwrap();
    assert_eq!((spans.line(), reader.ops_read()), (4, 2));
}

#[test]
fn bom_and_crlf() {
    let text = "\u{feff}{\"op\":\"device_sync\"}\r\n{\"op\":\"stream_sync\",\"stream\":\"s\"}\r\n";
    let (ops, e) = read_all(text.as_bytes());
    assert_eq!(e, None);
    assert_eq!(ops.iter().map(|(l, _)| *l).collect::<Vec<_>>(), [1, 2]);
    let mut reader = TraceReader::new(text.as_bytes(), "t");
    assert_eq!(
        reader.next_op().unwrap().unwrap().1.locate(Field::Op),
        (1, 1)
    );
    assert_eq!(
        reader.next_op().unwrap().unwrap().1.locate(Field::Stream),
        (2, 30)
    );
    // Columns of line 1 do not count the mark.
    let (_, e) = read_all("\u{feff}{\"op\":\"lanch\"}\n".as_bytes());
    assert!(e.unwrap().starts_with("t.jsonl:1:7: unknown op"));
    // Nor does an error at the end of a CRLF line count the CR.
    let (_, e) = read_all(b"{\"op\":\"device_sync\"}\n{\"op\":\"launch\"\r\n");
    assert_eq!(
        e.as_deref(),
        Some("t.jsonl:2:14: invalid JSON: EOF while parsing an object")
    );
    // A mark elsewhere is not ignored.
    let (_, e) =
        read_all("{\"op\":\"device_sync\"}\n\u{feff}{\"op\":\"device_sync\"}\n".as_bytes());
    assert_eq!(
        e.as_deref(),
        Some("t.jsonl:2:1: invalid JSON: expected value")
    );
}

#[test]
fn parse_error_display() {
    let e = ParseError::at(
        "t.jsonl",
        (3, 9),
        "region past the end of buffer \"a\"",
        Some("at most 16 bytes"),
    );
    assert_eq!(
        e.to_string(),
        "t.jsonl:3:9: region past the end of buffer \"a\"; expected at most 16 bytes"
    );
    let e = ParseError::at("t.jsonl", (3, 9), "bad", None);
    assert_eq!(e.to_string(), "t.jsonl:3:9: bad");
    let line = LineError {
        column: 4,
        message: "m".to_owned(),
        expected: None,
    };
    assert_eq!(line.to_string(), "4: m");
    assert_eq!(line.at_line("f", 2).to_string(), "f:2:4: m");
}

#[test]
fn blank_and_comment_lines() {
    for line in ["", "   ", "\t\r\n", "#", "  # {\"op\":\"lanch\"}"] {
        assert_eq!(parse_line(line), Ok(None), "{line:?}");
    }
}

/// The scanner's tables name what the schema names.
#[test]
fn scanner_tables_follow_the_schema() {
    use crate::trace::schema::Key as K;
    for key in K::ALL {
        assert_eq!(
            KEY_LITERALS[key as usize],
            format!(",\"{}\":", key.name()).as_bytes()
        );
        assert_eq!(key_from_name(short(key.name().as_bytes())), Some(key));
    }
    for (i, name) in Op::NAMES.iter().enumerate() {
        let kind = kind_from_word(pack(name.as_bytes())).expect("a known op");
        assert_eq!((kind as usize, kind.name()), (i, *name));
    }
}

proptest! {
    /// The fast path and the general scanner agree on every line the writer writes, and on
    /// the same lines with their keys spaced out.
    #[test]
    fn fast_path_agrees_with_general_scanner(op in arb_trace_op()) {
        let mut line = String::new();
        write_op(&op, &mut line);
        let fast = parse_line(&line);
        prop_assert_eq!(&fast, &general(&line));
        prop_assert_eq!(fast.map(|o| o.map(|(op, _)| op)), Ok(Some(op.clone())));
        let spaced = line.replace(",\"", ", \"");
        prop_assert_eq!(parse_line(&spaced), general(&spaced));
    }

    /// Every line the writer writes takes the fast path, in place, unless a string has an
    /// escape or a number 20 digits: the writer's field order (the schema's) is the one the
    /// fast path expects.
    #[test]
    fn written_lines_take_the_fast_path(op in arb_trace_op()) {
        let mut line = String::new();
        write_op(&op, &mut line);
        line.push('\n');
        let mut spans = Spans::default();
        let fast = Scanner::canonical_in_place(line.as_bytes(), &mut spans);
        if line.contains('\\') || numbers(&op.op).iter().any(|&n| n >= 10u64.pow(19)) {
            prop_assert_eq!(fast.map(|(op, _)| op), None);
        } else {
            prop_assert_eq!(fast, Some((op, line.len())));
        }
    }

    /// Cutting a written line anywhere gives the same answer from both paths, and no panic.
    #[test]
    fn truncated_lines(op in arb_trace_op(), cut in any::<prop::sample::Index>()) {
        let mut line = String::new();
        write_op(&op, &mut line);
        let mut at = cut.index(line.len() + 1);
        while !line.is_char_boundary(at) {
            at -= 1;
        }
        let line = &line[..at];
        prop_assert_eq!(parse_line(line), general(line));
    }

    /// So does a written line with one byte changed.
    #[test]
    fn mutated_lines(op in arb_trace_op(), at in any::<prop::sample::Index>(), byte in 0u8..0x80) {
        let mut line = String::new();
        write_op(&op, &mut line);
        let mut bytes = line.into_bytes();
        let at = at.index(bytes.len());
        bytes[at] = byte;
        if let Ok(line) = std::str::from_utf8(&bytes) {
            prop_assert_eq!(parse_line(line), general(line));
        }
    }
}

/// Every integer of an op's fields and regions.
fn numbers(op: &Op) -> Vec<u64> {
    use crate::trace::schema::Value;
    let mut out = Vec::new();
    let region = |r: &Region, out: &mut Vec<u64>| {
        out.push(r.offset);
        out.extend(r.bytes);
    };
    for field in op.kind().fields() {
        match op.value(field.key) {
            Some(Value::Int(n)) => out.push(n),
            Some(Value::Region(r)) => region(r, &mut out),
            Some(Value::Regions(rs)) => rs.iter().for_each(|r| region(r, &mut out)),
            _ => {}
        }
    }
    out
}

/// Every result of `reader` (which goes on after errors) as `line:col` or `line:op`.
fn results<R: BufRead>(mut reader: TraceReader<R>) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        match reader.next_op() {
            Ok(Some((op, spans))) => out.push(format!("{}:{}", spans.line(), op.op.name())),
            Ok(None) => return out,
            Err(e) => out.push(format!("{}:{}: {}", e.line, e.column, e.message)),
        }
    }
}

#[test]
fn over_long_lines_are_bad_input_and_skipped() {
    let op = r#"{"op":"device_sync"}"#; // 20 bytes
    let long = format!(r#"{{"op":"stream_sync","stream":"{}"}}"#, "x".repeat(40));
    let text = format!("{op}\n{long}\n{op}\n\u{feff}{op}\r\n{long}");
    let want = [
        "1:device_sync",
        "2:33: the line is longer than 32 bytes",
        "3:device_sync",
        "4:1",
        "5:33: the line is longer than 32 bytes",
    ];
    for cap in [1, 3, 7, 16, 64, 1 << 16] {
        let reader = TraceReader::new(BufReader::with_capacity(cap, text.as_bytes()), "t")
            .with_line_limit(32);
        let got = results(reader);
        assert_eq!(got.len(), 5, "{got:?}");
        assert_eq!(got[..3], want[..3], "buffer {cap}");
        assert_eq!(got[4], want[4], "buffer {cap}");
        // Line 4 starts with a BOM that is not at the start of the file: bad input.
        assert!(got[3].starts_with("4:1: "), "{got:?}");
    }
    // Exactly at the limit is fine; one byte more is not, also through a final `\r`.
    let at = format!(r#"{{"op":"device_sync"{}}}"#, " ".repeat(12));
    assert_eq!(at.len(), 32);
    let text = format!("{at}\n{at}\r\n{at}");
    let got = results(TraceReader::new(text.as_bytes(), "t").with_line_limit(32));
    assert_eq!(
        got,
        [
            "1:device_sync",
            "2:33: the line is longer than 32 bytes",
            "3:device_sync"
        ]
    );
    // A byte-order mark on line 1 counts toward the limit but not toward columns.
    let text = format!("\u{feff}{at}\n{op}");
    let got = results(TraceReader::new(text.as_bytes(), "t").with_line_limit(32));
    assert_eq!(
        got,
        ["1:30: the line is longer than 32 bytes", "2:device_sync"]
    );
    assert_eq!(
        check_line_length(format!("\u{feff}{at}").as_bytes(), true, 32).map(|e| e.column),
        Some(30)
    );
}

/// An endless line (`/dev/zero`): an error once the limit is passed, having read little more.
#[test]
fn an_endless_line_ends_at_the_limit() {
    struct Zeros(u64);
    impl std::io::Read for Zeros {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            buf.fill(0);
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
    }
    let mut reader = TraceReader::new(BufReader::new(Zeros(0)), "/dev/zero");
    let e = reader.next_op().expect_err("an error");
    assert_eq!(
        e.to_string(),
        format!(
            "/dev/zero:1:{}: the line is longer than {MAX_LINE_BYTES} bytes; expected a line \
             of at most {MAX_LINE_BYTES} bytes (the trace format's line limit)",
            MAX_LINE_BYTES + 1
        )
    );
    let read = reader.into_inner().into_inner().0;
    assert!(
        read <= MAX_LINE_BYTES as u64 + (1 << 16),
        "read {read} bytes"
    );
    assert!(reader_keeps_little(), "the line buffer is bounded");
}

/// The reader's line buffer never holds more than the limit (checked through its capacity
/// after an over-long line).
fn reader_keeps_little() -> bool {
    let text = "y".repeat(10_000);
    let mut r =
        TraceReader::new(BufReader::with_capacity(16, text.as_bytes()), "t").with_line_limit(100);
    let e = r.next_op().expect_err("an error");
    e.column == 101 && r.buf.capacity() < 1_000 && r.next_op() == Ok(None)
}

#[test]
fn echoed_values_are_clipped() {
    let name = "q".repeat(10_000);
    let e = parse_line(&format!(r#"{{"op":"{name}"}}"#)).unwrap_err();
    assert!(e.message.len() < 100, "{}", e.message);
    assert!(e.message.ends_with("…\""), "{}", e.message);
    let e = parse_line(&format!(r#"{{"op":"sync","{name}":1}}"#)).unwrap_err();
    assert!(e.message.len() < 200, "{}", e.message);
    let digits = "9".repeat(10_000);
    let e = parse_line(&format!(r#"{{"op":"device_sync","device":{digits}}}"#)).unwrap_err();
    assert!(e.message.len() < 150, "{}", e.message);
    assert!(e.message.contains("is too large (999"), "{}", e.message);
    let e = parse_line(&format!(
        r#"{{"op":"alloc","buffer":"b","bytes":1,"memory":"{name}"}}"#
    ))
    .unwrap_err();
    assert!(e.message.len() < 150, "{}", e.message);
    // Control characters in echoed values are escaped.
    let e = parse_line("{\"op\":\"\\u001b[2J\"}").unwrap_err();
    assert_eq!(e.message, "unknown op \"\\u{1b}[2J\"");
}
