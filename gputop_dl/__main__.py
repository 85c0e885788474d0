"""``python -m gputop_dl`` runs the ``gputop`` command."""

from gputop_dl.tui.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
