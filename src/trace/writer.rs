//! Writing traces: [`TraceOp`](super::TraceOp)s back to JSON Lines.
