"""``python -m triage_tools``: the ``triage`` command without its console script."""

from __future__ import annotations

if __name__ == "__main__":
    from triage_tools.cli import main

    raise SystemExit(main())
