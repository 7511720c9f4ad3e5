"""A site's diagnosis vocabulary, and its mapping to The Bethesda System (TBS).

Every site labels its cells in its own words: Herlev's 7 classes, SIPaKMeD's 5, The
Bethesda System's categories, or a laboratory's own ("normal", "abnormal"). A site declares
its vocabulary when it is indexed (``pathmaster index --vocabulary NAME|FILE``; stored in
the site database) and reports it, with the Bethesda term of each label, so that matches
from sites with different vocabularies can be voted on together in Bethesda terms
(`bethesda_vote`, `majority`).

A vocabulary file is TOML::

    name = "st-mary"                       # optional; default: the file's name
    labels = ["normal", "low", "high"]     # the diagnoses, in order of severity
    abnormal = ["low", "high"]             # which of them count as abnormal
    [bethesda]                             # optional: each label's Bethesda term
    normal = "NILM"
    low = "LSIL"
    high = "HSIL"
    [aliases]                              # optional: other folder names of a label
    "low-grade" = "low"

Folder names are matched to labels ignoring case, '-' / ' ' vs '_' and a leading "im_"
(``records._folder_key``), so "ASC-US", "asc_us" and "Asc Us" are one label.

The built-in vocabularies (`BUILTIN`) and their Bethesda mapping, a judgement documented
here (TBS 2014: Nayar & Wilbur, *The Bethesda System for Reporting Cervical Cytology*, 3rd
ed., Springer 2015; Solomon et al., JAMA 2002;287:2114):

- ``herlev`` (Jantzen et al. 2005): the three normal classes -> NILM (superficial,
  intermediate and columnar cells are normal findings); mild dysplasia (CIN 1) -> LSIL;
  moderate dysplasia (CIN 2), severe dysplasia (CIN 3) and carcinoma in situ -> HSIL: TBS
  defines HSIL as "encompassing moderate and severe dysplasia, CIS; CIN 2 and CIN 3", and
  keeps SCC for invasive carcinoma, so CIS is HSIL, not SCC.
- ``sipakmed`` (Plissiti et al. 2018): superficial-intermediate, parabasal and metaplastic
  (benign) cells -> NILM; koilocytotic cells (the HPV cytopathic effect) -> LSIL;
  dyskeratotic cells -> LSIL: dyskeratosis is listed with koilocytosis among the HPV
  changes of LSIL, although it also occurs beside HSIL; a site that grades its dyskeratotic
  cells otherwise declares its own mapping.
- ``bethesda``: the TBS categories themselves, NILM first; every other one is abnormal.

Severity (`BETHESDA_TERMS`, least to most severe) puts squamous and glandular categories on
one scale, because a case is reported by its single most significant abnormality and a tie
between two terms must go to the more severe. Squamous: NILM < ASC-US < LSIL < ASC-H < HSIL
< SCC (TBS 2014; ASC-H "cannot exclude HSIL" carries a higher risk of CIN 2+ than LSIL).
Glandular: AGC < AIS < adenocarcinoma. Between them, by the risk and work-up each category
calls for: AGC (high-grade lesions found in 10-40% of follow-ups; colposcopy plus
endocervical, and from 35 endometrial, sampling, ASCCP 2019) sits with ASC-H, above LSIL; AIS
(a precancer treated by excision) sits with HSIL; adenocarcinoma sits with SCC (invasive).
Within each of these pairs the glandular one ranks above the squamous one, since its work-up
is the wider (endocervical and endometrial sampling besides colposcopy). This is a judgement
for ordering only; a cytologist reports each abnormality found.
"""

from __future__ import annotations

import tomllib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from pathmaster.defaults import MAX_NAME_CHARS, MAX_VOCABULARY_LABELS
from pathmaster.records import (DIAGNOSES, DIAGNOSIS_ALIASES, SIPAKMED_DIAGNOSES, ConfigError, InvalidInput,
                                _folder_key)

