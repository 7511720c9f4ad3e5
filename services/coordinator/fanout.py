"""One case's calls to its sites: send, hedge, fall back, and report each site once.

For each site the coordinator has a plan (qos.policy.SitePlan: mode, class, when to
hedge). `FanOut` makes the calls and yields each site's outcome the moment it is final:

- the first call goes in the planned class and mode; a small request goes as
  `plan.copies` copies, each over its own connection (lane), so that a packet lost on
  one connection stalls one copy only, `plan.copy_gap_s` apart (copy k at k gaps), so
  that they do not meet a full queue together;
- a site still silent at its `hedge_after_s` gets a second copy of the request on the
  hedge class (a more favoured one the user may use); the first good answer wins and the
  other copy is cancelled;
- a site that refuses a features request as not its own (INVALID_ARGUMENT: columns other
  than those it compares now; FAILED_PRECONDITION: another schema) may have been re-indexed
  since the coordinator last asked: its Info is asked again, and when a features request can
  still go it is sent once more, as the site now says; the decision says so;
- a site that refuses features otherwise (or again, or a failure in the search path) gets
  the images instead, when the case has them, and the decision says so;
- when every copy failed, the site's outcome carries each copy's error.

Calls are gRPC futures; their completions, the copies' and the hedge timers meet in one
queue, so one thread (the SubmitCase handler's) makes every decision and sends every copy.
"""

from __future__ import annotations

import queue
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import grpc

from pathmaster.records import Why
from qos.policy import SitePlan
from services import reasons
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb

# A site that answers these to a features request may still take the images.
FEATURES_FALLBACK_CODES = (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT,
                           grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.INTERNAL)

# ... and these may mean the coordinator's idea of the site is out of date (its columns or
# schema changed since its Info was read): ask again before falling back (FanOut `recheck`).
RECHECK_CODES = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION)


def new_send_id() -> str:
    """A fresh id for one send of a request (AnalyseRequest.send_id): its copies share it.
    64 random bits in 16 characters: a few bytes on the wire, no collision in a site's memory."""
    return secrets.token_hex(8)


def features_request(case_id: str, request_class: str, k: int, feature_schema: str,
                     features: list[pb.CellFeatures], columns=(), send_id: str = "") -> pb.AnalyseRequest:
    """The features-mode request to a site: each cell's full vector, or with `columns`
    (the site's SiteInfo.feature_columns, ascending) only the values the site compares.

    Parameters
    ----------
    case_id, request_class, k, feature_schema
        As AnalyseRequest's fields.
    features : list of pb.CellFeatures
        The cells' full vectors, in `feature_schema`.
    columns : sequence of int
        Indices into those vectors; empty: send them whole.
    send_id : str
        The send's id (`new_send_id`); empty: the site takes every copy as new.

    Returns
    -------
    pb.AnalyseRequest
        What goes on the wire (its ByteSize() is the request's bytes).
    """
    columns = [int(c) for c in columns]
    if columns:
        features = [pb.CellFeatures(cell_id=f.cell_id, values=[f.values[c] for c in columns],
                                    background_estimated=f.background_estimated, mask_estimated=f.mask_estimated,
                                    image_sha256=f.image_sha256)
                    for f in features]
    return pb.AnalyseRequest(case_id=case_id, request_class=request_class, k=k, feature_schema=feature_schema,
                             features=features, feature_columns=columns, send_id=send_id)


def as_sent(message: pb.AnalyseRequest, request_class: str, send_id: str) -> pb.AnalyseRequest:
    """`message` as one send of it goes: in `request_class` with `send_id` (a copy of the
    message when either differs, e.g. a hedge in another class or a retry)."""
    if message.request_class == request_class and message.send_id == send_id:
        return message
    sent = pb.AnalyseRequest()
    sent.CopyFrom(message)
    sent.request_class, sent.send_id = request_class, send_id
    return sent


def features_request_bytes(cell_ids: list[str], feature_count: int, columns=(), *, case_id: str = "",
                           request_class: str = "routine", k: int = 5, feature_schema: str = "") -> int:
    """Bytes on the wire of `features_request` for `cell_ids` before the values are known
    (a double is 8 bytes whatever its value; cells flagged estimated, as most are): for
    planning, and for the testbed's transfer workload."""
    cells = [pb.CellFeatures(cell_id=c, values=[0.0] * feature_count, background_estimated=True,
                             mask_estimated=True) for c in cell_ids]
    return features_request(case_id, request_class, k, feature_schema, cells, columns, new_send_id()).ByteSize()


