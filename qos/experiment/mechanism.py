"""Where a run's packets were dropped, by place, and the mechanism claim tested on it.

The 2002 network's counters (`Testbed.bottleneck_stats`, per run as deltas in
`router_counters`) name each queue: "rA:hub/A1" is the master's card on hub A (its station),
"A1:A1-eth0" the card's kernel FIFO in front of it, "rA:hub/rA" router rA's port toward its
hosts, "core:core/rA" rA's port toward the shared segment. The routers' ports are where a
router strategy runs; the hosts' cards are where it cannot act.

The claim tested (`mechanism_tests`): a strategy at the routers shortens the case because it
protects the case's packets where it runs, i.e. the case's class loses fewer packets at the
routers' queues than under FIFO at the same level (one-sided Mann-Whitney U per strategy,
Holm-adjusted together). Raw data recorded before the per-station counters have only one
counter per medium ("rA:hub", mixing the master's card with rA's port): they are reported as
such and not tested.

The study's own claim (`hub_claim`) is stronger: the case's packets were lost at the hubs'
stations (the hosts' cards, "host card" here), where priority queuing at the routers cannot
reach, so PQ removes the losses at the routers' ports but not those at the stations. Two parts:
(a) where FIFO loses the case's packets: the share of its drops at the stations (of stations
plus router ports), with a percentile bootstrap interval over runs (no decision on fewer than
CLAIM_MIN_RUNS runs); (b) PQ against FIFO:
fewer drops at the router ports (one-sided Mann-Whitney U), while drops at the stations remain
(a bootstrap interval of PQ's mean station drops above 0). The hosts' kernel FIFOs
("A1:A1-eth0") count drops of every class together ("all"): they are counted apart, as
unclassed, and enter neither part.
"""

from __future__ import annotations

import numpy as np

PLACES = ("router port", "host card", "medium (not split)")


def place_of(key: str) -> tuple[str, str] | None:
    """(place, queue) of a `router_counters` key; None for a medium's total when its stations
    are also recorded (counted once)."""
    node, _, rest = key.partition(":")
    if "/" in rest:
        station = rest.split("/", 1)[1]
        return ("router port" if station.startswith("r") and len(station) == 2 else "host card"), key
    if rest in ("hub", "core"):
        return "medium (not split)", key
    if node == "core" or (node.startswith("r") and len(node) == 2):
        return "router port", key  # a router's kernel queue ("rA:rA-eth4", the lan network)
    return "host card", key  # a host's kernel FIFO ("A1:A1-eth0")


def drops_by_place(record: dict, klass: str) -> dict[str, int | None]:
    """One run's drops of `klass` by place (`PLACES`; None: the run recorded no queue there); a
    medium's total is left out where its stations were recorded."""
    counters = record.get("router_counters") or {}
    split = {k.split("/")[0] for k in counters if "/" in k}
    out: dict[str, int | None] = {p: None for p in PLACES}
    for key, classes in counters.items():
        if "/" not in key and key in split:
            continue
        where = place_of(key)
        c = (classes or {}).get(klass)
        if where is None or not isinstance(c, dict):
            continue
        out[where[0]] = (out[where[0]] or 0) + int(c.get("drops", 0))
    return out


def drops_by_queue(record: dict, klass: str) -> dict[str, int]:
    """One run's drops of `klass` per queue (key of `router_counters`)."""
    return {k: int((v or {}).get(klass, {}).get("drops", 0)) for k, v in (record.get("router_counters") or {}).items()
            if isinstance((v or {}).get(klass), dict)}


def place_rows(cells: dict, level: float, classes=("urgent", "bulk")) -> list[dict]:
    """Per strategy at `level`: the median per run of each class's drops at each place (nan: no
    queue recorded there)."""
    rows = []
    for key in sorted(k for k in cells if k[1] == level):
        cell = cells[key]
        if not cell.records:
            continue
        row = {"strategy": cell.strategy, "competing": level, "runs": len(cell.records)}
        for klass in classes:
            per = [drops_by_place(r, klass) for r in cell.records]
            for place in PLACES:
                seen = [p[place] for p in per if p[place] is not None]
                row[f"{klass} @ {place}"] = float(np.median(seen)) if seen else float("nan")
        rows.append(row)
    return rows