# The Bethesda System's interpretation categories, least to most severe (the module docstring
# says how squamous and glandular ones are ordered together).
BETHESDA_TERMS = ("NILM", "ASC-US", "LSIL", "ASC-H", "AGC", "HSIL", "AIS", "SCC", "ADENOCARCINOMA")
NILM = BETHESDA_TERMS[0]
FILE_KEYS = ("name", "labels", "abnormal", "bethesda", "aliases")


@dataclass(frozen=True)
class Vocabulary:
    """A site's diagnosis labels, which are abnormal, their Bethesda terms and aliases.

    Attributes
    ----------
    name : str
        What the vocabulary is called (reported by the site).
    labels : tuple of str
        The diagnoses, in order of severity.
    abnormal : frozenset of str
        The labels that count as abnormal.
    bethesda : dict
        label -> Bethesda term (one of `BETHESDA_TERMS`); labels without one are not voted
        on in Bethesda terms.
    aliases : dict
        Other names of labels (e.g. a dataset's folder names) -> label.
    """

    name: str
    labels: tuple[str, ...]
    abnormal: frozenset[str]
    bethesda: dict[str, str] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)

    def __contains__(self, label: object) -> bool:
        return label in self.labels

    def label(self, name: str, source: str | Path | None = None) -> str:
        """The label a class-folder name (or alias) stands for.

        Raises InvalidInput naming `source`, the name and the vocabulary when it is none
        of its labels or aliases.
        """
        key = _folder_key(name)
        for label in self.labels:
            if _folder_key(label) == key:
                return label
        for alias, label in self.aliases.items():
            if _folder_key(alias) == key:
                return label
        shown = ", ".join(self.labels[:20]) + (", ..." if len(self.labels) > 20 else "")
        raise InvalidInput(f"unknown diagnosis class {name[:MAX_NAME_CHARS]!r}: not a label of the site's vocabulary "
                           f"{self.name!r} ({shown}); declare another with `pathmaster index --vocabulary`",
                           source)

    def to_bethesda(self, label: str | None) -> str | None:
        """The Bethesda term of `label`, or None when it has none (or is unknown)."""
        return self.bethesda.get(label) if label else None

    def is_abnormal(self, label: str) -> bool:
        """True for an abnormal label; raises InvalidInput for one not in the vocabulary."""
        if label not in self.labels:
            raise InvalidInput(f"unknown diagnosis {label[:MAX_NAME_CHARS]!r} in vocabulary {self.name!r}")
        return label in self.abnormal

    def as_dict(self) -> dict:
        """JSON-ready form (stored in the site database; `from_dict` reads it back)."""
        return {"name": self.name, "labels": list(self.labels), "abnormal": sorted(self.abnormal),
                "bethesda": dict(self.bethesda), "aliases": dict(self.aliases)}

    @classmethod
    def from_dict(cls, data: dict, source: str | Path | None = None) -> "Vocabulary":
        """A checked Vocabulary from `as_dict`'s form or a parsed vocabulary file.

        Raises ConfigError naming `source` and the key at fault.
        """
        unknown = sorted(set(data) - set(FILE_KEYS))
        if unknown:
            raise ConfigError(f"unknown key; known: {', '.join(FILE_KEYS)}", source, unknown[0])
        labels = data.get("labels")
        if not isinstance(labels, list) or not labels or not all(isinstance(x, str) and x for x in labels):
            raise ConfigError("expected a non-empty list of label names", source, "labels")
        if len(labels) > MAX_VOCABULARY_LABELS:
            raise ConfigError(f"{len(labels)} labels; at most {MAX_VOCABULARY_LABELS}", source, "labels")
        long = [x for x in labels if len(x) > MAX_NAME_CHARS]
        if long:
            raise ConfigError(f"label {long[0][:20]!r}... is over {MAX_NAME_CHARS} characters", source, "labels")
        keys = Counter(_folder_key(x) for x in labels)
        twice = [x for x in labels if keys[_folder_key(x)] > 1]
        if twice:
            raise ConfigError(f"label {twice[0]!r} is given twice (case, '-' and ' ' do not count)", source, "labels")
        name = data.get("name", Path(source).stem if source else "custom")
        if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS:
            raise ConfigError(f"expected a name of 1-{MAX_NAME_CHARS} characters", source, "name")
        abnormal = data.get("abnormal", [])
        if not isinstance(abnormal, list) or not set(abnormal) <= set(labels):
            raise ConfigError("expected a list of some of the labels", source, "abnormal")
        tables = {}
        for key, allowed, what in (("bethesda", BETHESDA_TERMS, "a Bethesda term"), ("aliases", labels, "a label")):
            table = data.get(key, {})
            if not isinstance(table, dict):
                raise ConfigError("expected a table", source, key)
            for label, value in table.items():
                if key == "bethesda" and label not in labels:
                    raise ConfigError("not one of the labels", source, f"bethesda.{label}")
                if value not in allowed:
                    raise ConfigError(f"{value!r} is not {what} ({', '.join(allowed[:12])})", source,
                                      f"{key}.{label}")
            tables[key] = dict(table)
        return cls(name, tuple(labels), frozenset(abnormal), tables["bethesda"], tables["aliases"])


