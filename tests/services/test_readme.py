"""The README's command examples, as written, on small synthetic data.

The commands are read from README.md's ``bash`` blocks (not copied here): each is run, on a
site that learnt a lens on top of its eye and on one too small to (plain neighbours in the
eye's space),
or named in NOT_RUN with the reason. Placeholders (``CELL.png``, ``CELL_ID``, the
coordinator's address ...) become files and values made here, the README's ``--cells``
counts small ones; ``[optional]`` parts are run both left out and given. A command that
errs, or whose output lacks what the README says it shows, fails the test.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import re
import shlex
import shutil
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from pathmaster.cli import main
from tests.conftest import REPO

README = REPO / "README.md"
PLAIN_CELLS = 42     # `synth --cells` for the site that learns nothing on top of its eye (fewer than LEARNT_CELLS)
LEARNT_CELLS = 63    # and for the one that does (learn.MIN_CELLS_TO_LEARN lowered to it: see learnt_site)
NEW_WEEK_CELLS = 7   # the cells `index new-week/` adds

# Commands of the README not run here, by a word of theirs, and why.
NOT_RUN = {
    "/path/to/": "a real dataset's path (the real-data tests run Herlev)",
    "tbs-folders/": "a dataset labelled in Bethesda terms (tests/core/test_vocabulary.py)",
    "--ray-address": "a Ray cluster of several nodes",
    "pathmaster gateway": "serves the page until stopped (tests/clients)",
    "pathmaster serve": "serves until stopped, from a deployment's files (tests/services, tests/deploy)",
    "pathmaster health": "asks a running server from a deployment's files (tests/services/test_health.py)",
    "pathmaster testbed": "root and network namespaces (tests/qos)",
    "pathmaster experiment": "root and network namespaces (tests/experiment)",
}


def readme_commands(text: str) -> list[str]:
    """The PathMaster commands of `text`'s ``bash`` blocks, one string each, in order:
    continuation lines joined, comments left out, a comment's "or: ..." alternative as a
    command of the same program."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            command, _, comment = line.partition(" #")
            command = " ".join(command.split())
            if not re.match(r"(pathmaster|python -m pathmaster(\.\w+)*) ", command):
                continue
            commands.append(command)
            alternative = re.match(r"\s*or: (.+)", comment)
            if alternative and command.startswith("pathmaster "):
                commands.append(f"pathmaster {alternative.group(1).strip()}")
    return commands


def forms(command: str) -> list[str]:
    """The command with its ``[optional]`` parts left out and, when it has any, given; a
    cross-validation (`evaluate` without --queries, tens of seconds) only with them."""
    bare = " ".join(re.sub(r"\[[^\]]*\]", " ", command).split())
    full = " ".join(re.sub(r"\[([^\]]*)\]", r"\1", command).split())
    return [bare] if bare == full else [full] if cross_validates(command) else [bare, full]


def cross_validates(command: str) -> bool:
    return command.startswith("pathmaster evaluate") and "--queries" not in command


def not_run(command: str) -> str | None:
    """Why `command` is not run here, or None when it is."""
    return next((why for word, why in NOT_RUN.items() if word in command), None)


COMMANDS = readme_commands(README.read_text())


@dataclass
class Ran:
    """One command as run: its argv (after the placeholders), exit status and output."""

    argv: list[str]
    status: int
    out: str
    err: str


def run(command: str, cwd: Path, values: dict[str, str]) -> Ran:
    """`command` (a README line, one form) in `cwd` with each placeholder token replaced by
    `values`; `pathmaster ...` in this process (`pathmaster.cli.main`), `python -m ...` as a
    process of this Python."""
    argv = [values.get(token, token) for token in shlex.split(command)]
    if argv[:2] == ["python", "-m"]:
        done = subprocess.run([sys.executable, *argv[1:]], cwd=cwd, capture_output=True, text=True, timeout=120)
        return Ran(argv, done.returncode, done.stdout, done.stderr)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv[1:])
        except SystemExit as exc:  # argparse's: the README names an option that is not there
            status = exc.code if isinstance(exc.code, int) else 2
    return Ran(argv, status, out.getvalue(), err.getvalue())


