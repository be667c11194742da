"""Schemathesis against /openapi.json of a real coordinator: no input, valid or not, gives a server error,
and every response matches the schema the API documents.

The coordinator is one of its own (no agents), so the random requests disturb no other test's jobs.
Schemathesis' pytest plugin does not run under pytest 9, so the test drives its strategies with
Hypothesis itself: a bounded number of cases per operation, every failure collected and shown at once.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import Failure, FailureGroup
from schemathesis.specs.openapi.checks import response_schema_conformance

from mwms_testkit.cluster import Cluster

pytestmark = pytest.mark.e2e
CASES_PER_OPERATION = 50
CHECKS = [not_a_server_error, response_schema_conformance]


@pytest.fixture(scope="module")
def fuzzed_coordinator(tmp_path_factory):
    instance = Cluster(
        root=tmp_path_factory.mktemp("fuzz"),
        # A follow of a job that never ends would wait for the idle timeout: keep it short.
        server_env={"MWMS_FOLLOW_IDLE_TIMEOUT_S": "1"},
    )
    try:
        instance.start_server()
        yield instance
    finally:
        instance.stop()


def test_the_api_has_no_server_errors_and_keeps_its_schema(fuzzed_coordinator):
    auth = {"Authorization": f"Bearer {fuzzed_coordinator.admin_token}"}
    schema = schemathesis.openapi.from_url(f"{fuzzed_coordinator.api}/openapi.json", headers=auth)
    failures: list[str] = []
    failed: Counter[str] = Counter()
    calls = 0
    started = time.monotonic()
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 15, [op.label for op in operations]
    for operation in operations:
        cases = st.one_of(operation.as_strategy(mode) for mode in GenerationMode)

        @settings(
            max_examples=CASES_PER_OPERATION,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=cases)
        def fuzz(case: schemathesis.Case) -> None:
            nonlocal calls
            calls += 1
            response = case.call(headers=auth, timeout=30)
            try:
                case.validate_response(response, checks=CHECKS)
            except (Failure, FailureGroup) as failure:  # collected: one run shows every failure
                failed[f"{case.operation.label} -> {response.status_code}"] += 1
                failures.append(
                    f"{case.operation.label} -> {response.status_code}: {str(failure)[:600]}\n"
                    f"  {case.as_curl_command()[:400]}"
                )

        fuzz()
    elapsed = time.monotonic() - started
    print(f"schemathesis: {calls} cases over {len(operations)} operations in {elapsed:.1f} s")
    summary = "\n".join(f"  {count} x {what}" for what, count in failed.most_common())
    assert not failures, f"{len(failures)} failed cases:\n{summary}\nfirst ones:\n" + "\n".join(failures[:10])
