"""The fuzz suite's calls as Hypothesis strategies: each draws one call to an entry point of
a `FuzzStack` (a function of no arguments returning its `Outcome`), so that the quick
profile (tests/services/test_fuzz.py) and the long run (``python -m tests.fuzz``) send the
same inputs."""

from __future__ import annotations

from functools import partial

from hypothesis import strategies as st

from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
from tests.fuzz import inputs
from tests.fuzz.targets import METHODS, FuzzStack, gateway_json, gateway_upload, raw_call, site_analyse, submit_case


def calls(target, stack: FuzzStack, *arguments: st.SearchStrategy):
    """`target(stack, *drawn arguments)`, to be called: a strategy of such calls."""
    return st.tuples(*arguments).map(lambda drawn: partial(target, stack, *drawn))


def coordinator_cases(stack: FuzzStack):
    """SubmitCase with generated cases, on any of the coordinator's ports, any deadline."""
    return calls(submit_case, stack, inputs.case_requests(stack.site_names[0]), inputs.PORTS,
                 inputs.call_timeouts())


def site_analyses(stack: FuzzStack):
    """Analyse with generated requests, at any site, on any of its ports, any deadline."""
    return calls(site_analyse, stack, inputs.analyse_requests(), st.sampled_from(stack.site_names), inputs.PORTS,
                 inputs.call_timeouts())


@st.composite
def _request_of(draw, service: str, method: str, site: str):
    """A message of the method's request type to mutate: a generated one where the suite
    has it, else one with generated fields."""
    if (service, method) == ("Site", "Analyse"):
        return draw(inputs.analyse_requests()).message
    if method == "SubmitCase":
        return draw(inputs.case_requests(site)).message
    if method == "GetImage":
        return pb.ImageRequest(site=draw(st.sampled_from([site, "nowhere", ""])),
                               cell_id=draw(inputs.ids(128))[0])
    if method == "GetClassStats":
        return pb.ClassStatsRequest(request_class=draw(inputs.classes())[0])
    return METHODS[(service, method)][0]()


@st.composite
def raw_bytes(draw, stack: FuzzStack):
    """Any method of a site or the coordinator, with a mutated request or random bytes."""
    service, method = draw(st.sampled_from(sorted(METHODS)))
    site = draw(st.sampled_from(stack.site_names))
    if draw(st.integers(0, 4)):
        data = draw(inputs.mutated(draw(_request_of(service, method, site))))
    else:
        data = draw(st.binary(max_size=512))
    return partial(raw_call, stack, service, method, data, draw(inputs.PORTS), draw(inputs.call_timeouts()), site)


def gateway_uploads(stack: FuzzStack):
    """POST /api/upload with generated names and images."""
    return calls(gateway_upload, stack, inputs.FILE_NAMES, inputs.pictures())


def gateway_jsons(stack: FuzzStack):
    """POST /api/pair and /api/case (staged files) with generated JSON bodies."""
    return st.one_of(calls(gateway_json, stack, st.just("api/pair"), inputs.pair_bodies()),
                     calls(gateway_json, stack, st.just("api/case"), inputs.staged_case_bodies()))


TARGETS = {"coordinator cases": coordinator_cases, "site analyses": site_analyses, "raw bytes": raw_bytes,
           "gateway uploads": gateway_uploads, "gateway json": gateway_jsons}


def any_call(stack: FuzzStack):
    """One call to any target: raw bytes most often (they are the quickest), then cases,
    site requests and uploads, then the gateway's JSON."""
    weights = {"raw bytes": 3, "coordinator cases": 2, "site analyses": 2, "gateway uploads": 2, "gateway json": 1}
    return st.one_of(*[TARGETS[name](stack) for name, times in weights.items() for _ in range(times)])
