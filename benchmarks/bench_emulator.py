"""Benchmark of the user-space link emulator (qos.emulator) with real packets (needs root).

    python benchmarks/bench_emulator.py [--repeats 3] [--json out.json]

A line of three namespaces, client - router - server (`qos.testbed.line`); the emulator
runs in the router on the client->server direction; iperf3 sends one
TCP flow (1 s slow start left out, then `--seconds` measured at the receiver).

It prints:
1. CPU of the emulator process at 10 Mbit/s (20 ms delay, FIFO): % of one core, median
   over the repeats, from /proc/<pid>/stat while the flow runs; with the throughput ratio.
2. Release timer accuracy in the same runs: lateness (actual - scheduled release) median
   and p99, from the emulator's own statistics.
3. The highest rate the emulator sustains within 5%: a sweep of link rates; at each, the
   receiver's frame rate / configured rate (median of the repeats); the sweep stops at the
   first rate below 0.95. The plain kernel path (no emulator) is measured alongside as the
   ceiling the machine itself allows.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from qos import netns
from qos.emulator import launch
from qos.testbed.line import line_topology
from qos.traffic.iperf import client_argv

SWEEP_MBIT = (10, 20, 50, 100, 200, 300, 400, 600, 800)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def tcp_flow(client, server, seconds: float, port: int) -> float:
    """One iperf3 TCP flow client -> server; the receiver's goodput over the measured seconds."""
    srv = server.popen(["iperf3", "-s", "-1", "-J", "-p", str(port)], stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, text=True)
    try:
        server.wait_listening(port)
        client.cmd(*client_argv(server.ip, port=port, seconds=seconds, omit=1), timeout=seconds + 30)
        result = json.loads(srv.communicate(timeout=10)[0])
    finally:
        netns.stop_process(srv, timeout=2)
    intervals = [i["sum"] for i in result["intervals"] if not i["sum"].get("omitted")]
    goodput = sum(i["bytes"] for i in intervals) * 8 / sum(i["seconds"] for i in intervals)
    mss = result["start"].get("tcp_mss_default") or 1448
    return goodput * (mss + 52 + 14) / mss  # frames: IP + TCP (timestamps) + Ethernet headers


def emulated_run(line, rate_bps: float, seconds: float, port: int, delay_ms: float = 0) -> dict:
    config = {"seed": 1, "link": {"bottleneck": {
        "rate_kbit": rate_bps / 1000, "delay_ms": delay_ms, "overhead_bytes": 14, "limit_packets": 200,
        "forward": {"queue": 0, "out": line.out_interface}}}}
    emu = launch(line.router.namespace, config)
    try:
        before, t0 = cpu_seconds(emu.pid), time.monotonic()
        frames = tcp_flow(line.client, line.server, seconds, port)
        cpu = (cpu_seconds(emu.pid) - before) / (time.monotonic() - t0)
    finally:
        stats = emu.stop()
    late = stats["release_lateness_s"]
    return {"rate_bps": rate_bps, "frames_bps": frames, "ratio": frames / rate_bps, "cpu_core_fraction": cpu,
            "lateness_median_s": late["median"], "lateness_p99_s": late["p99"],
            "kernel_queue": stats["directions"]["bottleneck.forward"]["kernel_queue"]}


def measure(line, args) -> dict:
    """All three measurements on `line`; the raw data of every run."""
    port = iter(range(5401, 6000))
    raw: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "repeats": args.repeats,
                 "seconds": args.seconds, "load_average": os.getloadavg()}
    runs = [emulated_run(line, 10e6, args.seconds, next(port), delay_ms=20) for _ in range(args.repeats)]
    raw["at_10mbit"] = runs
    med = {k: statistics.median(r[k] for r in runs)
           for k in ("cpu_core_fraction", "ratio", "lateness_median_s", "lateness_p99_s")}
    print(f"10 Mbit/s, 20 ms, FIFO ({args.repeats} runs, medians):")
    print(f"  emulator CPU        {100 * med['cpu_core_fraction']:.1f} % of one core")
    print(f"  throughput / rate   {med['ratio']:.3f}")
    print(f"  release lateness    median {1e6 * med['lateness_median_s']:.0f} us, "
          f"p99 {1e6 * med['lateness_p99_s']:.0f} us")

    plain = [tcp_flow(line.client, line.server, args.seconds, next(port)) for _ in range(args.repeats)]
    raw["plain_kernel_path_bps"] = plain
    print(f"plain kernel path (no emulator): {statistics.median(plain) / 1e6:.0f} Mbit/s of frames")

    print("rate sweep (medians): rate -> throughput/rate, CPU, lateness p99")
    sweep, sustained = [], None
    for mbit in SWEEP_MBIT:
        runs = [emulated_run(line, mbit * 1e6, args.seconds, next(port)) for _ in range(args.repeats)]
        ratio = statistics.median(r["ratio"] for r in runs)
        cpu = statistics.median(r["cpu_core_fraction"] for r in runs)
        p99 = statistics.median(r["lateness_p99_s"] for r in runs)
        sweep.append({"mbit": mbit, "runs": runs})
        print(f"  {mbit:4d} Mbit/s -> {ratio:.3f}, CPU {100 * cpu:.0f} %, p99 {1e6 * p99:.0f} us")
        if ratio < 0.95:
            break
        sustained = mbit
    raw["sweep"] = sweep
    raw["highest_sustained_mbit"] = sustained
    print(f"highest rate sustained within 5%: {sustained} Mbit/s")
    return raw


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--json", help="also write the raw measurements here")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_emulator: needs root (network namespaces, iptables); skipped")
        return 0
    with line_topology(netns.new_tag("eb"), "10.78.1.0/24", "10.78.2.0/24") as line:
        raw = measure(line, args)
    if args.json:
        Path(args.json).write_text(json.dumps(raw, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
