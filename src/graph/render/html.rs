//! The HTML renderer: `streamsan check --format html -o report.html trace.jsonl`.
//!
//! One self-contained page: inline CSS, an inline SVG drawn here, and a few lines of inline
//! JavaScript; it loads nothing. Lanes are rows (the host first) with their names in a column
//! that stays in view while the picture scrolls; ops are boxes in issue order, one column per
//! drawn op; edges are paths with arrowheads, coloured by kind.
//!
//! Beside the picture, the hazard list: each entry links to `#hazard-<i>`, a ring around the
//! hazard's op in the picture. CSS `:target` highlights the hazard's op, its conflicting accesses
//! and its missing edge and dims the rest (no JavaScript needed, and the browser scrolls the ring
//! into view); the script only centres the op and keeps the entry in view.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::{
    edge_style, node_colors, plural, Drawn, EdgeKind, Picture, Role, CONFLICT_FILL, CONTEXT_FILL,
    EDGE_KINDS, HAZARD_FILL,
};
use crate::graph::picture::{Edge, Node, PictureSync};
use crate::report::Severity;

/// Width of an op's box.
const BOX_W: i64 = 176;
/// Distance between the left edges of two columns.
const COL_W: i64 = 216;
/// Height of one text line in a box.
const LINE_H: i64 = 14;
/// Padding above the first and below the last line of a box.
const PAD_Y: i64 = 6;
/// Space above and below the boxes of a lane.
const ROW_PAD: i64 = 22;
/// Space above the first lane, for the markers of ops not drawn.
const TOP: i64 = 26;
/// Space left of the first column and right of the last.
const SIDE: i64 = 24;
/// Width of the lane-name column.
const LANE_W: i64 = 156;
/// Where edges meet a box: this far below its top.
const ANCHOR_Y: i64 = 20;
/// At most this many access lines in a box (the tooltip has all).
const MAX_ACCESS_LINES: usize = 3;
/// Characters that fit on a box's line (11px monospace).
const BOX_CHARS: usize = 24;
/// Characters of a lane name that fit in the lane column.
const LANE_CHARS: usize = 18;

/// Renders `pic` as one self-contained HTML page: header, legend, picture and hazard list.
///
/// The page loads nothing (no scripts, styles, fonts or images from anywhere) and all text of the
/// picture is escaped. The output is deterministic.
pub fn render_html(pic: &Picture) -> String {
    let d = Drawn::new(pic);
    let mut out = String::with_capacity(16 * 1024 + 1024 * d.nodes.len());
    out.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    out.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    let _ = writeln!(out, "<title>streamsan: {}</title>", esc(&pic.title));
    out.push_str("<style>\n");
    out.push_str(CSS);
    // Fragment navigation without the script: keep the target clear of the lane-name column.
    let _ = writeln!(
        out,
        ".mark, .node {{ scroll-margin: 32px 32px 32px {}px; }}",
        LANE_W + 32
    );
    out.push_str(&target_css(pic.hazards.len()));
    out.push_str("</style>\n</head>\n<body>\n");
    header(&mut out, &d);
    out.push_str("<main>\n<section class=\"picture\" aria-label=\"dependency graph\">\n");
    if d.nodes.is_empty() {
        out.push_str("<p class=\"empty\">No ops to draw.</p>\n");
    } else {
        picture(&mut out, &d);
    }
    out.push_str("</section>\n");
    hazard_list(&mut out, &d);
    out.push_str("</main>\n<script>\n");
    out.push_str(JS);
    out.push_str("</script>\n</body>\n</html>\n");
    out
}

