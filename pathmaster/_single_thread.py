"""Imported first by the analysis pool's fork server (pathmaster/analysis/budget.py), before numpy
is, and by nothing else (importing it changes this process's environment): one thread for
each numeric library in every analysis worker the server forks. Imports nothing heavy."""

import os

# The same names as pathmaster.analysis.budget.THREAD_VARIABLES (tests/core/analysis/test_budget.py checks).
for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
              "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS"):
    os.environ[_name] = "1"
