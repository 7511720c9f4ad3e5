"""One query's path through the code: which project modules it crosses, and how often it
decodes and checks the cell's images.

    python benchmarks/query_path.py [--cells 40] [--no-mask]

Builds a small synthetic site (services/synthetic.py), starts one site and a
coordinator on loopback in this process (services.demo.LoopbackDeployment) over a local
Ray, and sends one 1-cell case through the client library: client -> coordinator -> site -> Ray worker -> core and
back. The site's worker is the real `SiteWorker` run in this process behind an actor
handle whose calls return `ray.put(result)` (Ray no longer has a local mode), so the
dispatcher's ray.wait/ray.get are the real ones and the worker's code is profiled with
the rest. Every thread is profiled (`sys.setprofile` / `threading.setprofile`) while the case
runs; start-up is not counted.

Prints:
- the project modules (pathmaster.*, qos.*, services.*; not the generated services.pb)
  the query calls into, and their count;
- the path: the module entered by every call that crosses from one module into another,
  in order, and the modules entered more than once along it (A > B > A);
- re-entries: call chains that enter a module, leave it for another project module and
  come back into it on the same stack (A -> B -> A), each chain once with how often;
- how many times the cell's bytes are opened and decoded (decode_image, decode_mask,
  probe_image; PIL's Image.open, and its _getdecoder: pixels actually decoded) and its
  arrays checked (check_cell, the mask-label check), per
  function.
"""

from __future__ import annotations

import argparse
import collections
import logging
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PROJECT = ("pathmaster", "qos", "services")
# (module, function) pairs counted as "decode" and "check" events.
DECODES = {("pathmaster.image.io", "decode_image"), ("pathmaster.image.io", "decode_mask"),
           ("pathmaster.image.io", "probe_image"),
           ("PIL.Image", "open"), ("PIL.Image", "_getdecoder")}  # a decoder: pixels decoded
CHECKS = {("pathmaster.image.io", "check_cell"), ("pathmaster.image.io", "_check_labels"),
          ("pathmaster.features.regions", "cell_regions")}


def project_module(frame) -> str | None:
    name = frame.f_globals.get("__name__", "")
    top = name.partition(".")[0]
    if top in PROJECT and not name.startswith("services.pb"):
        return name
    return None


class PathRecorder:
    """A profile function for every thread: module stacks, re-entries, decode/check counts."""

    def __init__(self):
        self.recording = False
        self.modules: collections.Counter = collections.Counter()  # calls into each module
        self.edges: collections.Counter = collections.Counter()    # caller module -> callee module
        self.reentries: collections.Counter = collections.Counter()
        self.events: collections.Counter = collections.Counter()
        self.sequence: list[str] = []  # callee of each call that crosses into another module
        self._local = threading.local()
        self._lock = threading.Lock()

    def _stack(self) -> list:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def __call__(self, frame, event, arg):
        if event not in ("call", "return") or not self.recording:
            return
        # Per thread: (frame, its project module or None) of each Python frame entered while
        # recording. A frame entered before (a server loop) returns unseen: skipped.
        stack = self._stack()
        if event == "return":
            for depth in range(len(stack) - 1, -1, -1):
                if stack[depth][0] is frame:
                    del stack[depth:]
                    break
            return
        code = frame.f_code
        key = (frame.f_globals.get("__name__", ""), code.co_name)
        module = project_module(frame)
        with self._lock:
            if key in DECODES:
                self.events[("decode",) + key] += 1
            elif key in CHECKS:
                self.events[("check",) + key] += 1
            if module is not None:
                self.modules[module] += 1
                modules = [m for _, m in stack if m is not None]
                caller = modules[-1] if modules else None
                if caller is not None and caller != module:
                    self.edges[(caller, module)] += 1
                    if not self.sequence or self.sequence[-1] != module:
                        self.sequence.append(module)
                    # The chain of distinct project modules on this stack, collapsed.
                    collapsed = [m for i, m in enumerate(modules) if i == 0 or modules[i - 1] != m]
                    if module in collapsed:
                        start = len(collapsed) - 1 - collapsed[::-1].index(module)
                        self.reentries[tuple(collapsed[start:]) + (module,)] += 1
        stack.append((frame, module))

    def start(self):
        threading.setprofile(self)
        sys.setprofile(self)

    def stop(self):
        self.recording = False
        sys.setprofile(None)
        threading.setprofile(None)