@dataclass
class Attempt:
    """One copy of a site's request in flight."""

    call: grpc.Future
    sent_at: float
    request_class: str
    mode: str
    request_bytes: int
    label: str              # "first", "copy 2", ..., "hedge", "images fallback"
    send_id: str = ""       # shared by the copies of one send
    done_at: float | None = None  # the clock when the call completed (its gRPC callback)
    clock: Callable[[], float] = time.monotonic

    def elapsed_s(self) -> float:
        """Seconds from sending to the call's completion: the site's answer as it arrived,
        not when the fan-out thread got to it (behind other sites' answers, or a stream
        write to the client)."""
        return (self.done_at if self.done_at is not None else self.clock()) - self.sent_at


def _may_answer(attempt: Attempt) -> bool:
    """The copy is still running, or it has answered (its event may not be handled yet)."""
    call = attempt.call
    return not call.done() or (not call.cancelled() and call.exception() is None)


@dataclass
class SiteRun:
    """Everything about one site's part of the case."""

    plan: SitePlan
    attempts: list[Attempt] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    why: list[Why] = field(default_factory=list)   # what happened, as reason codes
    timer: threading.Timer | None = None
    copy_timers: list[threading.Timer] = field(default_factory=list)
    copies_due: set[int] = field(default_factory=set)  # lanes of copies not sent yet
    done: bool = False
    hedged: bool = False
    rechecked: bool = False   # its Info was asked again after a features refusal (once a case)
    rechecking: bool = False  # ... and has not answered yet
    refusal: str = ""         # the refusal that made it ask
    retry: Attempt | None = None  # the features sent again after the site's Info said what it compares

    def running(self) -> list[Attempt]:
        return [a for a in self.attempts if not a.call.done()]

    def fell_back(self) -> bool:
        """True once the site refused the planned mode and was sent the images instead."""
        return any(a.mode != self.plan.mode for a in self.attempts)

    def drop_copies(self) -> None:
        """Stop the timers of copies not sent yet: none of them will go."""
        for timer in self.copy_timers:
            timer.cancel()
        self.copies_due.clear()

    def cancel_timers(self) -> None:
        """Stop the hedge timer and the timers of copies not sent yet."""
        if self.timer is not None:
            self.timer.cancel()
        self.drop_copies()


@dataclass
class SiteOutcome:
    """A site's final answer (`reply` is None when every copy failed)."""

    site: str
    plan: SitePlan
    attempt: Attempt | None
    reply: pb.AnalyseReply | None
    elapsed_s: float
    code: grpc.StatusCode
    message: str
    why: list[Why]
    bytes_sent: int

    @property
    def decisions(self) -> list[str]:
        """`why` in full words."""
        return reasons.decisions(self.why)


