"""Clean provenance: an experiment refuses uncommitted code unless told
--allow-dirty (and records it), a resume refuses other code than the start's, and a run's
queue counters are never negative, even across an emulator restart. Git runs on a throwaway
repository, so these tests do not depend on the state of the checkout they run in."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pathmaster.records import InvalidInput
from qos.experiment.matrix import expand
from qos.experiment.runner import counter_delta, drain_competing
from qos.experiment.spec import parse_spec
from qos.experiment.store import Store, git_state

SPEC = {
    "experiment": {"name": "t", "repetitions": 1},
    "strategies": {"fifo": {"discipline": "fifo"}},
    "links": [{"name": "a", "core_kbit": 1000}],
}


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "code"
    root.mkdir()
    _git(root, "init", "-q")
    _git(root, "config", "user.email", "t@example.org")
    _git(root, "config", "user.name", "t")
    (root / "mod.py").write_text("X = 1\n")
    _git(root, "add", "mod.py")
    _git(root, "commit", "-q", "-m", "first")
    return root


def test_git_state_lists_changed_and_new_modules_only(repo):
    clean = git_state(repo)
    assert clean["uncommitted"] == [] and clean["diff_sha256"] == "" and len(clean["commit"]) == 40
    (repo / "notes.txt").write_text("an untracked output file does not change the code\n")
    assert git_state(repo)["uncommitted"] == []
    (repo / "mod.py").write_text("X = 2\n")
    (repo / "new.py").write_text("Y = 1\n")
    dirty = git_state(repo)
    assert sorted(dirty["uncommitted"]) == ["mod.py", "new.py"] and dirty["diff_sha256"]
    (repo / "mod.py").write_text("X = 3\n")
    assert git_state(repo)["diff_sha256"] != dirty["diff_sha256"]  # other changes, other fingerprint


def test_a_dirty_tree_is_refused_with_what_is_uncommitted_and_what_to_do(repo, tmp_path):
    exp = parse_spec(SPEC)
    (repo / "mod.py").write_text("X = 2\n")
    out = tmp_path / "out"
    with pytest.raises(InvalidInput) as err:
        Store(out).open_for(exp, expand(exp), repo=repo)
    assert "mod.py" in str(err.value) and "--allow-dirty" in str(err.value) and "ommit" in str(err.value)
    assert not (out / "metadata.json").exists()
    meta = Store(out).open_for(exp, expand(exp), allow_dirty=True, repo=repo)
    assert meta["provenance"]["allow_dirty"] is True and meta["provenance"]["dirty"] is True
    assert meta["provenance"]["uncommitted"] == ["mod.py"]
    assert Store(out).metadata()["provenance"] == meta["provenance"]


def test_a_clean_tree_is_recorded_as_clean(repo, tmp_path):
    exp = parse_spec(SPEC)
    meta = Store(tmp_path / "out").open_for(exp, expand(exp), repo=repo)
    prov = meta["provenance"]
    assert prov["dirty"] is False and prov["allow_dirty"] is False and prov["commit"] == git_state(repo)["commit"]


def test_a_resume_refuses_other_code_unless_told_and_records_it(repo, tmp_path):
    exp = parse_spec(SPEC)
    out = tmp_path / "out"
    Store(out).open_for(exp, expand(exp), repo=repo)
    Store(out).open_for(exp, expand(exp), repo=repo)  # same code: resumes
    (repo / "mod.py").write_text("X = 2\n")
    _git(repo, "commit", "-q", "-am", "second")
    with pytest.raises(InvalidInput, match="--allow-code-change") as err:
        Store(out).open_for(exp, expand(exp), repo=repo)
    assert "was started from code" in str(err.value)
    meta = Store(out).open_for(exp, expand(exp), allow_code_change=True, repo=repo)
    assert [r["provenance"]["code_changed"] for r in meta["resumed"]] == [False, True]
    assert meta["resumed"][-1]["provenance"]["allow_code_change"] is True


def test_a_resume_with_other_uncommitted_changes_is_refused(repo, tmp_path):
    exp = parse_spec(SPEC)
    out = tmp_path / "out"
    (repo / "mod.py").write_text("X = 2\n")
    Store(out).open_for(exp, expand(exp), allow_dirty=True, repo=repo)
    Store(out).open_for(exp, expand(exp), allow_dirty=True, repo=repo)  # the same changes: resumes
    (repo / "mod.py").write_text("X = 3\n")
    with pytest.raises(InvalidInput, match="uncommitted changes"):
        Store(out).open_for(exp, expand(exp), allow_dirty=True, repo=repo)


def test_cli_has_the_flags():
    done = subprocess.run([sys.executable, "-m", "pathmaster", "experiment", "run", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert "--allow-dirty" in done.stdout and "--allow-code-change" in done.stdout


def test_counter_deltas_are_never_negative_across_a_restart():
    before = {"rA:hub": {"bulk": {"bytes": 5_000_000, "packets": 4000, "drops": 30, "backlog": 9000}},
              "core:core": {"urgent": {"bytes": 100, "packets": 2, "drops": 0, "backlog": 0}}}
    # the emulator restarted with a new strategy: rA's counters started again from 0
    after = {"rA:hub": {"bulk": {"bytes": 12_000, "packets": 9, "drops": 1, "backlog": 1500}},
             "core:core": {"urgent": {"bytes": 400, "packets": 5, "drops": 0, "backlog": 0}}}
    delta = counter_delta(before, after)
    assert delta["rA:hub"]["bulk"] == {"bytes": 12_000, "packets": 9, "drops": 1, "backlog": 1500, "reset": True}
    assert delta["core:core"]["urgent"] == {"bytes": 300, "packets": 3, "drops": 0, "backlog": 0}

    def leaves(d):
        for v in d.values():
            yield from (leaves(v) if isinstance(v, dict) else [v])

    assert all(v >= 0 for v in leaves(delta) if not isinstance(v, bool))


def test_counter_delta_of_a_queue_that_appeared_counts_from_zero():
    delta = counter_delta({}, {"rB:hub": {"bulk": {"bytes": 10, "packets": 1, "drops": 0}}})
    assert delta == {"rB:hub": {"bulk": {"bytes": 10, "packets": 1, "drops": 0}}}


class _Draining:
    """Competing targets that still receive a queue's leftovers for a few reads."""

    def __init__(self, leftovers):
        self.reads = list(leftovers)
        self.total = 0

    def competing_bytes(self):
        if self.reads:
            self.total += self.reads.pop(0)
        return self.total


