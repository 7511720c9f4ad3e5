"""The real bench: the PathMaster 2002 testbed (qos.testbed) with a case workload and competing downloads.

    bench = TestbedBench(experiment)     # builds a testbed with its own tag, starts the sites
    bench.configure(link, strategy)      # the strategy on every bottleneck queue
    bench.set_competing(8, seed)         # 8 downloads master -> each target (iperf3 -R)
    case = bench.run_case("urgent", seed, "run-id")
    bench.finish()                       # stops the competing traffic, returns what it achieved
    bench.close()                        # stops everything; the testbed leaves nothing behind

The case: the master (A1) sends the case to the server of every subnet in parallel over
gRPC, one channel per class with its DSCP (workload.py). The competing traffic comes from
qos.traffic (the study's downloads from the master to B3 and C3, constant-rate UDP or
Pareto bursts), marked with the bulk class's DSCP; what it achieves during each case is
read from the targets' receive counters, and each block's own totals are kept.
"""

from __future__ import annotations

import json
import selectors
import subprocess
import sys
import time

from qos import netns
from qos import traffic
from qos.cisco import WFQ_WEIGHTS
from qos.experiment.spec import Competing, Experiment, LinkProfile, Strategy
from qos.testbed import kernel
from qos.testbed.config import load_config
from qos.testbed.testbed import Testbed
from services.shared import SITE_PORT
from services.experiment.workload import classes_argv


def discipline_table(strategy: Strategy, link: LinkProfile) -> tuple[dict, str]:
    """The testbed's [bottleneck.discipline] table and backend for one strategy on one link.

    The kernel backend (htb) does FIFO, priority, WFQ-like shares and shaping; WRED and a
    propagation delay need the user-space emulator (this kernel has neither red nor netem).
    The delay is split over the two uplinks a packet between two subnets crosses, so the
    one-way delay between subnets is the link's `delay_ms`.
    """
    if link.network == "2002":  # the study's routers: Cisco IOS's disciplines, on the hubs (user space)
        return strategy.ios_table(), "emulator"
    table: dict = {"limit_packets": link.queue_packets}
    if strategy.discipline == "fifo":
        table["strategy"] = "fifo"
    elif strategy.discipline == "prio":
        table["strategy"] = "priority"
    elif strategy.discipline == "wfq":
        table["weights"] = dict(strategy.params.get("weights", WFQ_WEIGHTS))
        table["strategy"] = "shares"
    elif strategy.discipline == "wred":
        table["strategy"] = "wred"
        table["wred"] = {k: v for k, v in strategy.params.items()}
    elif strategy.discipline in ("codel", "class-codel"):  # emulator only: its own buffer
        table = strategy.ios_table()
    if strategy.shape_kbit is not None:
        if table["strategy"] != "shares":
            raise ValueError(f"strategy {strategy.name!r}: shaping combines with wfq only")
        table |= {"strategy": "shaping", "shaped_class": "bulk", "shaped_rate_kbit": strategy.shape_kbit}
    backend = "kernel"
    if strategy.discipline in ("wred", "codel", "class-codel") or link.delay_ms:
        backend = "emulator"
        if link.delay_ms:
            table["delay_ms"] = link.delay_ms / 2
    return table, backend


def competing_spec(competing: Competing, level: float, seed: int) -> dict:
    """The qos.traffic table for one level: downloads = streams per target, wget = fetching
    processes per target; udp and pareto =
    total mean rate in kbit/s over all targets."""
    spec: dict = {"kind": competing.kind, "targets": list(competing.targets)}
    if "dscp" in competing.params:
        spec["dscp"] = int(competing.params["dscp"])
    if competing.kind == "downloads":
        spec["streams"] = int(level)
    elif competing.kind == "wget":
        spec["processes"] = int(level)
        spec["file_bytes"] = competing.fetch_bytes
    elif competing.kind == "udp":
        spec["rate_bps"] = level * 1000
    else:
        spec["mean_bps"] = level * 1000 / len(competing.targets)
        spec["seed"] = seed
        if "alpha" in competing.params:
            spec["alpha"] = float(competing.params["alpha"])
    return spec


class AgentError(RuntimeError):
    """The master's workload agent did not answer as expected."""


