"""Benchmark of the web gateway as deployed: what it adds to a case, and what idle connections cost.

    python benchmarks/bench_gateway.py [--repeats 20] [--cells 14] [--idle 200]
                                       [--before COMMIT] [--cli-runs 3] [--json out.json]

Every part runs in its own process, as a deployment does:

- the loopback deployment (three small synthetic sites and a coordinator on one local
  Ray, as `pathmaster demo` runs them), in a process of its own;
- the gateway, `pathmaster gateway` (uvicorn) of this tree, in a process of its own, and
  with --before COMMIT also the gateway of that commit (a temporary git worktree) in
  another, both in front of the same coordinator;
- this process is only the client: a 6-cell case (cells with backgrounds and masks) is
  sent straight to the coordinator with the project's `CoordinatorClient` (what
  `pathmaster query` does, without Python's start-up), and through each gateway as the
  page does (one multipart POST on a kept-alive HTTP connection with the session cookie
  and CSRF token, the NDJSON stream read and each line parsed to the end); and through
  this tree's gateway as the page now does ("gateway staged"): the 18 files uploaded one by
  one (POST /api/upload, each checked and held by the gateway) as when they are chosen,
  then Send, a JSON POST naming their ids, timed from Send to the stream's last line (what
  the user waits for after pressing Send); the uploads' own time is printed beside it, and
  the sum. The staged files are dropped (untimed) before each round, so every round
  uploads and checks them anew. The paths take turns, their order rotated every round, so
  load on the host falls on all alike.

Printed per path: n, median and 90th percentile of the wall time from sending the case
to its summary, and of the time to its first event (the plan); each gateway's ratio to
the direct path (of the medians, and the median of the per-round ratios); the load
average. With --cli-runs N, `pathmaster query` itself is also timed N times (a new
Python process each time: its start-up is most of it; for reference only).

Then `--idle` connections are opened to each gateway and left idle: printed, the
gateway process's resident memory and threads before and with them, whether a request
is answered meanwhile, and how many the gateway closes once its head deadline passes.

Measured on the 2-CPU development VM shared with other work (load average 13-23, so the
spread is wide; medians, n = 50 per path, `--before bf7ea4a --coordinator` a running
`--serve-deployment`), times to the summary / to the plan:

    direct (CoordinatorClient)   268 ms / 23 ms
    gateway before (bf7ea4a)     317 ms / 46 ms   ratio 1.18 (paired 1.15)
    gateway after                318 ms / 58 ms   ratio 1.19 (paired 1.10)
    10th percentiles: direct 185 ms, before 220 ms, after 217 ms (about 30 ms added)

in an earlier run at load 13-15 (n = 60): direct 175 ms, before 192 ms (1.10), after
192 ms (1.10); in a later one (events by bisection, load 10 rising to 31, n = 30): direct
289 ms, before 436 ms (1.51; paired 1.23), after 354 ms (1.23; paired 0.93). 200 idle connections: +0.3 MiB resident and no thread added, either
gateway, all closed at the head deadline; the gateway after is 100 MiB resident, the
one before 165 MiB (it imported SciPy for the closeness ranks). The 5 % target was not
met by a multipart case: what the gateway adds is mostly the upload (1 MB received over
HTTP and parsed as multipart, then sent again over gRPC) before the coordinator sees it.

With files staged as they are chosen (benchmarks/results/gateway-staged-*; `--before
1d408ee`, the gateway before staging; load 10-19 on 2 CPUs), medians to the summary:

    run (n)          direct   before (ratio; paired)   after, multipart       staged, Send -> last line
    b558209 (30)     193 ms   184 ms (0.955; 0.987)    189 ms (0.981; 1.049)  180 ms (0.934; 0.984)
    063b298 (60)     192 ms   201 ms (1.047; 1.039)    197 ms (1.027; 1.062)  187 ms (0.972; 1.014)

Paired, staged against multipart through the same gateway: 0.918 and 0.945 (the upload
taken out of Send). The 18 uploads at pick time, one after another: median 860 ms (each
file decoded as its name says, ~20 ms a file on this host, plus a request each), so pick
+ Send is ~5.5x direct; the page keeps 4 uploads going while the user is still choosing.
The spread is wide on every path (p90 300-400 ms). Idle connections: as before.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import select
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.clients.web import multipart  # noqa: E402 - the browser-like upload the tests send, one copy

PASSWORD = "bench-password-1"
STAGED = "gateway staged"  # the gateway of this tree, files uploaded when chosen, Send names ids
RAY_TRIES = 3  # ensure_ray()s, each of which tries a few times itself
START_S = 1800  # the deployment's start: Ray, and building the databases on a first run


def quantile90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


# ------------------------------------------------------------------ the deployment's process
def serve_deployment(cells: int) -> int:
    """Run the loopback deployment in this process; print its coordinator's address as one
    JSON line; stop when standard input closes."""
    import ray

    from services.demo import DemoSite, LoopbackDeployment, demo_databases
    from services.synthetic import cache_root
    from services.ray_local import ensure_ray

    for attempt in range(1, RAY_TRIES + 1):  # a busy host can make Ray's own attempts time out
        try:
            ensure_ray()
            break
        except Exception as exc:  # Ray raises a bare Exception when its node does not register
            ray.shutdown()
            if attempt == RAY_TRIES:
                raise
            print(f"Ray did not start ({exc}); again ({attempt + 1} of {RAY_TRIES})", file=sys.stderr)
    databases = demo_databases([DemoSite(n, s, "flat") for n, s in
                                (("site-a", 11), ("site-b", 12), ("site-c", 13))],
                               cells=cells, cache=cache_root() / "bench-gateway")
    deployment = LoopbackDeployment(databases, metrics_port=None).start()
    try:
        print(json.dumps({"coordinator": deployment.coordinator.address, "pid": os.getpid()}), flush=True)
        sys.stdin.read()
    finally:
        deployment.stop()
        ray.shutdown()
    return 0


def read_line(proc: subprocess.Popen, prefix: str, timeout_s: float) -> str:
    """The first line `proc` prints that starts with `prefix` (its rest, stripped)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith(prefix):
            return line[len(prefix):].strip()
    raise RuntimeError(f"process {proc.args[:4]} did not print {prefix!r} in {timeout_s} s "
                       f"(exit code {proc.poll()})")


