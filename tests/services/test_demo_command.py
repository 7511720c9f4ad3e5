"""`pathmaster demo --once`, the README's main job, end to end in its own process.

Its three databases are pre-seeded in a fresh cache (copies of the session's small one)
so the test does not spend a minute generating cells; it joins the tests' Ray.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from pathmaster.vocabulary import BUILTIN, severity
from services.demo import CASE_SEED, DEMO_SITES
from services.synthetic import READY, synthetic_case_cells


@pytest.mark.slow
def test_demo_once_prints_every_site_and_the_conclusion_in_plain_words(site_db, tmp_path, ray_session):
    cache = tmp_path / "cache"
    for site in DEMO_SITES:
        shutil.copytree(site_db, cache / "demo" / f"{site.name}-seed{site.seed}-70cells")
        assert (cache / "demo" / f"{site.name}-seed{site.seed}-70cells" / READY).is_file()
    env = dict(os.environ, PATHMASTER_CACHE=str(cache))
    done = subprocess.run(
        [sys.executable, "-m", "pathmaster", "demo", "--once", "--port", "0", "--cells", "70",
         "--cache", str(cache / "demo"), "--ray-address", ray_session.get_runtime_context().gcs_address],
        capture_output=True, text=True, timeout=300, env=env)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "WITHOUT TLS" in out.splitlines()[0]
    assert "building" not in out  # the cache was used
    assert re.search(r"sign in once at +http://127\.0\.0\.1:\d+/login/once\?token=[\w-]{40,}\n", out), out
    # In plain words: each site's answer, its time and the wait; each match's diagnosis,
    # Bethesda term and similarity; no algorithm, no distance.
    first = out.split("the same case again")[0]
    for site in DEMO_SITES:
        assert re.search(rf"^{site.name}\s+answered in [\d.]+ s \(your wait [\d.]+ s\)$", first, re.M), first
    assert len(re.findall(r"test-2026-\d\.png \(true: [\w ]+\): ([\w ]+ \([\w-]+\) (<1|\d+)% similar(; |$))+",
                          first, re.M)) == 6 * len(DEMO_SITES)
    assert "faiss" not in first and "distance" not in first and "3 of 3 sites answered" in first
    # The case is concluded by its most significant abnormality, before its times and votes:
    # 3 normal cells, mild, moderate and severe dysplasia make HSIL in 2 of 6 cells.
    truth = [BUILTIN["herlev"].to_bethesda(c["diagnosis"]) for c in synthetic_case_cells(6, CASE_SEED)]
    worst = max(truth, key=severity)
    concluded = re.search(r"^Conclusion: ([\w-]+): (\d+) of 6 cells", first, re.M)
    assert concluded and concluded.groups() == (worst, str(truth.count(worst))), first
    assert first.index("Conclusion:") < first.index("3 of 3 sites answered")
    assert "decision support" in first.lower()
    # The second case is predicted before it is sent, and its actual wait printed beside it.
    second = out.split("the same case again")[1]
    assert re.search(r"expected in about [\d.]+ s", second), second
    assert re.search(r"case \w+: [\d.]+ s \(predicted [\d.]+ s\)", second), second
    # That the prediction is learnt from warm calls (sites and analysers serve a cell before
    # they are ready; a first, cold sample is held apart) is asserted where it does not depend
    # on how busy the machine is: tests/services/test_site_cells.py, test_predict_policy_admission.py.
    for site in DEMO_SITES:
        assert re.search(rf"{site.name}\s+answered in [\d.]+ s \(predicted [\d.]+ s\)", second), second
    log = cache / "demo" / "cases.jsonl"
    assert log.is_file() and '"outcome": "ok"' in log.read_text()
    # --cache holds everything the demo wrote: the page's users and audit log too.
    assert "site databases    synthetic cells" in out
    assert (cache / "demo" / "gateway" / "users.sqlite").is_file() and (cache / "demo" / "gateway" / "audit.log").is_file()
    assert sorted(p.name for p in cache.iterdir()) == ["demo"]
    assert (cache / "demo" / "case-id-key").stat().st_mode & 0o777 == 0o600  # the case log's secret, beside it


def test_a_real_dataset_is_dealt_over_the_sites_by_slide():
    from services.demo import slide_of

    assert slide_of("herlev/light_dysplastic/157181599-157181627-001.BMP") == "157181599-157181627"
    assert slide_of("herlev/x/157181599-157181627-012.BMP") == slide_of("herlev/y/157181599-157181627-001.bmp")
    assert slide_of("sipakmed/cell.bmp") == "cell"
