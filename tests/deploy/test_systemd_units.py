"""deploy/systemd: every unit passes `systemd-analyze verify` and keeps the hardening promised.

The units name the installed commands (/opt/pathmaster/venv/bin/...); verify checks that
ExecStart's command exists, so the test points them at this environment's own `pathmaster`
and `ray`, changing nothing else. `RestartSteps`/`RestartMaxDelaySec` (the restart backoff)
are systemd >= 254; an older systemd-analyze may warn about exactly those two keys and no more.
"""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pathmaster.environment import environment_program

REPO = Path(__file__).resolve().parents[2]
UNITS = sorted((REPO / "deploy" / "systemd").glob("*.service"))
INSTALLED_BIN = "/opt/pathmaster/venv/bin/"
NEWER_KEYS = {"RestartSteps", "RestartMaxDelaySec"}
WRITABLE_ROOTS = ("/var/lib/pathmaster/", "/var/log/pathmaster")


def _systemd_analyze() -> str:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze not found (Debian: apt-get install systemd)")
    return tool


def _service(unit: Path) -> dict[str, list[str]]:
    """[Service] key -> every value given for it (keys may repeat)."""
    values: dict[str, list[str]] = {}
    section = ""
    for line in unit.read_text().splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values.setdefault(key, []).append(value)
    return values


def test_the_units_are_there():
    names = {unit.name for unit in UNITS}
    assert {"pathmaster-site@.service", "pathmaster-coordinator.service", "pathmaster-gateway.service",
            "pathmaster-ray-node@.service", "pathmaster-ray-head.service"} <= names


def test_units_pass_systemd_analyze_verify(tmp_path):
    tool = _systemd_analyze()
    try:
        (here,) = {Path(environment_program(command)).parent for command in ("pathmaster", "ray")}
    except FileNotFoundError as exc:
        pytest.skip(f"{exc}: verify checks that ExecStart's command exists")
    for unit in UNITS:
        (tmp_path / unit.name).write_text(unit.read_text().replace(INSTALLED_BIN, f"{here}/"))
    run = subprocess.run([tool, "verify", "--man=no", *sorted(p.name for p in tmp_path.iterdir())],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    problems = [line for line in (run.stdout + run.stderr).splitlines()
                if line.strip() and not re.search(r"Unknown key '(%s)'" % "|".join(NEWER_KEYS), line)]
    assert run.returncode == 0 and not problems, "\n".join(problems)


@pytest.mark.parametrize("unit", UNITS, ids=lambda unit: unit.name)
def test_unit_is_hardened(unit):
    service = _service(unit)
    one = {key: values[-1] for key, values in service.items()}
    assert one["User"] == "pathmaster" and one["Group"] == "pathmaster"   # the dedicated user, never root
    for key, value in {"ProtectSystem": "strict", "PrivateTmp": "yes", "NoNewPrivileges": "yes",
                       "ProtectHome": "yes", "KillMode": "control-group", "Restart": "on-failure",
                       "CapabilityBoundingSet": "", "UMask": "0077"}.items():
        assert one.get(key) == value, f"{unit.name}: {key}={one.get(key)!r}, expected {value!r}"
    assert float(one["RestartSec"].rstrip("s")) > 0 and "RestartMaxDelaySec" in one   # restart with backoff
    writable = [path for values in service.get("ReadWritePaths", []) for path in values.split()]
    assert all(path.startswith(WRITABLE_ROOTS) for path in writable), writable
    for key in ("StateDirectory", "LogsDirectory"):   # these are writable too: under the same roots
        for name in one.get(key, "").split():
            assert f"/var/lib/{name}".startswith(WRITABLE_ROOTS) or f"/var/log/{name}".startswith(WRITABLE_ROOTS)
    unit_section = configparser.ConfigParser(interpolation=None, strict=False)
    unit_section.read_string(unit.read_text().split("[Service]")[0])
    assert int(unit_section["Unit"]["StartLimitBurst"]) > 0   # a unit that keeps failing stops for an operator


def test_units_score_well_in_systemd_analyze_security(tmp_path):
    """systemd's own exposure score (0 safest .. 10 unsafe) of each unit, offline."""
    tool = _systemd_analyze()
    scores = {}
    for unit in UNITS:
        (tmp_path / unit.name).write_text(unit.read_text())
        run = subprocess.run([tool, "security", "--offline=yes", "--no-pager", f"./{unit.name}"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=120)
        found = re.search(r"Overall exposure level for \S+: ([0-9.]+)", run.stdout)
        if found is None:
            pytest.skip(f"this systemd-analyze cannot score units offline: {run.stderr.strip()[:200]}")
        scores[unit.name] = float(found.group(1))
    assert all(score <= 3.0 for score in scores.values()), scores   # "OK" in systemd's words is < 4.5
