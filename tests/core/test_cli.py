"""The core commands as a user runs them: synth -> index -> search -> evaluate, and bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from pathmaster.cli import main
from pathmaster.learning.policy import ABNORMAL_SCORES
from pathmaster.site.search import SiteIndex

N_CELLS = 14  # 2 per Herlev class


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("synthetic")
    assert main(["synth", "--out", str(out), "--cells", str(N_CELLS), "--seed", "4"]) == 0
    return out


@pytest.fixture(scope="module")
def site(dataset, tmp_path_factory):
    path = tmp_path_factory.mktemp("site")
    assert main(["index", str(dataset), "--db", str(path), "--quiet"]) == 0
    return path


def _run_json(capsys, argv):
    capsys.readouterr()
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def _cell_files(dataset, index=3):
    manifest = json.loads((dataset / "manifest.json").read_text())
    entry = manifest["cells"][index]
    return entry, {key: dataset / entry[key] for key in ("image", "background", "mask")}


def test_index_reports_and_a_second_run_adds_nothing(dataset, site, capsys):
    capsys.readouterr()
    assert main(["index", str(dataset), "--db", str(site), "--quiet"]) == 0
    assert f"0 cells added, {N_CELLS} already there, 0 problems; {N_CELLS} cells" in capsys.readouterr().out


def test_index_with_eye_options_looks_through_that_eye_and_a_reindex_keeps_it(dataset, tmp_path, capsys):
    path = tmp_path / "site"
    assert main(["index", str(dataset), "--db", str(path), "--quiet", "--eye-views", "2",
                 "--eye-resolution", "144"]) == 0
    assert "2 views" in capsys.readouterr().out
    assert main(["index", str(dataset), "--db", str(path), "--quiet", "--relearn"]) == 0
    described = SiteIndex.open(path).eye.describe()
    assert (described["views"], described["resolution"]) == (2, 144)


@pytest.mark.parametrize("option, value", [("--eye-views", "3"), ("--eye-resolution", "150"),
                                           ("--eye-resolution", "320")])
def test_index_refuses_eye_options_out_of_bounds_before_ingesting(dataset, tmp_path, option, value):
    path = tmp_path / "site"
    assert main(["index", str(dataset), "--db", str(path), "--quiet", option, value]) == 2
    assert not path.exists()


def test_search_json_finds_the_database_cell_itself_first(dataset, site, capsys):
    entry, files = _cell_files(dataset)
    out = _run_json(capsys, ["search", "--db", str(site), str(files["image"]), "--background", str(files["background"]),
                             "--mask", str(files["mask"]), "--json"])
    matches = out["matches"]
    assert len(matches) == 5
    assert {"cell_id", "diagnosis", "distance"} <= matches[0].keys()
    assert matches[0]["source_id"] == entry["id"] and matches[0]["diagnosis"] == entry["diagnosis"]
    assert matches[0]["distance"] == pytest.approx(0.0, abs=1e-3)
    assert not out["mask_estimated"] and not out["background_estimated"]
    assert out["in_database"] == [matches[0]["cell_id"]] and matches[0]["same_image"]
    assert not any(m["same_image"] for m in matches[1:]) and not out["self_excluded"]


def test_search_flags_a_query_in_the_database_and_can_leave_it_out(dataset, site, capsys):
    entry, files = _cell_files(dataset)
    argv = ["search", "--db", str(site), str(files["image"]), "--background", str(files["background"]),
            "--mask", str(files["mask"])]
    kept = _run_json(capsys, argv + ["--json"])
    left = _run_json(capsys, argv + ["--json", "--exclude-self"])
    itself = kept["in_database"][0]
    assert left["self_excluded"] and left["in_database"] == [itself]
    assert [m["cell_id"] for m in left["matches"][:4]] == [m["cell_id"] for m in kept["matches"][1:]]
    assert len(left["matches"]) == 5 and itself not in {m["cell_id"] for m in left["matches"]}
    capsys.readouterr()
    assert main(argv) == 0
    assert "(the query itself)" in capsys.readouterr().out
    # another cell's image with a changed pixel is not the query
    from pathmaster.image.io import read_image, write_png

    image = read_image(files["image"]).copy()
    image[0, 0] ^= 1
    changed = dataset.parent / "changed.png"
    write_png(changed, image)
    other = _run_json(capsys, ["search", "--db", str(site), str(changed), "--json"])
    assert other["in_database"] == [] and not any(m["same_image"] for m in other["matches"])


def test_search_without_mask_and_background_estimates_them(dataset, site, capsys):
    _, files = _cell_files(dataset, 8)
    out = _run_json(capsys, ["search", "--db", str(site), str(files["image"]), "--k", "3", "--json"])
    assert len(out["matches"]) == 3
    assert out["mask_estimated"] and out["background_estimated"]
    from pathmaster.image.segmentation import CHOICE_REASONS

    assert out["cell_choice"]["reason"] in CHOICE_REASONS and out["cell_choice"]["bars"] == [0, 0, 0, 0]
    capsys.readouterr()
    assert main(["search", "--db", str(site), str(files["image"])]) == 0
    text = capsys.readouterr().out
    assert "estimated from the image" in text and text.count("\n") == 8  # 2 notes (one: in the database), header, 5 rows


def test_evaluate_cross_validated_leave_one_out_and_held_out(dataset, site, capsys):
    cv = _run_json(capsys, ["evaluate", "--db", str(site), "--json", "--seed", "3"])
    # 2 cells per class: the 5 folds asked for become 2 stratified folds
    assert cv["folds"] == 2 and cv["seed"] == 3 and cv["queries"] == N_CELLS
    for key in ("top1", "precision_at_5", "majority_at_5", "map", "binary_accuracy"):
        assert cv["ci"][key][0] - 1e-9 <= cv[key] <= cv["ci"][key][1] + 1e-9
    assert set(cv["ceilings"]) == {"knn_tuned", "logistic_regression"}
    assert cv["groups"]["known"] is False and cv["groups"]["note"]  # synthetic cells: no slide images
    for key in ("majority", "operating_point"):
        figures = cv["abnormal"][key]
        assert figures["sensitivity_ci"][0] <= figures["sensitivity"] <= figures["sensitivity_ci"][1]
        assert figures["positives"] + figures["negatives"] == N_CELLS
    assert 0.0 <= cv["abnormal"]["roc"]["auc"] <= 1.0
    assert cv == _run_json(capsys, ["evaluate", "--db", str(site), "--json", "--seed", "3"])
    loo = _run_json(capsys, ["evaluate", "--db", str(site), "--json", "--loo"])
    for key in ("top1", "precision_at_5", "majority_at_5", "map", "binary_accuracy"):
        assert 0.0 <= loo[key] <= 1.0
    assert sum(map(sum, loo["confusion"]["matrix"])) == N_CELLS == loo["queries"]
    # the database's own cells as held-out queries: each finds itself first
    held = _run_json(capsys, ["evaluate", "--db", str(site), "--queries", str(dataset), "--json"])
    assert held["top1"] == 1.0 and held["queries"] == N_CELLS
    assert held["abnormal"]["majority"]["positives"] + held["abnormal"]["majority"]["negatives"] == N_CELLS
    assert held["abnormal"]["roc"]["auc"] > 0.5
    assert held["map"] > loo["map"]
    # the score the site decides by, beside the match share, each named
    assert cv["abnormal"]["name"] == held["abnormal"]["name"] == "match_share"
    for figures in (cv["site_score"], held["site_score"]):
        point = figures["operating_point"]
        assert figures["score"] in ABNORMAL_SCORES
        assert point["positives"] + point["negatives"] == N_CELLS
        assert point["sensitivity_ci"][0] <= point["sensitivity"] <= point["sensitivity_ci"][1]
        assert 0.0 <= figures["roc"]["auc"] <= 1.0 and figures["cases"]["cases"] > 0
    assert len(cv["site_score"]["per_fold"]) == cv["folds"] == len(cv["site_score"]["operating_point"]["thresholds"])
    site_index = SiteIndex.open(site)
    assert held["site_score"]["operating_point"]["thresholds"] == [round(site_index.learnt.threshold, 6)]
    assert held["site_score"]["score"] == site_index.learnt.score
    fast = _run_json(capsys, ["evaluate", "--db", str(site), "--json", "--seed", "3", "--no-site-score"])
    assert fast["site_score"] is None and fast["abnormal"] == cv["abnormal"]


def _fails(capsys, argv, *needles):
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, err
    return err


def test_bad_search_inputs_name_the_file_and_the_problem(dataset, site, tmp_path, capsys):
    junk = tmp_path / "notes.png"
    junk.write_text("not a picture")
    _fails(capsys, ["search", "--db", str(site), str(junk)], str(junk), "not an image")
    truncated = tmp_path / "cut.png"
    _, files = _cell_files(dataset)
    truncated.write_bytes(files["image"].read_bytes()[:400])
    _fails(capsys, ["search", "--db", str(site), str(truncated)], str(truncated), "truncated")
    _, other = _cell_files(dataset, 5)
    _fails(capsys, ["search", "--db", str(site), str(files["image"]), "--mask", str(other["mask"])],
           str(other["mask"]), "mask is")
    _fails(capsys, ["search", "--db", str(tmp_path / "nosite"), str(files["image"])], "no site database here")
    _fails(capsys, ["search", "--db", str(site), str(tmp_path / "missing.png")], "missing.png", "not found")


def test_index_reports_bad_files_and_ingests_the_rest(dataset, tmp_path, capsys):
    folder = tmp_path / "plain" / "mild_dysplasia"
    folder.mkdir(parents=True)
    entry, files = _cell_files(dataset, 3)
    shutil.copy(files["image"], folder / "good.png")
    shutil.copy(files["mask"], folder / "good-mask.png")
    (folder / "broken.png").write_bytes(files["image"].read_bytes()[:300])
    capsys.readouterr()
    assert main(["index", str(tmp_path / "plain"), "--db", str(tmp_path / "site"), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "broken.png" in captured.err and "1 cells added" in captured.out and "1 problems" in captured.out


def test_index_of_a_missing_folder_fails_cleanly_from_the_real_entry_point(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pathmaster", "index", str(tmp_path / "absent"),
                           "--db", str(tmp_path / "site")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "absent" in done.stderr and "Traceback" not in done.stderr