def cell_files(dataset: Path, diagnosis: str, index: int = 0) -> dict[str, Path]:
    """{"image", "background", "mask"}: the files of the `index`-th `diagnosis` cell of a
    synthetic dataset."""
    entry = [c for c in json.loads((dataset / "manifest.json").read_text())["cells"]
             if c["diagnosis"] == diagnosis][index]
    return {part: dataset / entry[part] for part in ("image", "background", "mask")}


def core_commands() -> list[str]:
    """The README's commands on a site's database (before `query`), each form, in order."""
    core = [c for c in COMMANDS if c.split()[1] in ("synth", "index", "cells", "search", "evaluate")
            or c.startswith("python -m pathmaster")]
    return [form for command in core if not not_run(command) for form in forms(command)]


def run_core(root: Path, cells: int, cross_validate: bool = True) -> dict[str, Ran]:
    """The README's core commands in `root`, the dataset `cells` cells: {form: Ran}
    (without `cross_validate`, `evaluate`'s cross-validation left out).

    The inputs they name are made first where the commands themselves do not make them:
    CELL.png (with B.png, M.png: a severe dysplasia cell of the site's own dataset) once
    `data/syn` is written, `new-week/` (a few new synthetic cells) beside it."""
    values = {"1400": str(cells), "DIR": "new-week"}
    ran = {}
    for form in core_commands():
        if cross_validates(form) and not cross_validate:
            continue
        if "CELL_ID" in form:
            from pathmaster.site.search import SiteIndex

            ids = SiteIndex.open(root / "sites" / "a").cell_ids()
            values |= {"CELL_ID...": ids[-1], "CELL_ID": ids[-2], "DIAGNOSIS": "normal_superficial"}
        ran[form] = result = run(form, root, values)
        assert result.status == 0, f"{form!r} ({result.argv}) exited {result.status}:\n{result.err[-2000:]}"
        if form.startswith("pathmaster synth"):
            files = cell_files(root / "data" / "syn", "severe_dysplasia")
            for name, part in (("CELL.png", "image"), ("B.png", "background"), ("M.png", "mask")):
                shutil.copy(files[part], root / name)
            assert run(f"pathmaster synth --out new-week --cells {NEW_WEEK_CELLS} --seed 7", root, {}).status == 0
    return ran


@pytest.fixture(scope="module")
def plain_site(tmp_path_factory) -> tuple[Path, dict[str, Ran]]:
    """(folder, {command: Ran}): the core commands on PLAIN_CELLS cells, too few to learn from."""
    root = tmp_path_factory.mktemp("readme-plain")
    return root, run_core(root, PLAIN_CELLS)


@pytest.fixture(scope="module")
def learnt_site(tmp_path_factory) -> tuple[Path, dict[str, Ran]]:
    """(folder, {command: Ran}): the core commands on LEARNT_CELLS cells: the site learns a
    lens and head on top of its eye (``choice.MIN_CELLS_TO_LEARN`` lowered to LEARNT_CELLS:
    this tests the commands, not what the site learns)."""
    from pathmaster.learning import choice

    root = tmp_path_factory.mktemp("readme-learnt")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(choice, "MIN_CELLS_TO_LEARN", LEARNT_CELLS)
        ran = run_core(root, LEARNT_CELLS)
    return root, ran


def test_every_readme_command_is_run_or_says_why_not():
    assert len(COMMANDS) > 20  # the extraction found the README's examples
    run_here = set(core_commands()) | {f for c in COMMANDS if c.split()[1] in ("query", "batch") for f in forms(c)}
    for command in COMMANDS:
        assert not_run(command) or set(forms(command)) <= run_here, f"README command neither run nor excused: {command}"


