//! The picture's layout: op boxes in lanes, edges routed between them, gaps of removed ops.

use super::*;

/// The grey of redundant synchronization edges.
pub(super) const REDUNDANT_GREY: &str = "#bdbdbd";

/// One drawn op's box: where and how tall.
pub(super) struct BoxAt {
    x: i64,
    y: i64,
    h: i64,
}

/// The picture's geometry.
pub(super) struct Layout {
    /// Top of each lane's row.
    lane_top: Vec<i64>,
    /// Height of each lane's row.
    lane_h: Vec<i64>,
    /// Per drawn node (same order as [`Drawn::nodes`]).
    boxes: Vec<BoxAt>,
    width: i64,
    height: i64,
}

/// The lines of a box: `op N`, the label, the accesses (at most [`MAX_ACCESS_LINES`], then
/// `+k more`).
pub(super) fn box_lines(n: &Node) -> Vec<String> {
    let mut lines = vec![format!("op {}", n.op), n.label.clone()];
    if n.accesses.len() > MAX_ACCESS_LINES {
        lines.extend(n.accesses[..MAX_ACCESS_LINES - 1].iter().cloned());
        lines.push(format!(
            "+{} more",
            n.accesses.len() - (MAX_ACCESS_LINES - 1)
        ));
    } else {
        lines.extend(n.accesses.iter().cloned());
    }
    lines
}

pub(super) fn layout(d: &Drawn<'_>) -> Layout {
    let lanes = d.pic.lanes.len();
    let heights: Vec<i64> = d
        .nodes
        .iter()
        .map(|n| box_lines(n).len() as i64 * LINE_H + 2 * PAD_Y)
        .collect();
    let mut lane_h = vec![2 * LINE_H + 2 * PAD_Y + 2 * ROW_PAD; lanes];
    for (n, h) in d.nodes.iter().zip(&heights) {
        lane_h[n.lane] = lane_h[n.lane].max(h + 2 * ROW_PAD);
    }
    let mut lane_top = Vec::with_capacity(lanes);
    let mut y = TOP;
    for h in &lane_h {
        lane_top.push(y);
        y += h;
    }
    let boxes = d
        .nodes
        .iter()
        .zip(&heights)
        .enumerate()
        .map(|(col, (n, &h))| BoxAt {
            x: SIDE + col as i64 * COL_W,
            y: lane_top[n.lane] + ROW_PAD,
            h,
        })
        .collect();
    let width = 2 * SIDE + (d.nodes.len() as i64 - 1).max(0) * COL_W + BOX_W;
    Layout {
        lane_top,
        lane_h,
        boxes,
        width,
        height: y + 8,
    }
}