class FanOut:
    """Sends one case to its sites and yields a `SiteOutcome` per site as each is final.

    Parameters
    ----------
    plans : dict
        site -> SitePlan.
    send : callable
        ``send(site, request_class, mode, lane, send_id) -> (grpc.Future, request_bytes)``,
        or None when the case cannot be sent that way (e.g. images of a case that came as
        features); `lane` (0, 1, ...) picks the connection: copies of one request go on
        different lanes; `send_id` goes in the request (AnalyseRequest.send_id): the first
        copy and its copies share `self.send_id`, a hedge, a retry and the images fallback
        each get a new one, so that the site answers each of those once.
    deadline : float
        The clock's time by which every site must have answered.
    send_id : str, optional
        The id of the case's first send (and its copies) to every site; default a new one.
    recheck : callable, optional
        ``recheck(site) -> concurrent.futures.Future | None``: after `site` refused a
        features request with one of RECHECK_CODES, ask its Info again; the future's result
        is what the site compares now (words, for the decision) when a features request can
        go again (`send` then builds it as the site now says), or None when it cannot.
        None (the default): such a refusal goes straight to the images.
    clock : callable, optional
        Monotonic seconds (default time.monotonic); the hedge and copy timers wait real time.
    """

    def __init__(self, plans: dict[str, SitePlan], send: Callable, deadline: float,
                 recheck: Callable | None = None, send_id: str | None = None, clock: Callable | None = None):
        self.clock = clock or time.monotonic
        self.runs = {site: SiteRun(plan) for site, plan in plans.items()}
        self.send = send
        self.send_id = send_id or new_send_id()
        self.deadline = deadline
        self.recheck = recheck
        self._events: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> list[SiteOutcome]:
        """Send every site's first copy; returns the outcomes of sites that could not be sent to."""
        unsendable = []
        for site, run in self.runs.items():
            if not self._attempt(site, run.plan.request_class, run.plan.mode, "first", 0, self.send_id):
                run.done = True
                unsendable.append(self._failure(site, grpc.StatusCode.FAILED_PRECONDITION,
                                                f"site {site} compares features of another schema and this "
                                                "case came as features only: send the images"))
                continue
            for lane in range(1, run.plan.copies):
                if run.plan.copy_gap_s <= 0:
                    self._attempt(site, run.plan.request_class, run.plan.mode, f"copy {lane + 1}", lane,
                                  self.send_id)
                    continue
                run.copies_due.add(lane)
                timer = threading.Timer(lane * run.plan.copy_gap_s, self._events.put, args=(("copy", site, lane),))
                timer.daemon = True
                run.copy_timers.append(timer)
                timer.start()
            if run.plan.hedge_after_s is not None:
                run.timer = threading.Timer(run.plan.hedge_after_s, self._events.put, args=(("hedge", site, None),))
                run.timer.daemon = True
                run.timer.start()
        return unsendable

    def _attempt(self, site: str, request_class: str, mode: str, label: str, lane: int = 0,
                 send_id: str | None = None) -> bool:
        """Send one copy: of the case's first send with `send_id`, else (hedge, retry,
        fallback) a send of its own."""
        send_id = send_id or new_send_id()
        # The clock starts before the call is made: the site may begin (and even finish)
        # before send() returns, and its own wall time must fit inside ours.
        sent_at = self.clock()
        sent = self.send(site, request_class, mode, lane, send_id)
        if sent is None:
            return False
        call, request_bytes = sent
        attempt = Attempt(call, sent_at, request_class, mode, request_bytes, label, send_id=send_id, clock=self.clock)
        with self._lock:
            self.runs[site].attempts.append(attempt)
        call.add_done_callback(lambda c, s=site, a=attempt: self._completed(s, a))
        return True

    def _completed(self, site: str, attempt: Attempt) -> None:
        """gRPC's callback as a call completes: note when, and queue it for the decisions."""
        attempt.done_at = self.clock()
        self._events.put(("done", site, attempt))

    def cancel(self) -> None:
        """Cancel every copy still running and every hedge timer (idempotent)."""
        with self._lock:
            self._closed = True
            runs = list(self.runs.values())
        for run in runs:
            run.cancel_timers()
            for attempt in run.attempts:
                attempt.call.cancel()

    def outcomes(self):
        """Yield each remaining site's SiteOutcome, in the order they become final."""
        waiting = {s for s, r in self.runs.items() if not r.done}
        while waiting:
            try:
                # Every call ends by its own deadline; the extra second only guards against
                # a bug leaving the stream open for ever.
                kind, site, attempt = self._events.get(timeout=max(0.0, self.deadline - self.clock()) + 1.0)
            except queue.Empty:
                for site in sorted(waiting):
                    yield self._failure(site, grpc.StatusCode.DEADLINE_EXCEEDED, f"site {site}: no answer by the deadline")
                return
            run = self.runs[site]
            if run.done:
                continue
            if kind == "copy":
                outcome = self._copy(site, run, attempt)  # `attempt` is the copy's lane here
            elif kind == "rechecked":
                outcome = self._rechecked(site, run, attempt)  # `attempt` is the recheck's future here
            else:
                outcome = self._hedge(site, run) if kind == "hedge" else self._finished(site, run, attempt)
            if outcome is not None:
                run.done = True
                run.cancel_timers()
                for other in run.running():
                    other.call.cancel()
                waiting.discard(site)
                yield outcome

    # ------------------------------------------------------------ decisions, one thread

    def _copy(self, site: str, run: SiteRun, lane: int) -> SiteOutcome | None:
        """A copy's time has come: send it, unless the site has an answer (or its deadline passed)."""
        run.copies_due.discard(lane)
        plan = run.plan
        if self.clock() < self.deadline and not self._closed and not run.fell_back() and not run.rechecked:
            self._attempt(site, plan.request_class, plan.mode, f"copy {lane + 1}", lane, self.send_id)
            return None
        if any(_may_answer(a) for a in run.attempts) or run.copies_due or run.rechecking:
            return None
        # Every copy sent has failed and this one could not go: the site's outcome is final.
        return self._failed(site, run, run.attempts[-1])

    def _hedge(self, site: str, run: SiteRun) -> SiteOutcome | None:
        plan = run.plan
        if run.hedged or run.fell_back() or len(run.attempts) > plan.copies or self.clock() >= self.deadline:
            return None
        run.hedged = True
        target_class = plan.hedge_class or plan.request_class
        # A hedge in another class has connections of its own (lane 0 there); in the same
        # class it takes the next lane, clear of the copies'.
        lane = 0 if target_class != plan.request_class else plan.copies
        if self._attempt(site, target_class, run.attempts[0].mode, "hedge", lane):
            params = {"after_s": plan.hedge_after_s, "hedge_class": target_class}
            run.why.append(Why("hedge_sent", params | {"predicted_s": plan.predicted_s}) if plan.predicted_s
                           else Why("hedge_sent_unpredicted", params))
        return None

    def _finished(self, site: str, run: SiteRun, attempt: Attempt) -> SiteOutcome | None:
        call = attempt.call
        elapsed = attempt.elapsed_s()
        if not call.cancelled() and call.exception() is None:
            answered = {"copy": attempt.label, "request_class": attempt.request_class}
            if len(run.attempts) > 1:
                others = len(run.running())  # cancelled by outcomes() as this answer is final
                run.why.append(Why("answered_by_copy_others_cancelled", answered | {"others": others}) if others > 1
                               else Why("answered_by_copy_one_cancelled" if others else "answered_by_copy", answered))
            elif run.copies_due:  # spaced copies: the answer came before the next one was due
                unsent = len(run.copies_due)
                run.why.append(Why("answered_before_copies_sent", answered | {"unsent": unsent}) if unsent > 1
                               else Why("answered_before_copy_sent", answered))
            return SiteOutcome(site, run.plan, attempt, call.result(), elapsed, grpc.StatusCode.OK, "OK",
                               run.why, attempt.request_bytes)
        if call.cancelled():
            code, details = grpc.StatusCode.CANCELLED, "cancelled"
        else:
            code, details = call.exception().code(), call.exception().details()
        run.errors.append(f"{attempt.label} copy ({attempt.request_class}, {attempt.mode}): {code.name}: {details}")
        if attempt.mode == "features" and code in RECHECK_CODES and self._ask_again(site, run, code, details):
            return None
        if attempt.mode == "features" and run.rechecked and attempt is not run.retry and (
                run.rechecking or any(other is not attempt and _may_answer(other) for other in run.attempts)):
            return None  # a copy of the refused request: the site's Info, and what went after it, decide
        if attempt.mode == "features" and code in FEATURES_FALLBACK_CODES and self._images_instead(
                site, run, attempt.request_class, f"{code.name}: {details}"):
            return None
        if run.copies_due or any(other is not attempt and _may_answer(other) for other in run.attempts):
            return None  # another copy may still answer (or is still to be sent), or has answered
        return self._failed(site, run, attempt)

    def _ask_again(self, site: str, run: SiteRun, code: grpc.StatusCode, details: str) -> bool:
        """After a features refusal: ask the site's Info again (once a case); True if asked."""
        if self.recheck is None or run.rechecked or self._closed or self.clock() >= self.deadline:
            return False
        run.rechecked = True
        asked = self.recheck(site)
        if asked is None:
            return False
        run.rechecking, run.refusal = True, f"{code.name}: {details}"
        run.drop_copies()  # copies of the refused request still to go would be refused too
        asked.add_done_callback(lambda f, s=site: self._events.put(("rechecked", s, f)))
        return True

    def _rechecked(self, site: str, run: SiteRun, asked) -> SiteOutcome | None:
        """The site's Info has answered after a features refusal: the features once more as it
        now says, or else the images; final when neither can go and no copy may answer."""
        run.rechecking = False
        try:
            now = asked.result()
        except Exception:  # noqa: BLE001 - a failed look-up is "no features", as None
            now = None
        plan = run.plan
        if (now is not None and not self._closed and self.clock() < self.deadline
                and self._attempt(site, plan.request_class, "features", "features retry")):
            run.retry = run.attempts[-1]
            run.why.append(Why("features_sent_again", {"refusal": run.refusal, "compares": now}))
            return None
        if self._images_instead(site, run, plan.request_class, run.refusal):
            return None
        if run.copies_due or any(_may_answer(a) for a in run.attempts):
            return None
        return self._failed(site, run, run.attempts[-1])

    def _images_instead(self, site: str, run: SiteRun, request_class: str, why: str) -> bool:
        """Send the images after features failed (once; when the case has them); True if sent."""
        if any(a.mode == "images" for a in run.attempts) or self._closed:
            return False
        if not self._attempt(site, request_class, "images", "images fallback"):
            return False
        run.why.append(Why("images_after_features_failed", {"error": why}))
        return True

    def _failed(self, site: str, run: SiteRun, attempt: Attempt) -> SiteOutcome:
        """The outcome of a site whose every copy failed, `attempt` the last one handled."""
        call = attempt.call
        if call.cancelled():
            code, details = grpc.StatusCode.CANCELLED, "cancelled"
        else:
            code, details = call.exception().code(), call.exception().details()
        elapsed = attempt.elapsed_s()
        message = f"site {site}: {code.name}: {details}"
        if len(run.errors) > 1:
            message = f"site {site}: every copy failed: " + "; ".join(run.errors)
        return SiteOutcome(site, run.plan, attempt, None, elapsed, code, message, run.why,
                           sum(a.request_bytes for a in run.attempts))

    def _failure(self, site: str, code: grpc.StatusCode, message: str) -> SiteOutcome:
        run = self.runs[site]
        return SiteOutcome(site, run.plan, None, None, 0.0, code, message, run.why,
                           sum(a.request_bytes for a in run.attempts))
