//! The SARIF renderer: the log's header and rules, where results are located, related locations,
//! fingerprints, and a structural check of every example trace's log against the required and
//! allowed properties of the SARIF 2.1.0 schema.
//!
//! Fixtures: `examples/traces/**/*.jsonl`, embedded at build time (`tests/common/mod.rs`; two of
//! them also by `include_str!`), so the tests run wherever their executable is.

mod common;

use std::collections::HashSet;

use serde_json::Value;
use streamsan::report::{render_sarif, HazardKind, Report, SarifOptions};
use streamsan::trace::TraceReader;
use streamsan::Checker;

fn check(trace: &str) -> Report {
    let mut reader = TraceReader::new(trace.as_bytes(), "test");
    let mut checker = Checker::new();
    while let Some((op, _spans)) = reader.next_op().expect("valid trace") {
        checker.check(&op).expect("valid op");
    }
    checker.finish()
}

fn sarif(report: &Report, trace: Option<&str>) -> Value {
    let opts = SarifOptions {
        trace: trace.map(str::to_string),
    };
    serde_json::from_str(&render_sarif(report, &opts)).expect("SARIF is JSON")
}

fn results(log: &Value) -> &Vec<Value> {
    log["runs"][0]["results"].as_array().expect("results array")
}

/// A data race of `x`: written on s1 at op 1, read on s2 at op 2, with `site` on the read.
fn race_with_site(site: &str) -> String {
    format!(
        r#"{{"op":"alloc","buffer":"x","bytes":4096,"stream":"s1","site":"src/alloc.rs:3:1"}}
{{"op":"launch","stream":"s1","name":"produce","writes":["x"],"site":"src/produce.rs:7:9"}}
{{"op":"launch","stream":"s2","name":"consume","reads":["x"],"site":{site}}}
"#
    )
}

fn only_result(log: &Value) -> &Value {
    let r = results(log);
    assert_eq!(r.len(), 1, "{r:#?}");
    &r[0]
}

