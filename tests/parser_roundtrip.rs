//! What the writer writes, the reader reads back: one line at a time, and as a whole trace.

use std::io::BufReader;

use proptest::prelude::*;
use streamsan::trace::arbitrary::arb_trace_op;
use streamsan::trace::{parse_line, write_op, Field, TraceOp, TraceReader, TraceWriter};

proptest! {
    #[test]
    fn a_written_line_parses_back(op in arb_trace_op()) {
        let mut line = String::new();
        write_op(&op, &mut line);
        prop_assert!(!line.contains('\n'));
        let parsed = parse_line(&line).map(|o| o.map(|(op, _)| op));
        prop_assert_eq!(parsed, Ok(Some(op)));
    }

    /// A whole trace through `TraceWriter` and `TraceReader`, with a reader buffer small enough
    /// that lines straddle its refills.
    #[test]
    fn a_written_trace_reads_back(
        ops in prop::collection::vec(arb_trace_op(), 0..24),
        capacity in prop_oneof![1usize..16, Just(8192usize)],
        crlf in any::<bool>(),
    ) {
        let mut writer = TraceWriter::new(Vec::new());
        writer.comment("a trace").unwrap();
        for op in &ops {
            writer.write(op).unwrap();
        }
        let mut bytes = writer.finish().unwrap();
        if crlf {
            bytes = String::from_utf8(bytes).unwrap().replace('\n', "\r\n").into_bytes();
        }
        let mut reader = TraceReader::new(BufReader::with_capacity(capacity, &bytes[..]), "t");
        let mut read: Vec<TraceOp> = Vec::new();
        while let Some((op, spans)) = reader.next_op().unwrap() {
            prop_assert_eq!(spans.line(), read.len() as u64 + 2);
            prop_assert_eq!(spans.locate(Field::Op), (read.len() as u64 + 2, 1));
            read.push(op);
        }
        prop_assert_eq!(reader.ops_read(), ops.len() as u64);
        prop_assert_eq!(read, ops);
    }
}