def split_counters(cells: dict) -> bool:
    """Whether the runs recorded per-station counters (else only per medium)."""
    return any("/" in k for c in cells.values() for r in c.records for k in (r.get("router_counters") or {}))


def mechanism_tests(cells: dict, level: float, case_class: str = "urgent", baseline: str = "fifo",
                    alpha: float = 0.05) -> list[dict]:
    """Does each strategy lose fewer of the case's packets at the routers' ports than `baseline`?

    One-sided Mann-Whitney U (scipy.stats.mannwhitneyu) of the per-run drops of `case_class`
    at "router port", per strategy at `level` against the baseline's, Holm-adjusted together.
    """
    from scipy import stats as sps

    from qos.experiment.findings import holm

    base = next((c for k, c in cells.items() if k[0] == baseline and k[1] == level), None)
    if base is None or not base.records:
        return []
    b = [drops_by_place(r, case_class)["router port"] or 0 for r in base.records]
    rows = []
    for key in sorted(k for k in cells if k[1] == level and k[0] != baseline):
        cell = cells[key]
        a = [drops_by_place(r, case_class)["router port"] or 0 for r in cell.records]
        if len(a) < 2 or len(b) < 2:
            continue
        p = 1.0 if max(a + b) == min(a + b) else float(sps.mannwhitneyu(a, b, alternative="less").pvalue)
        rows.append({"strategy": cell.strategy, "versus": baseline, "competing": level,
                     "median_drops": float(np.median(a)), "baseline_median_drops": float(np.median(b)), "p": p})
    for row, p in zip(rows, holm([r["p"] for r in rows])):
        row["p_holm"] = p
        row["fewer_at_routers"] = bool(p < alpha)
    return rows


HUB, PORT = "host card", "router port"
CLAIM_SEED = 0  # the bootstrap's seed: a report drawn twice from the same raw data says the same
CLAIM_RESAMPLES = 9999
CLAIM_MIN_RUNS = 5  # fewer runs give a bootstrap of a handful of distinct resamples: no decision on it


def unclassed_drops(record: dict) -> int:
    """One run's drops at queues that do not tell classes apart (the hosts' kernel FIFOs, "all")."""
    return sum(int((v or {}).get("all", {}).get("drops", 0)) for v in (record.get("router_counters") or {}).values()
               if isinstance((v or {}).get("all"), dict))


def _bootstrap(statistic, samples: tuple, confidence: float) -> tuple[float, float]:
    """Seeded percentile bootstrap (scipy.stats.bootstrap) of `statistic` over paired `samples`;
    percentile, not BCa: the drop counts are often all 0 in a cell, where BCa is undefined."""
    from scipy import stats as sps

    if len(samples[0]) < 2:
        return float("nan"), float("nan")
    ci = sps.bootstrap(samples, statistic, paired=True, vectorized=True, method="percentile",
                       confidence_level=confidence, n_resamples=CLAIM_RESAMPLES,
                       random_state=np.random.default_rng(CLAIM_SEED)).confidence_interval
    return float(ci.low), float(ci.high)


def _share(hub, port, axis=-1):
    return np.sum(hub, axis=axis) / (np.sum(hub, axis=axis) + np.sum(port, axis=axis))


def _mean(x, axis=-1):
    return np.mean(x, axis=axis)


