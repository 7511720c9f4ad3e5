"""The raw-data store of one experiment: a directory that is the whole record of it.

    OUT/
      experiment.toml        the experiment file exactly as run
      metadata.json          kernel, git commit, host, configuration, seed, run order, timestamps,
                             and `provenance`: the git state the runs were made from (see `git_state`)
      runs/RUN_ID.json       one file per finished run: the raw measurements (see `save_run`):
                             the run's matrix cell, seed, link, strategy, the case's per-site
                             record, router counter deltas, the competing traffic (totals and
                             `samples` during the case), the bound: readable without the rest
      iperf3/RUN_ID.json     iperf3's own JSON for the competing flows during that run
                             (runs with iperf3 traffic only; written when its block of traffic stops)

Every run file is written to a temporary name and renamed, so an interrupted experiment
leaves only whole runs behind; `done_ids` is what a resumed experiment skips.
Reports read nothing but these files.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from pathmaster.records import InvalidInput
from qos.experiment.matrix import Run
from qos.experiment.spec import Experiment

REPO = Path(__file__).resolve().parents[2]
FORMAT_VERSION = 1


def now_iso() -> str:
    """The current UTC time, ISO 8601 with microseconds."""
    return datetime.now(timezone.utc).isoformat()


def git_commit(repo: Path = REPO) -> str:
    """The commit the code ran at (with '+dirty' if the tree had changes), or 'unknown'."""
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def _git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise OSError(out.stderr.strip() or f"git {' '.join(args)} failed")
    return out.stdout


def git_state(repo: Path = REPO) -> dict:
    """What the code of a run is: the commit, its tree, and what differs from it.

    Returns {"commit", "tree", "uncommitted", "diff_sha256"}: `uncommitted` lists the changed
    tracked files and the untracked *.py files (a new module changes what runs; other untracked
    files, e.g. an output folder, do not); `diff_sha256` is the SHA-256 of `git diff HEAD` plus
    those untracked files' contents, so two dirty trees compare equal only if they hold the same
    changes. Outside a git checkout every field is "unknown" and `uncommitted` is empty.
    """
    try:
        commit = _git(repo, "rev-parse", "HEAD").strip()
        tree = _git(repo, "rev-parse", "HEAD^{tree}").strip()
        status = _git(repo, "status", "--porcelain", "--untracked-files=all")
        digest = hashlib.sha256(_git(repo, "diff", "HEAD", "--binary").encode())
    except (OSError, subprocess.TimeoutExpired):
        return {"commit": "unknown", "tree": "unknown", "uncommitted": [], "diff_sha256": "unknown"}
    uncommitted = []
    for line in status.splitlines():
        code, path = line[:2], line[3:]
        if code == "??":
            if not path.endswith(".py"):
                continue
            digest.update(path.encode())
            try:
                digest.update((repo / path).read_bytes())
            except OSError:
                pass
        uncommitted.append(path)
    return {"commit": commit, "tree": tree, "uncommitted": uncommitted,
            "diff_sha256": digest.hexdigest() if uncommitted else ""}


def _listing(paths: list[str], most: int = 10) -> str:
    shown = ", ".join(paths[:most])
    return shown + (f" and {len(paths) - most} more" if len(paths) > most else "")


def check_provenance(state: dict, allow_dirty: bool) -> None:
    """Raise InvalidInput, saying what is uncommitted and what to do, if the tree is dirty and
    `allow_dirty` is not given."""
    if state["uncommitted"] and not allow_dirty:
        raise InvalidInput(
            f"the code has uncommitted changes ({_listing(state['uncommitted'])}); results must come from "
            "a commit so that they can be reproduced. Commit (or stash) them and run again, or pass "
            "--allow-dirty to run anyway (the metadata then records the run as made from a dirty tree)",
            REPO)


def environment() -> dict:
    """What the machine was: kernel, Python, host, tool versions."""
    def version(cmd: list[str]) -> str:
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
            return (out.stdout or out.stderr).strip().splitlines()[0]
        except (OSError, subprocess.TimeoutExpired, IndexError):
            return "absent"

    return {
        "kernel": platform.release(),
        "kernel_version": platform.version(),
        "machine": platform.machine(),
        "hostname": platform.node(),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "iperf3": version(["iperf3", "--version"]),
        "tc": version(["tc", "-V"]),
        "git_commit": git_commit(),
    }


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Store:
    """One experiment's output directory."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.runs_dir = self.root / "runs"

    @property
    def metadata_path(self) -> Path:
        return self.root / "metadata.json"

    def open_for(self, experiment: Experiment, order: list[Run], allow_dirty: bool = False,
                 allow_code_change: bool = False, repo: Path = REPO) -> dict:
        """Start a new experiment here, or check that the one here is the same and resume it.

        Returns the metadata. Raises InvalidInput if the directory holds a different
        experiment (another configuration would make the runs incomparable), if the code in
        `repo` has uncommitted changes and not `allow_dirty`, or, on a resume, if the code is
        not the code the experiment started with (another commit, or other uncommitted
        changes) and not `allow_code_change`. What was allowed is recorded in the metadata:
        `provenance` (the start's git state and `allow_dirty`), and for each resume its own
        state and whether the code had changed.
        """
        state = git_state(repo)
        check_provenance(state, allow_dirty)
        provenance = state | {"allow_dirty": allow_dirty, "dirty": bool(state["uncommitted"])}
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        if self.metadata_path.exists():
            meta = self.metadata()
            if meta.get("fingerprint") != experiment.fingerprint():
                raise InvalidInput(
                    f"holds experiment {meta.get('experiment', {}).get('name')!r} with another configuration "
                    f"(fingerprint {meta.get('fingerprint')} != {experiment.fingerprint()}); "
                    "use a new --out directory", self.root)
            began = meta.get("provenance") or {"commit": meta.get("environment", {}).get("git_commit", "unknown"),
                                                "diff_sha256": ""}
            changed = (began.get("commit"), began.get("diff_sha256")) != (state["commit"], state["diff_sha256"])
            if changed and not allow_code_change:
                raise InvalidInput(
                    f"was started from code {began.get('commit')}"
                    + (" with uncommitted changes" if began.get("diff_sha256") else "")
                    + f", and the code now is {state['commit']}"
                    + (f" with uncommitted changes ({_listing(state['uncommitted'])})" if state["uncommitted"] else "")
                    + "; runs from two versions of the code would be mixed. Check out the start's code "
                    "to resume, use a new --out directory, or pass --allow-code-change to resume anyway "
                    "(the metadata then records the change)", self.root)
            meta.setdefault("resumed", []).append({"at": now_iso(), "environment": environment(),
                                                   "provenance": provenance | {"allow_code_change": allow_code_change,
                                                                               "code_changed": changed}})
        else:
            meta = {
                "format": FORMAT_VERSION,
                "experiment": experiment.to_dict(),
                "fingerprint": experiment.fingerprint(),
                "seed": experiment.seed,
                "order": [run.run_id for run in order],
                "started": now_iso(),
                "environment": environment(),
                "provenance": provenance,
                "command": sys.argv,
            }
            if experiment.source and Path(experiment.source).is_file():
                shutil.copyfile(experiment.source, self.root / "experiment.toml")
        _write_json(self.metadata_path, meta)
        return meta

    def metadata(self) -> dict:
        """The experiment's metadata; InvalidInput if there is none."""
        try:
            return json.loads(self.metadata_path.read_text())
        except FileNotFoundError:
            raise InvalidInput("no metadata.json: not an experiment output directory", self.root) from None
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"metadata.json is not valid JSON: {exc}", self.root) from None

    def update_metadata(self, **fields) -> None:
        meta = self.metadata()
        meta.update(fields)
        _write_json(self.metadata_path, meta)

    def run_path(self, run_id: str) -> Path:
        return self.runs_dir / f"{run_id}.json"

    def save_run(self, run: Run, record: dict) -> Path:
        """Write one run's raw record (atomically). `record` holds the measurements."""
        path = self.run_path(run.run_id)
        _write_json(path, {"format": FORMAT_VERSION, "run": run.to_dict()} | record)
        return path

    def save_invalid(self, run: Run, attempt: int, record: dict) -> Path:
        """Keep an attempt judged invalid (its emulator fell behind) in OUT/invalid/, apart from runs/."""
        path = self.root / "invalid" / f"{run.run_id}.a{attempt}.json"
        path.parent.mkdir(exist_ok=True)
        _write_json(path, {"format": FORMAT_VERSION, "run": run.to_dict()} | record)
        return path

    def iperf3_path(self, run_id: str) -> Path:
        return self.root / "iperf3" / f"{run_id}.json"

    def save_iperf3(self, run_id: str, data: dict) -> Path:
        """Write the competing flows' iperf3 JSON of one run (atomically)."""
        path = self.iperf3_path(run_id)
        path.parent.mkdir(exist_ok=True)
        _write_json(path, data)
        return path

    def load_iperf3(self, run_id: str) -> dict | None:
        """The iperf3 JSON kept for a run, or None if it had no iperf3 traffic."""
        path = self.iperf3_path(run_id)
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"iperf3 file is not valid JSON: {exc}", path) from None

    def done_ids(self) -> set[str]:
        """Ids of the runs whose raw data are complete on disk."""
        if not self.runs_dir.is_dir():
            return set()
        return {p.stem for p in self.runs_dir.glob("*.json")}

    def load_runs(self) -> list[dict]:
        """Every run record, sorted by run id; a damaged file raises InvalidInput naming it."""
        records = []
        for path in sorted(self.runs_dir.glob("*.json")):
            try:
                records.append(json.loads(path.read_text()))
            except json.JSONDecodeError as exc:
                raise InvalidInput(f"run file is not valid JSON: {exc}", path) from None
        return records
