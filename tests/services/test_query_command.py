"""`pathmaster query`, the desktop client, against the running deployment."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def query(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "pathmaster", "query", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def test_query_json_pairs_masks_and_streams_each_site(deployment, case_cells, tmp_path):
    files = []
    for i, cell in enumerate(case_cells[:2]):
        for role, suffix in (("image", ""), ("background", "-background"), ("mask", "-mask")):
            files.append(tmp_path / f"cell{i}{suffix}.png")
            files[-1].write_bytes(cell[role])
    done = query("--coordinator", deployment.coordinator.address, "--class", "urgent", "--json", *files)
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    # The plan (predicted wait, how each site gets the case) comes before any result.
    assert [e["type"] for e in events] == ["plan", "site", "site", "site", "summary"]
    plan = events[0]
    assert {s["site"] for s in plan["sites"]} == {"alpha", "beta", "gamma"}
    assert all(s["mode"] == "features" and s["reasons"] for s in plan["sites"])
    for site in events[1:4]:
        assert site["mode"] == "features" and "predicted_s" in site
        assert site["ok"] and [c["query_cell_id"] for c in site["cells"]] == ["cell0.png", "cell1.png"]
        # Background and mask were paired with their image and sent: nothing estimated.
        assert not any(c["mask_estimated"] or c["background_estimated"] for c in site["cells"])
    assert events[-1]["request_class"] == "urgent" and events[-1]["sites_ok"] == 3
    assert "predicted_s" in events[-1]
    # The case conclusion, as codes: two normal cells (superficial, intermediate) make NILM.
    conclusion = events[-1]["conclusion"]
    assert (conclusion["outcome"], conclusion["bethesda"], conclusion["cells_total"]) == ("nilm", "NILM", 2)
    assert [c["query_cell_id"] for c in conclusion["cells"]] == ["cell0.png", "cell1.png"]
    assert [r["code"] for r in conclusion["why"]] == ["no_abnormal_cell", "decision_support_not_a_specimen"]
    assert all(c["total"] == 15 and not c["abnormal"] for c in conclusion["cells"])


def test_query_predicts_once_the_sites_have_answered_and_logs_prediction_and_actual(deployment, case_cells, tmp_path):
    (tmp_path / "one.png").write_bytes(case_cells[0]["image"])
    address = deployment.coordinator.address
    for _ in range(2):  # the first answers teach the predictor every site's path and service time
        assert query("--coordinator", address, "--class", "routine", "--json", tmp_path / "one.png").returncode == 0
    done = query("--coordinator", address, "--class", "routine", "--json", tmp_path / "one.png")
    events = [json.loads(line) for line in done.stdout.splitlines()]
    plan, summary = events[0], events[-1]
    assert plan["predicted_s"] > 0 and all(s["predicted_s"] > 0 for s in plan["sites"])
    assert summary["predicted_s"] == plan["predicted_s"]
    logged = [json.loads(line) for line in deployment.case_log.read_text().splitlines()]
    named = deployment.coordinator.servicer.case_log.case_name(summary["case_id"])  # keyed, not as sent
    record = next(r for r in logged if r["case_id"] == named)
    assert record["predicted_s"] == round(plan["predicted_s"], 6) and record["total_s"] > 0
    expected_error = abs(record["predicted_s"] - record["total_s"]) / record["total_s"]
    assert record["prediction_error"] == pytest.approx(expected_error, abs=1e-3)
    assert {s["mode"] for s in record["sites"].values()} == {"features"}


def test_query_can_analyse_locally_and_upload_only_features(deployment, case_cells, tmp_path):
    files = []
    for i, cell in enumerate(case_cells[:3]):
        files.append(tmp_path / f"c{i}.png")
        files[-1].write_bytes(cell["image"])
    address = deployment.coordinator.address
    local = query("--coordinator", address, "--json", "--analyse-locally", *files)
    remote = query("--coordinator", address, "--json", "--ship", "images", *files)
    assert local.returncode == 0 and remote.returncode == 0, local.stderr + remote.stderr
    local_sites = {e["site"]: e for e in map(json.loads, local.stdout.splitlines()) if e["type"] == "site"}
    remote_sites = {e["site"]: e for e in map(json.loads, remote.stdout.splitlines()) if e["type"] == "site"}
    for name, site in local_sites.items():
        assert site["mode"] == "features" and remote_sites[name]["mode"] == "images"
        # The same matches whichever way the cell travelled.
        for a, b in zip(site["cells"], remote_sites[name]["cells"]):
            assert [m["cell_id"] for m in a["matches"]] == [m["cell_id"] for m in b["matches"]]
        assert site["bytes_sent"] * 20 < remote_sites[name]["bytes_sent"]


def test_query_text_output(deployment, case_cells, tmp_path):
    (tmp_path / "one.png").write_bytes(case_cells[0]["image"])
    done = query("--coordinator", deployment.coordinator.address, "--site", "beta", tmp_path / "one.png")
    assert done.returncode == 0, done.stderr
    assert any(line.split()[:2] == ["beta", "answered"] for line in done.stdout.splitlines())
    assert "one.png" in done.stdout and "% similar" in done.stdout and "faiss" not in done.stdout
    # The summary opens with the case's conclusion, before how many sites answered.
    summary = done.stdout[done.stdout.index("Conclusion: "):]
    assert summary.index("Conclusion: ") < summary.index("1 of 1 sites answered")
    # --verbose: every decision, the algorithm, times, bytes and votes.
    verbose = query("--coordinator", deployment.coordinator.address, "--site", "beta", "--verbose",
                    tmp_path / "one.png")
    assert verbose.returncode == 0, verbose.stderr
    assert "faiss-hnsw" in verbose.stdout and "KiB" in verbose.stdout and "distance" in verbose.stdout
    assert verbose.stdout.index("Conclusion: ") < verbose.stdout.index("1 site(s) OK")


def test_query_bad_input_is_named(deployment, case_cells, tmp_path):
    missing = tmp_path / "nope.png"
    done = query("--coordinator", deployment.coordinator.address, missing)
    assert done.returncode == 2 and "nope.png" in done.stderr and "not found" in done.stderr
    (tmp_path / "one.png").write_bytes(case_cells[0]["image"])
    done = query("--coordinator", deployment.coordinator.address, "--class", "express", tmp_path / "one.png")
    assert done.returncode == 2 and "INVALID_ARGUMENT" in done.stderr and "urgent" in done.stderr
    # A file of no accepted format is refused here, from its header, before anything is sent.
    (tmp_path / "junk.png").write_bytes(b"not a png at all")
    done = query("--coordinator", deployment.coordinator.address, tmp_path / "junk.png")
    assert done.returncode == 2 and "junk.png" in done.stderr and "PNG, BMP, TIFF or JPEG" in done.stderr