#[test]
fn header_tool_and_one_rule_per_kind() {
    let log = sarif(&check(""), None);
    assert_eq!(log["version"], "2.1.0");
    assert_eq!(
        log["$schema"],
        "https://json.schemastore.org/sarif-2.1.0.json"
    );
    let runs = log["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 1);
    let driver = &runs[0]["tool"]["driver"];
    assert_eq!(driver["name"], "streamsan");
    assert_eq!(driver["version"], env!("CARGO_PKG_VERSION"));
    let rules = driver["rules"].as_array().expect("rules");
    assert_eq!(rules.len(), HazardKind::ALL.len());
    let names = [
        "DataRace",
        "UnsafeFree",
        "ReuseRace",
        "UseAfterFree",
        "InvalidFree",
        "WaitOnUnrecordedEvent",
    ];
    for ((rule, kind), name) in rules.iter().zip(HazardKind::ALL).zip(names) {
        assert_eq!(rule["id"], kind.as_str());
        assert_eq!(rule["name"], name);
        let level = if kind == HazardKind::WaitOnUnrecordedEvent {
            "warning"
        } else {
            "error"
        };
        assert_eq!(rule["defaultConfiguration"]["level"], level, "{kind}");
        for field in ["shortDescription", "fullDescription", "help"] {
            let text = rule[field]["text"].as_str().unwrap_or_default();
            assert!(text.len() > 10, "{kind}: {field} is {text:?}");
        }
    }
}

#[test]
fn clean_report_has_an_empty_results_array() {
    let trace = r#"{"op":"alloc","buffer":"x","bytes":4096,"stream":"s1"}
{"op":"launch","stream":"s1","writes":["x"]}
{"op":"event_record","event":"e","stream":"s1"}
{"op":"event_wait","stream":"s2","event":"e"}
{"op":"launch","stream":"s2","reads":["x"]}
"#;
    let report = check(trace);
    assert!(report.hazards.is_empty());
    let log = sarif(&report, Some("clean.jsonl"));
    assert_eq!(log["runs"][0]["results"], Value::Array(vec![]));
    assert_eq!(log["runs"][0]["properties"]["errors"], 0);
    assert_eq!(log["runs"][0]["properties"]["ops"], 5);
}

#[test]
fn cross_stream_race_example_maps_its_site_to_a_file_region() {
    let trace = include_str!("../examples/traces/cross-stream-race.jsonl");
    let report = check(trace);
    let log = sarif(&report, None);
    let r = only_result(&log);
    let h = &report.hazards[0];
    assert_eq!(r["ruleId"], "data-race");
    assert_eq!(r["ruleIndex"], 0);
    assert_eq!(r["level"], "error");

    let text = r["message"]["text"].as_str().expect("message");
    assert!(
        text.starts_with("data race on x: read by stream consumer at op 5"),
        "{text}"
    );
    let fix = h.fix.as_deref().expect("a race has a fix");
    assert!(text.contains(&format!(". Fix: {fix}")), "{text}");

    let loc = &r["locations"][0];
    let phys = &loc["physicalLocation"];
    assert_eq!(phys["artifactLocation"]["uri"], "src/pipeline.rs");
    assert_eq!(phys["region"]["startLine"], 21);
    assert_eq!(phys["region"]["startColumn"], 5);
    assert_eq!(loc["logicalLocations"][0]["name"], "op 5");
    assert_eq!(loc["logicalLocations"][0]["kind"], "object");

    // One related location per conflict, ids 1..n, in the report's order.
    let related = r["relatedLocations"].as_array().expect("related");
    assert!(related.len() >= h.conflicts.len());
    assert!(!h.conflicts.is_empty());
    for (i, (c, rl)) in h.conflicts.iter().zip(related).enumerate() {
        assert_eq!(rl["id"], i + 1);
        assert_eq!(
            rl["logicalLocations"][0]["name"],
            format!("op {}", c.op).as_str()
        );
        let msg = rl["message"]["text"].as_str().expect("message");
        assert!(
            msg.contains(&format!("by stream {} at op {}", c.participant, c.op)),
            "{msg}"
        );
        let site = c
            .site
            .as_ref()
            .expect("the example gives sites")
            .to_string();
        let (path, line) = match site.split(':').collect::<Vec<_>>()[..] {
            [p, l, _] => (p.to_string(), l.parse::<u64>().expect("line")),
            _ => panic!("{site}"),
        };
        assert_eq!(rl["physicalLocation"]["artifactLocation"]["uri"], path);
        assert_eq!(rl["physicalLocation"]["region"]["startLine"], line);
    }
    // The write by `fill` at op 3 is among them.
    assert!(related.iter().any(|rl| rl["message"]["text"]
        .as_str()
        .is_some_and(|m| m.starts_with("write of x\\[0, 4096) by stream producer at op 3"))));

    let props = &r["properties"];
    assert_eq!(props["op"], 5);
    assert_eq!(props["buffer"], "x");
    assert_eq!(props["pattern"], "read-after-write");
    assert_eq!(props["participant"], "consumer");
    assert_eq!(props["fix"], fix);
    assert_eq!(
        r["partialFingerprints"]["streamsanHazard/v1"],
        "data-race:x:src/pipeline.rs:21:5"
    );
}

#[test]
fn line_without_column() {
    let log = sarif(&check(&race_with_site(r#""train.py:45""#)), None);
    let phys = &only_result(&log)["locations"][0]["physicalLocation"];
    assert_eq!(phys["artifactLocation"]["uri"], "train.py");
    assert_eq!(phys["region"]["startLine"], 45);
    assert!(phys["region"].get("startColumn").is_none(), "{phys}");
}

#[test]
fn label_site_has_a_logical_location_only() {
    let log = sarif(&check(&race_with_site(r#""my-label""#)), None);
    let r = only_result(&log);
    let loc = &r["locations"][0];
    assert!(loc.get("physicalLocation").is_none(), "{loc}");
    assert_eq!(loc["logicalLocations"][0]["name"], "op 2");
    assert!(r.get("analysisTarget").is_none());
    assert!(log["runs"][0].get("artifacts").is_none());
    assert_eq!(
        r["partialFingerprints"]["streamsanHazard/v1"],
        "data-race:x:my-label"
    );
}

#[test]
fn with_the_trace_path_a_label_site_is_located_in_the_trace() {
    let log = sarif(
        &check(&race_with_site(r#""my-label""#)),
        Some("traces\\run 1.jsonl"),
    );
    let r = only_result(&log);
    let phys = &r["locations"][0]["physicalLocation"];
    assert_eq!(phys["artifactLocation"]["uri"], "traces/run%201.jsonl");
    assert!(phys.get("region").is_none(), "{phys}");
    assert_eq!(r["analysisTarget"]["uri"], "traces/run%201.jsonl");
    assert_eq!(r["analysisTarget"]["index"], 0);
    let artifacts = &log["runs"][0]["artifacts"];
    assert_eq!(artifacts[0]["location"]["uri"], "traces/run%201.jsonl");
    assert_eq!(artifacts[0]["roles"][0], "analysisTarget");

    // A site that parses still wins over the trace.
    let log = sarif(
        &check(&race_with_site(r#""src/a.rs:2:3""#)),
        Some("t.jsonl"),
    );
    let r = only_result(&log);
    let uri = &r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"];
    assert_eq!(uri, "src/a.rs");
    assert_eq!(r["analysisTarget"]["uri"], "t.jsonl");
}

#[test]
fn stack_site_uses_the_innermost_frame_that_parses() {
    let site = r#"["<frozen importlib>", "lib/ops.py:10", "train.py:45:3"]"#;
    let log = sarif(&check(&race_with_site(site)), None);
    let r = only_result(&log);
    let phys = &r["locations"][0]["physicalLocation"];
    assert_eq!(phys["artifactLocation"]["uri"], "lib/ops.py");
    assert_eq!(phys["region"]["startLine"], 10);
    assert!(phys["region"].get("startColumn").is_none());

    let frames = r["stacks"][0]["frames"].as_array().expect("frames");
    assert_eq!(frames.len(), 3);
    assert_eq!(
        frames[0]["location"]["message"]["text"],
        "<frozen importlib>"
    );
    assert!(frames[0]["location"].get("physicalLocation").is_none());
    let f2 = &frames[2]["location"]["physicalLocation"];
    assert_eq!(f2["artifactLocation"]["uri"], "train.py");
    assert_eq!(f2["region"]["startColumn"], 3);
}

/// Sites outside the trace's tree — absolute paths, drive paths, URIs, paths that climb out —
/// never become artifact URIs: the result is located on the trace, the site kept as text.
#[test]
fn sites_outside_the_tree_stay_text() {
    for site in [
        r#""C:\\x\\y.rs:3:4""#,
        r#""file:///etc/passwd:1:1""#,
        r#""/abs/path:1:1""#,
        r#""../../x:1:1""#,
        r#""src/../../x:1:1""#,
        r#"["../x.py:2", "/etc/shadow:1"]"#,
    ] {
        let log = sarif(&check(&race_with_site(site)), Some("traces/t.jsonl"));
        let text = serde_json::to_string(&log).unwrap();
        let uris: Vec<&str> = text
            .match_indices("\"uri\":\"")
            .map(|(i, m)| {
                let rest = &text[i + m.len()..];
                &rest[..rest.find('"').unwrap()]
            })
            .collect();
        // The trace (artifact, analysis target, the result's location) and the sites of the
        // two earlier ops, which are inside the tree.
        for uri in &uris {
            assert!(
                ["traces/t.jsonl", "src/alloc.rs", "src/produce.rs"].contains(uri),
                "{site}: {uri}"
            );
        }
        let r = only_result(&log);
        let primary = &r["locations"][0];
        assert_eq!(
            primary["physicalLocation"]["artifactLocation"]["uri"],
            "traces/t.jsonl"
        );
        assert!(primary["physicalLocation"].get("region").is_none());
        let message = primary["message"]["text"].as_str().unwrap();
        let first = site
            .trim_matches(['[', ']', '"'])
            .split('"')
            .next()
            .unwrap();
        let first = first.replace("\\\\", "\\");
        assert!(message.contains(&first), "{site}: {message}");
        // The fingerprint keeps the site too.
        let print = r["partialFingerprints"]["streamsanHazard/v1"]
            .as_str()
            .unwrap();
        assert!(print.contains(&first), "{print}");
    }
}

/// Message text escapes `[` and `]` (SARIF 2.1.0 §3.11.6): an id cannot forge an embedded link.
#[test]
fn brackets_in_messages_are_escaped() {
    let trace = r#"{"op":"alloc","buffer":"see [here](1)","bytes":64,"stream":"s1"}
{"op":"launch","stream":"s1","writes":["see [here](1)"]}
{"op":"launch","stream":"s2","reads":["see [here](1)"],"site":"a[1].py:3"}
"#;
    let log = sarif(&check(trace), None);
    let r = only_result(&log);
    let mut texts = vec![r["message"]["text"].as_str().unwrap()];
    texts.push(r["locations"][0]["message"]["text"].as_str().unwrap());
    for rl in r["relatedLocations"].as_array().unwrap() {
        texts.push(rl["message"]["text"].as_str().unwrap());
    }
    for t in &texts {
        let unescaped = t
            .char_indices()
            .filter(|&(i, c)| (c == '[' || c == ']') && !t[..i].ends_with('\\'))
            .count();
        assert_eq!(unescaped, 0, "{t}");
    }
    assert!(
        texts[0].starts_with("data race on see \\[here\\](1): "),
        "{}",
        texts[0]
    );
    // The file location of a site is not a message: it stays as it is.
    assert_eq!(
        r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"],
        "a%5B1%5D.py"
    );
    // The JSON report is unaffected.
    assert_eq!(
        check(trace).hazards[0].buffer.as_deref(),
        Some("see [here](1)")
    );
}

#[test]
fn reuse_race_relates_the_conflicts_and_the_free() {
    let trace = r#"{"op":"alloc","buffer":"x","bytes":4096,"stream":"s1","site":"a.rs:1"}
{"op":"launch","stream":"s1","name":"produce","writes":["x"],"site":"a.rs:2"}
{"op":"event_record","event":"e","stream":"s1","site":"a.rs:3"}
{"op":"event_wait","stream":"s2","event":"e","site":"a.rs:4"}
{"op":"launch","stream":"s2","name":"consume","reads":["x"],"site":"a.rs:5"}
{"op":"free","buffer":"x","site":"a.rs:6"}
{"op":"alloc","buffer":"y","bytes":4096,"stream":"s1","site":"a.rs:7"}
{"op":"launch","stream":"s1","name":"next","writes":["y"],"site":"a.rs:8"}
"#;
    let report = check(trace);
    let log = sarif(&report, None);
    let results = results(&log);
    let kinds: Vec<&str> = results
        .iter()
        .map(|r| r["ruleId"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(kinds, ["unsafe-free", "reuse-race"]);
    let (h, r) = (&report.hazards[1], &results[1]);
    assert_eq!(r["ruleIndex"], 2);
    let free = h.free.as_ref().expect("a reuse race names its free");
    let related = r["relatedLocations"].as_array().expect("related");
    let ids: Vec<u64> = related.iter().filter_map(|l| l["id"].as_u64()).collect();
    assert_eq!(ids, (1..=related.len() as u64).collect::<Vec<_>>());
    let conflict = &related[0];
    assert_eq!(
        conflict["logicalLocations"][0]["name"],
        format!("op {}", h.conflicts[0].op).as_str()
    );
    let free_loc = related
        .iter()
        .skip(h.conflicts.len())
        .find(|l| l["logicalLocations"][0]["name"] == format!("op {}", free.op).as_str())
        .expect("the free is a related location");
    assert_eq!(
        free_loc["physicalLocation"]["artifactLocation"]["uri"],
        "a.rs"
    );
    assert_eq!(free_loc["physicalLocation"]["region"]["startLine"], 6);
    assert_eq!(r["properties"]["pattern"], "write-after-read");
}

#[test]
fn warnings_have_level_warning() {
    let trace = include_str!("../examples/traces/hazards/wait-on-unrecorded-event.jsonl");
    let log = sarif(&check(trace), None);
    let r = only_result(&log);
    assert_eq!(r["ruleId"], "wait-on-unrecorded-event");
    assert_eq!(r["ruleIndex"], 5);
    assert_eq!(r["level"], "warning");
    assert!(r.get("relatedLocations").is_none());
    assert_eq!(r["properties"]["buffer"], Value::Null);
    assert_eq!(r["properties"]["participant"], "s2");
    assert_eq!(
        r["partialFingerprints"]["streamsanHazard/v1"],
        "wait-on-unrecorded-event:-:op 1"
    );
    assert_eq!(log["runs"][0]["properties"]["warnings"], 1);
}

#[test]
fn fingerprints_survive_unrelated_edits_and_output_is_deterministic() {
    let trace = race_with_site(r#""src/a.rs:9:1""#);
    let a = render_sarif(&check(&trace), &SarifOptions::default());
    assert_eq!(a, render_sarif(&check(&trace), &SarifOptions::default()));
    let shifted = format!(
        "{}\n{trace}",
        r#"{"op":"alloc","buffer":"unrelated","bytes":512,"stream":"s3"}"#
    );
    let fp = |s: &str| {
        let log: Value = serde_json::from_str(s).expect("json");
        only_result(&log)["partialFingerprints"].clone()
    };
    let b = render_sarif(&check(&shifted), &SarifOptions::default());
    assert_eq!(fp(&a), fp(&b));
    assert_ne!(a, b, "op indices did move");
}

// ---------------------------------------------------------------------------------------------
// Structural validation against the SARIF 2.1.0 schema (OASIS, errata 01): for every object kind
// the log uses, the required properties, the allowed properties (the schema forbids others), and
// the constraints on values that matter here.

struct Validator<'a> {
    path: Vec<String>,
    errors: &'a mut Vec<String>,
}

impl Validator<'_> {
    fn fail(&mut self, what: String) {
        self.errors.push(format!("{}: {what}", self.path.join("")));
    }

    fn at<R>(&mut self, seg: impl Into<String>, f: impl FnOnce(&mut Self) -> R) -> R {
        self.path.push(seg.into());
        let r = f(self);
        self.path.pop();
        r
    }

    /// `v` is an object with every `required` key and no key outside `allowed`.
    fn object(&mut self, v: &Value, required: &[&str], allowed: &[&str]) -> bool {
        let Some(o) = v.as_object() else {
            self.fail(format!("not an object: {v}"));
            return false;
        };
        for k in required {
            if !o.contains_key(*k) {
                self.fail(format!("missing required {k:?}"));
            }
        }
        for k in o.keys() {
            if !allowed.contains(&k.as_str()) && !required.contains(&k.as_str()) {
                self.fail(format!("property {k:?} is not allowed"));
            }
        }
        true
    }

    fn string(&mut self, v: &Value) {
        if !v.is_string() {
            self.fail(format!("not a string: {v}"));
        }
    }

    fn int_at_least(&mut self, v: &Value, min: i64) {
        match v.as_i64() {
            Some(n) if n >= min => {}
            _ => self.fail(format!("not an integer >= {min}: {v}")),
        }
    }

    fn array<'v>(&mut self, v: &'v Value) -> &'v [Value] {
        match v.as_array() {
            Some(a) => a,
            None => {
                self.fail(format!("not an array: {v}"));
                &[]
            }
        }
    }

    fn property_bag(&mut self, v: &Value) {
        // Any key is allowed; `tags`, when present, is an array of unique strings.
        if !v.is_object() {
            self.fail(format!("not an object: {v}"));
            return;
        }
        if let Some(tags) = v.get("tags") {
            let tags = self.array(tags);
            let set: HashSet<_> = tags.iter().filter_map(Value::as_str).collect();
            if set.len() != tags.len() {
                self.fail("tags are not unique strings".into());
            }
        }
    }

    fn message(&mut self, v: &Value) {
        // `message` needs `text` or `id`; `multiformatMessageString` needs `text`.
        self.object(
            v,
            &[],
            &["text", "markdown", "id", "arguments", "properties"],
        );
        if v.get("text").is_none() && v.get("id").is_none() {
            self.fail("message has neither text nor id".into());
        }
        if let Some(t) = v.get("text") {
            self.at(".text", |c| c.string(t));
        }
    }

    fn multiformat(&mut self, v: &Value) {
        self.object(v, &["text"], &["markdown", "properties"]);
        if let Some(t) = v.get("text") {
            self.string(t);
        }
    }

    fn artifact_location(&mut self, v: &Value) {
        self.object(
            v,
            &[],
            &["uri", "uriBaseId", "index", "description", "properties"],
        );
        if let Some(uri) = v.get("uri").and_then(Value::as_str) {
            // A URI reference: no spaces, backslashes or other characters outside RFC 3986.
            let bad = uri
                .chars()
                .find(|c| !(c.is_ascii_alphanumeric() || "-._~!$&'()*+,;=:@/?#%[]".contains(*c)));
            if let Some(c) = bad {
                self.fail(format!("uri {uri:?} holds {c:?}"));
            }
        }
        if let Some(i) = v.get("index") {
            self.int_at_least(i, -1);
        }
    }

    fn physical_location(&mut self, v: &Value) {
        self.object(
            v,
            &[],
            &[
                "address",
                "artifactLocation",
                "region",
                "contextRegion",
                "properties",
            ],
        );
        if v.get("address").is_none() && v.get("artifactLocation").is_none() {
            self.fail("physicalLocation needs address or artifactLocation".into());
        }
        if let Some(a) = v.get("artifactLocation") {
            self.at(".artifactLocation", |c| c.artifact_location(a));
        }
        if let Some(r) = v.get("region") {
            self.at(".region", |c| {
                c.object(
                    r,
                    &[],
                    &[
                        "startLine",
                        "startColumn",
                        "endLine",
                        "endColumn",
                        "charOffset",
                        "charLength",
                        "byteOffset",
                        "byteLength",
                        "snippet",
                        "message",
                        "sourceLanguage",
                        "properties",
                    ],
                );
                if r.get("startLine").is_none()
                    && r.get("charOffset").is_none()
                    && r.get("byteOffset").is_none()
                {
                    c.fail("region needs startLine, charOffset or byteOffset".into());
                }
                for k in ["startLine", "startColumn", "endLine", "endColumn"] {
                    if let Some(n) = r.get(k) {
                        c.at(format!(".{k}"), |c| c.int_at_least(n, 1));
                    }
                }
            });
        }
    }

    fn location(&mut self, v: &Value) {
        self.object(
            v,
            &[],
            &[
                "id",
                "physicalLocation",
                "logicalLocations",
                "message",
                "annotations",
                "relationships",
                "properties",
            ],
        );
        if let Some(id) = v.get("id") {
            self.at(".id", |c| c.int_at_least(id, -1));
        }
        if let Some(p) = v.get("physicalLocation") {
            self.at(".physicalLocation", |c| c.physical_location(p));
        }
        if let Some(ls) = v.get("logicalLocations") {
            for (i, l) in self.array(ls).iter().enumerate() {
                self.at(format!(".logicalLocations[{i}]"), |c| {
                    c.object(
                        l,
                        &[],
                        &[
                            "name",
                            "index",
                            "fullyQualifiedName",
                            "decoratedName",
                            "parentIndex",
                            "kind",
                            "properties",
                        ],
                    );
                    for k in ["name", "kind"] {
                        if let Some(s) = l.get(k) {
                            c.string(s);
                        }
                    }
                });
            }
        }
        if let Some(m) = v.get("message") {
            self.at(".message", |c| c.message(m));
        }
    }

    fn rule(&mut self, v: &Value) {
        self.object(
            v,
            &["id"],
            &[
                "deprecatedIds",
                "guid",
                "deprecatedGuids",
                "name",
                "deprecatedNames",
                "shortDescription",
                "fullDescription",
                "messageStrings",
                "defaultConfiguration",
                "helpUri",
                "help",
                "relationships",
                "properties",
            ],
        );
        for k in ["shortDescription", "fullDescription", "help"] {
            if let Some(m) = v.get(k) {
                self.at(format!(".{k}"), |c| c.multiformat(m));
            }
        }
        if let Some(d) = v.get("defaultConfiguration") {
            self.at(".defaultConfiguration", |c| {
                c.object(
                    d,
                    &[],
                    &["enabled", "level", "rank", "parameters", "properties"],
                );
                c.level(d.get("level"));
            });
        }
        if let Some(p) = v.get("properties") {
            self.at(".properties", |c| c.property_bag(p));
        }
    }

    fn level(&mut self, v: Option<&Value>) {
        if let Some(l) = v {
            if !["none", "note", "warning", "error"].contains(&l.as_str().unwrap_or_default()) {
                self.fail(format!("bad level {l}"));
            }
        }
    }

    fn result(&mut self, v: &Value, rules: &[Value]) {
        self.object(
            v,
            &["message"],
            &[
                "ruleId",
                "ruleIndex",
                "rule",
                "kind",
                "level",
                "analysisTarget",
                "locations",
                "guid",
                "correlationGuid",
                "occurrenceCount",
                "partialFingerprints",
                "fingerprints",
                "stacks",
                "codeFlows",
                "graphs",
                "graphTraversals",
                "relatedLocations",
                "suppressions",
                "baselineState",
                "rank",
                "attachments",
                "hostedViewerUri",
                "workItemUris",
                "provenance",
                "fixes",
                "taxa",
                "webRequest",
                "webResponse",
                "properties",
            ],
        );
        if let Some(m) = v.get("message") {
            self.at(".message", |c| c.message(m));
        }
        self.level(v.get("level"));
        if let Some(i) = v.get("ruleIndex") {
            self.int_at_least(i, -1);
            let rule = i.as_u64().and_then(|i| rules.get(i as usize));
            if rule.map(|r| &r["id"]) != v.get("ruleId") {
                self.fail("ruleIndex does not point at the rule of ruleId".into());
            }
        }
        if let Some(a) = v.get("analysisTarget") {
            self.at(".analysisTarget", |c| c.artifact_location(a));
        }
        for key in ["locations", "relatedLocations"] {
            if let Some(ls) = v.get(key) {
                let mut ids = HashSet::new();
                for (i, l) in self.array(ls).iter().enumerate() {
                    self.at(format!(".{key}[{i}]"), |c| c.location(l));
                    if let Some(id) = l.get("id").and_then(Value::as_i64) {
                        if !ids.insert(id) {
                            self.fail(format!("{key}: duplicate id {id}"));
                        }
                    }
                }
            }
        }
        if let Some(ss) = v.get("stacks") {
            for (i, s) in self.array(ss).iter().enumerate() {
                self.at(format!(".stacks[{i}]"), |c| {
                    c.object(s, &["frames"], &["message", "properties"]);
                    if let Some(m) = s.get("message") {
                        c.message(m);
                    }
                    for (j, f) in c.array(&s["frames"]).iter().enumerate() {
                        c.at(format!(".frames[{j}]"), |c| {
                            c.object(
                                f,
                                &[],
                                &["location", "module", "threadId", "parameters", "properties"],
                            );
                            if let Some(l) = f.get("location") {
                                c.location(l);
                            }
                        });
                    }
                });
            }
        }
        if let Some(fp) = v.get("partialFingerprints") {
            match fp.as_object() {
                Some(o) if o.values().all(Value::is_string) => {}
                _ => self.fail("partialFingerprints: not an object of strings".into()),
            }
        }
        if let Some(p) = v.get("properties") {
            self.at(".properties", |c| c.property_bag(p));
        }
    }

    fn log(&mut self, v: &Value) {
        self.object(
            v,
            &["version", "runs"],
            &["$schema", "inlineExternalProperties", "properties"],
        );
        if v["version"] != "2.1.0" {
            self.fail("version is not 2.1.0".into());
        }
        for (i, run) in self.array(&v["runs"]).iter().enumerate() {
            self.at(format!(".runs[{i}]"), |c| c.run(run));
        }
    }

    fn run(&mut self, run: &Value) {
        self.object(
            run,
            &["tool"],
            &[
                "invocations",
                "conversion",
                "language",
                "versionControlProvenance",
                "originalUriBaseIds",
                "artifacts",
                "logicalLocations",
                "graphs",
                "results",
                "automationDetails",
                "runAggregates",
                "baselineGuid",
                "redactionTokens",
                "defaultEncoding",
                "defaultSourceLanguage",
                "newlineSequences",
                "columnKind",
                "externalPropertyFileReferences",
                "threadFlowLocations",
                "taxonomies",
                "addresses",
                "translations",
                "policies",
                "webRequests",
                "webResponses",
                "specialLocations",
                "properties",
            ],
        );
        let tool = &run["tool"];
        self.at(".tool", |c| {
            c.object(tool, &["driver"], &["extensions", "properties"])
        });
        let driver = &tool["driver"];
        self.at(".tool.driver", |c| {
            c.object(
                driver,
                &["name"],
                &[
                    "guid",
                    "product",
                    "productSuite",
                    "shortDescription",
                    "fullDescription",
                    "fullName",
                    "version",
                    "semanticVersion",
                    "dottedQuadFileVersion",
                    "releaseDateUtc",
                    "downloadUri",
                    "informationUri",
                    "globalMessageStrings",
                    "notifications",
                    "rules",
                    "taxa",
                    "locations",
                    "language",
                    "contents",
                    "isComprehensive",
                    "localizedDataSemanticVersion",
                    "minimumRequiredLocalizedDataSemanticVersion",
                    "associatedComponent",
                    "translationMetadata",
                    "supportedTaxonomies",
                    "organization",
                    "properties",
                ],
            )
        });
        let rules = driver
            .get("rules")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let mut ids = HashSet::new();
        for (i, r) in rules.iter().enumerate() {
            self.at(format!(".tool.driver.rules[{i}]"), |c| c.rule(r));
            if !ids.insert(r["id"].as_str().unwrap_or_default().to_string()) {
                self.fail(format!("duplicate rule id {}", r["id"]));
            }
        }
        if let Some(arts) = run.get("artifacts") {
            for (i, a) in self.array(arts).iter().enumerate() {
                self.at(format!(".artifacts[{i}]"), |c| {
                    c.object(
                        a,
                        &[],
                        &[
                            "location",
                            "parentIndex",
                            "offset",
                            "length",
                            "roles",
                            "mimeType",
                            "contents",
                            "encoding",
                            "sourceLanguage",
                            "hashes",
                            "lastModifiedTimeUtc",
                            "description",
                            "properties",
                        ],
                    );
                    if let Some(l) = a.get("location") {
                        c.artifact_location(l);
                    }
                });
            }
        }
        if let Some(results) = run.get("results") {
            for (i, r) in self.array(results).iter().enumerate() {
                self.at(format!(".results[{i}]"), |c| c.result(r, &rules));
                if let Some(idx) = r
                    .get("analysisTarget")
                    .and_then(|a| a.get("index"))
                    .and_then(Value::as_u64)
                {
                    if run["artifacts"].get(idx as usize).is_none() {
                        self.fail(format!("results[{i}]: analysisTarget.index {idx} dangles"));
                    }
                }
            }
        }
        if let Some(p) = run.get("properties") {
            self.at(".properties", |c| c.property_bag(p));
        }
    }
}

fn validate(log: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    Validator {
        path: vec!["$".into()],
        errors: &mut errors,
    }
    .log(log);
    errors
}

fn example_traces() -> Vec<common::Fixture> {
    common::fixtures_with_extension(common::EXAMPLE_TRACES, "jsonl")
}

#[test]
fn every_example_trace_gives_a_structurally_valid_log() {
    let files = example_traces();
    assert!(files.len() >= 10, "{files:?}");
    let mut kinds = HashSet::new();
    for file in files {
        let report = check(file.text());
        for trace in [None, Some(file.path)] {
            let log = sarif(&report, trace);
            let errors = validate(&log);
            assert!(errors.is_empty(), "{}: {errors:#?}", file.path);
            assert_eq!(results(&log).len(), report.hazards.len());
        }
        kinds.extend(report.hazards.iter().map(|h| h.kind));
    }
    assert_eq!(
        kinds.len(),
        HazardKind::ALL.len(),
        "every kind is exercised"
    );
}

#[test]
fn the_validator_catches_broken_logs() {
    let good = sarif(&check(&race_with_site(r#""a.rs:1:2""#)), None);
    assert_eq!(validate(&good), Vec::<String>::new());
    let mut bad = good.clone();
    bad["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"]["startLine"] =
        0.into();
    bad["runs"][0]["results"][0]["ruleIndex"] = 3.into();
    bad["runs"][0]["results"][0]["level"] = "fatal".into();
    bad["runs"][0]["tool"]["driver"]["rules"][0]
        .as_object_mut()
        .expect("rule")
        .remove("id");
    bad["runs"][0]["extra"] = true.into();
    let errors = validate(&bad);
    for needle in [
        "startLine: not an integer >= 1",
        "ruleIndex does not point",
        "bad level",
        "missing required \"id\"",
        "\"extra\" is not allowed",
    ] {
        assert!(
            errors.iter().any(|e| e.contains(needle)),
            "{needle}: {errors:#?}"
        );
    }
}
