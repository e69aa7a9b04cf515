from __future__ import annotations

if __name__ == "__main__":
    from triage.cli import main

    raise SystemExit(main())