def start_gateway_process(tree: Path, coordinator: str, state_dir: Path) -> tuple[subprocess.Popen, str, str]:
    """(process, page URL, one-time sign-in link) of `pathmaster gateway` of source `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, "-m", "pathmaster", "gateway", "--state-dir", str(state_dir)]
    subprocess.run([*command, "--add-user", "bench", "--role", "pathologist"], input=PASSWORD + "\n",
                   env=env, check=True, capture_output=True, text=True, timeout=120, cwd=tree)
    proc = subprocess.Popen([*command, "--coordinator", coordinator, "--port", "0", "--login-link", "bench"],
                            env=env, cwd=tree, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    try:
        url = read_line(proc, "PathMaster page: ", 120).split()[0]
        link = read_line(proc, "sign in once at: ", 30)
    except BaseException:
        stop_process(proc)
        raise
    return proc, url, link


def stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS (bytes) and Threads of process `pid`."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key == "VmRSS":
            found["rss"] = int(value.split()[0]) * 1024
        elif key == "Threads":
            found["threads"] = int(value)
    return found


# ------------------------------------------------------------------ the page's requests


class PageClient:
    """A signed-in page on one kept-alive HTTP connection to a gateway."""

    def __init__(self, url: str, link: str):
        parts = urlsplit(url)
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
        status, headers, _ = self.request("GET", urlsplit(link).path + "?" + urlsplit(link).query)
        assert status == 303, status
        self.cookie = headers["set-cookie"].split(";")[0]
        status, _, body = self.request("GET", "/api/session")
        assert status == 200, body
        self.csrf = json.loads(body)["csrf"]

    def fresh(self) -> None:
        """Drop the connection when the gateway has closed it (idle keep-alive ended), so the
        next request opens a new one, as a browser does; before the clock starts."""
        sock = self.conn.sock
        if sock is not None and select.select([sock], [], [], 0)[0]:
            self.conn.close()

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
        self.fresh()
        headers = dict(headers or {})
        if getattr(self, "cookie", None):
            headers["Cookie"] = self.cookie
        self.conn.request(method, path, body=body, headers=headers)
        reply = self.conn.getresponse()
        return reply.status, {k.lower(): v for k, v in reply.getheaders()}, reply.read()

    def post_staged(self, refs: dict[str, str], request_class: str) -> tuple[float, float, list[dict]]:
        """A case of staged files (only their names and ids), as the page sends it."""
        body = json.dumps({"request_class": request_class,
                           "files": [{"name": n, "id": i} for n, i in refs.items()]}).encode()
        return self.post_case(body, "application/json")

    def post_case(self, body: bytes, content_type: str) -> tuple[float, float, list[dict]]:
        """(seconds to the first event, seconds to the end of the stream, the events)."""
        headers = {"Content-Type": content_type, "X-CSRF-Token": self.csrf, "Origin": self.origin,
                   "Cookie": self.cookie}
        self.fresh()
        started = time.perf_counter()
        first = None
        self.conn.request("POST", "/api/case", body=body, headers=headers)
        reply = self.conn.getresponse()
        assert reply.status == 200, reply.read()
        events = []
        while line := reply.readline():
            if line.strip():
                events.append(json.loads(line))
                if first is None and events[-1]["type"] != "accepted":
                    first = time.perf_counter() - started
        return first, time.perf_counter() - started, events

    def stage(self, files: dict[str, bytes]) -> dict[str, str]:
        """Upload each file on its own (POST /api/upload), one after another, as the page
        does when files are chosen (it keeps up to 4 going at once); {name: staged id}."""
        refs = {}
        for name, data in files.items():
            body, content_type = multipart({}, {name: data}, field="file")
            status, _, reply = self.request("POST", "/api/upload", body, {
                "Content-Type": content_type, "X-CSRF-Token": self.csrf, "Origin": self.origin})
            assert status == 200, reply
            refs[name] = json.loads(reply)["id"]
        return refs

    def drop_staged(self) -> None:
        """Drop this user's staged files, so the next round uploads and checks them anew."""
        status, _, reply = self.request("DELETE", "/api/upload", None, {
            "X-CSRF-Token": self.csrf, "Origin": self.origin})
        assert status == 200, reply

    def close(self) -> None:
        self.conn.close()


