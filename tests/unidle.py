"""Give a process tree back normal scheduling: every thread under PID that runs SCHED_IDLE.

`make test` starts the rest of the suite under SCHED_IDLE beside the measuring tests, so
that it takes only the CPU they leave. Once they are done, nothing needs protecting and the
rest must not starve behind whatever else the machine runs: this switches every thread of
PID and its descendants (Ray, sites, browsers they started meanwhile) from SCHED_IDLE to
SCHED_OTHER. Other policies (an emulator's SCHED_FIFO) are left as they are. Scheduling
policy is per thread on Linux and a child takes its parent's at fork, so every thread is
visited and what starts afterwards is normal.

Usage: python tests/unidle.py PID
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def children_by_parent() -> dict[int, list[int]]:
    """{parent pid: [child pids]} of every process now running."""
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # the command name (field 2) may hold spaces and ')': the parent follows the last ')'
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        tree.setdefault(parent, []).append(int(entry.name))
    return tree


def unidle(root: int) -> int:
    """Switch every SCHED_IDLE thread of `root` and its descendants to SCHED_OTHER; how many."""
    tree, todo, switched = children_by_parent(), [root], 0
    while todo:
        pid = todo.pop()
        todo.extend(tree.get(pid, []))
        try:
            threads = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
        except OSError:
            continue
        for tid in threads:
            try:
                if os.sched_getscheduler(tid) == os.SCHED_IDLE:
                    os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
                    switched += 1
            except OSError:
                continue  # ended meanwhile
    return switched


if __name__ == "__main__":
    print(f"make test: {unidle(int(sys.argv[1]))} threads of the rest back to normal scheduling")
