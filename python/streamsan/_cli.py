"""The `streamsan` command of the wheel: the same command line as the Rust binary."""

from __future__ import annotations

import signal
import sys


def main() -> None:
    from ._streamsan import run_cli

    # Ctrl-C ends the command at once, as it does the binary (the Rust code never returns to
    # Python while it runs).
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    except ValueError:  # not the main thread
        pass
    sys.stdout.flush()
    sys.exit(run_cli(["streamsan", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