/// The lane names and the graph, side by side in one scrolling pane.
pub(super) fn picture(out: &mut String, d: &Drawn<'_>) {
    let l = layout(d);
    out.push_str("<div class=\"scroll\" id=\"picture\">\n<div class=\"canvas\">\n");

    // The lane names: a column that stays at the left while the graph scrolls.
    let _ = writeln!(
        out,
        "<svg class=\"lanes\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{LANE_W}\" height=\"{}\" \
         viewBox=\"0 0 {LANE_W} {}\">",
        l.height, l.height
    );
    for (i, lane) in d.pic.lanes.iter().enumerate() {
        let (top, h) = (l.lane_top[i], l.lane_h[i]);
        let _ = writeln!(
            out,
            "<g class=\"lane-name\" id=\"lane-{i}\"><title>{}&#10;{}</title><rect class=\"band{}\" x=\"0\" \
             y=\"{top}\" width=\"{LANE_W}\" height=\"{h}\"/><text class=\"name\" x=\"12\" y=\"{}\">{}</text>\
             {}</g>",
            esc(&lane.name),
            esc(&lane.description),
            i % 2,
            top + ROW_PAD + 14,
            esc(&fit(&lane.name, LANE_CHARS)),
            wrap(&lane.description, LANE_CHARS + 4, 2)
                .iter()
                .enumerate()
                .map(|(k, line)| format!(
                    "<text class=\"desc\" x=\"12\" y=\"{}\">{}</text>",
                    top + ROW_PAD + 30 + k as i64 * 12,
                    esc(line)
                ))
                .collect::<String>(),
        );
    }
    out.push_str("</svg>\n");

    let _ = writeln!(
        out,
        "<svg class=\"graph\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
         viewBox=\"0 0 {w} {h}\" role=\"img\" aria-label=\"dependency graph of {title}\">",
        w = l.width,
        h = l.height,
        title = esc(&d.pic.title)
    );
    out.push_str("<defs>\n");
    for kind in EDGE_KINDS {
        let s = edge_style(kind);
        let _ = writeln!(
            out,
            "<marker id=\"arrow-{}\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" markerWidth=\"9\" \
             markerHeight=\"9\" markerUnits=\"userSpaceOnUse\" orient=\"auto\"><path d=\"M0 0 L10 5 L0 10 z\" \
             fill=\"{}\"/></marker>",
            s.name, s.color
        );
    }
    if !d.pic.syncs.is_empty() {
        let _ = writeln!(
            out,
            "<marker id=\"arrow-redundant\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" markerWidth=\"9\" \
             markerHeight=\"9\" markerUnits=\"userSpaceOnUse\" orient=\"auto\"><path d=\"M0 0 L10 5 L0 10 z\" \
             fill=\"{REDUNDANT_GREY}\"/></marker>"
        );
    }
    out.push_str("</defs>\n");

    // Lane bands.
    for i in 0..d.pic.lanes.len() {
        let _ = writeln!(
            out,
            "<rect class=\"band{}\" x=\"0\" y=\"{}\" width=\"{}\" height=\"{}\"/>",
            i % 2,
            l.lane_top[i],
            l.width,
            l.lane_h[i]
        );
    }

    gaps(out, d, &l);

    // Edges under the boxes, their labels above.
    let mut labels = String::new();
    let mut seen: BTreeMap<(u64, u64), i64> = BTreeMap::new();
    let (mut outs, mut ins) = (vec![0i64; d.nodes.len()], vec![0i64; d.nodes.len()]);
    for e in &d.edges {
        let (Some(&from), Some(&to)) = (d.column.get(&e.from), d.column.get(&e.to)) else {
            continue;
        };
        if from == to {
            continue;
        }
        let nth = seen
            .entry((e.from.min(e.to), e.from.max(e.to)))
            .or_insert(0);
        let mut ends = Ends {
            from,
            to,
            out_slot: 0,
            in_slot: 0,
            offset: *nth * 5,
        };
        *nth += 1;
        if d.nodes[from].lane != d.nodes[to].lane && ends.offset == 0 {
            ends.out_slot = outs[from];
            ends.in_slot = ins[to];
            outs[from] += 1;
            ins[to] += 1;
        }
        let (path, at) = route(d, &l, &ends);
        let s = edge_style(e.kind);
        let mut hz = hazard_classes(&d.fixes(e));
        match d.sync_edge(e) {
            Some(v) if v.needed => hz.push_str(" needed"),
            Some(_) => hz.push_str(" redundant"),
            None => {}
        }
        let _ = writeln!(
            out,
            "<path class=\"edge k-{}{hz}\" d=\"{path}\" marker-end=\"url(#arrow-{})\"><title>{}</title></path>",
            s.name,
            match d.sync_edge(e) {
                Some(v) if !v.needed => "redundant",
                _ => s.name,
            },
            esc(&edge_title(d, e))
        );
        if let Some(label) = d.edge_label(e) {
            let _ = writeln!(
                labels,
                "<text class=\"elabel k-{}{hz}\" x=\"{}\" y=\"{}\" text-anchor=\"{}\">{}</text>",
                s.name,
                at.x,
                at.y,
                at.anchor,
                esc(&label)
            );
        }
    }

    for (n, b) in d.nodes.iter().zip(&l.boxes) {
        node(out, d, n, b);
    }
    out.push_str(&labels);

    // The rings the hazard list links to.
    for (i, h) in d.pic.hazards.iter().enumerate() {
        if let Some(&col) = d.column.get(&h.op) {
            let b = &l.boxes[col];
            let _ = writeln!(
                out,
                "<g class=\"mark\" id=\"hazard-{i}\" data-op=\"{}\"><rect x=\"{}\" y=\"{}\" width=\"{}\" \
                 height=\"{}\" rx=\"10\"/></g>",
                h.op,
                b.x - 7,
                b.y - 7,
                BOX_W + 14,
                b.h + 14
            );
        }
    }
    out.push_str("</svg>\n</div>\n</div>\n");
}

