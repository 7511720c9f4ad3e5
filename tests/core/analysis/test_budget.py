"""pathmaster.analysis.budget: the pixel cap (from the header) and the bounded analysis pool.

The pool's tests assert outcomes (which error, that the next task runs on a fresh worker,
peak memory under the limit), never wall-clock durations: the CPU budget is counted by the
kernel in CPU seconds, so a busy machine changes how long a test takes, not what it sees.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

from pathmaster import defaults
from pathmaster.analysis.budget import (
    THREAD_VARIABLES,
    AnalysisPool,
    CellBudget,
    CellStopped,
    check_analysis_size,
)
from pathmaster.image.io import encode_png
from pathmaster.records import InvalidInput

sys.path.insert(0, str(Path(__file__).parent))
import budget_tasks as tasks  # noqa: E402  (the workers import it by this name)

LIMIT = 1024**3  # 1 GiB of address space for the test pool's workers
# 1 CPU second (the kernel counts whole seconds); the wall-clock cap is far beyond it so
# that only the CPU budget can stop burn_cpu, however busy the machine is.
BUDGET = CellBudget(floor_s=1.0, per_megapixel_s=0.0, wall_factor=600.0, memory_bytes=LIMIT)


@pytest.fixture(scope="module")
def pool():
    with AnalysisPool(workers=1, budget=BUDGET) as running:
        yield running


def flat_png(width: int, height: int) -> bytes:
    return encode_png(np.full((height, width, 3), 200, np.uint8), compress_level=9)


def test_a_field_of_view_is_refused_from_its_header():
    png = flat_png(4096, 4096)
    assert len(png) < 200_000  # a small file: only its header says how big it is
    with pytest.raises(InvalidInput) as err:
        check_analysis_size(png, "cell 'field.png' image")
    message = str(err.value)
    assert "'field.png'" in message and "4096 x 4096" in message
    assert str(defaults.MAX_ANALYSIS_PIXELS) in message and "crop the cell" in message


def test_a_cell_sized_image_passes_and_garbage_is_not_an_image():
    assert check_analysis_size(flat_png(1024, 1024), "cell") == 1024 * 1024
    assert check_analysis_size(flat_png(300, 200), "cell") == 60_000
    with pytest.raises(InvalidInput, match="not an image"):
        check_analysis_size(b"not a png at all", "cell 'x'")


def test_budget_scales_with_pixels_from_a_floor():
    budget = CellBudget(floor_s=2.0, per_megapixel_s=10.0)
    assert budget.cpu_s(0) == 2.0 and budget.cpu_s(10**6) == 12.0
    assert CellBudget().cpu_s(defaults.MAX_ANALYSIS_PIXELS) > CellBudget().cpu_s(300 * 300)


def test_tasks_run_in_a_worker_with_one_thread_each(pool):
    assert pool.run(tasks.double, 21) == 42
    assert set(pool.run(tasks.thread_settings).values()) == {"1"}
    import pathmaster._single_thread as names  # the fork server's copy of the names
    assert all(name in open(names.__file__).read() for name in THREAD_VARIABLES)


def test_workers_keep_freed_memory_for_their_next_arrays(pool):
    # A 24 MiB buffer gets its own mapping (returned to the kernel when freed, faulted in
    # anew next time) in a process with glibc's defaults, and comes from the heap in an
    # analysis worker (pathmaster.analysis.budget.keep_freed_memory).
    size = 24 * 2**20
    import subprocess
    default = subprocess.run([sys.executable, "-c", "import budget_tasks; print(budget_tasks.mapped_bytes_holding("
                              f"{size}))"], cwd=Path(__file__).parent, capture_output=True, text=True, check=True)
    assert int(default.stdout) >= size  # the control: without the setting it is mapped
    assert pool.run(tasks.mapped_bytes_holding, size) < size


def test_a_task_over_its_cpu_budget_is_killed_and_the_worker_replaced(pool):
    before = pool.run(tasks.worker_pid)
    with pytest.raises(CellStopped) as err:
        pool.run(tasks.burn_cpu, name="cell 'slow.png'")
    assert err.value.reason == "budget"
    assert "cell 'slow.png'" in str(err.value) and "longer than its budget of 1 s" in str(err.value)
    after = pool.run(tasks.worker_pid)
    assert after != before and pool.run(tasks.double, 2) == 4  # a fresh worker serves the next


@pytest.mark.parametrize("task", [tasks.exit_now, tasks.kill_self])
def test_a_worker_that_dies_is_replaced(pool, task):
    with pytest.raises(CellStopped) as err:
        pool.run(task, name="cell 'c'")
    assert err.value.reason == "crashed" and "not analysed" in str(err.value)
    assert pool.run(tasks.double, 5) == 10


def test_a_task_past_the_memory_limit_gets_a_clear_error_and_peak_stays_under(pool):
    with pytest.raises(CellStopped) as err:
        pool.run(tasks.allocate, name="cell 'big'")
    assert err.value.reason == "memory" and "limit of 1024 MiB" in str(err.value)
    assert pool.run(tasks.double, 3) == 6
    assert 0 < pool.stats.peak_rss_bytes < LIMIT


def test_the_tasks_own_errors_come_through(pool):
    with pytest.raises(ValueError, match="bad cell"):
        pool.run(tasks.refuse, "bad cell")
    assert pool.run(tasks.double, 1) == 2


def test_a_passed_deadline_means_not_started(pool):
    completed = pool.stats.completed
    with pytest.raises(CellStopped) as err:
        pool.run(tasks.double, 1, deadline=time.time() - 1, name="cell 'late'")
    assert err.value.reason == "deadline" and "not analysed" in str(err.value)
    assert pool.stats.completed == completed and pool.stats.not_started >= 1


def test_a_running_task_is_stopped_at_its_deadline(pool):
    # block() uses no CPU: only the deadline can stop it (the wall cap is 600 s).
    with pytest.raises(CellStopped) as err:
        pool.run(tasks.block, 600, deadline=time.time() + 1.0, name="cell 'w'")
    assert err.value.reason == "deadline" and "deadline passed" in str(err.value)
    assert pool.run(tasks.double, 4) == 8


def test_work_that_blocks_is_stopped_by_the_wall_cap():
    budget = CellBudget(floor_s=1.0, per_megapixel_s=0.0, wall_factor=1.0, memory_bytes=LIMIT)
    with AnalysisPool(budget=budget) as pool:
        with pytest.raises(CellStopped) as err:
            pool.run(tasks.block, 600, name="cell 'b'")
        assert err.value.reason == "budget" and "wall clock" in str(err.value)
        assert pool.run(tasks.double, 6) == 12


def test_a_cancelled_task_is_not_started(pool):
    completed, cancelled = pool.stats.completed, pool.stats.cancelled
    with pytest.raises(CellStopped) as err:
        pool.run(tasks.double, 1, name="cell 'gone'", should_stop=lambda: True)
    assert err.value.reason == "cancelled" and "not analysed" in str(err.value)
    assert pool.stats.completed == completed and pool.stats.cancelled == cancelled + 1
    assert pool.stats.events[-1][1:] == ("cell 'gone'", "cancelled")


def test_a_running_task_is_stopped_when_its_caller_cancels_and_the_worker_replaced(pool, tmp_path):
    started = tmp_path / "started"  # the task writes its worker's pid here once it runs
    # block() uses no CPU and the wall cap is 600 s: only the cancellation can stop it
    with pytest.raises(CellStopped) as err:
        pool.run(tasks.announce_and_block, str(started), 600, name="cell 'c'", should_stop=started.exists)
    assert err.value.reason == "cancelled" and "case was cancelled" in str(err.value)
    assert pool.stats.events[-1][1:] == ("cell 'c'", "cancelled")
    assert pool.run(tasks.worker_pid) != int(started.read_text())  # killed, and a fresh worker serves


def test_a_worker_ends_at_sigterm_whatever_its_fork_server_caught():
    # pebble stops a worker with SIGTERM and waits 3 s before SIGKILL; a handler inherited
    # from the fork server (a Ray worker's imports Ray) held every stop those 3 s. A fresh
    # interpreter: a process has one fork server, preloaded by the first pool it starts.
    import os
    import subprocess

    repo = str(Path(__file__).resolve().parents[3])  # the fork server finds pathmaster here
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")])))
    code = ("from pathmaster.analysis.budget import AnalysisPool\n"
            "import budget_tasks\n"
            "with AnalysisPool(workers=1, preload=('sigterm_catcher',)) as pool:\n"
            "    print(pool.run(budget_tasks.sigterm_is_default))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parent, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "True"


MAIN_SCRIPT = """
import os, sys
sys.path.insert(0, {tests!r})
with open({ran!r}, "a") as f:  # every run of this script, by pid
    f.write(f"{{os.getpid()}}\\n")
if __name__ == "__main__":
    import budget_tasks
    from pathmaster.analysis.budget import AnalysisPool, CellStopped
    with AnalysisPool(workers=1) as pool:
        first = pool.warm_up()
        try:
            pool.run(budget_tasks.kill_self)
        except CellStopped:
            pass
        print(first, pool.run(budget_tasks.worker_pid))
"""


def test_workers_do_not_run_the_parents_main_script_again(tmp_path):
    # Python 3.11's fork server ignores its "__main__" preload, so each new worker ran the
    # parent's main script (in a Ray actor: Ray's default_worker.py, ~1 s of CPU) before
    # its first task; the server runs it once (pathmaster/_forkserver_main.py).
    import os
    import subprocess

    ran = tmp_path / "ran.txt"
    script = tmp_path / "main_script.py"
    script.write_text(MAIN_SCRIPT.format(tests=str(Path(__file__).parent), ran=str(ran)))
    repo = str(Path(__file__).resolve().parents[3])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    workers = set(done.stdout.split())
    runs = ran.read_text().split()
    assert len(workers) == 2  # the first worker and its replacement
    assert not workers & set(runs)  # neither ran the script
    assert len(runs) == 2  # the parent (as __main__) and the fork server (as __mp_main__)