def ran_by(ran: dict[str, Ran], start: str, *words: str) -> list[Ran]:
    """The runs of commands starting with `start` that hold every one of `words`."""
    found = [r for form, r in ran.items() if form.startswith(start) and all(w in form.split() for w in words)]
    assert found, f"the README has no {start!r} command with {words}"
    return found


@pytest.mark.parametrize("which", ["plain_site", "learnt_site"])
def test_the_site_commands_work_as_written(which, request):
    from pathmaster.site.search import SiteIndex

    root, ran = request.getfixturevalue(which)
    site = SiteIndex.open(root / "sites" / "a")
    assert site.lens is not None and (site.lens.head is not None) == (which == "learnt_site")  # what it is for
    # search: "the 5 most similar cells with their diagnoses"; says when the query is already there.
    for r in ran_by(ran, "pathmaster search", "--json"):
        out = json.loads(r.out)
        assert len(out["matches"]) == 5 and all(m["diagnosis"] in site.diagnoses() for m in out["matches"])
        assert out["in_database"] and out["self_excluded"]
        assert not any(m["same_image"] for m in out["matches"])
    [plain] = [r for r in ran_by(ran, "pathmaster search") if "--json" not in r.argv]
    rows = [line.split() for line in plain.out.splitlines() if re.match(r"\s*\d+\s", line)]
    assert len(rows) == 5 and "already in the database" in plain.out
    assert all(set(row) & set(site.diagnoses()) for row in rows)
    # evaluate with held-out queries: every query cell read.
    [held] = [r for r in ran_by(ran, "pathmaster evaluate", "--queries") if "--json" in r.argv]
    assert json.loads(held.out)["queries"] == NEW_WEEK_CELLS
    # the feature table.
    [table] = ran_by(ran, "python -m pathmaster.features")
    assert table.out.count("\n|") >= len(site.feature_names)


def test_evaluate_reports_what_the_readme_lists(plain_site):
    """"sensitivity, specificity, ROC, cases, ceiling" (the cross-validation, on the site
    that learns nothing on top of its eye)."""
    _, ran = plain_site
    [cv] = [r for r in ran_by(ran, "pathmaster evaluate", "--json") if "--queries" not in r.argv]
    metrics = json.loads(cv.out)
    assert metrics["folds"] == 5 and metrics["abnormal"]["roc"]["auc"] is not None
    assert {"sensitivity", "specificity"} <= metrics["abnormal"]["operating_point"].keys()
    assert metrics["cases"] and metrics["ceilings"]


@pytest.fixture(scope="module")
def readme_deployment(ray_session, plain_site, learnt_site, tmp_path_factory):
    """The two sites the README's commands built, behind a coordinator on loopback (with a
    case log and metrics)."""
    from services.demo import LoopbackDeployment
    from tests.conftest import running_on_ray

    databases = {"learnt": learnt_site[0] / "sites" / "a", "plain": plain_site[0] / "sites" / "a"}
    log = tmp_path_factory.mktemp("readme-coordinator") / "cases.jsonl"
    with running_on_ray(LoopbackDeployment(databases, {name: "" for name in databases}, case_log=log)) as running:
        yield running


def documented_keys(kind: str) -> set[str]:
    """The keys the README lists for `query --json`'s events of type `kind`."""
    line = re.search(rf"^- `{kind}`[^:]*: (.+)$", README.read_text(), re.M)
    assert line, f"the README does not document the {kind!r} event"
    return set(re.findall(r"`(\w+)`", line.group(1)))


def service_commands(start: str) -> list[str]:
    return [form for command in COMMANDS if command.startswith(start) for form in forms(command)]


