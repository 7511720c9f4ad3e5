"""Imported by the analysis pool's fork server only (services.analysis.PRELOAD, after
``pathmaster._single_thread``): one thread for OpenCV and the BLAS/OpenMP pools, their
control library loaded, then one small analysis (`warm_up_analysis`), all before the
server forks a worker. A new worker (the first, or one replacing a worker that was killed
or died) then starts with everything the analysis loads on first use, so the cell it gets
first, possibly an urgent case's queued behind the killed one, costs what any cell does.

The fork server forks after this, so it must leave no thread running: every numeric
library is held to one thread before anything runs (tests/services/test_warm_worker.py
checks the server's thread count). A failed warm-up is reported and not raised: the
server must start anyway (the workers then load what they need on first use).

Last, everything the server holds is moved to the garbage collector's permanent generation
(`gc.freeze`, as the gc documentation advises before fork without exec): a worker's full
collections then skip the inherited objects instead of writing to (and so copying) every
page that holds one, ~40 ms of CPU and the memory of those pages in each new worker.
"""

import gc
import warnings

from pathmaster.analysis.budget import one_thread_numerics

one_thread_numerics()

try:
    from services.analysis import warm_up_analysis

    warm_up_analysis()
except Exception as exc:  # noqa: BLE001  (anything: the fork server must start)
    warnings.warn(f"analysis warm-up in the fork server failed ({exc!r}); workers load on first use", stacklevel=1)

gc.freeze()
