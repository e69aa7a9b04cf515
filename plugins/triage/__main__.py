from __future__ import annotations

from triage.cli import main

raise SystemExit(main())
