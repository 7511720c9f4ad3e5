"""Predict how long a site will take for a case, and the case as a whole, before it is sent.

A site's call is modelled as its path plus its own work::

    predicted_s = base_s + (bytes_up + bytes_down) / rate_Bps + site_s

- `base_s` and `rate_Bps` (per request class) are fitted passively from the coordinator's
  own calls, as robust recent medians (a Theil-Sen rate, `PathModel`), among calls made
  with about as many cases in flight as now: the estimate follows competing traffic, and
  one stalled call or a burst of clients does not move it. Cases all of one size cannot
  separate rate from latency; the prior rate is kept and the rest goes to `base_s`.
- `site_s` is what the site reports (work queued ahead, workers, seconds per cell by
  shipping mode) plus the per-call overhead measured here (`SiteModel`).

The modelled parts' spreads add up and their medians do not sum to the whole's, so a call,
and a whole case (`CaseModel`: the coordinator's analysis, then its slowest site), is
predicted by the recent median of like ones (`RecentLevel`; "like": modelled alike, under
about the same concurrency), and until 3 are known by the modelled sum (a case's scaled by
`Calibration`, the recent ratio of actual to modelled). A call the model rates differently
(other bytes, a slower path, a site that reports a changed service time) falls back to the
sum at once. A fresh process's first call is cold, so it is held apart once a second is
known (`RecentMedian`). No library fits this model as a whole (scipy's Theil-Sen slope and
numpy medians do the parts); `PredictionLog` reports the median absolute percentage error
of predicted against actual.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

WINDOW_CALLS = 32          # calls kept per path
PRIOR_RATE_BPS = 100e6     # bits/s assumed before the path has shown its rate (a LAN)
SIMILAR_SHARING = 2.0      # calls made under up to 2x (or 1/2) the coordinator's concurrency are alike
RECENT_CALLS = 9           # calls a recent median is taken over: a spike is ignored, a new level
                           # is followed after RECENT_CALLS // 2 + 1 calls
RECENT_SLOPE_CALLS = 16    # calls a path's rate is fitted over (Theil-Sen: one stall does not tilt it)
RECENT_CASES = 5           # cases (or a site's calls) a recent level is the median of (at least 3 needed)
SIMILAR_MODELLED = 1.5     # calls the model rates within 1.5x of each other are alike (RecentLevel's `like`)
REPLY_BYTES_WEIGHT = 0.3   # a site's reply bytes per cell: EWMA weight of the latest reply
ONE_JOB_MODES = frozenset({"features"})  # modes a site serves a whole request in one job


def theilslopes():
    """scipy.stats.theilslopes, imported on first use: the processes that use only this module's
    small helpers (RecentMedian: the coordinator's Ray analysers; the experiment bench's sites)
    do not pay the ~2 s of CPU that importing scipy.stats costs. A Predictor loads it when it is
    made, so no case pays it."""
    from scipy.stats import theilslopes as fit

    return fit


class Calibration:
    """Recent ratios of actual to modelled seconds, by key (a site's mode, a kind of
    case), each with the concurrency it was measured under.

    `factor(key, sharing)` is the median of the last RECENT_CALLS ratios of `key` measured
    under about `sharing` cases in flight (within SIMILAR_SHARING), or of the last
    RECENT_CALLS of any concurrency when fewer than 3 are that similar; 1.0 before any.
    A median, because the median absolute percentage error is what predictions are
    judged by.

    Parameters
    ----------
    window : int
        Ratios kept per key (of every concurrency).
    """

    def __init__(self, window: int = WINDOW_CALLS):
        self.window = window
        self._ratios: dict[str, deque[tuple[float, float]]] = {}

    def add(self, key: str, actual_s: float, modelled_s: float | None, sharing: int = 1) -> None:
        """Record one outcome: `actual_s` against the model's `modelled_s` (ignored when
        either is not a positive number)."""
        if modelled_s is None or not (math.isfinite(actual_s) and math.isfinite(modelled_s)):
            return
        if actual_s <= 0 or modelled_s <= 0:
            return
        ratios = self._ratios.setdefault(key, deque(maxlen=self.window))
        ratios.append((actual_s / modelled_s, float(max(1, sharing))))

    def factor(self, key: str, sharing: int = 1) -> float:
        """The recent median ratio of `key` under about `sharing` cases in flight."""
        ratios = self._ratios.get(key)
        if not ratios:
            return 1.0
        sharing = max(1, sharing)
        similar = [r for r, k in ratios if max(k, sharing) / min(k, sharing) <= SIMILAR_SHARING]
        chosen = similar if len(similar) >= 3 else [r for r, _ in ratios]
        return float(np.median(chosen[-RECENT_CALLS:]))


class RecentLevel:
    """The recent median of actual seconds by key (e.g. a kind of case), from those measured
    under about the same concurrency (and, where given, rated alike by a model).

    `value(key, sharing, like)` is the median of the last `last` values of `key` measured
    under about `sharing` cases in flight (within SIMILAR_SHARING) and, with `like` (a
    positive number describing the call, e.g. the model's seconds for it), added with a
    `like` within SIMILAR_MODELLED of it; None while fewer than 3 are. Measured on loopback
    under load, this predicts a whole case better than the sum of its modelled parts (the
    analysis, then the slowest site): every part's spread adds up in the sum, and the parts'
    medians do not add up to the median of the whole.

    Parameters
    ----------
    last : int
        Values the median is taken over.
    window : int
        Values kept per key (of every concurrency).
    """

    def __init__(self, last: int = RECENT_CASES, window: int = WINDOW_CALLS):
        self.last = last
        self.window = window
        self._values: dict[str, deque[tuple[float, float, float | None]]] = {}

    def add(self, key: str, seconds: float, sharing: int = 1, like: float | None = None) -> None:
        """Record one actual time (ignored unless a positive number); `like`: what it is
        compared by (ignored unless a positive number)."""
        if math.isfinite(seconds) and seconds > 0:
            if like is not None and not (math.isfinite(like) and like > 0):
                like = None
            self._values.setdefault(key, deque(maxlen=self.window)).append(
                (float(seconds), float(max(1, sharing)), None if like is None else float(like)))

    def value(self, key: str, sharing: int = 1, like: float | None = None) -> float | None:
        """The recent median of `key` under about `sharing` cases in flight (and alike
        `like`, when given), or None."""
        sharing = max(1, sharing)
        if like is not None and not like > 0:
            return None  # nothing is alike a call the model cannot rate

        def alike(k: float, m: float | None) -> bool:
            if max(k, sharing) / min(k, sharing) > SIMILAR_SHARING:
                return False
            return like is None or (m is not None and max(m, like) / min(m, like) <= SIMILAR_MODELLED)

        similar = [v for v, k, m in self._values.get(key, ()) if alike(k, m)]
        return float(np.median(similar[-self.last:])) if len(similar) >= 3 else None


class RecentMedian:
    """The median of the last `window` values: a level that follows a change within
    window // 2 + 1 values and, unlike a mean, is not pulled by one slow outlier (the
    median absolute percentage error is what the predictions are judged by).

    The first value ever added is held apart as possibly cold (a fresh process's first
    call pays its lazy imports, a first search, a channel's set-up): it is the level
    while it is the only value, and is left out from the second value on. A median of
    two values is their mean, so without this one cold call would skew the level of the
    next two calls (the demo's second case was predicted 1.5 s against 0.3 s).

    Parameters
    ----------
    window : int
        Values kept (the first, cold one not counted).
    """

    def __init__(self, window: int = RECENT_CALLS):
        self._first: float | None = None
        self._values: deque[float] = deque(maxlen=window)

    def add(self, value: float) -> None:
        """Keep `value` (a non-finite one is ignored)."""
        if not math.isfinite(value):
            return
        if self._first is None:
            self._first = float(value)
        else:
            self._values.append(float(value))

    def value(self) -> float | None:
        """The median of the values kept (the first alone until a second comes), None
        before the first."""
        if self._values:
            return float(np.median(self._values))
        return self._first


@dataclass(frozen=True)
class PathFit:
    """A path's fitted model: transfer seconds = base_s + bytes / rate_Bps."""

    base_s: float
    rate_Bps: float
    calls: int

    def transfer_s(self, nbytes: int) -> float:
        """Predicted seconds to move `nbytes` (both directions summed) over this path."""
        return self.base_s + nbytes / self.rate_Bps


class PathModel:
    """Passive estimate of one (site, class) path from the calls made over it.

    Parameters
    ----------
    prior_rate_bps : float
        Rate in bits per second assumed until calls of different sizes show the real one.
    """

    def __init__(self, prior_rate_bps: float = PRIOR_RATE_BPS):
        self.prior_rate_Bps = prior_rate_bps / 8
        self._first: tuple[float, float, float] | None = None  # the first call, held apart (cold)
        self._calls: deque[tuple[float, float, float]] = deque(maxlen=WINDOW_CALLS)

    def observe(self, nbytes: int, transfer_s: float, sharing: int = 1) -> None:
        """Record one call: bytes moved (request + reply), its transfer seconds, and how
        many of the coordinator's cases (this one included) were in flight when it was made."""
        if nbytes < 0 or not math.isfinite(transfer_s) or transfer_s < 0:
            return
        if self._first is None:  # the path's first call may open its connection: cold
            self._first = (float(nbytes), float(transfer_s), float(max(1, sharing)))
            return
        self._calls.append((float(nbytes), float(transfer_s), float(max(1, sharing))))

    def fit(self, sharing: int = 1) -> PathFit | None:
        """The fit for a call made while `sharing` of the coordinator's cases are in
        flight, or None before the first call.

        The rate (slope) is the Theil-Sen one (the median of the pairwise slopes) of the
        last RECENT_SLOPE_CALLS calls; the base is the median, over the last RECENT_CALLS
        calls, of each call's transfer less its bytes at that rate. One slow call (a
        scheduling stall of ~0.1 s on a loaded machine, against ~5 ms of transfer) would
        otherwise tilt the slope or lift the next predictions, and the median absolute
        percentage error is what predictions are judged by. While sizes do not vary the
        prior rate is kept, unless the calls were faster than it allows (loopback, a
        LAN: ~900 KB in ~10 ms): then the recent median of seconds per byte is the rate
        and the base 0.

        The path's first call (which may have opened its connection) is used only while
        it is the only one (as `RecentMedian` treats a first value). Calls made under
        about the same sharing (within a factor SIMILAR_SHARING) are taken as they are;
        with fewer than 3 of those, every call is scaled to `sharing` as if the path's
        time were shared equally (transfer_s * sharing / its own sharing)."""
        calls = self._calls or ([self._first] if self._first is not None else [])
        if not calls:
            return None
        x, y, k = np.array(calls).T
        similar = np.maximum(k, sharing) / np.minimum(k, sharing) <= SIMILAR_SHARING
        if similar.sum() >= 3:
            x, y = x[similar], y[similar]
        else:
            y = y * sharing / k
        x, y = x[-RECENT_SLOPE_CALLS:], y[-RECENT_SLOPE_CALLS:]
        slope = None
        # Sizes must vary by more than ~10% of their mean for the slope to mean anything.
        if x.std() > 0.1 * x.mean() and len(x) >= 3:
            slope = float(theilslopes()(y, x).slope)
        if slope is None or not slope > 0:
            slope = 1.0 / self.prior_rate_Bps
            if np.median((y - slope * x)[-RECENT_CALLS:]) < 0:
                # Faster than the prior rate (loopback, a LAN): what the calls showed.
                slope = float(np.median((y / np.maximum(x, 1.0))[-RECENT_CALLS:])) or slope
        base = max(0.0, float(np.median((y - slope * x)[-RECENT_CALLS:])))
        return PathFit(base_s=float(base), rate_Bps=float(1.0 / slope), calls=len(x))


@dataclass(frozen=True)
class SiteLoad:
    """What a site reports about its work (in each reply and in Info).

    waiting_cells: cells queued at the site and not started; workers: cells it analyses at
    once; seconds_per_cell: its recent service time per cell, by shipping mode (a worker's
    wall time, dispatch to result); waiting_s: seconds of work ahead of a new cell (queued
    and running cells over the workers); at: when the report came (time.monotonic()).
    """

    waiting_cells: int = 0
    workers: int = 1
    seconds_per_cell: dict | None = None
    waiting_s: float = 0.0
    at: float = field(default_factory=time.monotonic)


class SiteModel:
    """One site's predictor: a path model per request class, and per shipping mode the
    site's work for a call::

        site_s = queue_s + overhead_s + seconds_per_cell * rounds

    - `queue_s`: the work the site last reported ahead of a new cell (`waiting_s`), less
      the time since that report (the queue drains meanwhile; never below 0);
    - `seconds_per_cell`: the site's reported service time per cell in that mode;
    - `rounds`: how many cells one worker does in turn: all of them in features mode (the
      site searches a request's vectors in one job), ceil(cells / workers) for images;
    - `overhead_s`: what a call costs the site beyond its cells' service (handler,
      decoding, reply): the recent median (`RecentMedian`) of the measured rest, site
      wall time less the site's reported queue wait less the cells' service.

    A call's prediction is the queue reported now plus the recent median of the site's own
    calls in the same mode that the model rated alike (`levels`, `RecentLevel` with `like`
    the modelled seconds), each less the queue it met; the queue plus the modelled seconds
    until 3 such calls are known.

    Parameters
    ----------
    prior_rate_bps : float
        Rate in bits per second assumed until calls of different sizes show the real one.
    clock : callable
        Monotonic seconds (time.monotonic); tests pass their own.
    """

    def __init__(self, prior_rate_bps: float = PRIOR_RATE_BPS, clock=time.monotonic):
        self.prior_rate_bps = prior_rate_bps
        self.clock = clock
        self.paths: dict[str, PathModel] = {}
        self.per_cell_s: dict[str, float] = {}
        self.overhead_s: dict[str, RecentMedian] = {}
        self.levels = RecentLevel()  # by mode: calls' seconds less their queue wait, with their modelled seconds
        self.load = SiteLoad(at=clock())

    def path(self, request_class: str) -> PathModel:
        """The path model of one class (made on first use)."""
        if request_class not in self.paths:
            self.paths[request_class] = PathModel(self.prior_rate_bps)
        return self.paths[request_class]

    def rounds(self, mode: str, cells: int) -> int:
        """Cells one worker serves in turn for a call of `cells` cells in `mode`."""
        if mode in ONE_JOB_MODES:
            return cells
        return math.ceil(cells / max(1, self.load.workers))

    def observe(self, request_class: str, mode: str, nbytes: int, transfer_s: float,
                cells: int, site_wall_s: float, load: SiteLoad | None = None,
                queue_s: float = 0.0, sharing: int = 1) -> None:
        """Record one answered call.

        Parameters
        ----------
        request_class, mode : str
            The class the call travelled in and how the cells were shipped
            ("features" or "images").
        nbytes : int
            Request plus reply bytes.
        transfer_s : float
            The call's wall time at the coordinator less `site_wall_s`, seconds.
        cells : int
            Cells in the call.
        site_wall_s : float
            Seconds the site spent on the call (queue included).
        load : SiteLoad, optional
            The site's report after the call.
        queue_s : float
            Of `site_wall_s`, the seconds its cells waited for a worker (site-reported).
        sharing : int
            The coordinator's cases in flight when the call was made, this one included.
        """
        # What the model made of this call before learning from it: the calls it rates alike
        # are the level's (after it, for the site's first call in this mode or on this path).
        modelled = self.modelled_s(request_class, mode, nbytes, cells, sharing)
        self.path(request_class).observe(nbytes, transfer_s, sharing)
        if load is not None:
            self.load = load
            reported = (load.seconds_per_cell or {}).get(mode)
            if reported is not None and reported > 0:
                self.per_cell_s[mode] = reported
        if cells <= 0 or site_wall_s <= 0:
            return
        if mode not in self.per_cell_s:
            # Without a report, the site's wall time per cell stands in for its service time.
            self.per_cell_s[mode] = max(0.0, site_wall_s - queue_s) / max(1, self.rounds(mode, cells))
        rest = site_wall_s - max(0.0, queue_s) - self.per_cell_s[mode] * self.rounds(mode, cells)
        self.overhead_s.setdefault(mode, RecentMedian()).add(rest)
        if modelled is None:
            modelled = self.modelled_s(request_class, mode, nbytes, cells, sharing)
        self.levels.add(mode, transfer_s + site_wall_s - max(0.0, queue_s), sharing, like=modelled)

    def queue_s(self) -> float:
        """Seconds of work ahead of a new cell now, from the latest report."""
        return max(0.0, self.load.waiting_s - (self.clock() - self.load.at))

    def site_parts(self, mode: str, cells: int) -> dict[str, float] | None:
        """{"queue_s", "overhead_s", "service_s"} of a call of `cells` cells (seconds), or
        None before the site has answered in this mode."""
        per_cell = self.per_cell_s.get(mode)
        if per_cell is None:
            return None
        overhead = self.overhead_s[mode].value() if mode in self.overhead_s else None
        return {"queue_s": self.queue_s(), "overhead_s": max(0.0, overhead or 0.0),
                "service_s": per_cell * self.rounds(mode, cells)}

    def site_s(self, mode: str, cells: int) -> float | None:
        """Predicted seconds of site work for `cells` new cells (queue ahead included)."""
        parts = self.site_parts(mode, cells)
        return None if parts is None else sum(parts.values())

    def modelled_s(self, request_class: str, mode: str, nbytes: int, cells: int, sharing: int = 1) -> float | None:
        """The model's seconds for a call, its queue wait left out: transfer + overhead +
        service; None until the site has answered once in this mode and the class's path
        has carried a call."""
        fit = self.path(request_class).fit(max(1, sharing))
        parts = self.site_parts(mode, cells)
        if fit is None or parts is None:
            return None
        return fit.transfer_s(nbytes) + parts["overhead_s"] + parts["service_s"]

    def predict(self, request_class: str, mode: str, nbytes: int, cells: int, sharing: int = 1) -> float | None:
        """Predicted completion seconds, or None until the site has answered once in this
        mode and the class's path has carried a call: the queue reported now, plus the recent
        median of 3 or more calls in `mode` the model rated alike (their modelled seconds
        within SIMILAR_MODELLED of this call's, under about as many cases in flight), else
        the modelled seconds. `sharing`: the coordinator's cases that share the path now,
        this one included (the transfer takes that many times its time alone)."""
        modelled = self.modelled_s(request_class, mode, nbytes, cells, sharing)
        if modelled is None:
            return None
        level = self.levels.value(mode, max(1, sharing), like=modelled)
        return self.queue_s() + (modelled if level is None else level)


class Predictor:
    """Every site's model, shared by the coordinator's threads."""

    def __init__(self, prior_rate_bps: float = PRIOR_RATE_BPS, clock=time.monotonic):
        theilslopes()  # scipy.stats loaded now, not in the first case whose slope is fitted
        self.prior_rate_bps = prior_rate_bps
        self.clock = clock
        self._sites: dict[str, SiteModel] = {}
        self._reply_bytes_per_cell: dict[str, float] = {}
        self._lock = threading.Lock()

    def site(self, name: str) -> SiteModel:
        with self._lock:
            if name not in self._sites:
                self._sites[name] = SiteModel(self.prior_rate_bps, self.clock)
            return self._sites[name]

    def observe(self, site: str, request_class: str, mode: str, request_bytes: int, reply_bytes: int,
                elapsed_s: float, cells: int, site_wall_s: float, load: SiteLoad | None = None,
                queue_s: float = 0.0, sharing: int = 1) -> None:
        """One answered call as the coordinator sees it: `SiteModel.observe` with the call's
        transfer (`elapsed_s`, the call's wall time, less `site_wall_s`), and the site's
        reply bytes per cell learnt for the next predictions (an EWMA, REPLY_BYTES_WEIGHT).

        Parameters
        ----------
        request_bytes, reply_bytes : int
            The request's and the reply's serialised bytes.
        elapsed_s : float
            The call's wall time at the coordinator, seconds.
        Others : as `SiteModel.observe`.
        """
        model = self.site(site)
        with self._lock:
            model.observe(request_class, mode, request_bytes + reply_bytes, max(0.0, elapsed_s - site_wall_s),
                          cells=cells, site_wall_s=site_wall_s, load=load, queue_s=queue_s, sharing=sharing)
            per_cell, old = reply_bytes / max(1, cells), self._reply_bytes_per_cell.get(site)
            self._reply_bytes_per_cell[site] = per_cell if old is None else old + REPLY_BYTES_WEIGHT * (per_cell - old)

    def call_bytes(self, site: str, request_bytes: int, cells: int) -> int:
        """A call's bytes both ways: the request's, and the reply's expected from the site's
        recent replies (0 before its first)."""
        with self._lock:
            return self._call_bytes(site, request_bytes, cells)

    def _call_bytes(self, site: str, request_bytes: int, cells: int) -> int:
        return int(request_bytes + self._reply_bytes_per_cell.get(site, 0.0) * cells)

    def predict(self, site: str, request_class: str, mode: str, request_bytes: int, cells: int,
                sharing: int = 1) -> float | None:
        """`SiteModel.predict` for one site, under the lock, of a request of `request_bytes`
        and its expected reply (`call_bytes`)."""
        model = self.site(site)
        with self._lock:
            return model.predict(request_class, mode, self._call_bytes(site, request_bytes, cells), cells, sharing)

    def path_fit(self, site: str, request_class: str) -> PathFit | None:
        model = self.site(site)
        with self._lock:
            return model.path(request_class).fit()


class CaseModel:
    """A whole case's predicted time, as the coordinator makes it before sending it.

    The recent median of like cases' actual times (`RecentLevel`: the same request class,
    modes, e.g. "features", and number of cells, under about as many cases in flight) once 3
    are known: under load an urgent case overtakes bulk ones, so their times say nothing of its;
    until then the modelled case, its coordinator's analysis then its slowest site's
    prediction, scaled by the recent ratio of actual to modelled (`Calibration`). The
    coordinator and the testbed's workload (services/experiment/workload.py) both predict
    with it, so the testbed measures the product's prediction.
    """

    def __init__(self):
        self.levels = RecentLevel()
        self.calibration = Calibration()
        self._lock = threading.Lock()

    @staticmethod
    def kind(modes) -> str:
        """The kind of a case whose sites are sent `modes`, e.g. "features+images"."""
        return "+".join(sorted(set(modes)))

    def predict(self, modes, cells: int, analysis_s: float, site_predictions, sharing: int = 1,
                request_class: str = "") -> tuple[float | None, float | None]:
        """The case's predicted seconds and its modelled seconds (each None when unknown).

        Parameters
        ----------
        modes : iterable of str
            How each site is sent its cells ("features", "images").
        cells : int
            Cells in the case.
        analysis_s : float
            The coordinator's predicted analysis before features leave, seconds (0 without).
        site_predictions : iterable of float or None
            Each site's predicted seconds (`Predictor.predict`).
        sharing : int
            The coordinator's cases in flight now, this one included.
        request_class : str
            The class the case is served in.
        """
        predictions = list(site_predictions)
        modelled = analysis_s + max(predictions) if predictions and None not in predictions else None
        kind = f"{request_class}/{self.kind(modes)}"
        with self._lock:
            predicted = self.levels.value(f"{kind}/{cells}", sharing)
            if predicted is None and modelled is not None:
                predicted = modelled * self.calibration.factor(kind, sharing)
        return predicted, modelled

    def observe(self, modes, sent_modes, cells: int, total_s: float, modelled_s: float | None,
                sharing: int = 1, request_class: str = "") -> None:
        """One case of `request_class` answered by every site: its actual seconds, against the
        modelled seconds `predict` gave it; learnt only when the sites were sent what was
        planned (`sent_modes` of the same kind as `modes`: a site that fell back to images
        makes another kind)."""
        if self.kind(sent_modes) != self.kind(modes):
            return
        kind = f"{request_class}/{self.kind(modes)}"
        with self._lock:
            self.calibration.add(kind, total_s, modelled_s, sharing)
            self.levels.add(f"{kind}/{cells}", total_s, sharing)


def absolute_percentage_error(predicted_s: float, actual_s: float) -> float:
    """|predicted - actual| / actual, as a fraction (0.1 = 10%)."""
    if actual_s <= 0:
        raise ValueError(f"actual time must be positive, got {actual_s}")
    return abs(predicted_s - actual_s) / actual_s


class PredictionLog:
    """The latest predicted-vs-actual pairs, for the median absolute percentage error."""

    def __init__(self, window: int = 500):
        self._errors: deque[float] = deque(maxlen=window)
        self._lock = threading.Lock()

    def add(self, predicted_s: float | None, actual_s: float) -> float | None:
        """Record one pair; returns its absolute percentage error (None without a prediction)."""
        if predicted_s is None or actual_s <= 0:
            return None
        error = absolute_percentage_error(predicted_s, actual_s)
        with self._lock:
            self._errors.append(error)
        return error

    def mdape(self) -> float | None:
        """Median absolute percentage error of the pairs kept, or None before any."""
        with self._lock:
            return float(np.median(self._errors)) if self._errors else None

    def __len__(self) -> int:
        return len(self._errors)
