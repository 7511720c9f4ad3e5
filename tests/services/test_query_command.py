"""`pathmaster query`, the desktop client, against the running deployment."""

from __future__ import annotations

import json
import subprocess
import sys


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
    assert [e["type"] for e in events] == ["site", "site", "site", "summary"]
    for site in events[:3]:
        assert site["ok"] and [c["query_cell_id"] for c in site["cells"]] == ["cell0.png", "cell1.png"]
        # Background and mask were paired with their image and sent: nothing estimated.
        assert not any(c["mask_estimated"] or c["background_estimated"] for c in site["cells"])
    assert events[-1]["request_class"] == "urgent" and events[-1]["sites_ok"] == 3


def test_query_text_output(deployment, case_cells, tmp_path):
    (tmp_path / "one.png").write_bytes(case_cells[0]["image"])
    done = query("--coordinator", deployment.coordinator.address, "--site", "beta", tmp_path / "one.png")
    assert done.returncode == 0, done.stderr
    assert "beta" in done.stdout and "OK" in done.stdout and "one.png" in done.stdout


def test_query_bad_input_is_named(deployment, tmp_path):
    missing = tmp_path / "nope.png"
    done = query("--coordinator", deployment.coordinator.address, missing)
    assert done.returncode == 2 and "nope.png" in done.stderr and "not found" in done.stderr
    (tmp_path / "junk.png").write_bytes(b"not a png at all")
    done = query("--coordinator", deployment.coordinator.address, "--class", "express", tmp_path / "junk.png")
    assert done.returncode == 2 and "INVALID_ARGUMENT" in done.stderr and "urgent" in done.stderr
    done = query("--coordinator", deployment.coordinator.address, tmp_path / "junk.png")
    assert done.returncode == 2 and "junk.png" in done.stderr and "INVALID_ARGUMENT" in done.stderr