def test_drain_waits_for_the_competing_leftovers():
    bench = _Draining([0, 40_000, 30_000, 3_000])
    drain_competing(bench, limit_s=30, quiet_s=0.01)
    assert bench.reads == []  # read until the bytes stopped growing


def test_drain_is_bounded():
    bench = _Draining([1000] * 10_000)
    waited = drain_competing(bench, limit_s=0.05, quiet_s=0.01)
    assert waited < 5 and bench.reads  # gave up, with leftovers still coming


class _Bench:
    """A bench whose competing targets keep receiving a stopped block's leftovers for a while,
    and whose emulator restarts (counters from 0) with every new strategy."""

    def __init__(self):
        self.received = 0
        self.leftovers: list[int] = []
        self.sent = 0

    def configure(self, link, strategy):
        self.sent = 0

    def set_competing(self, level, seed):
        if not level:
            self.leftovers = [40_000, 30_000, 3_000]  # still in the routers' queues
        return None

    def competing_bytes(self):
        if self.leftovers:
            self.received += self.leftovers.pop(0)
        return self.received

    def counters(self):
        self.sent += 1000
        return {"rA:hub": {"bulk": {"bytes": self.sent, "packets": self.sent // 1000, "drops": 0, "backlog": 0}}}

    def run_case(self, request_class, seed, case_id):
        return {"ok": False, "error": "fake"}

    def emulator_snapshots(self, newer_than=0.0):
        return {}


def test_a_level_0_run_after_a_block_neither_meets_nor_counts_its_leftovers(monkeypatch):
    import qos.experiment.runner as runner
    from qos.experiment.matrix import Run

    monkeypatch.setattr(runner, "QUIET_S", 0.01)
    monkeypatch.setattr(runner, "drain_competing",
                        lambda bench, limit_s=30, quiet_s=0.01: drain_competing(bench, limit_s, quiet_s))
    exp = parse_spec({**SPEC, "experiment": {"name": "t", "repetitions": 1, "settle_s": 0.0, "settle_fraction": 0.0},
                      "competing": {"levels": [0, 4]}})
    bench = _Bench()
    state: dict = {}
    loaded = runner.execute_run(exp, Run("fifo", 4.0, "a", "urgent", 0), bench, state)
    idle = runner.execute_run(exp, Run("fifo", 0.0, "a", "urgent", 0), bench, state)
    assert "drained_s" not in loaded and idle["drained_s"] >= 0
    assert idle["competing"]["bytes"] == 0 and idle["competing"]["achieved_kbit"] == 0
    assert idle["competing"]["samples"][0] == [0.0, 0] and all(b == 0 for _, b in idle["competing"]["samples"])
    assert idle["experiment"]["name"] == "t" and idle["workload"]["cells"] == exp.workload.cells
    assert all(v >= 0 for v in idle["router_counters"]["rA:hub"]["bulk"].values())