/// Markers where ops are not drawn: before the first column, between columns, after the last.
pub(super) fn gaps(out: &mut String, d: &Drawn<'_>, l: &Layout) {
    let mut mark = |x: i64, count: u64, anchor: &str| {
        let _ = writeln!(
            out,
            "<g class=\"gap\"><title>{} not drawn</title><line x1=\"{x}\" y1=\"{}\" x2=\"{x}\" y2=\"{}\"/>\
             <text x=\"{x}\" y=\"16\" text-anchor=\"{anchor}\">⋯ {count}</text></g>",
            plural(count, "op"),
            TOP - 4,
            l.height
        );
    };
    let (Some(first), Some(last)) = (d.nodes.first(), d.nodes.last()) else {
        return;
    };
    if first.op > 0 {
        mark(SIDE / 2, first.op, "start");
    }
    for (i, w) in d.nodes.windows(2).enumerate() {
        let skipped = w[1].op - w[0].op - 1;
        if skipped > 0 {
            mark(
                SIDE + i as i64 * COL_W + BOX_W + (COL_W - BOX_W) / 2,
                skipped,
                "middle",
            );
        }
    }
    let after = d.pic.ops.saturating_sub(last.op.saturating_add(1));
    if after > 0 {
        mark(l.width - SIDE / 2, after, "end");
    }
}

/// Where one edge leaves and enters: its columns, and which of the cross-lane edges of its ends
/// it is (so that they leave and enter side by side).
pub(super) struct Ends {
    from: usize,
    to: usize,
    out_slot: i64,
    in_slot: i64,
    /// Shift of a second, third… edge between the same two ops.
    offset: i64,
}

/// Where an edge's label goes: `x`, `y` and the SVG `text-anchor`.
pub(super) struct Label {
    x: i64,
    y: i64,
    anchor: &'static str,
}

/// The path of an edge, and where its label goes.
///
/// Within a lane: a straight line from side to side when no box of the lane is in between, else
/// an arc above the row. Across lanes: a curve from the bottom (or top) of one box to the top (or
/// bottom) of the other, so that it does not meet the lane's own edges.
pub(super) fn route(d: &Drawn<'_>, l: &Layout, e: &Ends) -> (String, Label) {
    let (a, b) = (e.from, e.to);
    let (ba, bb) = (&l.boxes[a], &l.boxes[b]);
    let (lane_a, lane_b) = (d.nodes[a].lane, d.nodes[b].lane);
    if lane_a == lane_b {
        let (lo, hi) = (a.min(b), a.max(b));
        let blocked = d.nodes[lo + 1..hi].iter().any(|n| n.lane == lane_a);
        if !blocked {
            let (x1, x2) = if a < b {
                (ba.x + BOX_W, bb.x)
            } else {
                (ba.x, bb.x + BOX_W)
            };
            let y = ba.y + ANCHOR_Y + e.offset;
            return (
                format!("M{x1} {y} H{x2}"),
                Label {
                    x: (x1 + x2) / 2,
                    y: y - 5,
                    anchor: "middle",
                },
            );
        }
        // Over the boxes in between: leave and enter through the tops.
        let (sx, tx) = (ba.x + BOX_W / 2 + 12, bb.x + BOX_W / 2 - 12);
        let top = ba.y - e.offset;
        let rise = 16 + 4 * ((hi - lo) as i64).min(4);
        return (
            format!(
                "M{sx} {top} C{sx} {c} {tx} {c} {tx} {top}",
                c = top - rise * 4 / 3
            ),
            Label {
                x: (sx + tx) / 2,
                y: top - rise - 3,
                anchor: "middle",
            },
        );
    }
    let down = l.lane_top[lane_b] > l.lane_top[lane_a];
    let sx = (ba.x + BOX_W - 18 - 14 * e.out_slot - e.offset).max(ba.x + 8);
    let tx = (bb.x + 18 + 14 * e.in_slot + e.offset).min(bb.x + BOX_W - 8);
    let (sy, ty) = if down {
        (ba.y + ba.h, bb.y)
    } else {
        (ba.y, bb.y + bb.h)
    };
    let v = ((ty - sy).abs() / 2).max(24) * if down { 1 } else { -1 };
    (
        format!("M{sx} {sy} C{sx} {} {tx} {} {tx} {ty}", sy + v, ty - v),
        // Beside the curve's middle, on the side where the second half does not pass: above
        // it for a curve that goes down, below it for one that goes up.
        Label {
            x: (sx + tx) / 2 + if tx >= sx { 6 } else { -6 },
            y: (sy + ty) / 2 + if down { -4 } else { 11 },
            anchor: if tx >= sx { "start" } else { "end" },
        },
    )
}

