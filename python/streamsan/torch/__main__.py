"""python -m streamsan.torch [options] script.py [args…]: runs a script under streamsan.torch.check.

Prints the report to standard error and exits 1 when the script had hazards (2 on bad usage), or
with the script's own status when it failed; like `python -m cProfile`.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m streamsan.torch",
        description="Run a PyTorch script and check its streams, events and allocations as it runs.",
    )
    p.add_argument("--trace", help="also write the trace (format v1) to this file")
    p.add_argument("--backend", default="auto", choices=["auto", "native", "python"])
    p.add_argument("--format", default="text", choices=["text", "json", "sarif", "html"],
                   help="report format (default text)")
    p.add_argument("-o", "--output", help="write the report here instead of standard error")
    p.add_argument("-m", dest="module", action="store_true", help="run a module, as python -m")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)

    from . import check

    sys.argv = [a.script, *a.args]
    run = check(raise_on_hazard=False, trace=a.trace, backend=a.backend)
    status = 0
    with run:
        try:
            if a.module:
                runpy.run_module(a.script, run_name="__main__", alter_sys=True)
            else:
                sys.path.insert(0, os.path.dirname(os.path.abspath(a.script)))
                runpy.run_path(a.script, run_name="__main__")
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    report = run.report
    text = {
        "text": lambda: report.to_text(color=a.output is None and sys.stderr.isatty()),
        "json": report.to_json,
        "sarif": lambda: report.to_sarif(trace=a.trace),
        "html": report.to_html,
    }[a.format]()
    if a.output:
        with open(a.output, "w") as f:
            f.write(text)
    else:
        sys.stderr.write(text)
    if status:
        return status
    return 1 if report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
