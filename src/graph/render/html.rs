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

mod layout;
mod replay;
mod template;

use layout::*;
use template::{CSS, JS};

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
        replay::replays(&mut out, &d);
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
