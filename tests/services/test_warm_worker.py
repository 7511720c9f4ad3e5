"""A worker that replaces a killed one is warm: its first cell imports nothing.

After a hostile cell's worker is killed, the next cell (possibly an
urgent case's) runs on a new worker. The pool's fork server imports the analysis and runs
one small analysis (services/warm_analysis.py) before it forks any worker, so the new
worker starts with every module the analysis loads on first use. Asserted on outcomes (the
modules a first analysis imports, the worker's pid, the server's threads), not on times.
Each case runs in a fresh interpreter: a process has one fork server, whose preload is
that of the first pool it started (another test's pool may have started it already).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# A pool as the site's actor makes it (preload: the PRELOAD given in argv, "warm" = the
# product's), one worker killed, then a user's cell (image only) and a cell with its mask
# and slide on the replacement; prints what those first analyses imported.
SCRIPT = """
import json, multiprocessing.forkserver, os, sys
sys.path.insert(0, {tests!r})
from pathmaster.analysis.budget import AnalysisPool, CellStopped
from services.analysis import PRELOAD, WARM_MODULE
from services.synthetic import synthetic_case_cells
import warm_tasks
preload = PRELOAD if sys.argv[1] == "warm" else tuple(m for m in PRELOAD if m != WARM_MODULE)
cell = synthetic_case_cells(1, seed=5)[0]
with AnalysisPool(workers=1, preload=preload) as pool:
    killed = pool.warm_up()
    try:
        pool.run(warm_tasks.kill_self)
    except CellStopped as exc:
        assert exc.reason == "crashed", exc
    pid, alone = pool.run(warm_tasks.imports_during_analysis, cell["image"])
    _, with_parts = pool.run(warm_tasks.imports_during_analysis, cell["image"], cell["background"], cell["mask"])
    server = multiprocessing.forkserver._forkserver._forkserver_pid
    print(json.dumps(dict(killed=killed, pid=pid, alone=alone, with_parts=with_parts,
                          server_threads=len(os.listdir(f"/proc/{{server}}/task")),
                          peak_rss=pool.stats.peak_rss_bytes, limit=pool.budget.memory_bytes)))
"""


def first_analyses(preload: str) -> dict:
    code = SCRIPT.format(tests=str(Path(__file__).parent))
    done = subprocess.run([sys.executable, "-c", code, preload], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def warm():
    return first_analyses("warm")


def test_a_replacement_workers_first_analysis_imports_nothing(warm):
    assert warm["pid"] != warm["killed"]  # the killed worker was replaced
    assert warm["alone"] == []  # segmentation, slide estimate, features: all loaded already
    assert warm["with_parts"] == []
    assert warm["peak_rss"] < warm["limit"]


def test_the_fork_server_forks_with_one_thread_after_its_warm_up(warm):
    assert warm["server_threads"] == 1  # the warm-up left no library thread behind


def test_without_the_warm_up_a_first_analysis_imports_modules():
    # The control: the measure above sees a cold worker's lazy imports.
    cold = first_analyses("cold")
    assert cold["pid"] != cold["killed"]
    assert len(cold["alone"]) > 0 and any(name.startswith("skimage.") for name in cold["alone"])
