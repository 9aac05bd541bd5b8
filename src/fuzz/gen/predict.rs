//! The hazards the generator's own model predicts for a program it generated.

use super::model::{name_number, participant, stream_index, BodyOp, Model};
use super::Program;
use crate::report::HazardKind;
use crate::trace::Op;

/// The hazards the generator's own model predicts for a program it generated, as (op index,
/// kind) pairs in op order: `data-race` and `reuse-race` at an access that conflicts with an
/// unordered earlier access (same buffer; same bytes of a freed buffer), `unsafe-free` at a free,
/// `use-after-free` at an op naming a freed buffer.
///
/// The model is written from the trace format independently of the checker, so this is a second
/// opinion: on generated programs the checker should report hazards of these kinds at exactly
/// these ops. It understands the names the generator writes (`s0`, `b`, `default`, `x0`, `e0`,
/// …), not arbitrary traces.
pub fn predicted_hazards(program: &Program) -> Vec<(usize, HazardKind)> {
    let mut model = Model::new(0);
    let mut out = Vec::new();
    for (i, top) in program.ops.iter().enumerate() {
        let op = &top.op;
        if let Op::GraphLaunch { graph, stream } = op {
            // The replay's accesses, each checked as its lane's; use after free of the buffers
            // of the body that are freed and not pool buffers.
            let g = name_number(graph);
            let (mut race, mut reuse) = (false, false);
            let freed = model
                .graphs
                .get(g)
                .and_then(Option::as_ref)
                .is_some_and(|graph| {
                    graph.body.iter().any(|b| match b {
                        BodyOp::Access(_, touches) => touches.iter().any(|t| {
                            let buf = &model.bufs[t.buf];
                            !buf.live && buf.pool.is_none()
                        }),
                        _ => false,
                    })
                });
            model.launch(g, stream_index(stream), |m, p, touches| {
                m.conflicts(
                    p,
                    touches,
                    |_, _, r, _| {
                        if r {
                            reuse = true
                        } else {
                            race = true
                        }
                    },
                )
            });
            for (hit, kind) in [
                (race, HazardKind::DataRace),
                (reuse, HazardKind::ReuseRace),
                (freed, HazardKind::UseAfterFree),
            ] {
                if hit {
                    out.push((i, kind));
                }
            }
            continue;
        }
        let captured = op.is_access()
            && op
                .on_stream()
                .is_some_and(|s| model.capturing[stream_index(s)].is_some());
        if captured {
            model.apply(op);
            continue;
        }
        let p = op.is_access().then(|| participant(op));
        if let Some(p) = p {
            let (mut race, mut reuse) = (false, false);
            model.conflicts(p, &model.touches(op), |_, _, r, _| {
                if r {
                    reuse = true
                } else {
                    race = true
                }
            });
            let freed = op.accesses().any(|a| {
                let b = model
                    .slots
                    .get(name_number(&a.region.buffer))
                    .copied()
                    .flatten();
                b.is_some_and(|b| !model.bufs[b].live)
            });
            for (hit, kind) in [
                (race, HazardKind::DataRace),
                (reuse, HazardKind::ReuseRace),
                (freed, HazardKind::UseAfterFree),
            ] {
                if hit {
                    out.push((i, kind));
                }
            }
        }
        if let Op::Free { buffer, stream } = op {
            if let Some(b) = model.live(buffer) {
                if !model
                    .free_needs(b, stream.as_ref().map(stream_index))
                    .is_empty()
                {
                    out.push((i, HazardKind::UnsafeFree));
                }
            }
        }
        model.apply(op);
    }
    out
}