def direct_case(client, case, deadline_s: float) -> tuple[float, float, list]:
    started = time.perf_counter()
    first = None
    events = []
    for event in client.submit(case, "urgent", deadline_s=deadline_s):
        events.append(event)
        if first is None:
            first = time.perf_counter() - started
    return first, time.perf_counter() - started, events


def idle_check(name: str, proc: subprocess.Popen, page: PageClient, url: str, count: int) -> dict:
    parts = urlsplit(url)
    before = proc_status(proc.pid)
    idle = [socket.create_connection((parts.hostname, parts.port), timeout=60) for _ in range(count)]
    status = page.request("GET", "/api/session")[0]  # answered after the gateway has accepted them
    with_idle = proc_status(proc.pid)
    closed = 0
    for sock in idle:
        try:
            if sock.recv(1) == b"":  # blocks until the gateway's head deadline closes it
                closed += 1
        except OSError:
            closed += 1
        sock.close()
    after = proc_status(proc.pid)
    print(f"  {name}: {count} idle connections: resident memory {before['rss'] / 2**20:.1f} MiB -> "
          f"{with_idle['rss'] / 2**20:.1f} MiB (+{(with_idle['rss'] - before['rss']) / 1024:.0f} KiB, "
          f"{(with_idle['rss'] - before['rss']) / max(count, 1) / 1024:.1f} KiB each), threads "
          f"{before['threads']} -> {with_idle['threads']}; a request meanwhile: HTTP {status}; "
          f"closed by the head deadline: {closed}/{count}; after: {after['rss'] / 2**20:.1f} MiB")
    return {"count": count, "before": before, "with_idle": with_idle, "after": after,
            "status_meanwhile": status, "closed": closed}