class InProcessActor:
    """An actor handle over a local object: `handle.method.remote(*args)` runs the method
    here and now and returns a Ray ObjectRef to its result."""

    def __init__(self, target):
        self._target = target

    def __getattr__(self, name):
        import ray

        method = getattr(self._target, name)
        return type("Method", (), {"remote": staticmethod(lambda *a: ray.put(method(*a)))})()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=int, default=40, help="cells in the synthetic site (default 40)")
    parser.add_argument("--no-mask", action="store_true", help="send the image alone (segment + estimate)")
    args = parser.parse_args()

    import ray

    from services.synthetic import build_synthetic_site, synthetic_case_cells

    work = Path(tempfile.mkdtemp(prefix="query-path-"))
    db = build_synthetic_site(work / "site", args.cells, seed=1)
    cell = synthetic_case_cells(1, seed=2026)[0]

    ray.init(num_cpus=1, include_dashboard=False, logging_level=logging.ERROR,
             log_to_driver=False, _node_ip_address="127.0.0.1")
    recorder = PathRecorder()
    recorder.start()  # before the servers start their threads; records nothing yet
    import services.site.server as site_server
    from services.client import CoordinatorClient
    from services.demo import LoopbackDeployment
    from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
    from services.site.worker import SiteWorker

    site_server.start_workers = lambda db, *args, **kwargs: [InProcessActor(SiteWorker(db))]
    site_server.stop_workers = lambda workers: None

    parts = ("image",) if args.no_mask else ("image", "background", "mask")
    case = [pb.CellImage(cell_id=cell["cell_id"], **{p: cell[p] for p in parts})]
    try:
        with LoopbackDeployment({"alpha": db}, metrics_port=None, case_log=work / "cases.jsonl") as running:
            with CoordinatorClient(running.coordinator.address) as client:
                list(client.submit(case, "urgent", deadline_s=120))  # warm: lazy imports, channels
                recorder.recording = True
                started = time.perf_counter()
                events = list(client.submit(case, "urgent", deadline_s=120))
                elapsed = time.perf_counter() - started
                recorder.recording = False
    finally:
        recorder.stop()
        ray.shutdown()
    result = events[0].site_result
    assert result.status_code == 0 and result.cells[0].error == "", result
    report(recorder, elapsed, len(result.cells[0].matches), args.no_mask)


def report(rec: PathRecorder, elapsed: float, matches: int, no_mask: bool) -> None:
    print(f"one 1-cell case ({'image only' if no_mask else 'image + background + mask'}), "
          f"{matches} matches, {elapsed:.2f} s under the profiler")
    modules = sorted(rec.modules)
    print(f"\nproject modules called: {len(modules)}")
    for m in modules:
        print(f"  {m:40s} {rec.modules[m]:7d} calls")
    print(f"\nmodule-to-module call edges: {len(rec.edges)}")
    print(f"\nre-entries (A -> ... -> A on one call stack): {len(rec.reentries)} distinct chains, "
          f"{sum(rec.reentries.values())} calls; modules re-entered: "
          f"{len({chain[0] for chain in rec.reentries})}")
    for chain, n in sorted(rec.reentries.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {n:6d} x  {' -> '.join(chain)}")
    runs = collections.Counter(rec.sequence)
    again = {m: n for m, n in runs.items() if n > 1}
    print(f"\nthe path, in order (each entry: a call from another module into this one): "
          f"{len(rec.sequence)} entries")
    print("  " + " > ".join(m.replace("pathmaster.", "pm.").replace("services.", "svc.")
                             for m in rec.sequence))
    print(f"modules entered more than once along it (A > B > A): {len(again)}")
    for m, n in sorted(again.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {m:40s} {n} times")
    decodes = {k[1:]: n for k, n in rec.events.items() if k[0] == "decode"}
    checks = {k[1:]: n for k, n in rec.events.items() if k[0] == "check"}
    print(f"\ndecode calls: {sum(n for (mod, fn), n in decodes.items() if mod == 'pathmaster.image.io')} "
          f"project, {sum(n for (mod, fn), n in decodes.items() if mod.startswith('PIL'))} Pillow")
    for (mod, fn), n in sorted(decodes.items()):
        print(f"  {mod}.{fn}: {n}")
    print(f"check calls: {sum(checks.values())}")
    for (mod, fn), n in sorted(checks.items()):
        print(f"  {mod}.{fn}: {n}")


if __name__ == "__main__":
    main()
