"""A coordinator whose configuration re-maps the request classes is the one source of them
for every client: the page's class list (gateway /api/config), `pathmaster query`, the batch,
and the DSCP each marks its requests with. Every check here fails if a client used
qos.classes.DEFAULT_CLASSES instead: urgent is CS5 (40) here, not AF41 (34); there is a
"second-opinion" class (AF31) and no "bulk"; teaching is AF12 with a label of its own.
"""

from __future__ import annotations

import json
import tomllib

import pytest

import qos.channels
from qos.classes import ClassTable, UnknownClass

from .test_gateway_http import read_case
from .web import WebClient

# A site serves classes this coordinator does not have: no thread of the coordinator may
# fail over them (its class-port look-up did, opening connections for the site's 'bulk').
pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")

REMAPPED_TOML = """
[classes.urgent]
dscp = 40
priority = 0
description = "frozen section: the surgeon is waiting (CS5)"

[classes.second-opinion]
dscp = 26
priority = 1
description = "a second opinion for another hospital (AF31)"

[classes.routine]
dscp = 18
priority = 2
description = "diagnostic query (AF21)"

[classes.teaching]
dscp = 12
priority = 3
description = "teaching-set lessons (AF12)"
"""
REMAPPED = ClassTable(tomllib.loads(REMAPPED_TOML)["classes"])


@pytest.fixture(scope="module")
def remapped(stack, tmp_path_factory):
    """A coordinator over the stack's sites, configured with REMAPPED (from its TOML file)."""
    from services.config import load_coordinator_config
    from services.coordinator.server import CoordinatorServer

    path = tmp_path_factory.mktemp("remapped") / "coordinator.toml"
    sites = "".join(f'\n[[sites]]\nname = "{name}"\naddress = "{site.address}"\n'
                    for name, site in stack.sites.items())
    # analysis_workers = 0: images to the sites, no analyser actors to start for this second coordinator
    path.write_text(f'[coordinator]\nlisten = "127.0.0.1:0"\nanalysis_workers = 0\n{sites}{REMAPPED_TOML}')
    coordinator = CoordinatorServer(load_coordinator_config(path)).start()
    yield coordinator
    coordinator.stop(0.5)


@pytest.fixture(scope="module")
def remapped_gateway(remapped):
    from services.gateway import start_gateway

    handle = start_gateway(remapped.address)
    yield WebClient(handle)
    handle.stop()


@pytest.fixture
def channels_opened(monkeypatch) -> list[tuple[str, int | None]]:
    """(address, DSCP) of every gRPC channel this process opens from now on."""
    opened = []
    real = qos.channels.open_channel

    def recording(address, dscp=None, *args, **kwargs):
        opened.append((address, dscp))
        return real(address, dscp, *args, **kwargs)

    monkeypatch.setattr(qos.channels, "open_channel", recording)
    return opened


def class_channel(coordinator, request_class: str) -> str:
    """The address of the coordinator's port for `request_class`."""
    return f"{coordinator.address.rpartition(':')[0]}:{coordinator.class_ports[request_class]}"


def dscps_to(opened, address: str) -> set:
    return {dscp for a, dscp in opened if a == address}


def test_the_client_learns_the_coordinators_table(remapped):
    from services.client import CoordinatorClient

    with CoordinatorClient(remapped.address) as client:
        assert client.classes == REMAPPED
        assert client.classes.names() == ["urgent", "second-opinion", "routine", "teaching"]
        assert client.request_class("urgent").dscp == 40
        with pytest.raises(UnknownClass, match="second-opinion"):
            client.request_class("bulk")


def test_the_page_lists_the_coordinators_classes(remapped_gateway):
    status, _, body = remapped_gateway.get("api/config")
    assert status == 200
    config = json.loads(body)
    assert [{k: c[k] for k in ("name", "dscp", "priority", "description")} for c in config["classes"]] == [
        {"name": c.name, "dscp": c.dscp, "priority": c.priority, "description": c.description}
        for c in REMAPPED]
    labels = {c["name"]: c["label"] for c in config["classes"]}
    assert labels["urgent"] == "Intra-operative — fastest" and labels["second-opinion"] == "Second opinion"
    assert all(c["allowed"] for c in config["classes"])  # a pathologist; this table has no bulk
    assert config["default_class"] == "routine" and "classes_error" not in config
    # The gateway checks a class against the same table.
    status, _, body = remapped_gateway.get("api/stats?class=second-opinion")
    assert status == 200 and json.loads(body)["request_class"] == "second-opinion"
    status, _, body = remapped_gateway.get("api/stats?class=bulk")
    assert status == 400 and "second-opinion" in json.loads(body)["error"]


def test_a_page_case_goes_with_the_coordinators_dscp(remapped, remapped_gateway, case_dir, channels_opened):
    events = remapped_gateway.post_case(read_case(case_dir, cells=(1,)), "second-opinion")
    assert events[-1]["type"] == "summary", events[-1]
    assert events[-1]["request_class"] == "second-opinion" and events[-1]["sites_ok"] == 3
    assert dscps_to(channels_opened, class_channel(remapped, "second-opinion")) == {26}


def test_query_uses_the_coordinators_classes_and_dscp(remapped, case_dir, channels_opened, capsys):
    from pathmaster.cli import main

    files = [str(case_dir / name) for name in ("cell1.png", "cell1-background.png", "cell1-mask.png")]
    assert main(["query", "--coordinator", remapped.address, "--class", "urgent", "--site", "site-a",
                 "--json", *files]) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert events[-1]["type"] == "summary" and events[-1]["request_class"] == "urgent"
    # CS5 (40) to the urgent port: the coordinator's table, not the default AF41 (34).
    assert dscps_to(channels_opened, class_channel(remapped, "urgent")) == {40}

    assert main(["query", "--coordinator", remapped.address, "--class", "second-opinion", "--site",
                 "site-a", "--json", *files]) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert events[-1]["request_class"] == "second-opinion"
    assert dscps_to(channels_opened, class_channel(remapped, "second-opinion")) == {26}

    # A class of the default table the coordinator does not have is refused before sending,
    # naming the coordinator's classes.
    assert main(["query", "--coordinator", remapped.address, "--class", "bulk", *files]) == 2
    err = capsys.readouterr().err
    assert "'bulk'" in err and "urgent, second-opinion, routine, teaching" in err and remapped.address in err


def test_batch_uses_the_coordinators_classes_and_dscp(remapped, case_dir, tmp_path, channels_opened, capsys):
    from pathmaster.cli import main
    from services.gateway.batch import ResultsFile, run_batch

    folder = tmp_path / "set"
    folder.mkdir()
    for name in ("cell1.png", "cell1-background.png", "cell1-mask.png"):
        (folder / name).write_bytes((case_dir / name).read_bytes())
    out = tmp_path / "results.csv"
    summary = run_batch(folder, out, remapped.address, request_class="second-opinion", progress=False)
    assert summary.status_counts() == {"ok": 1}
    assert [r["request_class"] for r in ResultsFile(out).read().values()] == ["second-opinion"]
    assert dscps_to(channels_opened, class_channel(remapped, "second-opinion")) == {26}

    with pytest.raises(UnknownClass, match="second-opinion"):
        run_batch(folder, tmp_path / "bulk.csv", remapped.address, request_class="bulk", progress=False)
    assert main(["batch", str(folder), "--out", str(tmp_path / "bulk.csv"), "--class", "bulk",
                 "--coordinator", remapped.address, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "'bulk'" in err and "second-opinion" in err
