//! Replays of CUDA graphs: each a dashed rectangle holding its body's lanes (`G/c`) with the
//! captured ops the replay runs, under the picture, linked from its launch.

use super::*;

/// The colour of a replay's rectangle.
const REPLAY: &str = "#6a4fb3";

/// Draws every replay of the picture.
pub(super) fn replays(out: &mut String, d: &Drawn<'_>) {
    for r in &d.pic.replays {
        replay(out, d, r);
    }
}

fn replay(out: &mut String, d: &Drawn<'_>, r: &crate::graph::PictureReplay) {
    let n = r.launch;
    // One column per captured op, in body order; one row per lane.
    let lines = |o: &crate::graph::ReplayOp| 2 + o.accesses.len().min(MAX_ACCESS_LINES);
    let row_h: Vec<i64> = (0..r.lanes.len())
        .map(|j| {
            let most = r
                .ops
                .iter()
                .filter(|o| o.lane == j)
                .map(lines)
                .max()
                .unwrap_or(2);
            most as i64 * LINE_H + 2 * PAD_Y + ROW_PAD
        })
        .collect();
    let top = TOP + 8;
    let width = LANE_W + r.ops.len() as i64 * COL_W + SIDE;
    let height = top + row_h.iter().sum::<i64>() + 8;
    let launch_on = d
        .nodes
        .iter()
        .find(|x| x.op == n)
        .and_then(|x| d.pic.lanes.get(x.lane))
        .map(|l| l.name.as_str())
        .unwrap_or("?");
    let _ = writeln!(
        out,
        "<figure class=\"replay\" id=\"replay-{n}\"><figcaption>replay of {} at <a href=\"#op-{n}\">op {n}</a>: it starts from {} at the launch and joins it at its end</figcaption>",
        esc(&r.graph),
        esc(launch_on)
    );
    let _ = writeln!(
        out,
        "<svg class=\"replay\" width=\"{width}\" height=\"{height}\" role=\"img\" aria-label=\"{}\">",
        esc(&format!("replay of {} at op {n}", r.graph))
    );
    let _ = writeln!(
        out,
        "<rect class=\"replay-box\" x=\"1\" y=\"1\" width=\"{}\" height=\"{}\" rx=\"8\" fill=\"none\" stroke=\"{REPLAY}\" stroke-dasharray=\"6 4\"/>",
        width - 2,
        height - 2
    );
    let mut y = top;
    for (j, lane) in r.lanes.iter().enumerate() {
        let _ = writeln!(
            out,
            "<text class=\"lane-name\" x=\"10\" y=\"{}\">{}</text>",
            y + PAD_Y + 11,
            esc(&fit(lane, LANE_CHARS))
        );
        for (k, o) in r.ops.iter().enumerate().filter(|(_, o)| o.lane == j) {
            let x = LANE_W + k as i64 * COL_W;
            let h = lines(o) as i64 * LINE_H + 2 * PAD_Y;
            let (fill, stroke) = if !o.hazards.is_empty() {
                HAZARD_FILL
            } else if !o.conflicts.is_empty() {
                CONFLICT_FILL
            } else {
                CONTEXT_FILL
            };
            let tip = format!(
                "the replay at op {n} of op {} (captured on {lane})",
                o.captured
            );
            let _ = writeln!(
                out,
                "<g class=\"node replayed\"><title>{}</title><rect x=\"{x}\" y=\"{y}\" width=\"{BOX_W}\" height=\"{h}\" rx=\"5\" fill=\"{fill}\" stroke=\"{stroke}\"/>",
                esc(&tip)
            );
            let mut text = vec![format!("op {}", o.captured), o.label.clone()];
            text.extend(o.accesses.iter().take(MAX_ACCESS_LINES).cloned());
            for (i, line) in text.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "<text class=\"{}\" x=\"{}\" y=\"{}\">{}</text>",
                    if i == 0 { "opn" } else { "acc" },
                    x + 7,
                    y + PAD_Y + 11 + i as i64 * LINE_H,
                    esc(&fit(line, BOX_CHARS))
                );
            }
            out.push_str("</g>\n");
        }
        y += row_h[j];
    }
    out.push_str("</svg>\n</figure>\n");
}
