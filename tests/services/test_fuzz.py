"""The fuzz suite's quick profile (tests/fuzz): a few generated inputs per entry point of
the session's deployment and a gateway in front of it; each answered with the status its
input calls for, within its deadline, leaving nothing stored when refused. The long run
(>= 10,000 inputs, counts and memory) is ``python -m tests.fuzz --long``."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from tests.fuzz.suite import TARGETS
from tests.fuzz.targets import FuzzStack

# Few examples, the same ones each run (derandomize): seconds, and no flaky CI; no example
# database on disk. Generating images is slow for Hypothesis's taste, and the stack is a
# module fixture on purpose.
QUICK = settings(max_examples=20, derandomize=True, database=None, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                        HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def stack(deployment, tmp_path_factory):
    fuzzed = FuzzStack(tmp_path_factory.mktemp("fuzz"), deployment).start()
    yield fuzzed
    fuzzed.stop()


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_every_entry_point_answers_generated_input_as_it_should(stack, target):
    @QUICK
    @given(call=TARGETS[target](stack))
    def answered_as_it_should(call):
        outcome = call()
        assert not outcome.problem, outcome

    answered_as_it_should()
    assert stack.healthy()
