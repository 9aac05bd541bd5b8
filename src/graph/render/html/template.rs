//! The page's inline style and script.

/// The page's style. Per-hazard `:target` rules follow it ([`target_css`]).
pub(super) const CSS: &str = r#"* { box-sizing: border-box; }
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
figure.replay { margin: 8px 0 0 0; }
figure.replay figcaption { font-size: 12px; color: #6a4fb3; margin: 0 0 4px 8px; }
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
pub(super) const JS: &str = r#"(function () {
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