def hub_claim(cells: dict, level: float, case_class: str = "urgent", baseline: str = "fifo",
              pq: str = "prio", alpha: float = 0.05) -> dict:
    """The study's mechanism claim at `level`: the case's drops are at the hubs' stations under
    FIFO (a), and PQ removes those at the router ports but not those at the stations (b).

    Parameters
    ----------
    cells : dict
        report.Cell per (strategy, competing, link, class), with their runs' records.
    level : float
        The competing level tested (the report uses its highest).
    case_class, baseline, pq : str
        The case's class, the FIFO strategy and the priority-queuing strategy.
    alpha : float
        1 - confidence of the intervals, and the level of part (b)'s test.

    Returns
    -------
    dict
        ``verdict`` ("reproduced", "not reproduced", "not resolvable at this n", or "not
        testable: ..."), ``n_fifo``/``n_pq`` runs, part (a) ``hub_share`` of FIFO's drops at the
        stations with ``hub_share_ci``, over the ``n_fifo_with_drops`` runs that lost any, and
        ``where``; part (b) the medians of PQ's and FIFO's drops at each place, ``port_p`` (PQ
        fewer at the ports, one-sided Mann-Whitney U), ``pq_hub_mean`` with ``pq_hub_mean_ci``;
        ``unclassed`` drops (hosts' kernel FIFOs, every class together) in both cells.
    """
    from scipy import stats as sps

    def cell_of(name):
        return next((c for k, c in cells.items() if k[0] == name and k[1] == level and k[3] == case_class), None)

    fifo, prio = cell_of(baseline), cell_of(pq)
    out: dict = {"competing": level, "class": case_class, "baseline": baseline, "pq": pq,
                 "n_fifo": len(fifo.records) if fifo else 0, "n_pq": len(prio.records) if prio else 0}
    if fifo is None or prio is None or not fifo.records or not prio.records:
        return out | {"verdict": f"not testable: no {baseline} or {pq} runs at {level:g}"}
    if not split_counters({fifo.key: fifo, prio.key: prio}):
        return out | {"verdict": "not testable: counters missing (no drops by class per station and port)"}
    conf = 1 - alpha
    places = {name: [drops_by_place(r, case_class) for r in c.records] for name, c in ((baseline, fifo), (pq, prio))}
    hub = {n: np.array([p[HUB] or 0 for p in per], dtype=float) for n, per in places.items()}
    port = {n: np.array([p[PORT] or 0 for p in per], dtype=float) for n, per in places.items()}
    out["unclassed"] = sum(unclassed_drops(r) for r in fifo.records + prio.records)
    for n, tag in ((baseline, "fifo"), (pq, "pq")):
        out[f"{tag}_hub_median"] = float(np.median(hub[n]))
        out[f"{tag}_port_median"] = float(np.median(port[n]))
    lost = (hub[baseline] + port[baseline]) > 0
    out["n_fifo_with_drops"] = int(lost.sum())
    if lost.any():
        out["hub_share"] = float(_share(hub[baseline][lost], port[baseline][lost]))
        out["hub_share_ci"] = _bootstrap(_share, (hub[baseline][lost], port[baseline][lost]), conf)
    else:
        out["hub_share"], out["hub_share_ci"] = float("nan"), (float("nan"), float("nan"))
    lo, hi = out["hub_share_ci"]
    out["where"] = ("no drops" if not lost.any() else "not resolvable" if lost.sum() < CLAIM_MIN_RUNS else
                    "hub stations" if lo > 0.5 else "router ports" if hi < 0.5 else "not resolvable")
    a, b = port[pq], port[baseline]
    out["port_p"] = (1.0 if a.size < 2 or b.size < 2 or np.ptp(np.r_[a, b]) == 0 else float(sps.mannwhitneyu(a, b, alternative="less").pvalue))
    out["pq_hub_mean"] = float(hub[pq].mean())
    out["pq_hub_mean_ci"] = _bootstrap(_mean, (hub[pq],), conf)
    ports_fewer = out["port_p"] < alpha
    hub_lo, hub_hi = out["pq_hub_mean_ci"]
    stations_remain = ("not resolvable" if hub[pq].size < CLAIM_MIN_RUNS else
                       "yes" if hub_lo > 0 else "no" if hub_hi == 0 else "not resolvable")
    out["pq_fewer_at_ports"], out["pq_stations_remain"] = ports_fewer, stations_remain
    if out["n_fifo"] >= CLAIM_MIN_RUNS and out["where"] in ("router ports", "no drops") or stations_remain == "no":
        out["verdict"] = "not reproduced"
    elif out["where"] == "hub stations" and ports_fewer and stations_remain == "yes":
        out["verdict"] = "reproduced"
    else:
        out["verdict"] = "not resolvable at this n"
    return out


def _interval(ci) -> str:
    lo, hi = ci
    return "-" if not (np.isfinite(lo) and np.isfinite(hi)) else f"{lo:.2f} .. {hi:.2f}"