def _herlev() -> Vocabulary:
    bethesda = dict.fromkeys(DIAGNOSES[:3], "NILM")
    bethesda.update(mild_dysplasia="LSIL", moderate_dysplasia="HSIL", severe_dysplasia="HSIL",
                    carcinoma_in_situ="HSIL")
    aliases = {k: v for k, v in DIAGNOSIS_ALIASES.items() if v in DIAGNOSES and k not in DIAGNOSES}
    return Vocabulary("herlev", DIAGNOSES, frozenset(DIAGNOSES[3:]), bethesda, aliases)


def _sipakmed() -> Vocabulary:
    bethesda = dict.fromkeys(SIPAKMED_DIAGNOSES[:3], "NILM")
    bethesda.update(koilocytotic="LSIL", dyskeratotic="LSIL")
    return Vocabulary("sipakmed", SIPAKMED_DIAGNOSES, frozenset(SIPAKMED_DIAGNOSES[3:]), bethesda)


def _bethesda() -> Vocabulary:
    return Vocabulary("bethesda", BETHESDA_TERMS, frozenset(BETHESDA_TERMS[1:]),
                      {term: term for term in BETHESDA_TERMS},
                      {"ascus": "ASC-US", "asch": "ASC-H", "negative": "NILM", "adenocarcinoma_in_situ": "AIS"})


BUILTIN = {v.name: v for v in (_herlev(), _sipakmed(), _bethesda())}
DEFAULT = "herlev"


def load_vocabulary(name_or_path: str | Path) -> Vocabulary:
    """A built-in vocabulary by name (`BUILTIN`), or one read from a TOML file.

    Raises ConfigError naming the file and key for a bad file, InvalidInput for a name
    that is neither built in nor a file.
    """
    if str(name_or_path) in BUILTIN:
        return BUILTIN[str(name_or_path)]
    path = Path(name_or_path)
    if not path.is_file():
        raise InvalidInput(f"no such vocabulary: neither built in ({', '.join(BUILTIN)}) nor a file", path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"not TOML: {exc}", path) from None
    return Vocabulary.from_dict(data, path)


def vocabulary_for_labels(labels) -> Vocabulary:
    """The first built-in vocabulary holding every label (for databases indexed before
    sites declared one; herlev when there are none), else all built-in ones merged."""
    present = {x for x in labels if x is not None}
    for vocabulary in BUILTIN.values():
        if present <= set(vocabulary.labels):
            return vocabulary
    return merged(BUILTIN.values())


def merged(vocabularies) -> Vocabulary:
    """One vocabulary holding the labels, Bethesda terms and aliases of all of `vocabularies`
    (whose labels are distinct), named "a+b+..."."""
    parts = list(vocabularies)
    return Vocabulary("+".join(v.name for v in parts), tuple(x for v in parts for x in v.labels),
                      frozenset().union(*(v.abnormal for v in parts)),
                      {k: t for v in parts for k, t in v.bethesda.items()},
                      {k: x for v in parts for k, x in v.aliases.items()})