class TestbedBench:
    """A testbed of its own (unique tag) with sites, a master agent and competing traffic."""

    __test__ = False  # not a pytest class, despite the name

    def __init__(self, experiment: Experiment, tag: str | None = None, testbed_config=None):
        self.experiment = experiment
        self.workload = experiment.workload
        config = (testbed_config or load_config()).with_tag(tag or netns.new_tag("x"))
        first = experiment.links[0]
        config = config.with_bottleneck(rate_kbit=first.core_kbit).with_network(first.network)
        self.testbed = Testbed(config, classes=experiment.classes)  # routers classify by the run's DSCPs
        self.sites: dict = {}
        self.agent: subprocess.Popen | None = None
        self.traffic = None  # the running qos.traffic generator, if any
        self.traffic_reports: list[dict] = []  # what each block of competing traffic achieved
        self.competing_level = 0.0
        self.strategy: Strategy | None = None  # the strategy configured last (run_case's)
        self._mtu = 1500
        self._rto_min_ms: int | None = None  # the end hosts' (set_rto_min), as configured last
        self._rto_read_back: dict | None = None  # ... and as read back from their routes then
        self.deployment = None  # service mode: the product's own processes (services.experiment.deployment)
        try:
            self.testbed.up()
            if self.workload.mode == "service":
                self._deploy_service()
            else:
                self._start_sites()
                self._start_agent()
        except BaseException:
            self.close()
            raise

    # -- set-up ---------------------------------------------------------------------------------

    def _features(self) -> tuple[str, int]:
        """The installation's feature schema and vector length, when a strategy may send
        features (adaptive); ("", 0) otherwise, so that no site takes features."""
        if not any(s.adaptive is not None for s in self.experiment.strategies):
            return "", 0
        from pathmaster.features import feature_names
        from pathmaster.features.schema import feature_schema

        return feature_schema(), len(feature_names())

    def _start_sites(self) -> None:
        schema, values = self._features()
        # Linux caches a path's ssthresh and RTT between connections; a run must not inherit them.
        for name in {*self.workload.sites, self.testbed.config.master}:
            self.testbed.host(name).cmd("sysctl", "-q", "-w", "net.ipv4.tcp_no_metrics_save=1")
        for name in self.workload.sites:
            host = self.testbed.host(name)
            proc = host.popen([sys.executable, "-m", "services.experiment.workload", "site", "--name", name,
                               "--host", host.ip, "--port", str(SITE_PORT),
                               "--match-bytes", str(self.workload.match_bytes),
                               "--feature-schema", schema,
                               "--feature-count", str(values if self.workload.forward_selection else 0),
                               "--analysis-s", repr(self.workload.analysis_s),
                               "--site-nodes", str(self.workload.site_nodes), *classes_argv(self.experiment.classes)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            self.sites[name] = proc
        deadline = time.monotonic() + 60
        for name, proc in self.sites.items():
            while True:  # until it listens; a site that dies says why at once
                if proc.poll() is not None:
                    raise RuntimeError(f"transfer site on {name} exited ({proc.returncode}): "
                                       f"{proc.stderr.read().strip()[-2000:]}")
                try:
                    self.testbed.host(name).wait_listening(SITE_PORT, timeout=0.5)
                    break
                except TimeoutError:
                    if time.monotonic() > deadline:
                        raise

    def _deploy_service(self) -> None:
        import tempfile

        from services.experiment import deployment

        for name in {*deployment.site_hosts(self.testbed), self.testbed.config.master}:
            self.testbed.host(name).cmd("sysctl", "-q", "-w", "net.ipv4.tcp_no_metrics_save=1")
        workdir = tempfile.mkdtemp(prefix=f"pm-experiment-{self.testbed.tag}-")
        self.deployment = deployment.deploy(self.testbed, workdir, workers_on_x2=self.workload.workers_on_x2,
                                            classes=self.experiment.classes)
        for cls in self.experiment.request_classes:  # first case per class: Ray workers warm up
            deployment.run_case(self.deployment, cls, cells=1, seed=0, deadline_s=self.workload.deadline_s)

    def _service_case(self, request_class: str, seed: int) -> dict:
        """One case through the product (`pathmaster query` on the master), as a run record."""
        from services.experiment import deployment

        w = self.workload
        # Adaptive: the coordinator's own policy (features where it can); otherwise today's images.
        adaptive = self.strategy is not None and self.strategy.adaptive is not None
        ship = self.strategy.adaptive.ship if adaptive else "images"
        try:
            case = deployment.run_case(self.deployment, request_class, cells=w.cells, seed=seed,
                                       deadline_s=w.deadline_s, ship=ship)
        except deployment.DeploymentError as exc:
            return {"ok": False, "error": str(exc)}
        sites = []
        for name, event in case.sites.items():
            timing = event["timing"]
            sites.append({"site": name, "status": event["status"], "total_s": timing["total_s"],
                          "transfer_s": timing["transfer_s"], "compute_s": timing["site_wall_s"],
                          "extraction_s": timing["extraction_s"], "search_s": timing["search_s"],
                          "bytes_up": event["bytes_sent"], "bytes_down": event["bytes_received"],
                          "mode": event.get("mode"), "request_class": event.get("request_class"),
                          "predicted_s": event.get("predicted_s")})
        return {"completion_s": case.total_s, "query_wall_s": case.wall_s, "ok": case.ok, "sites": sites,
                "policy": "adaptive" if adaptive else "static", "predicted_s": case.summary.get("predicted_s"),
                "modes": sorted({s["mode"] for s in sites if s["mode"]}),
                "bytes_up": case.summary["bytes_sent"], "bytes_down": case.summary["bytes_received"],
                "votes": case.summary["votes"]}

    def _start_agent(self) -> None:
        schema, values = self._features()
        argv = [sys.executable, "-m", "services.experiment.workload", "agent",
                "--feature-schema", schema, "--feature-values", str(values),
                # features mode: the coordinator's own analysis of the cells, on a site's nodes
                "--analysis-s", repr(self.workload.analysis_s), "--site-nodes", str(self.workload.site_nodes),
                *classes_argv(self.experiment.classes)]
        for name in self.workload.sites:
            argv += ["--site", f"{name}={self.testbed.ip(name)}:{SITE_PORT}"]
        self.agent = self.testbed.master.popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                               stderr=subprocess.PIPE, text=True)
        self._read_agent(60)
        for cls in self.experiment.request_classes:
            self._ask({"op": "warm", "class": cls}, 60)

    def _read_agent(self, timeout: float) -> dict:
        sel = selectors.DefaultSelector()
        sel.register(self.agent.stdout, selectors.EVENT_READ)
        try:
            if not sel.select(timeout):
                raise AgentError(f"the master's workload agent gave no answer in {timeout} s")
        finally:
            sel.close()
        line = self.agent.stdout.readline()
        if not line:
            err = self.agent.stderr.read() if self.agent.poll() is not None else ""
            raise AgentError(f"the master's workload agent exited: {err.strip()[-2000:]}")
        return json.loads(line)

    def _ask(self, command: dict, timeout: float) -> dict:
        self.agent.stdin.write(json.dumps(command) + "\n")
        self.agent.stdin.flush()
        reply = self._read_agent(timeout)
        if reply.get("ok") is False and "sites" not in reply:
            raise AgentError(f"agent failed on {command.get('op')}: {reply.get('error')}")
        return reply

    # -- the Bench protocol ---------------------------------------------------------------------

    def environment(self) -> dict:
        return {"bench": "testbed", "tag": self.testbed.tag, "testbed": self.testbed.config.to_dict(),
                "sites": {n: self.testbed.ip(n) for n in self.workload.sites} if self.deployment is None
                else {n: self.testbed.ip(n) for n in self.deployment.sites},
                "master": self.testbed.config.master, "workload_mode": self.workload.mode,
                "competing_tool": "qos.traffic (downloads: iperf3 -R from the master; wget: wget loops fetching "
                                  "from http.server on the master; DSCP set at the master)",
                "kernel_qdiscs": sorted(kernel.available_qdiscs())}

    def behind_core(self, site: str) -> bool:
        host = site.rsplit("-", 1)[-1]  # "B1", or the service's "site-B1"
        return host[0] != self.testbed.config.master[0]

    def configure(self, link: LinkProfile, strategy: Strategy) -> None:
        if link.mtu != self._mtu:
            self._set_mtu(link.mtu)
        table, backend = discipline_table(strategy, link)
        self.strategy = strategy
        if self.testbed.config.bottleneck.rate_kbit != link.core_kbit:
            self.testbed.config = self.testbed.config.with_bottleneck(rate_kbit=link.core_kbit)
        self.testbed.set_strategy(table, backend=backend, at=strategy.at)
        if strategy.rto_min_ms != self._rto_min_ms:
            self.testbed.set_rto_min(self.end_hosts(), strategy.rto_min_ms)
            self._rto_min_ms = strategy.rto_min_ms
        if any(s.rto_min_ms for s in self.experiment.strategies):  # each run records what the routes say
            self._rto_read_back = self.end_host_rto_min_ms()

    def end_hosts(self) -> list[str]:
        """The hosts a case runs between: the coordinator's (the master) and the sites'."""
        if self.deployment is not None:
            from services.experiment import deployment

            sites = deployment.site_hosts(self.testbed)
        else:
            sites = list(self.workload.sites)
        return sorted({self.testbed.config.master, *sites})

    def end_host_rto_min_ms(self) -> dict[str, int | None]:
        """What the routes between the end hosts say now: {"A1>B1": ms or None, ...} (read back)."""
        hosts = self.end_hosts()
        return {f"{a}>{b}": self.testbed.rto_min_ms(a, b) for a in hosts for b in hosts if a != b}

    def _set_mtu(self, mtu: int) -> None:
        for node in self.testbed.topology.nodes.values():
            for intf in node.interfaces:
                node.cmd("ip", "link", "set", "dev", intf.name, "mtu", str(mtu))
        self._mtu = mtu

    def set_competing(self, level: float, seed: int):
        """Stop the current competing traffic, let the queues drain, start `level` (qos.traffic).

        Returns what the stopped block achieved (a qos.traffic TrafficResult), or None."""
        ended = self.stop_competing()
        self._wait_queues_empty()
        self.competing_level = level
        if level:
            self.traffic = traffic.from_spec(self.testbed, competing_spec(self.experiment.competing, level, seed))
            self.traffic.start()
        return ended

    def _wait_queues_empty(self, timeout: float = 15.0) -> None:
        """Poll until the bottleneck queues have drained what stopped traffic left in them."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            # Only the kernel queues are read live; the emulator's counters lag by seconds.
            live = {k: v for k, v in self.counters().items() if k in self.testbed.disciplines}
            backlog = sum(c["backlog"] for queues in live.values() for c in queues.values())
            if backlog == 0:
                return
            time.sleep(0.05)
        raise TimeoutError(f"bottleneck queues still hold packets {timeout} s after the competing traffic stopped")

    def stop_competing(self):
        """Stop the competing traffic; its TrafficResult (with the flows' iperf3 JSON), or None if none ran."""
        if self.traffic is None:
            return None
        try:
            result = self.traffic.stop()
            self.traffic_reports.append({"level": self.competing_level, **result.to_dict()})
        finally:
            self.traffic = None
        return result

    def competing_bytes(self) -> int:
        """Bytes the competing targets have received so far (their interfaces' rx counters)."""
        total = 0
        for target in self.experiment.competing.targets:
            node = self.testbed.host(target)
            for intf in node.interfaces:
                total += int(node.cmd("cat", f"/sys/class/net/{intf.name}/statistics/rx_bytes"))
        return total

    def counters(self) -> dict:
        return self.testbed.bottleneck_stats()

    def emulator_snapshots(self, newer_than: float = 0.0) -> dict:
        """Each user-space emulator's last statistics snapshot (for the run's fidelity record)."""
        return self.testbed.emulator_snapshots(newer_than)

    def run_case(self, request_class: str, seed: int, case_id: str) -> dict:
        record = self._run_case(request_class, seed, case_id)
        if self._rto_read_back is not None:
            record["end_hosts"] = {"rto_min_ms": self._rto_read_back}
        return record

    def _run_case(self, request_class: str, seed: int, case_id: str) -> dict:
        if self.deployment is not None:
            return self._service_case(request_class, seed)
        w = self.workload
        strategy = self.strategy
        adaptive = strategy.adaptive.model_dump() if strategy and strategy.adaptive else None
        # An adaptive strategy's first case warms each class and mode its policy may choose first.
        warm_s = 0 if adaptive is None else 2 * len(self.experiment.classes.names()) * 20
        reply = self._ask({"op": "case", "class": request_class, "cells": w.cells, "image_bytes": w.image_bytes,
                           "background": w.with_background, "mask": w.with_mask, "k": w.k, "seed": seed,
                           "deadline_s": w.deadline_s, "case_id": case_id,
                           "strategy": strategy.name if strategy else "", "adaptive": adaptive},
                          w.deadline_s + 30 + warm_s)
        if "sites" not in reply:
            return {"ok": False, "error": reply.get("error", "no reply")}
        return reply

    def finish(self) -> dict:
        """Stop the competing traffic; returns what each block of it achieved since the last finish."""
        self.stop_competing()
        self.competing_level = 0.0
        reports, self.traffic_reports = self.traffic_reports, []
        return {"competing_blocks": reports}

    def __enter__(self) -> "TestbedBench":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop every process and take the testbed down (idempotent)."""
        try:
            self.stop_competing()
            if self.agent is not None:
                if self.agent.stdin:
                    self.agent.stdin.close()
                netns.stop_process(self.agent)
                self.agent = None
            for proc in self.sites.values():
                netns.stop_process(proc)
            self.sites.clear()
            if self.deployment is not None:
                self.deployment.stop()
                self.deployment = None
        finally:
            self.testbed.down()
