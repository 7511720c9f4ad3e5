"""Site vocabularies: built-in and TOML ones, stored at index time, unknown labels refused by
name, and votes across sites with different vocabularies through The Bethesda System."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pathmaster.site.ingest import ingest
from pathmaster.records import ConfigError, InvalidInput
from pathmaster.site.search import SiteIndex
from pathmaster.image.synth import write_dataset
from pathmaster.vocabulary import (BETHESDA_TERMS, BUILTIN, Vote, bethesda_vote, load_vocabulary, majority,
                                  severity_order)

HERLEV_TO_BETHESDA = {"normal_superficial": "NILM", "normal_intermediate": "NILM", "normal_columnar": "NILM",
                      "mild_dysplasia": "LSIL", "moderate_dysplasia": "HSIL", "severe_dysplasia": "HSIL",
                      "carcinoma_in_situ": "HSIL"}


def test_builtin_vocabularies_and_their_bethesda_terms():
    herlev, sipakmed, bethesda = BUILTIN["herlev"], BUILTIN["sipakmed"], BUILTIN["bethesda"]
    assert herlev.bethesda == HERLEV_TO_BETHESDA and len(herlev.labels) == 7
    assert herlev.label("light_dysplastic") == "mild_dysplasia"  # Herlev's own folder name
    assert sipakmed.bethesda == {"superficial_intermediate": "NILM", "parabasal": "NILM", "metaplastic": "NILM",
                                 "koilocytotic": "LSIL", "dyskeratotic": "LSIL"}
    assert not sipakmed.is_abnormal("metaplastic") and sipakmed.is_abnormal("koilocytotic")
    assert bethesda.label("asc-us") == "ASC-US" and bethesda.label("Asc H") == "ASC-H"
    assert set(bethesda.labels) >= {"NILM", "ASC-US", "ASC-H", "LSIL", "HSIL", "SCC", "AGC"}
    assert bethesda.abnormal == set(BETHESDA_TERMS) - {"NILM"}
    with pytest.raises(InvalidInput, match=r"unknown diagnosis class 'normal'.*vocabulary 'herlev'"):
        herlev.label("normal")


def test_vocabulary_file(tmp_path):
    path = tmp_path / "st-mary.toml"
    path.write_text('labels = ["normal", "abnormal"]\nabnormal = ["abnormal"]\n'
                    '[bethesda]\nnormal = "NILM"\nabnormal = "ASC-US"\n[aliases]\nneg = "normal"\n')
    vocabulary = load_vocabulary(path)
    assert vocabulary.name == "st-mary" and vocabulary.label("NEG") == "normal"
    assert vocabulary.to_bethesda("abnormal") == "ASC-US" and vocabulary.is_abnormal("abnormal")
    for text, key in (('labels = ["a"]\nlabel = 1\n', "label"),
                      ('labels = ["a"]\n[bethesda]\na = "CIN2"\n', "bethesda.a"),
                      ('labels = ["a"]\nabnormal = ["b"]\n', "abnormal"),
                      ('labels = ["a", "A"]\n', "labels")):
        path.write_text(text)
        with pytest.raises(ConfigError) as err:
            load_vocabulary(path)
        assert str(err.value).startswith(f"{path}: {key}:")
    with pytest.raises(InvalidInput, match="neither built in"):
        load_vocabulary(tmp_path / "missing.toml")


def test_majority_and_bethesda_vote():
    assert majority(["a", "b", "b", "a", None, ""]) == Vote("a", 2, 4)  # tie: first seen
    assert majority([None]) is None
    # Ordered by severity, a tie goes to the more severe label, wherever it was seen.
    cis = BUILTIN["herlev"]
    assert majority(["moderate_dysplasia"] * 5 + ["carcinoma_in_situ"] * 5, cis.labels).label == "carcinoma_in_situ"
    assert majority(["HSIL", "LSIL", "LSIL", "HSIL"], BETHESDA_TERMS) == Vote("HSIL", 2, 4)
    assert majority(["LSIL", "HSIL", "HSIL"], BETHESDA_TERMS) == Vote("HSIL", 2, 3)  # no tie: most votes
    assert bethesda_vote([(BUILTIN["bethesda"], ["LSIL", "HSIL"])]) == Vote("HSIL", 1, 2)
    # Across sites: by Bethesda severity, then by the built-in vocabulary's own order.
    herlev = BUILTIN["herlev"]
    order = severity_order((x, herlev.to_bethesda(x)) for x in ["carcinoma_in_situ", "moderate_dysplasia",
                                                                "normal_columnar", "mild_dysplasia"])
    assert order == ("normal_columnar", "mild_dysplasia", "moderate_dysplasia", "carcinoma_in_situ")
    mixed = severity_order([("HSIL", "HSIL"), ("mild_dysplasia", "LSIL"), ("NILM", "NILM"), ("odd", None)])
    assert mixed[0] == "odd" and mixed.index("NILM") < mixed.index("mild_dysplasia") < mixed.index("HSIL")
    vote = bethesda_vote([(BUILTIN["herlev"], ["mild_dysplasia", "carcinoma_in_situ", "severe_dysplasia"]),
                          (BUILTIN["bethesda"], ["HSIL", "NILM"])])
    assert vote == Vote("HSIL", 3, 5)


@pytest.fixture(scope="module")
def two_sites(tmp_path_factory):
    """The same 14 synthetic cells indexed twice: site "herlev" in Herlev's words, site
    "bethesda" from class folders named NILM/LSIL/HSIL with `--vocabulary bethesda`."""
    root = tmp_path_factory.mktemp("vocab")
    data = write_dataset(root / "syn", 14, seed=5)
    folders = root / "tbs"
    for image in sorted(Path(data).glob("*/synth-*.png")):
        term = HERLEV_TO_BETHESDA[image.parent.name]
        (folders / term).mkdir(parents=True, exist_ok=True)
        shutil.copy(image, folders / term / image.name)
    ingest(data, root / "herlev")
    report = ingest(folders, root / "bethesda", vocabulary=BUILTIN["bethesda"])
    assert report.problems == [] and report.total_cells == 14
    return {name: SiteIndex.open(root / name) for name in ("herlev", "bethesda")}, data, root


def test_sites_report_their_vocabulary_and_vote_together(two_sites):
    sites, data, _ = two_sites
    assert sites["herlev"].vocabulary.name == "herlev" and sites["bethesda"].vocabulary.name == "bethesda"
    assert sites["bethesda"].diagnoses() == ["NILM", "LSIL", "HSIL"]  # the vocabulary's order
    query = next(Path(data).glob("carcinoma_in_situ/synth-*[0-9].png"))
    from pathmaster.image.io import read_image

    image = read_image(query)
    background = read_image(query.with_name(query.stem + "-background.png"))
    per_site = []
    for site in sites.values():
        matches = site.search_analysis(site.analyse(image, background), k=5)
        per_site.append((site.vocabulary, [m.diagnosis for m in matches]))
    vote = bethesda_vote(per_site)
    assert vote.total == 10 and vote.label in ("NILM", "LSIL", "HSIL")
    # The same cell at both sites: its own copy is each site's nearest match, and both
    # name it HSIL, Herlev's carcinoma in situ through the mapping.
    assert per_site[0][1][0] == "carcinoma_in_situ" and per_site[1][1][0] == "HSIL"
    terms = [vocabulary.to_bethesda(x) for vocabulary, labels in per_site for x in labels]
    assert vote == majority(terms, BETHESDA_TERMS)


def test_unknown_labels_fail_by_name_and_a_site_keeps_its_vocabulary(two_sites, tmp_path):
    sites, data, root = two_sites
    odd = tmp_path / "odd"
    (odd / "normal").mkdir(parents=True)
    shutil.copy(next(Path(data).glob("normal_columnar/synth-*[0-9].png")), odd / "normal" / "a.png")
    report = ingest(odd, tmp_path / "site", vocabulary=BUILTIN["herlev"])
    assert report.total_cells == 0 and len(report.problems) == 1
    assert "unknown diagnosis class 'normal'" in report.problems[0][1] and "'herlev'" in report.problems[0][1]
    with pytest.raises(InvalidInput, match="this site's vocabulary is 'bethesda', not 'herlev'"):
        ingest(data, root / "bethesda", vocabulary=BUILTIN["herlev"])


def test_index_with_a_vocabulary_file_then_search(two_sites, tmp_path, capsys):
    """`pathmaster index --vocabulary FILE` on "normal"/"abnormal" folders, which no
    built-in vocabulary knows; `search --json` gives each match's Bethesda term."""
    import json

    from pathmaster.cli import main

    _, data, _ = two_sites
    dataset = tmp_path / "lab"
    for label, source in (("normal", "normal_intermediate"), ("abnormal", "severe_dysplasia")):
        (dataset / label).mkdir(parents=True)
        for image in sorted(Path(data).glob(f"{source}/synth-*[0-9].png")):
            for part in ("", "-mask", "-background"):
                shutil.copy(image.with_name(image.stem + part + ".png"), dataset / label / (image.stem + part + ".png"))
    vocabulary = tmp_path / "lab.toml"
    vocabulary.write_text('labels = ["normal", "abnormal"]\nabnormal = ["abnormal"]\n'
                          '[bethesda]\nnormal = "NILM"\nabnormal = "HSIL"\n')
    assert main(["index", str(dataset), "--db", str(tmp_path / "site"), "--quiet"]) == 1  # herlev: refused
    assert "unknown diagnosis class 'abnormal'" in capsys.readouterr().err
    site = tmp_path / "site2"
    assert main(["index", str(dataset), "--db", str(site), "--vocabulary", str(vocabulary), "--quiet"]) == 0
    query = next(dataset.glob("abnormal/synth-*[0-9].png"))
    capsys.readouterr()
    assert main(["search", "--db", str(site), str(query), "--json", "--k", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["vocabulary"] == "lab" and out["matches"][0]["diagnosis"] == "abnormal"
    assert out["matches"][0]["bethesda"] == "HSIL"