def claim_row(claim: dict) -> dict:
    """`hub_claim`'s result as one row of the report's table."""
    row = {"competing": claim["competing"], "verdict": claim["verdict"], "n_fifo": claim["n_fifo"],
           "n_pq": claim["n_pq"]}
    if "where" not in claim:
        return row
    return row | {
        "(a) FIFO's drops at stations": f"{claim['hub_share']:.2f}" if np.isfinite(claim["hub_share"]) else "-",
        "(a) 95% interval": _interval(claim["hub_share_ci"]), "(a) where": claim["where"],
        "FIFO runs with drops": claim["n_fifo_with_drops"],
        "(b) median at ports, PQ / FIFO": f"{claim['pq_port_median']:g} / {claim['fifo_port_median']:g}",
        "(b) PQ fewer at ports, p": claim["port_p"],
        "(b) PQ's mean at stations": claim["pq_hub_mean"],
        "(b) 95% interval": _interval(claim["pq_hub_mean_ci"]),
        "unclassed drops": claim["unclassed"]}


def router_strategy(meta: dict, discipline: str) -> str | None:
    """The name of the experiment's plain `discipline` strategy at the routers (not shaped, not
    adaptive), e.g. "prio" or "router-pq"; None when it has none."""
    return next((s["name"] for s in meta["experiment"]["strategies"] if s["discipline"] == discipline
                 and s.get("shape_kbit") is None and not s.get("adaptive")
                 and s.get("at", "routers") == "routers"), None)


def report_lines(meta: dict, cells: dict, markdown_table) -> list[str]:
    """The report's "Mechanism" section: drops by place at the highest level, the study's claim
    (`hub_claim`, FIFO and PQ as the experiment names them) and each strategy against FIFO at
    the routers' ports (`mechanism_tests`); `markdown_table(rows, columns)` draws a table."""
    levels = sorted({k[1] for k in cells})
    if not levels or not any(r.get("router_counters") for c in cells.values() for r in c.records):
        return []
    top = levels[-1]
    rows = place_rows(cells, top)
    text = ["## Mechanism: where packets were dropped", "",
            f"Median per run, at {top:g}, of each class's drops by place: a router's port (where a router "
            f"strategy runs), a host's card (its station on the hub, or its kernel FIFO: where a router "
            f"strategy cannot act), or a medium's total where the runs did not record its stations; "
            f"'-': no queue of that place recorded.", "",
            markdown_table(rows, list(rows[0])) if rows else "(no runs)", ""]
    claim = claim_row(hub_claim(cells, top, baseline=router_strategy(meta, "fifo") or "fifo",
                                pq=router_strategy(meta, "prio") or "prio"))
    text += ["### The study's claim: urgent requests were dropped at the hubs", "",
             "(a) Under FIFO, the share of the urgent class's drops that were at the hubs' stations (of "
             "stations plus router ports; ratio of the totals over the runs that lost any), with a 95% "
             "percentile bootstrap interval over runs (seeded): 'hub stations' when the interval is above "
             "0.5, 'router ports' when below. (b) PQ against FIFO: fewer urgent drops at the router ports "
             "(one-sided Mann-Whitney U, alpha 0.05), and urgent drops at the stations remain (bootstrap "
             f"interval of PQ's mean per run above 0). Neither part decides on fewer than {CLAIM_MIN_RUNS} "
             "runs. Reproduced when (a) says hub stations and both "
             "parts of (b) hold; not reproduced when (a) says router ports (or FIFO lost none) or PQ lost "
             "none at the stations. Unclassed drops: the hosts' kernel FIFOs, which count every class "
             "together; in neither part.", "",
             markdown_table([claim], list(claim)), ""]
    if not split_counters(cells):
        return text + ["These raw data predate the per-station counters: a hub's drops are one total per medium "
                       "(\"rA:hub\" mixes the master's card with router rA's port), so neither the claim nor "
                       "the strategies' protection where they run can be tested on them.", ""]
    tests = mechanism_tests(cells, top)
    return text + ["Each strategy against FIFO: does it lose fewer of the case's (urgent) packets at the "
                   "routers' ports (one-sided Mann-Whitney U per strategy, Holm-adjusted together)?", "",
                   markdown_table(tests, list(tests[0])) if tests else "(no FIFO cell to compare with)", ""]
