"""The embedded checker: streamsan.Checker, Report, check_trace, HazardError, the command."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import streamsan

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRACES = os.path.join(ROOT, "examples", "traces")
REUSE = os.path.join(TRACES, "reuse-without-record-stream.jsonl")


def lines(path):
    with open(path) as f:
        return f.read().splitlines()


def cli(*args, **kw):
    kw.setdefault("timeout", 300)  # no test hangs on a child: past it, killed and failed
    return subprocess.run([sys.executable, "-m", "streamsan", *args], capture_output=True, text=True, **kw)


def test_push_returns_the_hazards_of_each_op():
    c = streamsan.Checker(explain=False)
    assert c.push({"op": "alloc", "buffer": "a", "bytes": 4096, "stream": "s1"}) == []
    assert c.push('{"op":"launch","stream":"s1","writes":["a"]}') == []
    raised = c.push(b'{"op":"launch","stream":"s2","reads":[{"buffer":"a","offset":1024,"bytes":8}]}\n')
    assert [h["kind"] for h in raised] == ["data-race"]
    h = raised[0]
    assert h["op"] == 2 and h["buffer"] == "a" and h["pattern"] == "read-after-write"
    assert h["access"] == {"op": 2, "participant": "s2", "access": "read", "offset": 1024, "bytes": 8, "site": None}
    assert [x["op"] for x in h["conflicts"]] == [1]
    assert c.ops == 3
    r = c.finish()
    assert (r.ops, r.errors, r.warnings, r.clean) == (3, 1, 0, False)
    assert r.hazards == [h]
    assert c.finished


def test_report_is_the_cli_report(tmp_path):
    c = streamsan.Checker()
    found = []
    for line in lines(REUSE):
        found += c.push(line)
    r = c.finish()
    out = cli("check", "--format", "json", REUSE)
    assert out.returncode == 1
    cli_report = json.loads(out.stdout)
    assert json.loads(r.to_json())["hazards"] == cli_report["hazards"]
    assert r.hazards == cli_report["hazards"] == found
    assert (r.errors, r.warnings, r.ops) == (cli_report["errors"], cli_report["warnings"], cli_report["ops"])
    # The text report is the command's, with explanations.
    text = r.to_text()
    assert "why:" in text and "help:" in text
    cli_text = cli("check", "--color", "never", REUSE).stdout
    assert text.replace("<ops>", REUSE) == cli_text


def test_check_trace_and_renderings():
    r = streamsan.check_trace(REUSE)
    assert [h["kind"] for h in r.hazards] == ["unsafe-free", "reuse-race"]
    assert r.to_text() == cli("check", "--color", "never", REUSE).stdout
    sarif = json.loads(r.to_sarif(trace=REUSE))
    assert sarif["version"] == "2.1.0" and len(sarif["runs"][0]["results"]) == 2
    assert sarif == json.loads(cli("check", "--format", "sarif", REUSE).stdout)
    html = r.to_html()
    assert html.lstrip().lower().startswith("<!doctype html") and "grad" in html
    assert r.to_dot().startswith("digraph")
    assert "unsafe-free on grad at op 7 (train.py:45)" in repr(r)
    assert str(r) == r.to_text()


def test_clean_trace():
    r = streamsan.check_trace(os.path.join(TRACES, "reuse-with-record-stream.jsonl"))
    assert r.clean and r.errors == 0 and r.hazards == []
    assert "no hazards" in r.to_text()
    assert "<html" in r.to_html().lower()


def test_trace_file_is_written_and_checks_the_same(tmp_path):
    path = tmp_path / "t.jsonl"
    c = streamsan.Checker(trace=path)
    c.push_lines("\n".join(lines(REUSE)))
    r = c.finish()
    assert lines(path) == lines(REUSE)
    assert streamsan.check_trace(path).hazards == r.hazards
    assert "why:" in r.to_text()


def test_a_checkers_report_is_explained_when_its_text_is_asked_for():
    """A Checker's report reads its kept ops again only for the text (and the pictures): its
    hazards and JSON come first, without them; the text then has every `why:`, each time."""
    c = streamsan.Checker()
    c.push_lines("\n".join(lines(REUSE)) + "\n")
    r = c.finish()
    assert r.errors == 2 and len(r.hazards) == 2 and '"hazards"' in r.to_json()
    text = r.to_text()
    assert text.count("why:") == 2, text
    assert r.to_text() == text == str(r)
    assert "<html" in r.to_html().lower()


def test_a_report_of_a_trace_file_written_over_later_keeps_its_explanations(tmp_path):
    """The ops kept in the caller's trace file are explained when the check ends: a later check
    that writes the same file does not change what the first report says."""
    path = tmp_path / "t.jsonl"
    c = streamsan.Checker(trace=path)
    c.push_lines("\n".join(lines(REUSE)) + "\n")
    first = c.finish()
    c = streamsan.Checker(trace=path)
    c.push_lines("\n".join(lines(os.path.join(TRACES, "reuse-with-record-stream.jsonl"))) + "\n")
    assert c.finish().clean
    assert first.to_text().count("why:") == 2, first.to_text()


def test_without_explanations():
    c = streamsan.Checker(explain=False)
    c.push_lines("\n".join(lines(REUSE)) + "\n")
    r = c.finish()
    assert r.errors == 2 and "why:" not in r.to_text() and "help:" in r.to_text()
    with pytest.raises(ValueError, match="not kept"):
        r.to_html()


def test_bad_input_raises_located_trace_error():
    c = streamsan.Checker(explain=False, name="mine")
    c.push({"op": "alloc", "buffer": "a", "bytes": 16})
    with pytest.raises(streamsan.TraceError, match=r'^mine:2:7: unknown op "lanch"; expected one of'):
        c.push('{"op":"lanch","stream":"s"}')
    with pytest.raises(streamsan.TraceError, match=r"^mine:3:\d+: .*alloc"):
        c.push({"op": "alloc", "buffer": "a", "bytes": 16})  # a live name
    with pytest.raises(streamsan.TraceError, match=r"^mine:4:"):
        c.push({"op": "launch", "stream": "s", "reads": [{"buffer": "a", "offset": 8, "bytes": 16}]})
    with pytest.raises(streamsan.TraceError, match=r"^mine:5:"):
        c.push({"op": "free", "buffer": "a", "bytes": -1})
    assert issubclass(streamsan.TraceError, ValueError)
    with pytest.raises(TypeError):
        c.push(42)
    with pytest.raises(TypeError):
        c.push({"op": "free", "buffer": object()})
    with pytest.raises(ValueError, match="one op"):
        c.push('{"op":"device_sync"}\n{"op":"device_sync"}')
    # The bad ops were not checked; the checker goes on.
    assert c.ops == 1
    c.push({"op": "free", "buffer": "a"})
    r = c.finish()
    assert r.clean and r.ops == 2
    with pytest.raises(ValueError, match="finished"):
        c.push({"op": "device_sync"})
    with pytest.raises(ValueError, match="finished"):
        c.finish()


def test_push_lines_stops_at_the_bad_line():
    c = streamsan.Checker(explain=False)
    text = '{"op":"alloc","buffer":"a","bytes":16}\n# a comment\n\n{"op":"free","buffer":"a"}\n{"op":"free","buffer":"a"}\n{"op":"bad"}\n{"op":"device_sync"}\n'
    with pytest.raises(streamsan.TraceError, match=r"^<ops>:6:"):
        c.push_lines(text)
    r = c.finish()
    assert r.ops == 3 and [h["kind"] for h in r.hazards] == ["invalid-free"]


def test_check_trace_errors(tmp_path):
    with pytest.raises(OSError, match="cannot open"):
        streamsan.check_trace(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"op":"alloc","buffer":"a","bytes":16}\n{"op":"launch","stream":"host"}\n')
    with pytest.raises(streamsan.TraceError, match=r"bad.jsonl:2:"):
        streamsan.check_trace(bad)


def test_hazard_error_message_is_the_text_report():
    r = streamsan.check_trace(REUSE)
    e = streamsan.HazardError(r)
    assert str(e) == r.to_text() and e.report is r
    assert isinstance(e, AssertionError)


def test_hazard_error_header():
    r = streamsan.check_trace(REUSE)
    e = streamsan.HazardError(r, header="streamsan.torch: rank 1 of 2, pid 7")
    assert str(e) == "streamsan.torch: rank 1 of 2, pid 7\n" + r.to_text() and e.header.endswith("pid 7")


def test_stats_follow_what_the_checker_keeps():
    c = streamsan.Checker(explain=False)
    assert c.stats()["ops"] == 0
    c.push({"op": "alloc", "buffer": "a", "bytes": 4096, "stream": "s1", "addr": 4096})
    c.push({"op": "launch", "stream": "s1", "writes": ["a"]})
    c.push({"op": "launch", "stream": "s2", "reads": ["a"]})
    s = c.stats()
    assert set(s) >= {"ops", "participants", "generations", "graveyard", "history", "hazards"}
    assert (s["ops"], s["generations"], s["hazards"]) == (3, 1, 1)
    assert s["history"] >= 2 and s["participants"] >= 3
    c.push({"op": "free", "buffer": "a"})
    # The freed buffer's accesses (s1's write, s2's read) stay as tombstones for reuse checks
    # until the host synchronizes with them.
    assert c.stats()["graveyard"] == 2
    c.finish()
    assert c.stats() == {}


def test_the_command(tmp_path):
    out = cli("--version")
    assert out.returncode == 0 and out.stdout.startswith("streamsan ")
    assert cli("check", REUSE).returncode == 1
    assert cli("check", os.path.join(TRACES, "reuse-with-record-stream.jsonl")).returncode == 0
    bad = cli("check", str(tmp_path / "missing.jsonl"))
    assert bad.returncode == 2 and "cannot open" in bad.stderr
    fixed = tmp_path / "fixed.jsonl"
    assert cli("fix", REUSE, "-o", str(fixed)).returncode == 0
    assert streamsan.check_trace(fixed).clean
    assert cli("bogus").returncode == 2


def test_console_script_is_installed():
    import shutil

    exe = shutil.which("streamsan", path=os.path.dirname(sys.executable))
    if exe is None:
        pytest.skip("no streamsan script beside this Python (not installed with pip?)")
    out = subprocess.run([exe, "check", "--format", "json", REUSE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and json.loads(out.stdout)["errors"] == 2
