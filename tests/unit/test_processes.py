"""Processes by pid through psutil (triage_tools/processes.py), not by reading /proc by hand."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from triage_tools.processes import _group_alive, alive, group_members

ROOT = Path(__file__).resolve().parents[2]


def wait_for(condition: object, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if callable(condition) and condition():
            return True
        time.sleep(0.05)
    return False


def test_a_zombie_child_is_not_alive() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        # Not waited for: the exited child stays a zombie, which still answers kill(0).
        assert wait_for(lambda: not alive(child.pid))
        os.kill(child.pid, 0)
    finally:
        child.wait()
    assert not alive(child.pid)
    assert alive(os.getpid())


def test_a_group_lives_while_a_member_does_after_its_leader_died() -> None:
    # The leader starts a member of its own group and exits: the group lives on in the member.
    leader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])",
        ],
        start_new_session=True,
    )
    leader.wait()
    try:
        members = group_members(leader.pid)
        assert len(members) == 1
        assert members[0].pid != leader.pid
        assert _group_alive(leader.pid)
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
    assert wait_for(lambda: not group_members(leader.pid))


def test_no_hand_parsed_proc() -> None:
    sources = [*ROOT.glob("triage_tools/**/*.py"), *ROOT.glob("plugins/**/*.py")]
    assert [str(p.relative_to(ROOT)) for p in sources if '"/proc' in p.read_text() or "/proc/" in p.read_text()] == []
