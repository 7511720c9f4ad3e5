"""`pathmaster batch` against a real deployment: a labelled teaching set into CSV/JSONL,
resumable after a kill mid-write, failed cells retried, a concurrency limit, a summary
with per-class accuracy."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from pathmaster.conclusion import OUTCOMES
from pathmaster.records import DIAGNOSES
from pathmaster.image.synth import write_dataset
from pathmaster.vocabulary import BETHESDA_TERMS
from services.gateway import batch
from services.gateway.batch import ResultsFile, run_batch

N_LABELLED = 14  # 2 per diagnosis


@pytest.fixture(scope="module")
def teaching_set(tmp_path_factory) -> Path:
    """14 labelled synthetic cells in class folders (with backgrounds and masks), one file
    that is not an image, and a mask whose cell is missing."""
    root = write_dataset(tmp_path_factory.mktemp("teaching"), N_LABELLED, seed=777)
    (root / "mild_dysplasia" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    (root / "severe_dysplasia" / "lost-mask.png").write_bytes(b"")
    return root


def test_batch_writes_every_cell_with_accuracy_and_resumes_after_a_kill(stack, teaching_set, tmp_path):
    out = tmp_path / "results.csv"
    summary = run_batch(teaching_set, out, stack.coordinator.address, jobs=2, case_size=4,
                        progress=False)

    assert (summary.cells, summary.skipped, summary.run) == (N_LABELLED + 1, 0, N_LABELLED + 1)
    assert summary.status_counts() == {"ok": N_LABELLED, "invalid": 1}
    assert [name for name, _ in summary.problems] == ["severe_dysplasia/lost-mask.png"]
    broken = summary.rows["mild_dysplasia/broken"]
    assert broken["status"] == "invalid" and "broken.png" in broken["error"]
    for row in summary.rows.values():
        if row["status"] == "ok":
            assert row["label"] in DIAGNOSES and row["diagnosis"] in DIAGNOSES
            assert row["correct"] == (row["diagnosis"] == row["label"])
            assert sorted(row["matches"]) == ["site-a", "site-b", "site-c"]
            assert all(len(m) == 5 for m in row["matches"].values())
            # Its Bethesda term and spread over the 15 matches, and its case's conclusion.
            counts = [int(part.split()[1].split("/")[0]) for part in row["bethesda_spread"].split(", ")]
            assert row["bethesda"] in BETHESDA_TERMS and sum(counts) == 15
            assert row["supports"] in ("",) + BETHESDA_TERMS[1:]
            assert row["case_outcome"] in OUTCOMES and row["case_conclusion"]
    for case_id in {r["case_id"] for r in summary.rows.values() if r["status"] == "ok"}:
        case = [r for r in summary.rows.values() if r["case_id"] == case_id]
        assert len({(r["case_outcome"], r["case_conclusion"]) for r in case}) == 1
        supported = {r["supports"] for r in case} - {""}
        assert (case[0]["case_outcome"] == "abnormal") == bool(supported)
    accuracy = summary.accuracy()
    assert set(accuracy) == set(DIAGNOSES) | {"all"}
    assert accuracy["all"][1] == N_LABELLED
    assert accuracy["all"][0] == sum(r["correct"] is True for r in summary.rows.values())
    text = summary.format()
    assert "cells/s" in text and "carcinoma_in_situ" in text and "lost-mask.png" in text

    # Everything done: a second run sends nothing and leaves the file as it was.
    before = out.read_bytes()
    again = run_batch(teaching_set, out, stack.coordinator.address, progress=False)
    assert (again.skipped, again.run) == (N_LABELLED + 1, 0) and out.read_bytes() == before

    # Killed mid-write: header, 5 whole rows and half of the sixth. The torn row is dropped
    # and only the cells without a whole row are run again.
    lines = before.decode().splitlines(keepends=True)
    out.write_text("".join(lines[:6]) + lines[6][:40])
    resumed = run_batch(teaching_set, out, stack.coordinator.address, progress=False)
    assert (resumed.skipped, resumed.run) == (5, N_LABELLED + 1 - 5)
    assert len(ResultsFile(out).read()) == N_LABELLED + 1
    assert len(out.read_text().splitlines()) == 1 + N_LABELLED + 1  # header + one row each


def test_failed_cells_are_retried_and_jobs_bound_the_cases_in_flight(
        stack, teaching_set, tmp_path, nowhere, monkeypatch, capsys):
    from pathmaster.cli import main

    out = tmp_path / "results.jsonl"
    # The coordinator is not there: every cell fails, with the reason, and the exit code says so.
    code = main(["batch", str(teaching_set), "--out", str(out), "--coordinator", nowhere, "--quiet"])
    assert code == 1
    rows = ResultsFile(out).read()
    assert sum(r["status"] == "failed" for r in rows.values()) == N_LABELLED
    assert all("UNAVAILABLE" in r["error"] for r in rows.values() if r["status"] == "failed")
    assert "14 failed (run again to retry)" in capsys.readouterr().out

    # Count the cases in flight while the real coordinator answers.
    in_flight, most, lock = [0], [0], threading.Lock()
    real_run_case = batch.run_case

    def counting_run_case(*args, **kwargs):
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        try:
            return real_run_case(*args, **kwargs)
        finally:
            with lock:
                in_flight[0] -= 1

    monkeypatch.setattr(batch, "run_case", counting_run_case)
    code = main(["batch", str(teaching_set), "--out", str(out), "--coordinator",
                 stack.coordinator.address, "--jobs", "3", "--case-size", "2"])
    captured = capsys.readouterr()
    assert code == 0
    assert most[0] == 3  # 7 cases, never more than --jobs at once
    assert "batch (teaching)" in captured.err and "cell" in captured.err  # the progress bar
    assert f"1 already done, {N_LABELLED} run now" in captured.out
    assert "accuracy of the diagnosis voted across sites" in captured.out
    final = ResultsFile(out).read()
    assert sum(r["status"] == "ok" for r in final.values()) == N_LABELLED
    assert all(r["request_class"] == "teaching" for r in final.values())


def test_batch_refuses_bad_arguments_with_a_message(stack, teaching_set, tmp_path, capsys, nowhere):
    from pathmaster.cli import main

    assert main(["batch", str(teaching_set), "--out", str(tmp_path / "r.txt"),
                 "--coordinator", nowhere]) == 2
    assert "must end in .csv or .jsonl" in capsys.readouterr().err
    # The class is checked against the coordinator's table (only a coordinator can say).
    assert main(["batch", str(teaching_set), "--out", str(tmp_path / "r.csv"), "--class",
                 "express", "--coordinator", stack.coordinator.address]) == 2
    assert "express" in capsys.readouterr().err
    assert main(["batch", str(tmp_path / "missing"), "--out", str(tmp_path / "r.csv"),
                 "--coordinator", nowhere]) == 2
    assert "not a folder" in capsys.readouterr().err


def test_a_herlev_teaching_set_runs_with_its_folder_names_and_colour_masks(
        stack, herlev_40px, tmp_path):
    """Real Herlev cells: folder names like light_dysplastic become diagnoses, and each
    NAME-d.bmp colour mask is sent as labels, so no site has to segment the cell."""
    root = tmp_path / "herlev"
    for folder in sorted(p for p in herlev_40px.iterdir() if p.is_dir()):
        (root / folder.name).mkdir(parents=True)
        for image in sorted(folder.glob("*.BMP"))[:2]:
            for path in (image, image.with_name(image.stem + "-d.bmp")):
                (root / folder.name / path.name).write_bytes(path.read_bytes())

    summary = run_batch(root, tmp_path / "herlev.jsonl", stack.coordinator.address,
                        case_size=7, progress=False)
    assert summary.problems == [] and summary.cells == N_LABELLED
    rows = list(summary.rows.values())
    assert {r["label"] for r in rows} == set(DIAGNOSES)  # light_dysplastic -> mild_dysplasia, ...
    assert summary.status_counts()["ok"] == N_LABELLED, [r["error"] for r in rows]
    assert all(r["mask_estimated"] is False and r["background_estimated"] is True for r in rows)
    assert summary.accuracy()["all"][1] == N_LABELLED


def test_ctrl_c_says_how_far_the_batch_got_and_the_same_command_resumes(teaching_set, tmp_path, nowhere,
                                                                        monkeypatch, capsys):
    """Ctrl-C (KeyboardInterrupt in the main thread) after the first case's rows are written:
    the batch stops, says how many cells of how many are done, and exits as SIGINT does."""
    import services.gateway.batch as batch
    from pathmaster.cli import main

    real = batch.as_completed

    def interrupted(futures):
        yield next(iter(real(futures)))
        raise KeyboardInterrupt

    monkeypatch.setattr(batch, "as_completed", interrupted)
    out = tmp_path / "r.csv"
    with pytest.raises(batch.BatchStopped) as stopped:
        run_batch(teaching_set, out, nowhere, case_size=4, deadline_s=2, progress=False)
    total = len(batch.find_cells(teaching_set)[0])
    assert (stopped.value.done, stopped.value.total) == (4, total)
    assert len(ResultsFile(out).read()) == 4  # the first case's rows, kept for the resume
    assert main(["batch", str(teaching_set), "--out", str(tmp_path / "r2.csv"), "--coordinator", nowhere,
                 "--case-size", "4", "--deadline", "2", "--quiet"]) == 130
    assert f"4 of {total}" in capsys.readouterr().err