/// The title, the counts and the legend.
fn header(out: &mut String, d: &Drawn<'_>) {
    let pic = d.pic;
    let errors = pic
        .hazards
        .iter()
        .filter(|h| h.severity == Severity::Error)
        .count() as u64;
    let warnings = pic.hazards.len() as u64 - errors;
    out.push_str("<header>\n");
    let _ = writeln!(
        out,
        "<h1><span class=\"tool\">streamsan</span> {}</h1>",
        esc(&pic.title)
    );
    let _ = write!(
        out,
        "<p class=\"summary\"><span>{} in the trace</span> <span>{} drawn</span>",
        plural(pic.ops, "op"),
        d.nodes.len()
    );
    if pic.elided > 0 {
        let _ = write!(
            out,
            " <span class=\"elided\">{} not drawn</span>",
            plural(pic.elided, "op")
        );
    }
    let _ = writeln!(
        out,
        " <span class=\"{}\">{}</span> <span class=\"{}\">{}</span></p>",
        if errors > 0 { "count error" } else { "count" },
        plural(errors, "error"),
        if warnings > 0 {
            "count warning"
        } else {
            "count"
        },
        plural(warnings, "warning"),
    );
    out.push_str("<ul class=\"legend\" aria-label=\"legend\">\n");
    for (fill, what) in [
        (HAZARD_FILL, "hazard's op"),
        (CONFLICT_FILL, "conflicting access"),
        (CONTEXT_FILL, "other op"),
    ] {
        let _ = writeln!(
            out,
            "<li><svg width=\"26\" height=\"14\" aria-hidden=\"true\"><rect x=\"1\" y=\"1\" width=\"24\" \
             height=\"12\" rx=\"3\" fill=\"{}\" stroke=\"{}\" stroke-width=\"1.5\"/></svg>{what}</li>",
            fill.0, fill.1
        );
    }
    for kind in EDGE_KINDS {
        let s = edge_style(kind);
        let _ = writeln!(
            out,
            "<li><svg width=\"40\" height=\"14\" aria-hidden=\"true\"><path class=\"edge k-{}\" \
             d=\"M2 7 H31\"/><path d=\"M31 3 L38 7 L31 11 z\" fill=\"{}\"/></svg>{}</li>",
            s.name,
            s.color,
            esc(s.legend)
        );
    }
    if !pic.syncs.is_empty() {
        let redundant = pic.syncs.iter().filter(|s| !s.needed).count() as u64;
        let _ = writeln!(
            out,
            "<li><svg width=\"40\" height=\"14\" aria-hidden=\"true\"><path class=\"edge k-event redundant\" \
             d=\"M2 7 H31\"/><path d=\"M31 3 L38 7 L31 11 z\" fill=\"{REDUNDANT_GREY}\"/></svg>redundant \
             synchronization ({} of {} drawn; hover a sync edge for what a needed one prevents)</li>",
            redundant,
            pic.syncs.len()
        );
    }
    out.push_str("</ul>\n</header>\n");
}

/// The grey of redundant synchronization edges.
const REDUNDANT_GREY: &str = "#bdbdbd";

/// One drawn op's box: where and how tall.
struct BoxAt {
    x: i64,
    y: i64,
    h: i64,
}

