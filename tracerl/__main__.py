"""``python -m tracerl``: the same entry point as the ``tracerl`` console script."""

from tracerl.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
