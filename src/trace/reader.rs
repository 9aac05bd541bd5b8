//! Reading traces: JSON Lines into [`TraceOp`](super::TraceOp)s, with located errors.
