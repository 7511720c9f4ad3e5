"""Programs of the project's own Python environment, found without the PATH.

A program that a Python package installs (``ray``, ``pathmaster``, ``uvicorn``) lives beside
the interpreter that runs the project (``.venv/bin``), and nothing puts that folder on the
PATH: the project is run as ``.venv/bin/python -m pathmaster``, the environment never
activated. So every such program is started by its absolute path from `environment_program`;
the interpreter itself is `sys.executable`. System tools (``ip``, ``tc``, ``iperf3``,
``tcpdump``) are the machine's and stay on the PATH.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path


def environment_folders() -> list[Path]:
    """Where this environment's programs are: its scripts folder, then the interpreter's own."""
    folders = [Path(sysconfig.get_path("scripts")), Path(sys.executable).parent]
    return list(dict.fromkeys(folders))


def environment_program(name: str) -> str:
    """The absolute path of program `name` installed in this Python environment.

    Parameters
    ----------
    name : str
        A program's bare name, e.g. ``"ray"``.

    Returns
    -------
    str
        Its absolute path, to put first in an argv.

    Raises
    ------
    FileNotFoundError
        When the environment has no such executable (its package is not installed); the
        message names the folders looked in. The PATH is never searched.
    """
    if not name or os.sep in name:
        raise ValueError(f"a program's bare name is expected, got {name!r}")
    folders = environment_folders()
    for folder in folders:
        path = folder / name
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    raise FileNotFoundError(f"{name!r} is not installed in this Python environment "
                            f"(looked in {', '.join(map(str, folders))})")
