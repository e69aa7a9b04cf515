"""``triage schemas`` (``make schemas``): write the event registry, the JSON schema of every
published event (:func:`triage.contracts.events.registry`), into ``include/schemas/``; with
``--check``, write nothing and exit 1 when a committed file differs from its model or no
model makes it.

Regenerate only for a change the compatibility rule calls additive (``docs/events.md``);
anything else is a new ``SCHEMA_VERSION`` with files of its own.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from triage.contracts.events import SUPPORTED_VERSIONS, registry, schema_text

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = ROOT / "include" / "schemas"


def differences(directory: Path = SCHEMAS) -> list[str]:
    """What differs between ``directory`` and the models: files to write, or to remove."""
    wanted = registry()
    found = {p.relative_to(directory).as_posix() for p in directory.rglob("*.json")}
    problems = [
        f"{name}: differs from its model" if name in found else f"{name}: missing"
        for name, schema in sorted(wanted.items())
        if name not in found or (directory / name).read_text(encoding="utf-8") != schema_text(schema)
    ]
    # Files of older versions that are still supported stay, as published.
    kept = {name for name in found if any(name.endswith(f".v{v}.json") for v in SUPPORTED_VERSIONS)}
    problems += [f"{name}: no model makes it" for name in sorted(found - set(wanted) - kept)]
    return problems


def write(directory: Path = SCHEMAS) -> list[str]:
    """Write every schema of the registry; the names written (changed or new)."""
    written = []
    for name, schema in sorted(registry().items()):
        path = directory / name
        text = schema_text(schema)
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            written.append(name)
    return written


def main(argv: Sequence[str] | None = None, prog: str = "triage schemas") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 on any difference")
    args = parser.parse_args(argv)
    if args.check:
        problems = differences()
        for problem in problems:
            print(f"include/schemas/{problem}", file=sys.stderr)
        return 1 if problems else 0
    for name in write():
        print(f"wrote include/schemas/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
