"""The pytest plugin of streamsan (entry point `pytest11`).

- `pytest --streamsan` runs every test under `streamsan.torch.check()`: a test with hazards fails
  with the text report.
- `@pytest.mark.streamsan` does it for one test (or a module, with `pytestmark`).
- The `streamsan` fixture is a running check (`streamsan.torch.Run`) for the test: its hazards
  fail the test at teardown, and `streamsan.hazards` shows what was found so far.

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
        "--streamsan-backend",
        default="auto",
        choices=["auto", "native", "python"],
        help="the recorder streamsan.torch uses (default: auto)",
    )


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "streamsan: check this test's CUDA streams and allocations with streamsan.torch"
    )


def _checked(item) -> bool:
    if "streamsan" in getattr(item, "fixturenames", ()):
        return False  # the fixture checks it
    return bool(item.config.getoption("--streamsan") or item.get_closest_marker("streamsan"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    if not _checked(item):
        return (yield)
    from streamsan.torch import check

    run = check(raise_on_hazard=False, backend=item.config.getoption("--streamsan-backend"))
    run.__enter__()
    try:
        result = yield
    finally:
        run.__exit__(None, None, None)
    if run.report is not None and run.report.errors:
        from streamsan import HazardError

        raise HazardError(run.report, header=run.header)
    return result


@pytest.fixture
def streamsan(request):
    """A running streamsan.torch check for this test; its hazards fail the test."""
    from streamsan.torch import check

    run = check(raise_on_hazard=False, backend=request.config.getoption("--streamsan-backend"))
    with run:
        yield run
    if run.report is not None and run.report.errors:
        from streamsan import HazardError

        raise HazardError(run.report, header=run.header)
