"""pathmaster.environment: the project's programs come from its own environment, never the PATH."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from pathmaster import environment
from pathmaster.environment import environment_program


def _fake_environment(tmp_path: Path, monkeypatch, *programs: str) -> Path:
    """An environment folder holding an interpreter and `programs` (executables), made this
    process's scripts folder and interpreter."""
    folder = tmp_path / "venv" / "bin"
    folder.mkdir(parents=True)
    for name in ("python", *programs):
        (folder / name).write_text("#!/bin/sh\n")
        (folder / name).chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(folder / "python"))
    monkeypatch.setattr(environment.sysconfig, "get_path", lambda name: str(folder))
    return folder


def test_a_program_is_found_beside_the_interpreter_with_no_path(tmp_path, monkeypatch):
    folder = _fake_environment(tmp_path, monkeypatch, "ray")
    monkeypatch.setenv("PATH", "")
    assert environment_program("ray") == str(folder / "ray")


def test_the_path_is_never_searched(tmp_path, monkeypatch):
    _fake_environment(tmp_path, monkeypatch)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "ray").write_text("#!/bin/sh\n")
    (elsewhere / "ray").chmod(0o755)
    monkeypatch.setenv("PATH", str(elsewhere))
    with pytest.raises(FileNotFoundError, match="ray"):
        environment_program("ray")


def test_a_file_that_is_not_executable_is_not_a_program(tmp_path, monkeypatch):
    folder = _fake_environment(tmp_path, monkeypatch)
    (folder / "ray").write_text("not a program")
    with pytest.raises(FileNotFoundError):
        environment_program("ray")


@pytest.mark.parametrize("name", ["", "bin/ray", "/usr/bin/ray"])
def test_only_a_bare_name_is_accepted(name):
    with pytest.raises(ValueError):
        environment_program(name)


def test_this_environment_has_its_own_ray():
    pytest.importorskip("ray")
    path = Path(environment_program("ray"))
    assert path.is_absolute() and os.access(path, os.X_OK)
    assert path.parent in environment.environment_folders()
