"""What the synchronization analysis says, in a program's own words.

`describe(report)` turns `report.syncs_by_site()` into one sentence per call site, redundant
sites first:

    .item() at train.py:88 synchronized the host 1,000 times; none was needed
    wait_stream at train.py:52 made a stream wait 200 times; 100 were needed

The op kinds of the trace are named by what a PyTorch program calls: where the site is a
`file:line` whose source line holds one of the calls below, that call names it (`.item()`,
`.cpu()`, `torch.cuda.synchronize()`, …); otherwise the kind does (`a stream synchronization`,
`an event wait`, …).
"""

from __future__ import annotations

import linecache
import re
from typing import Any, Optional

# Calls that synchronize, as they appear in source lines, most specific first.
_CALLS = [
    (".item()", ".item()"),
    (".tolist()", ".tolist()"),
    (".cpu()", ".cpu()"),
    (".numpy()", ".numpy()"),
    ("cuda.synchronize(", "torch.cuda.synchronize()"),
    (".synchronize()", ".synchronize()"),
    ("wait_stream(", "wait_stream"),
    ("wait_event(", "wait_event"),
    (".wait(", ".wait()"),
    ("record_stream(", "record_stream"),
    (".query()", ".query()"),
    ("print(", "print()"),
]

_KINDS = {
    "stream_sync": "a stream synchronization",
    "device_sync": "a device synchronization",
    "event_sync": "an event synchronization",
    "event_query": "an event query",
    "stream_query": "a stream query",
    "event_wait": "an event wait",
    "record_stream": "record_stream",
}

_SITE = re.compile(r"^(?P<file>.+):(?P<line>\d+)(?::\d+)?$")


def _call_at(site: Optional[str]) -> Optional[str]:
    """The synchronizing call on the source line of `site` (`file:line`), if it shows one."""
    if not site:
        return None
    frame = site.split(" <- ", 1)[0]
    m = _SITE.match(frame)
    if not m:
        return None
    text = linecache.getline(m["file"], int(m["line"]))
    for needle, name in _CALLS:
        if needle in text:
            return name
    return None


def _what_it_did(kinds: list[str], count: int) -> str:
    times = f"{count:,} time{'s' if count != 1 else ''}"
    if all(k in ("stream_sync", "device_sync", "event_sync", "event_query", "stream_query") for k in kinds):
        return f"synchronized the host {times}"
    if kinds == ["event_wait"]:
        return f"made a stream wait {times}"
    if kinds == ["record_stream"]:
        return f"held memory back from reuse {times}"
    return f"synchronized {times}"


def _needed(needed: int, count: int) -> str:
    if needed == 0:
        return "it was not needed" if count == 1 else "none was needed"
    if needed == count:
        return "it was needed" if count == 1 else "all were needed"
    return f"{needed:,} {'was' if needed == 1 else 'were'} needed"


def describe(report: Any) -> list[str]:
    """One sentence per site of the report's synchronization analysis, redundant sites first;
    an empty list without the analysis (`syncs=False`)."""
    sites = report.syncs_by_site()
    if sites is None:
        return []
    out = []
    for s in sites:
        site = s["site"]
        what = _call_at(site) or " or ".join(_KINDS.get(k, k) for k in s["kinds"])
        where = f"at {site}" if site else f"at op {s['ops'][0]}"
        line = f"{what} {where} {_what_it_did(s['kinds'], s['count'])}; {_needed(s['needed'], s['count'])}"
        if s["needed"] and s["prevents"]:
            p = s["prevents"][0]
            more = len(s["prevents"]) - 1
            line += f" (without it: {p['kind']} on {p['buffer']} at op {p['op']}"
            line += f" and {more} more)" if more else ")"
        out.append(line)
    return out