@dataclass(frozen=True)
class Vote:
    """The winner of a vote: `label` had `votes` of `total` votes."""

    label: str
    votes: int
    total: int


def severity(term: str | None, order=BETHESDA_TERMS) -> int:
    """The rank of `term` in `order` (least severe first); -1 for None or a term not in it."""
    try:
        return order.index(term)
    except ValueError:
        return -1


def majority(labels, order=None) -> Vote | None:
    """The most common label (None and "" do not vote).

    Parameters
    ----------
    labels : iterable of str or None
    order : sequence of str, optional
        Labels from least to most severe (e.g. `BETHESDA_TERMS`, or a `Vocabulary`'s
        ``labels``): a tie goes to the more severe label, as a cytologist reports the
        more significant finding. Without it (or between labels not in it) a tie goes to
        the label seen first.

    Returns None when nothing voted.
    """
    counts = Counter(x for x in labels if x is not None and x != "")
    if not counts:
        return None
    top = max(counts.values())
    tied = [x for x in counts if counts[x] == top]  # first-seen order
    label = max(tied, key=lambda x: severity(x, tuple(order))) if order is not None else tied[0]
    return Vote(label, top, sum(counts.values()))


def severity_order(labelled) -> tuple[str, ...]:
    """Diagnosis labels from least to most severe, for `majority`'s ties across sites.

    Parameters
    ----------
    labelled : iterable of (label, Bethesda term or None)
        Matches' diagnoses with the Bethesda term their site maps each to.

    Labels are ordered by their Bethesda term's severity, then, among labels of one term, by
    their place in the built-in vocabulary holding them all (`vocabulary_for_labels`), whose
    labels are in order of severity (Herlev's moderate < severe < carcinoma in situ).
    """
    terms: dict[str, int] = {}
    for label, term in labelled:
        if label:
            terms[label] = max(terms.get(label, -1), severity(term))
    within = vocabulary_for_labels(terms).labels
    return tuple(sorted(terms, key=lambda x: (terms[x], within.index(x) if x in within else -1)))


def bethesda_vote(site_matches) -> Vote | None:
    """Vote in Bethesda terms on matches from sites with different vocabularies.

    Parameters
    ----------
    site_matches : iterable of (Vocabulary, iterable of diagnosis labels)
        Each site's vocabulary and the diagnoses of its matches (nearest first).

    Returns
    -------
    Vote or None
        The most common Bethesda term over every match whose label maps to one; a tie goes
        to the more severe term.
    """
    return majority((vocabulary.to_bethesda(label) for vocabulary, labels in site_matches for label in labels),
                    BETHESDA_TERMS)


def stored_vocabulary(stored: dict | None, labels, source=None) -> Vocabulary:
    """A site's vocabulary as its database keeps it (``Vocabulary.as_dict``), or, for a site
    indexed before sites declared vocabularies (`stored` None), the built-in one that holds
    its cells' `labels`."""
    return Vocabulary.from_dict(stored, source) if stored else vocabulary_for_labels(labels)


def site_vocabulary(db, declared: Vocabulary | None = None, default: Vocabulary | None = None) -> Vocabulary:
    """A site's vocabulary: the one stored in its database `db` (a ``pathmaster.site.database.SiteDB``),
    else `declared`, else one holding the labels of the cells it already has, else
    `default` (its dataset's), else herlev; stored when new.

    Raises InvalidInput when `declared` differs from the stored one: a site has one
    vocabulary (index into a new site directory to use another).
    """
    stored = db.get_config("vocabulary")
    if stored is not None:
        current = stored_vocabulary(stored, (), db.path)
        if declared is not None and declared.as_dict() != current.as_dict():
            raise InvalidInput(f"this site's vocabulary is {current.name!r}, not {declared.name!r}; a site has "
                               "one vocabulary (index into a new site directory to use another)", db.path)
        return current
    if declared is None and len(db):  # indexed before sites declared vocabularies
        declared = stored_vocabulary(None, (c.diagnosis for c in db.cells()))
    declared = declared or default or BUILTIN[DEFAULT]
    db.set_config("vocabulary", declared.as_dict())
    return declared