/// `" hz-0 hz-3"` for the given hazards.
pub(super) fn hazard_classes(hazards: &[usize]) -> String {
    hazards.iter().map(|h| format!(" hz-{h}")).collect()
}

/// An edge's tooltip: `"event e1: op 2 → op 3"`.
pub(super) fn edge_title(d: &Drawn<'_>, e: &Edge) -> String {
    let s = edge_style(e.kind);
    let mut t = match e.kind {
        EdgeKind::Missing => d.edge_label(e).unwrap_or_default(),
        _ => match &e.label {
            Some(label) if !label.is_empty() => format!("{} {label}", s.name),
            _ => s.legend.to_string(),
        },
    };
    let _ = write!(t, ": op {} → op {}", e.from, e.to);
    if let Some(v) = d.sync_edge(e) {
        t.push('\n');
        t.push_str(&sync_verdict(v));
    }
    if e.kind == EdgeKind::Missing {
        for h in d.fixes(e) {
            if let Some(fix) = &d.pic.hazards[h].fix {
                let _ = write!(t, "\nfix: {fix}");
            }
        }
    }
    t
}

/// What the synchronization analysis says of a synchronization op, for tooltips.
pub(super) fn sync_verdict(v: &PictureSync) -> String {
    if v.needed {
        format!("needed: without it, {}", v.prevents.join("; "))
    } else {
        "redundant: removing this synchronization alone adds no hazard".to_string()
    }
}

/// One op's box, with its tooltip and hazard badges.
pub(super) fn node(out: &mut String, d: &Drawn<'_>, n: &Node, b: &BoxAt) {
    let involved = d.hazards_of(n.op);
    let reported = d.reported_at(n);
    let role = match n.role {
        Role::Hazard => " hazard",
        Role::Conflict => " conflict",
        Role::Context => "",
    };
    let lane = &d.pic.lanes[n.lane];
    let mut tip = format!("op {} on {}: {}", n.op, lane.name, n.label);
    if let Some(site) = &n.site {
        let _ = write!(tip, "\nsite: {site}");
    }
    for a in &n.accesses {
        let _ = write!(tip, "\n{a}");
    }
    for &h in &reported {
        let hz = &d.pic.hazards[h];
        let _ = write!(tip, "\nhazard {h} ({}): {}", hz.kind, hz.title);
    }
    if let Some(v) = d.sync_of(n.op) {
        tip.push('\n');
        tip.push_str(&sync_verdict(v));
    }
    for &h in involved.iter().filter(|h| !reported.contains(h)) {
        let _ = write!(
            tip,
            "\nconflicts with hazard {h} at op {}",
            d.pic.hazards[h].op
        );
    }
    let data = match reported.first().or(involved.first()) {
        Some(h) => format!(" data-hazard=\"{h}\""),
        None => String::new(),
    };
    let (fill, stroke) = node_colors(n);
    let _ = writeln!(
        out,
        "<g class=\"node{role}{}\" id=\"op-{}\"{data}><title>{}</title><rect x=\"{}\" y=\"{}\" width=\"{BOX_W}\" \
         height=\"{}\" rx=\"5\" fill=\"{fill}\" stroke=\"{stroke}\"/>",
        hazard_classes(&involved),
        n.op,
        esc(&tip),
        b.x,
        b.y,
        b.h
    );
    for (i, line) in box_lines(n).iter().enumerate() {
        let _ = writeln!(
            out,
            "<text class=\"{}\" x=\"{}\" y=\"{}\">{}</text>",
            if i == 0 {
                "opn"
            } else if i == 1 {
                "label"
            } else {
                "acc"
            },
            b.x + 7,
            b.y + PAD_Y + 11 + i as i64 * LINE_H,
            esc(&fit(line, if i == 0 { BOX_CHARS - 8 } else { BOX_CHARS }))
        );
    }
    // Badges that link to the hazards reported here (at most three; the tooltip lists all).
    let mut x = b.x + BOX_W - 6;
    for &h in reported.iter().take(3).rev() {
        let text = format!("#{h}");
        let w = 7 * text.chars().count() as i64 + 6;
        let _ = writeln!(
            out,
            "<a href=\"#hazard-{h}\" class=\"badge\"><rect x=\"{}\" y=\"{}\" width=\"{w}\" height=\"14\" rx=\"7\"/>\
             <text x=\"{}\" y=\"{}\">{text}</text></a>",
            x - w,
            b.y + 4,
            x - w / 2,
            b.y + 15
        );
        x -= w + 3;
    }
    out.push_str("</g>\n");
}