/// The picture's geometry.
struct Layout {
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
fn box_lines(n: &Node) -> Vec<String> {
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

fn layout(d: &Drawn<'_>) -> Layout {
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
fn picture(out: &mut String, d: &Drawn<'_>) {
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
fn gaps(out: &mut String, d: &Drawn<'_>, l: &Layout) {
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
struct Ends {
    from: usize,
    to: usize,
    out_slot: i64,
    in_slot: i64,
    /// Shift of a second, third… edge between the same two ops.
    offset: i64,
}

/// Where an edge's label goes: `x`, `y` and the SVG `text-anchor`.
struct Label {
    x: i64,
    y: i64,
    anchor: &'static str,
}

/// The path of an edge, and where its label goes.
///
/// Within a lane: a straight line from side to side when no box of the lane is in between, else
/// an arc above the row. Across lanes: a curve from the bottom (or top) of one box to the top (or
/// bottom) of the other, so that it does not meet the lane's own edges.
fn route(d: &Drawn<'_>, l: &Layout, e: &Ends) -> (String, Label) {
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
fn hazard_classes(hazards: &[usize]) -> String {
    hazards.iter().map(|h| format!(" hz-{h}")).collect()
}

/// An edge's tooltip: `"event e1: op 2 → op 3"`.
fn edge_title(d: &Drawn<'_>, e: &Edge) -> String {
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
fn sync_verdict(v: &PictureSync) -> String {
    if v.needed {
        format!("needed: without it, {}", v.prevents.join("; "))
    } else {
        "redundant: removing this synchronization alone adds no hazard".to_string()
    }
}

/// One op's box, with its tooltip and hazard badges.
fn node(out: &mut String, d: &Drawn<'_>, n: &Node, b: &BoxAt) {
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

/// The hazard list: one entry per hazard, linking to its ring in the picture.
fn hazard_list(out: &mut String, d: &Drawn<'_>) {
    out.push_str("<aside class=\"hazards\" aria-label=\"hazards\">\n");
    let _ = writeln!(
        out,
        "<h2>Hazards <span class=\"n\">{}</span></h2>",
        d.pic.hazards.len()
    );
    if d.pic.hazards.is_empty() {
        out.push_str("<p class=\"empty\">No hazards.</p>\n");
    } else {
        out.push_str("<ol>\n");
    }
    for (i, h) in d.pic.hazards.iter().enumerate() {
        let sev = match h.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        let _ = writeln!(out, "<li class=\"entry {sev}\" id=\"entry-{i}\">");
        if !d.column.contains_key(&h.op) {
            // Not drawn: the link's target is the entry itself.
            let _ = writeln!(out, "<span class=\"anchor\" id=\"hazard-{i}\"></span>");
        }
        let _ = write!(
            out,
            "<a class=\"hazard-link\" href=\"#hazard-{i}\" data-hazard=\"{i}\"><span class=\"num\">#{i}</span> \
             <span class=\"sev {sev}\">{sev}</span> <span class=\"kind\">{}</span> <span class=\"at\">at op {}</span>",
            h.kind, h.op
        );
        if let Some(buffer) = &h.buffer {
            let _ = write!(
                out,
                " <span class=\"at\">on</span> <code>{}</code>",
                esc(buffer)
            );
        }
        out.push_str("</a>\n");
        let _ = writeln!(out, "<p class=\"title\">{}</p>", esc(&h.title));
        if !h.why.is_empty() {
            out.push_str("<ul class=\"why\">\n");
            for w in &h.why {
                let _ = writeln!(out, "<li>{}</li>", esc(w));
            }
            out.push_str("</ul>\n");
        }
        if let Some(fix) = &h.fix {
            let _ = writeln!(out, "<p class=\"fix\"><b>fix</b> {}</p>", esc(fix));
        }
        let mut conflicts = h.conflicts.clone();
        conflicts.sort_unstable();
        conflicts.dedup();
        if !conflicts.is_empty() {
            out.push_str("<p class=\"conflicts\">conflicts with ");
            let links: Vec<String> = conflicts
                .iter()
                .map(|op| {
                    if d.column.contains_key(op) {
                        format!("<a href=\"#op-{op}\">op {op}</a>")
                    } else {
                        format!("op {op} (not drawn)")
                    }
                })
                .collect();
            out.push_str(&links.join(", "));
            out.push_str("</p>\n");
        }
        out.push_str("</li>\n");
    }
    if !d.pic.hazards.is_empty() {
        out.push_str("</ol>\n");
    }
    out.push_str("</aside>\n");
}

/// The rules that highlight hazard `i` while `#hazard-i` is the target: its ops and missing edge
/// stand out, the rest of the picture is dimmed, and its entry in the list is marked.
fn target_css(hazards: usize) -> String {
    if hazards == 0 {
        return String::new();
    }
    let each = |suffix: &str| -> String {
        (0..hazards)
            .map(|i| {
                format!(
                    "body:has(#hazard-{i}:target) {}",
                    suffix.replace("{i}", &i.to_string())
                )
            })
            .collect::<Vec<_>>()
            .join(",\n")
    };
    let mut css = String::new();
    let _ = writeln!(css, "{} {{ opacity: 1; }}", each(".hz-{i}"));
    let _ = writeln!(
        css,
        "{} {{ stroke-width: 3px; }}",
        each(".node.hz-{i} > rect")
    );
    let _ = writeln!(
        css,
        "{} {{ stroke-width: 3.5px; animation: march 0.8s linear infinite; }}",
        each("path.edge.hz-{i}")
    );
    let _ = writeln!(
        css,
        "{} {{ background: #fff1f0; border-color: #d62728; }}",
        each("#entry-{i}")
    );
    css
}

/// `s` in at most `lines` lines of at most `width` characters, broken at spaces where it can be;
/// the last line is cut with `…` if the rest does not fit.
fn wrap(s: &str, width: usize, lines: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    if lines == 0 {
        return out;
    }
    let mut cur = String::new();
    for word in s.split(' ').filter(|w| !w.is_empty()) {
        let len = cur.chars().count();
        if len > 0 && len + 1 + word.chars().count() > width {
            out.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(word);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    if out.len() > lines {
        let rest = out[lines - 1..].join(" ");
        out.truncate(lines - 1);
        out.push(rest);
    }
    out.into_iter().map(|l| fit(&l, width)).collect()
}

/// `s` cut to `max` characters, with `…` where it was cut.
fn fit(s: &str, max: usize) -> String {
    let one_line: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if one_line.chars().count() <= max {
        one_line
    } else {
        let mut cut: String = one_line.chars().take(max.saturating_sub(1)).collect();
        cut.push('…');
        cut
    }
}

/// `s` escaped for HTML text and attribute values; control characters other than line breaks and
/// tabs become spaces.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\n' | '\t' => out.push(c),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// The page's style. Per-hazard `:target` rules follow it ([`target_css`]).
const CSS: &str = r#"* { box-sizing: border-box; }
html, body { margin: 0; height: 100%; }
body { display: flex; flex-direction: column; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: #222; background: #f4f4f1; }
header { flex: none; padding: 10px 20px 8px; background: #fff; border-bottom: 1px solid #d8d8d8; }
h1 { font-size: 18px; margin: 0 0 2px; font-weight: 600; word-break: break-all; }
h1 .tool { color: #888; font-weight: 400; margin-right: 6px; }
.summary { margin: 0 0 6px; color: #555; }
.summary span + span::before { content: "·"; margin: 0 8px; color: #aaa; }
.summary .elided { color: #8a5a00; }
.summary .error { color: #c62828; font-weight: 600; }
.summary .warning { color: #b26a00; font-weight: 600; }
.legend { display: flex; flex-wrap: wrap; gap: 2px 18px; margin: 0; padding: 0; list-style: none; font-size: 12px; color: #444; }
.legend li { display: flex; align-items: center; gap: 5px; }
main { flex: 1; min-height: 0; display: grid; grid-template-columns: minmax(0, 1fr) 400px; }
.picture { min-width: 0; min-height: 0; display: flex; }
.scroll { flex: 1; overflow: auto; background: #fff; }
.canvas { display: flex; width: max-content; }
svg.lanes { background: #fff; position: sticky; left: 0; z-index: 2; flex: none; border-right: 1px solid #d0d0d0; }
svg text { font: 11px ui-monospace, SFMono-Regular, Menlo, Consolas, "DejaVu Sans Mono", monospace; fill: #222; }
.lanes .name { font-weight: 700; font-size: 12px; }
.lanes .desc { fill: #777; font-size: 10px; }
.band0 { fill: #fbfbfa; }
.band1 { fill: #f0f1f4; }
.gap line { stroke: #c9c9c9; stroke-dasharray: 2 4; }
.gap text { fill: #8a5a00; font-size: 10px; }
.node rect { stroke-width: 1.2px; }
.node.hazard > rect, .node.conflict > rect { stroke-width: 2px; }
.node .opn { font-weight: 700; fill: #555; }
.node .acc { fill: #444; }
.node.hazard .opn { fill: #b71c1c; }
.node:target > rect { stroke: #1f6fd1; stroke-width: 3px; }
.node[data-hazard] { cursor: pointer; }
.badge rect { fill: #d62728; }
.badge text { fill: #fff; font-size: 10px; font-weight: 700; text-anchor: middle; }
path.edge { fill: none; stroke-width: 1.3px; }
.k-stream, .k-host { stroke: #7a7a7a; fill: #7a7a7a; }
.k-issue { stroke: #a0a0a0; stroke-dasharray: 2 3; fill: #a0a0a0; }
.k-event { stroke: #1f6fd1; stroke-width: 1.6px; fill: #1f6fd1; }
.k-host-sync { stroke: #2e8b3a; stroke-width: 1.6px; fill: #2e8b3a; }
.k-legacy { stroke: #e07b00; stroke-width: 1.6px; fill: #e07b00; }
.k-record-stream { stroke: #8a3fb5; stroke-dasharray: 7 4; stroke-width: 1.6px; fill: #8a3fb5; }
.k-elided { stroke: #a0a0a0; stroke-dasharray: 1 3; fill: #8a8a8a; }
.k-missing { stroke: #d62728; stroke-dasharray: 8 5; stroke-width: 2.2px; fill: #d62728; }
path.edge.redundant, text.elabel.redundant { stroke: #bdbdbd; fill: #bdbdbd; }
text.elabel.redundant { fill: #9a9a9a; stroke: #fff; }
.legend path.edge { stroke-width: 2px; }
text.elabel { stroke: #fff; stroke-width: 3px; stroke-dasharray: none; paint-order: stroke; stroke-linejoin: round; font-size: 10px; }
text.elabel.k-missing { font-weight: 700; }
.mark rect { fill: none; stroke: #d62728; stroke-width: 3px; opacity: 0; pointer-events: none; }
.mark:target rect { opacity: 1; }
body:has(.mark:target) svg.graph :is(.node, path.edge, .elabel) { opacity: 0.25; }
@keyframes march { to { stroke-dashoffset: -26; } }
.hazards { overflow: auto; padding: 12px 16px 24px; border-left: 1px solid #d8d8d8; background: #fafaf8; }
.hazards h2 { font-size: 15px; margin: 0 0 8px; }
.hazards h2 .n { color: #fff; background: #888; border-radius: 9px; padding: 0 7px; font-size: 12px; vertical-align: 1px; }
.hazards ol { list-style: none; margin: 0; padding: 0; }
.entry { background: #fff; border: 1px solid #ddd; border-left: 4px solid #d62728; border-radius: 5px; padding: 8px 10px; margin: 0 0 10px; scroll-margin: 8px; }
.entry.warning { border-left-color: #e0a000; }
.entry:target { background: #fff1f0; }
.hazard-link { display: block; color: inherit; text-decoration: none; font-weight: 600; }
.hazard-link:hover .kind { text-decoration: underline; }
.num { color: #888; font-weight: 400; }
.sev { font-size: 11px; text-transform: uppercase; letter-spacing: 0.04em; border-radius: 3px; padding: 0 5px; color: #fff; background: #c62828; }
.sev.warning { background: #c58a00; }
.kind { color: #b71c1c; }
.warning .kind { color: #8a5a00; }
.at { color: #555; font-weight: 400; }
code { font: 12.5px ui-monospace, SFMono-Regular, Menlo, Consolas, "DejaVu Sans Mono", monospace; background: #f1f1ee; padding: 0 3px; border-radius: 3px; }
.entry p { margin: 4px 0; }
.entry .title { font-weight: 500; }
.why { margin: 4px 0; padding-left: 18px; color: #444; font-size: 13px; }
.fix { font-size: 13px; background: #eef7ee; border-radius: 3px; padding: 2px 6px; }
.fix b { color: #2e7d32; margin-right: 4px; }
.conflicts { font-size: 12px; color: #666; }
.conflicts a { color: #1f6fd1; }
.empty { color: #777; padding: 16px; }
@media (max-width: 1000px) {
  html, body { height: auto; }
  main { display: block; }
  .scroll { max-height: 70vh; }
  .hazards { border-left: none; border-top: 1px solid #d8d8d8; }
}
"#;

/// The page's script: when a hazard is selected, centre its op in the picture and keep its entry
/// in view; a click on a box with a hazard selects it; the page opens with the first hazard's op
/// in view. Everything else is CSS.
const JS: &str = r#"(function () {
  "use strict";
  var pane = document.getElementById("picture");
  var lanes = pane && pane.querySelector("svg.lanes");
  // Scrolls the picture so that op box `g` is in view: centred, or just inside the right edge.
  var still = window.matchMedia && window.matchMedia("(prefers-reduced-motion: reduce)").matches;
  function show(g, centre, smooth) {
    var box = g.querySelector("rect").getBBox();
    var free = pane.clientWidth - (lanes ? lanes.getBoundingClientRect().width : 0);
    var left = centre ? box.x + box.width / 2 - free / 2 : box.x + box.width + 48 - free;
    var top = centre ? box.y + box.height / 2 - pane.clientHeight / 2 : pane.scrollTop;
    pane.scrollTo({ left: Math.max(0, left), top: Math.max(0, top), behavior: smooth && !still ? "smooth" : "auto" });
  }
  function reveal(smooth) {
    if (!pane) return;
    var m = /^#hazard-(\d+)$/.exec(location.hash);
    var mark = m ? document.getElementById("hazard-" + m[1]) : pane.querySelector(".mark");
    var op = mark && mark.getAttribute("data-op");
    var g = op !== null && op !== undefined ? document.getElementById("op-" + op) : null;
    if (g) show(g, !!m, smooth);
    var entry = m && document.getElementById("entry-" + m[1]);
    if (entry) entry.scrollIntoView({ block: "nearest", behavior: smooth && !still ? "smooth" : "auto" });
  }
  window.addEventListener("hashchange", function () { reveal(true); });
  document.addEventListener("click", function (ev) {
    var t = ev.target;
    if (!t.closest) return;
    var link = t.closest("a.hazard-link");
    if (link && location.hash === link.getAttribute("href")) { reveal(true); return; }
    var g = t.closest("g.node[data-hazard]");
    if (g && !t.closest("a")) location.hash = "hazard-" + g.getAttribute("data-hazard");
  });
  // Open at the selected hazard, or with the first hazard in view.
  reveal(false);
})();
"#;

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::super::tests::{arb_picture, broken, hostile, rounds, rounds_of, small};
    use super::*;

    /// Every `id="…"` of the page.
    fn ids(html: &str) -> Vec<&str> {
        html.split(" id=\"")
            .skip(1)
            .map(|rest| &rest[..rest.find('"').unwrap()])
            .collect()
    }

    /// The element of the page that starts with `start`, up to its closing tag `end`.
    fn element<'a>(html: &'a str, start: &str, end: &str) -> &'a str {
        let at = html
            .find(start)
            .unwrap_or_else(|| panic!("{start} not in the page"));
        let rest = &html[at..];
        &rest[..rest.find(end).map_or(rest.len(), |e| e + end.len())]
    }

    /// The page loads nothing: the only address is the SVG namespace.
    fn assert_offline(html: &str) {
        let lower = html.to_ascii_lowercase();
        for scheme in ["http://", "https://"] {
            for (at, _) in lower.match_indices(scheme) {
                let before = &html[at.saturating_sub(7)..at];
                assert!(
                    before == "xmlns=\"" && html[at..].starts_with("http://www.w3.org/2000/svg\""),
                    "network reference at {at}: {}",
                    &html[at.saturating_sub(40)..(at + 60).min(html.len())]
                );
            }
        }
        for banned in [
            "<script src",
            "<link",
            "@import",
            "<img",
            "<iframe",
            "//fonts.",
            "src=",
        ] {
            assert!(!lower.contains(banned), "{banned} in the page");
        }
        // `url(` only for the arrowhead markers of the page itself.
        for (at, _) in lower.match_indices("url(") {
            assert!(
                html[at..].starts_with("url(#arrow-"),
                "{}",
                &html[at..at + 30]
            );
        }
    }

    /// Tags the renderer writes are balanced.
    fn assert_balanced(html: &str) {
        for tag in [
            "svg", "g", "text", "a", "li", "ol", "ul", "p", "section", "aside", "main", "header",
            "marker",
        ] {
            let open = html.matches(&format!("<{tag} ")).count()
                + html.matches(&format!("<{tag}>")).count();
            let close = html.matches(&format!("</{tag}>")).count();
            assert_eq!(
                open, close,
                "<{tag}> opened {open} times, closed {close} times"
            );
        }
        let ids = ids(html);
        let unique: BTreeSet<&&str> = ids.iter().collect();
        assert_eq!(unique.len(), ids.len(), "duplicate ids");
    }

    #[test]
    fn small_picture() {
        let pic = small();
        let html = render_html(&pic);
        assert!(html.starts_with("<!DOCTYPE html>\n"));
        assert!(html.ends_with("</html>\n"));
        assert_offline(&html);
        assert_balanced(&html);
        // Header: title, counts, no elided count, a legend entry per edge kind.
        assert!(html.contains("<title>streamsan: small.jsonl</title>"));
        assert!(html.contains("<span>6 ops in the trace</span> <span>6 drawn</span>"));
        assert!(!html.contains("class=\"elided\""));
        assert!(!html.contains("class=\"gap\""));
        assert!(html.contains("1 error"));
        for kind in EDGE_KINDS {
            let s = edge_style(kind);
            assert!(
                html.contains(&format!(
                    "<path class=\"edge k-{}\" d=\"M2 7 H31\"/>",
                    s.name
                )),
                "{kind:?}"
            );
            assert!(html.contains(&esc(s.legend)));
        }
        // One box per node, in lane order, with its id and a tooltip with the site and accesses.
        assert_eq!(html.matches("<g class=\"node").count(), 6);
        for n in &pic.nodes {
            let at = html.find(&format!(" id=\"op-{}\"", n.op)).unwrap();
            assert!(html[..at].ends_with(match n.role {
                Role::Hazard => "<g class=\"node hazard hz-0\"",
                Role::Conflict => "<g class=\"node conflict hz-0\"",
                Role::Context => "<g class=\"node\"",
            }));
        }
        let op5 = element(&html, "<g class=\"node hazard hz-0\" id=\"op-5\"", "</g>");
        assert!(op5.contains(
            "<title>op 5 on s2: launch sum\nsite: train.py:15 &lt;- main.py:3\nwrites x[0, 4096)\nhazard 0 (data-race): \
             data race on x: write-after-read</title>"
        ), "{op5}");
        assert!(op5.contains("fill=\"#fbd0d0\" stroke=\"#c62828\""));
        assert!(
            element(&html, "<g class=\"node conflict hz-0\" id=\"op-4\"", "</g>")
                .contains("fill=\"#ffe0b2\"")
        );
        // Lanes as rows, host first: op 0 (host) above op 1 (s1) above op 3 (s2); columns by op.
        let rect = |op: u64| -> (i64, i64) {
            let g = html.find(&format!(" id=\"op-{op}\"")).unwrap();
            let r = &html[g..];
            let num = |attr: &str| -> i64 {
                let at = r.find(&format!(" {attr}=\"")).unwrap() + attr.len() + 3;
                r[at..at + r[at..].find('"').unwrap()].parse().unwrap()
            };
            (num("x"), num("y"))
        };
        assert!(rect(0).1 < rect(1).1 && rect(1).1 < rect(3).1);
        assert_eq!(rect(1).1, rect(4).1);
        for op in 1..6 {
            assert_eq!(rect(op).0 - rect(op - 1).0, COL_W);
        }
        // The missing edge: a dashed red path with an arrowhead, labelled, tied to hazard 0.
        let missing = element(&html, "<path class=\"edge k-missing hz-0\"", "</path>");
        assert!(missing.contains("marker-end=\"url(#arrow-missing)\""));
        assert!(missing.contains(
            "<title>missing: fixes data-race at op 5: op 4 → op 5\nfix: record an event"
        ));
        assert!(html.contains(".k-missing { stroke: #d62728; stroke-dasharray: 8 5;"));
        assert!(html.contains(">missing: fixes data-race at op 5</text>"));
        // The event edge, blue and labelled with the event.
        assert!(html.contains("<path class=\"edge k-event\""));
        assert!(element(&html, "<text class=\"elabel k-event\"", "</text>").ends_with(">e1</text>"));
        assert!(html.contains("<marker id=\"arrow-event\""));
        // The hazard list: the entry links to the ring around op 5, which `:target` shows.
        let entry = &html[html
            .find("<li class=\"entry error\" id=\"entry-0\">")
            .unwrap()..];
        let entry = &entry[..entry.find("</li>\n</ol>").unwrap()];
        assert!(entry.contains("<a class=\"hazard-link\" href=\"#hazard-0\""));
        for part in [
            "data-race",
            ">error<",
            "at op 5",
            "<code>x</code>",
            "<p class=\"title\">data race on x: write-after-read</p>",
            "<li>op 4 (s1) reads x[0, 4096)</li>",
            "<b>fix</b> record an event on s1 after op 4 and make s2 wait on it before op 5",
            "<a href=\"#op-4\">op 4</a>",
        ] {
            assert!(entry.contains(part), "{part} not in {entry}");
        }
        assert!(html.contains("<g class=\"mark\" id=\"hazard-0\" data-op=\"5\">"));
        assert!(html.contains("<a href=\"#hazard-0\" class=\"badge\">"));
        assert!(html.contains("body:has(#hazard-0:target) .hz-0 {"));
        assert!(html.contains("body:has(#hazard-0:target) path.edge.hz-0 {"));
        assert!(html.contains(".mark:target rect { opacity: 1; }"));
        assert_eq!(html, render_html(&small()), "deterministic");
        if std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")).is_file() {
            insta::assert_snapshot!("small_html", html);
        } else {
            // Away from the source tree (a staged test executable), where insta would look for
            // the snapshot under a directory that is not there: the embedded snapshot file.
            super::super::tests::assert_embedded_snapshot(
                include_str!("snapshots/streamsan__graph__render__html__tests__small_html.snap"),
                &html,
            );
        }
    }

    #[test]
    fn hostile_names_are_escaped() {
        let html = render_html(&hostile());
        assert_offline(&html);
        assert_balanced(&html);
        // Only the page's own script element.
        assert_eq!(html.matches("<script").count(), 1);
        assert!(!html.contains("alert(1)</script>"));
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(!html.contains("<b>trace"));
        assert!(html.contains(
            "<title>streamsan: &lt;b&gt;trace&lt;/b&gt; &quot;quoted&quot;.jsonl</title>"
        ));
        assert!(html.contains(">launch a&quot;b\\c</text>"));
        assert!(html.contains(">&lt;x&gt;</text>"));
        assert!(!html.contains("<x>"));
        assert!(html.contains("<code>&amp;amp;</code>"));
        assert!(html.contains("<li>a&quot;b\\c read &lt;x&gt; &amp; wrote &#39;y&#39;</li>"));
        assert!(html.contains("site: line one\nline two"));
    }

    #[test]
    fn broken_pictures_render() {
        let html = render_html(&broken());
        assert_offline(&html);
        assert_balanced(&html);
        assert!(!html.contains("id=\"op-9\""));
        assert!(!html.contains("duplicate"));
        assert_eq!(html.matches(" id=\"op-3\"").count(), 1);
        assert!(html.contains("<span class=\"elided\">3 ops not drawn</span>"));
        // The hazard's op is not drawn: its anchor is in its entry.
        assert!(html.contains("<span class=\"anchor\" id=\"hazard-0\"></span>"));
        assert!(html.contains("op 1000 (not drawn)"));
        assert!(html.contains(">missing: fixes data-race at op 18446744073709551615</text>"));

        let empty = render_html(&Picture::default());
        assert_offline(&empty);
        assert_balanced(&empty);
        assert!(empty.contains("No ops to draw."));
        assert!(empty.contains("No hazards."));
        let mut no_lanes = small();
        no_lanes.lanes.clear();
        let html = render_html(&no_lanes);
        assert_balanced(&html);
        assert!(!html.contains("id=\"op-0\""));
    }

    #[test]
    fn long_pictures_scroll() {
        let pic = rounds();
        let html = render_html(&pic);
        assert_offline(&html);
        assert_balanced(&html);
        assert_eq!(html.matches("<g class=\"node").count(), pic.nodes.len());
        let width = SIDE * 2 + (pic.nodes.len() as i64 - 1) * COL_W + BOX_W;
        assert!(html.contains(&format!(
            "<svg class=\"graph\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\""
        )));
        assert!(html.contains(".scroll { flex: 1; overflow: auto;"));
        // Ops not drawn are marked between the columns.
        assert!(html.contains("<g class=\"gap\"><title>2 ops not drawn</title>"));
        let last = pic.nodes.iter().map(|n| n.op).max().unwrap();
        let after = format!(
            "<g class=\"gap\"><title>{} ops not drawn</title>",
            pic.ops - last - 1
        );
        assert!(html.contains(&after), "{after}");
        assert!(html.contains("<span class=\"sev warning\">warning</span>"));
    }

    #[test]
    fn hundreds_of_ops() {
        let pic = rounds_of(60);
        assert!(pic.nodes.len() > 400);
        let html = render_html(&pic);
        assert_offline(&html);
        assert_balanced(&html);
        assert_eq!(html.matches("<g class=\"node").count(), pic.nodes.len());
        // About a kilobyte per op, not more.
        assert!(
            html.len() < 1500 * pic.nodes.len() + 32 * 1024,
            "{} bytes",
            html.len()
        );
    }

    #[test]
    fn text_helpers() {
        assert_eq!(
            esc("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
        assert_eq!(esc("a\u{0}b\nc"), "a b\nc");
        assert_eq!(fit("abcdef", 6), "abcdef");
        assert_eq!(fit("abcdefg", 6), "abcde…");
        assert_eq!(fit("ééééééé", 3), "éé…");
        assert_eq!(fit("a\nb", 5), "a b");
        assert_eq!(
            wrap("stream, device 0, non-blocking", 22, 2),
            ["stream, device 0,", "non-blocking"]
        );
        assert_eq!(
            wrap("one two three four five six", 9, 2),
            ["one two", "three fo…"]
        );
        assert_eq!(wrap("", 9, 2), Vec::<String>::new());
        assert_eq!(wrap("x", 9, 0), Vec::<String>::new());
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]

        /// Any picture renders: offline, balanced, unique ids, no markup from the picture's text.
        #[test]
        fn any_picture_renders(pic in arb_picture()) {
            let html = render_html(&pic);
            assert_offline(&html);
            assert_balanced(&html);
            prop_assert_eq!(html.matches("<script").count(), 1);
            prop_assert_eq!(html.matches("</script>").count(), 1);
            prop_assert_eq!(&html, &render_html(&pic));
        }
    }
}
