"""Bounds on every client-chosen value at the coordinator, the private rotating case log,
and no case ids in INFO logs. A stand-in site (no Ray) answers, so these run in seconds."""

from __future__ import annotations

import json
import logging
import math
import stat
from concurrent import futures

import grpc
import pytest

from pathmaster import defaults
from pathmaster.ids import keyed_id
from qos.classes import DEFAULT_CLASSES
from qos.policy import MAX_CASE_DEADLINE_S
from services.coordinator.bounds import MAX_CASE_SITES
from services.coordinator.stats import CaseLog
from services.coordinator.validation import CaseRejected, check_case_request
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
from services.pb.pathmaster.v1 import pathmaster_pb2_grpc as pb_grpc

LIMITS = dict(classes=DEFAULT_CLASSES, max_cells=8, max_case_bytes=64 * 2**20)
HUGE_CASE_ID = "A" * (4 * 2**20)     # 4 MiB, as a careless or hostile client sends
HUGE_CELL_ID = "c" * (8 * 2**20)     # 8 MiB


def rejected(request) -> CaseRejected:
    with pytest.raises(CaseRejected) as err:
        check_case_request(request, **LIMITS)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert len(err.value.message) < 300, "a refused value is never echoed whole"
    return err.value


def test_ids_and_names_are_bounded_and_shown_short(case):
    message = rejected(pb.CaseRequest(case_id=HUGE_CASE_ID, cells=case)).message
    assert f"at most {defaults.MAX_CASE_ID_CHARS} characters" in message and "4194304 characters" in message
    assert "'AAAAAAAAAAAAAAAA'..." in message
    cell = pb.CellImage(cell_id=HUGE_CELL_ID, image=case[0].image)
    assert f"at most {defaults.MAX_CELL_ID_CHARS} characters" in rejected(pb.CaseRequest(cells=[cell])).message
    assert "character ' '" in rejected(pb.CaseRequest(case_id="ACC 1", cells=case)).message
    assert "allowed: [A-Za-z0-9._:-]" in rejected(pb.CaseRequest(case_id="ACC\n1", cells=case)).message
    assert "request class" in rejected(pb.CaseRequest(request_class="u" * 10**6, cells=case)).message
    assert "site name" in rejected(pb.CaseRequest(sites=["s" * 10**5], cells=case)).message
    many = rejected(pb.CaseRequest(sites=["a"] * (MAX_CASE_SITES + 1), cells=case)).message
    assert f"at most {MAX_CASE_SITES}" in many
    for deadline in (math.nan, math.inf, MAX_CASE_DEADLINE_S + 1):
        assert "deadline_s must be at most" in rejected(pb.CaseRequest(deadline_s=deadline, cells=case)).message
    # Within bounds: accession-number-like ids, file names with folders.
    good = [pb.CellImage(cell_id="teaching/mild_dysplasia/153958345-001.BMP", image=case[0].image)]
    assert check_case_request(pb.CaseRequest(case_id="ACC-2026:000123.b", cells=good), **LIMITS).name == "routine"


class StandInSite(pb_grpc.SiteServicer):
    """Answers every cell with one normal match, like a site with one database cell."""

    def Info(self, request, context):
        return pb.SiteInfo(site="stand-in")

    def Analyse(self, request, context):
        return pb.AnalyseReply(site="stand-in", algorithm="stand-in", cells=[
            pb.CellResult(query_cell_id=c.cell_id, matches=[pb.Match(cell_id="x", diagnosis="normal_superficial")])
            for c in request.cells])


@pytest.fixture
def coordinator(tmp_path):
    from services.config import CoordinatorConfig, SiteEndpoint
    from services.coordinator.server import CoordinatorServer

    site = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_SiteServicer_to_server(StandInSite(), site)
    port = site.add_insecure_port("127.0.0.1:0")
    site.start()
    config = CoordinatorConfig(sites=[SiteEndpoint(name="stand-in", address=f"127.0.0.1:{port}")],
                               case_log=tmp_path / "logs" / "cases.jsonl", analysis_workers=0,  # a stand-in site: images
                               case_id_key=tmp_path / "secrets" / "case-id-key")
    server = CoordinatorServer(config).start()
    yield server
    server.stop(0)
    site.stop(0)