def summarise(times: dict[str, list[float]], direct: str) -> dict:
    out = {}
    for name, values in times.items():
        out[name] = {"n": len(values), "median_s": statistics.median(values), "p90_s": quantile90(values),
                     "min_s": min(values), "max_s": max(values)}
        if name != direct:
            paired = [g / d for g, d in zip(values, times[direct])]
            out[name]["ratio_of_medians"] = statistics.median(values) / statistics.median(times[direct])
            out[name]["median_paired_ratio"] = statistics.median(paired)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--cells", type=int, default=14, help="cells per site database")
    parser.add_argument("--idle", type=int, default=200)
    parser.add_argument("--before", metavar="COMMIT", help="also run the gateway of COMMIT, side by side")
    parser.add_argument("--cli-runs", type=int, default=3, help="`pathmaster query` processes timed")
    parser.add_argument("--coordinator", metavar="HOST:PORT",
                        help="use this running deployment's coordinator instead of starting one "
                             "(e.g. `%(prog)s --serve-deployment` left running: Ray's start is slow on a busy host)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--serve-deployment", action="store_true",
                        help="only run the loopback deployment, print its coordinator's address, "
                             "stop when standard input closes")
    args = parser.parse_args()
    if args.serve_deployment:
        return serve_deployment(args.cells)

    from services.shared import CASE_DEADLINE_S
    from services.client import CoordinatorClient
    from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
    from services.synthetic import synthetic_case_cells

    load_start = os.getloadavg()
    processes: list[subprocess.Popen] = []
    pages: list[PageClient] = []
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp:
        tmp = Path(tmp)
        old_tree = None
        try:
            if args.coordinator:
                coordinator = args.coordinator
            else:
                deployment = subprocess.Popen([sys.executable, __file__, "--serve-deployment", "--cells",
                                               str(args.cells)], env={**os.environ, "PYTHONPATH": str(REPO)},
                                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                processes.append(deployment)
                coordinator = json.loads("{" + read_line(deployment, "{", START_S))["coordinator"]
            trees = {"after": REPO}
            if args.before:
                old_tree = tmp / "before"
                subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet",
                                str(old_tree), args.before], check=True)
                trees = {"before": old_tree, **trees}
            gateways = {}
            for name, tree in trees.items():
                proc, url, link = start_gateway_process(tree, coordinator, tmp / f"state-{name}")
                processes.append(proc)
                page = PageClient(url, link)
                pages.append(page)
                gateways[name] = (proc, url, page)

            cells = synthetic_case_cells(6, seed=4242)
            files = {}
            for n, c in enumerate(cells, start=1):
                files.update({f"cell{n}.png": c["image"], f"cell{n}-background.png": c["background"],
                              f"cell{n}-mask.png": c["mask"]})
            case = [pb.CellImage(cell_id=f"cell{n}", image=c["image"], background=c["background"],
                                 mask=c["mask"]) for n, c in enumerate(cells, start=1)]
            body, content_type = multipart({"request_class": "urgent"}, files)
            paths = ["direct", *(f"gateway {name}" for name in gateways), STAGED]
            totals = {p: [] for p in paths}
            firsts = {p: [] for p in paths}
            picks = []  # the staged path's uploads at pick time, before Send
            with CoordinatorClient(coordinator) as client:
                def run(path: str):
                    if path == "direct":
                        first, total, events = direct_case(client, case, CASE_DEADLINE_S)
                        assert events[-1].WhichOneof("event") == "summary"
                        assert events[-1].summary.sites_ok == 3, events[-1].summary
                    elif path == STAGED:
                        page = gateways["after"][2]
                        page.drop_staged()  # untimed: every round uploads and checks anew
                        started = time.perf_counter()
                        refs = page.stage(files)
                        picks.append(time.perf_counter() - started)
                        first, total, events = page.post_staged(refs, "urgent")
                        assert events[-1]["type"] == "summary", events[-1]
                        assert events[-1]["sites_ok"] == 3, events[-1]
                    else:
                        first, total, events = gateways[path.split()[1]][2].post_case(body, content_type)
                        assert events[-1]["type"] == "summary", events[-1]
                        assert events[-1]["sites_ok"] == 3, events[-1]
                    return first, total

                for _ in range(2):  # warm every path: Ray actors, channels, connections
                    for path in paths:
                        run(path)
                picks.clear()
                for round_ in range(args.repeats):
                    for path in paths[round_ % len(paths):] + paths[:round_ % len(paths)]:
                        first, total = run(path)
                        firsts[path].append(first)
                        totals[path].append(total)
            load_end = os.getloadavg()

            summary = summarise(totals, "direct")
            first_summary = summarise(firsts, "direct")
            print(f"6-cell case (18 files, {len(body) / 1e6:.2f} MB multipart), loopback, every part in its "
                  f"own process; n = {args.repeats} per path, turns rotated; load average "
                  f"{load_start[0]:.1f} at start, {load_end[0]:.1f} at end ({os.cpu_count()} CPUs)")
            print(f"  {'path':<16} {'to summary: median':>19} {'p90':>8}   {'to plan: median':>16} {'p90':>8}"
                  f"   {'ratio to direct (medians; paired)':>34}")
            for path in paths:
                s, f = summary[path], first_summary[path]
                ratio = (f"{s['ratio_of_medians']:.3f}; {s['median_paired_ratio']:.3f}"
                         if "ratio_of_medians" in s else "")
                print(f"  {path:<16} {s['median_s'] * 1e3:>16.1f} ms {s['p90_s'] * 1e3:>5.1f} ms"
                      f"   {f['median_s'] * 1e3:>13.1f} ms {f['p90_s'] * 1e3:>5.1f} ms   {ratio:>34}")
            with_picks = [p + t for p, t in zip(picks, totals[STAGED])]
            pick_summary = summarise({"direct": totals["direct"], "picks": picks,
                                      "staged incl. picks": with_picks}, "direct")
            s = pick_summary["staged incl. picks"]
            print(f"  {STAGED}: Send to last line, above; the 18 uploads at pick time (one after another "
                  f"on one connection) median {statistics.median(picks) * 1e3:.1f} ms, p90 "
                  f"{quantile90(picks) * 1e3:.1f} ms; pick + Send to last line: median "
                  f"{s['median_s'] * 1e3:.1f} ms (ratio to direct {s['ratio_of_medians']:.3f}; "
                  f"paired {s['median_paired_ratio']:.3f})")
            for path in paths[1:]:
                print(f"  {path}: adds {(summary[path]['median_s'] - summary['direct']['median_s']) * 1e3:.1f} ms "
                      f"to the median case, {(first_summary[path]['median_s'] - first_summary['direct']['median_s']) * 1e3:.1f} ms "
                      "to the plan")

            cli = []
            if args.cli_runs:
                folder = tmp / "case"
                folder.mkdir()
                for name, data in files.items():
                    (folder / name).write_bytes(data)
                for _ in range(args.cli_runs):
                    started = time.perf_counter()
                    subprocess.run([sys.executable, "-m", "pathmaster", "query", "--coordinator", coordinator,
                                    "--class", "urgent", "--deadline", str(CASE_DEADLINE_S),
                                    *sorted(str(p) for p in folder.iterdir())],
                                   env={**os.environ, "PYTHONPATH": str(REPO)}, check=True,
                                   capture_output=True, timeout=300)
                    cli.append(time.perf_counter() - started)
                print(f"  `pathmaster query` as a command (a new Python process each time; reference): "
                      f"n = {len(cli)}, median {statistics.median(cli):.3f} s")

            idle = {}
            for name, (proc, url, page) in gateways.items():
                idle[name] = idle_check(f"gateway {name}", proc, page, url, args.idle)
            if args.json:
                args.json.write_text(json.dumps({
                    "before": args.before, "repeats": args.repeats, "load_start": load_start,
                    "load_end": load_end, "cpus": os.cpu_count(), "to_summary": summary,
                    "to_plan": first_summary, "totals_s": totals, "firsts_s": firsts,
                    "staged_picks_s": picks, "staged_with_picks": pick_summary,
                    "cli_s": cli, "idle": idle}, indent=1))
        finally:
            for page in pages:
                page.close()
            for proc in processes:
                if proc.stdin is not None:
                    proc.stdin.close()  # the deployment stops when its input closes
                    try:
                        proc.wait(timeout=60)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                else:
                    stop_process(proc)
            if old_tree is not None:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old_tree)],
                               check=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
