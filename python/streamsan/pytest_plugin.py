"""The pytest plugin of streamsan (entry point `pytest11`).

- `pytest --streamsan` runs every test under `streamsan.torch.check()`: a test with hazards fails
  with the text report.
- `@pytest.mark.streamsan` does it for one test (or a module, with `pytestmark`).
- The `streamsan` fixture is a running check (`streamsan.torch.Run`) for the test: its hazards
  fail the test at teardown, and `streamsan.hazards` shows what was found so far.
- `pytest --streamsan-syncs` checks every test (as `--streamsan`) with the synchronization
  analysis too, and ends the run with a section that lists, per test, which synchronizations
  were needed and which were paid for for nothing ("`.item()` at train.py:88 synchronized the
  host 1,000 times; none was needed"), redundant sites first. It never fails a test.

Under torchrun each rank checks its own tests; a failure's message names the rank.

torch is imported only when a test is checked.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("streamsan")
    group.addoption(
        "--streamsan",
        action="store_true",
        default=False,
        help="check every test's CUDA streams, events and allocations with streamsan.torch",
    )
    group.addoption(
        "--streamsan-syncs",
        action="store_true",
        default=False,
        help="check every test with streamsan.torch and list which synchronizations it needed",
    )
    group.addoption(
        "--streamsan-backend",
        default="auto",
        choices=["auto", "native", "python"],
        help="the recorder streamsan.torch uses (default: auto)",
    )


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "streamsan: check this test's CUDA streams and allocations with streamsan.torch"
    )
    if config.getoption("--streamsan") or config.getoption("--streamsan-syncs"):
        # Every test is checked: Triton's wrappers and Tensor.tolist's stay in place from one
        # test's check to the next (put back when the session ends).
        from streamsan.torch import _recorder

        _recorder._KEEP_WRAPPERS = True


def pytest_unconfigure(config):
    if config.getoption("--streamsan") or config.getoption("--streamsan-syncs"):
        from streamsan.torch import _recorder

        _recorder._KEEP_WRAPPERS = False
        try:
            _recorder.release_triton_hooks()
        finally:
            _recorder.release_kept_methods()  # torch.Tensor.tolist's wrapper


def _checked(item) -> bool:
    if "streamsan" in getattr(item, "fixturenames", ()):
        return False  # the fixture checks it
    return bool(
        item.config.getoption("--streamsan")
        or item.config.getoption("--streamsan-syncs")
        or item.get_closest_marker("streamsan")
    )


def _note_syncs(config, nodeid: str, run) -> None:
    """Keeps what the analysis said of a test's synchronizations, for the summary."""
    if run.syncs:
        config.stash.setdefault(_SYNCS, []).append((nodeid, run.syncs))


_SYNCS = pytest.StashKey()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    found = config.stash.get(_SYNCS, [])
    if not config.getoption("--streamsan-syncs"):
        return
    terminalreporter.section("streamsan synchronizations")
    if not found:
        terminalreporter.write_line("no test synchronized")
        return
    for nodeid, lines in found:
        terminalreporter.write_line(nodeid)
        for line in lines:
            terminalreporter.write_line("  " + line)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    if not _checked(item):
        return (yield)
    from streamsan.torch import check

    syncs = item.config.getoption("--streamsan-syncs")
    run = check(
        raise_on_hazard=False,
        backend=item.config.getoption("--streamsan-backend"),
        syncs=syncs,
        print_syncs=False,
    )
    run.__enter__()
    try:
        result = yield
    finally:
        run.__exit__(None, None, None)
        _note_syncs(item.config, item.nodeid, run)
    if run.report is not None and run.report.errors:
        from streamsan import HazardError

        raise HazardError(run.report, header=run.header)
    return result


@pytest.fixture
def streamsan(request):
    """A running streamsan.torch check for this test; its hazards fail the test."""
    from streamsan.torch import check

    run = check(
        raise_on_hazard=False,
        backend=request.config.getoption("--streamsan-backend"),
        syncs=request.config.getoption("--streamsan-syncs"),
        print_syncs=False,
    )
    with run:
        yield run
    _note_syncs(request.config, request.node.nodeid, run)
    if run.report is not None and run.report.errors:
        from streamsan import HazardError

        raise HazardError(run.report, header=run.header)
