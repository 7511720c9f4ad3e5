"""Imported by the analysis pool's fork server (pathmaster/analysis/budget.py), after the one-thread
settings: runs the main script of the process that started the server, as ``__mp_main__``,
once, here.

multiprocessing's own ``"__main__"`` preload does nothing on Python 3.11 (the fork server
is started with no main path: ``ensure_running`` looks for a ``main_path`` key that
``get_preparation_data`` calls ``init_main_from_path``), so every new worker ran the
parent's main script itself before its first task. In a Ray actor that script is Ray's
``default_worker.py``: ~0.8-1 s of CPU importing Ray in each worker that replaced a killed
one. Run here, the workers find it loaded and skip it. The path comes in the environment
(``MAIN_ENV``), set by the pool just before the server starts.
"""

import os
from multiprocessing import process, spawn

MAIN_ENV = "PATHMASTER_FORKSERVER_MAIN"

_path = os.environ.get(MAIN_ENV)
if _path:
    process.current_process()._inheriting = True  # as multiprocessing's own preload does
    try:
        spawn.import_main_path(_path)
    finally:
        del process.current_process()._inheriting
