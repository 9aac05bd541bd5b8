"""`python -m streamsan …` runs the `streamsan` command."""

from ._cli import main

main()