@pytest.fixture(scope="module")
def case_folder(plain_site, tmp_path_factory) -> Path:
    """What the README's `query` and `batch` lines name: cell1.png with its background and
    mask, cell2.png alone, and teaching-set/ (class folders of a few synthetic cells)."""
    root = tmp_path_factory.mktemp("readme-case")
    dataset = plain_site[0] / "new-week"
    first, second = cell_files(dataset, "severe_dysplasia"), cell_files(dataset, "normal_intermediate")
    for name, path in (("cell1.png", first["image"]), ("cell1-background.png", first["background"]),
                       ("cell1-mask.png", first["mask"]), ("cell2.png", second["image"])):
        shutil.copy(path, root / name)
    for diagnosis in ("severe_dysplasia", "normal_intermediate", "carcinoma_in_situ"):
        folder = root / "teaching-set" / diagnosis
        folder.mkdir(parents=True)
        for part, path in cell_files(dataset, diagnosis).items():
            shutil.copy(path, folder / ("cell.png" if part == "image" else f"cell-{part}.png"))
    return root


def test_query_as_written_answers_from_both_sites(readme_deployment, case_folder):
    address = readme_deployment.coordinator.address
    values = {"127.0.0.1:50051": address}
    for form in service_commands("pathmaster query"):
        ran = run(form, case_folder, values)
        assert ran.status == 0, f"{form!r} exited {ran.status}:\n{ran.err[-2000:]}\n{ran.out[-2000:]}"
        if "--json" in ran.argv:
            events = [json.loads(line) for line in ran.out.splitlines()]
            sites = {e["site"]: e for e in events if e["type"] == "site"}
            assert sites.keys() == {"learnt", "plain"} and all(s["ok"] for s in sites.values())
            assert all(len(c["matches"]) == 5 for s in sites.values() for c in s["cells"])
            summary = events[-1]
            assert summary["type"] == "summary" and summary["conclusion"]["cells_total"] == 2
            assert "bethesda" not in summary  # the case's one reading is its conclusion
            for event in events:  # the JSON shape is the one the README documents
                assert set(event) == documented_keys(event["type"]), event["type"]
            case_id = summary["case_id"]
        else:
            # "Every case ends with its conclusion, printed first"; per site its answer, per
            # match its diagnosis, Bethesda term and calibrated similarity, in plain words.
            out = ran.out
            assert out.index("Conclusion: ") < out.index("2 of 2 sites answered")
            assert sum(line.split()[:2] in (["learnt", "answered"], ["plain", "answered"])
                       for line in out.splitlines()) == 2
            assert out.count("% similar") == 2 * 2 * 5   # 2 sites x 2 cells x 5 matches
            assert "faiss" not in out and "distance" not in out and "KiB" not in out
            assert out.count("no estimate of the wait yet") <= 1
    # "no patient identifiers in logs": the case log and the metrics do not carry the case id.
    log = readme_deployment.coordinator.config.case_log
    assert case_id not in log.read_text()
    assert {json.loads(line)["case_ids"] for line in log.read_text().splitlines()} == {"keyed"}
    with urllib.request.urlopen(readme_deployment.coordinator.metrics_url, timeout=10) as page:
        assert case_id not in page.read().decode()


def test_batch_as_written_writes_a_row_a_cell(readme_deployment, case_folder):
    """The README's batch line takes the demo's coordinator by default: here the test's."""
    address = readme_deployment.coordinator.address
    for form in service_commands("pathmaster batch"):
        ran = run(f"{form} --coordinator {address}", case_folder, {})
        assert ran.status == 0, f"{form!r} exited {ran.status}:\n{ran.err[-2000:]}"
    with open(case_folder / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 and {r["status"] for r in rows} == {"ok"}   # resumed: the second run added none
    assert all(r["case_conclusion"] and r["bethesda_spread"] for r in rows)
    # Each match with its Bethesda term and the site's calibrated similarity beside its distance.
    for row in rows:
        for matches in json.loads(row["matches"]).values():
            assert all(len(m) == 5 and m[3] and 0 <= m[4] <= 1 for m in matches)