def submit(address: str, request: pb.CaseRequest) -> list[pb.CaseEvent]:
    with grpc.insecure_channel(address) as channel:
        return list(pb_grpc.CoordinatorStub(channel).SubmitCase(request, timeout=30))


def test_over_long_ids_are_refused_over_grpc_with_a_short_message(coordinator, case):
    for request in (pb.CaseRequest(case_id=HUGE_CASE_ID, cells=case[:1]),
                    pb.CaseRequest(cells=[pb.CellImage(cell_id=HUGE_CELL_ID, image=case[0].image)])):
        with pytest.raises(grpc.RpcError) as err:
            submit(coordinator.address, request)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "at most" in err.value.details() and len(err.value.details()) < 300
    with grpc.insecure_channel(coordinator.address) as channel:
        with pytest.raises(grpc.RpcError) as err:
            pb_grpc.CoordinatorStub(channel).GetImage(pb.ImageRequest(site="s" * 10**6, cell_id="x"), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and len(err.value.details()) < 300


def test_case_ids_stay_out_of_info_logs_and_in_a_private_case_log(coordinator, case, caplog):
    accession = "ACC-2026-000123"
    with caplog.at_level(logging.DEBUG):
        events = submit(coordinator.address, pb.CaseRequest(case_id=accession, cells=case[:2]))
        made = submit(coordinator.address, pb.CaseRequest(cells=case[:1]))
    assert events[-1].summary.case_id == accession
    generated = made[-1].summary.case_id  # none given: the coordinator makes one
    assert generated and len(generated) <= defaults.MAX_CASE_ID_CHARS
    info = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    debug = [r.getMessage() for r in caplog.records if r.levelno < logging.INFO]
    assert any("case c-" in line for line in info)
    assert not [line for line in info if accession in line or generated in line]
    assert any(accession in line for line in debug)
    for cell in case[:2]:
        assert not [line for line in info if cell.cell_id in line]

    path = coordinator.config.case_log
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert accession not in text and generated not in text  # no client's case id in the log
    records = [json.loads(line) for line in text.splitlines()]
    # Each named by its keyed hash under the deployment's secret, made on first start, 0600.
    key_file = coordinator.config.case_id_key
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    key = bytes.fromhex(key_file.read_text())
    assert [r["case_id"] for r in records] == [keyed_id(accession, key), keyed_id(generated, key)]
    assert {r["case_ids"] for r in records} == {"keyed"}
    assert all(r["tag"].startswith("c-") for r in records)


def test_the_case_log_keeps_case_ids_only_when_the_operator_says_so(tmp_path):
    from services.config import CoordinatorConfig, SiteEndpoint
    from services.coordinator.server import case_log

    sites = [SiteEndpoint(name="a", address="127.0.0.1:1")]
    key_file = tmp_path / "secrets" / "case-id-key"
    keyed = CoordinatorConfig(sites=sites, case_log=tmp_path / "keyed.jsonl", case_id_key=key_file)
    first, restarted = case_log(keyed), case_log(keyed)
    assert first.key == restarted.key and len(first.key) == 32  # the same secret after a restart
    assert first.case_name("S26-01234") == restarted.case_name("S26-01234") != "S26-01234"
    kept = case_log(CoordinatorConfig(sites=sites, case_log=tmp_path / "kept.jsonl", keep_case_ids=True))
    kept.write({"case_id": "S26-01234"})
    kept.close()
    [record] = [json.loads(line) for line in (tmp_path / "kept.jsonl").read_text().splitlines()]
    assert (record["case_id"], record["case_ids"]) == ("S26-01234", "kept")


def test_case_log_is_private_and_rotated_by_size(tmp_path):
    path = tmp_path / "cases.jsonl"
    path.write_text("")
    path.chmod(0o644)  # an older, world-readable log is made private
    log = CaseLog(path, max_bytes=1000, backups=2)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for i in range(100):
        log.write({"case_id": f"case-{i:03d}", "padding": "x" * 50})
    log.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["cases.jsonl", "cases.jsonl.1", "cases.jsonl.2"]
    for name in files:
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600
        assert (tmp_path / name).stat().st_size <= 1000
    last = json.loads(path.read_text().splitlines()[-1])
    assert last["case_id"] == "case-099"
