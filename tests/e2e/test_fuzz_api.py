"""Schemathesis against the served OpenAPI schema, on the real ASGI server (daphne) with PostgreSQL and a
Celery worker: every operation, as a member and as an admin, with valid and invalid data. No answer may be
a server error, and every answer must match the schema.

Bounded: FUZZ_EXAMPLES examples per operation, persona and mode (valid, invalid), derandomized so a
failure reproduces; each failure is listed with its request, not shrunk.
"""

import os

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from rest_framework.authtoken.models import Token
from schemathesis.core.failures import FailureGroup
from schemathesis.generation import GenerationMode

from broker.workloads.states import State
from tests.builders import make_workload

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "3"))
# Only the operations whose label holds this text (a failure's reproduction); all of them by default.
ONLY = os.environ.get("FUZZ_ONLY", "")
CHECKS = ("not_a_server_error", "response_schema_conformance")


def load_schema(base, headers):
    response = requests.get(f"{base}/api/schema/", params={"format": "json"}, headers=headers, timeout=60)
    response.raise_for_status()
    return schemathesis.openapi.from_dict(response.json())


def checks():
    from schemathesis import checks as registry

    return [getattr(registry, name) for name in CHECKS]


def describe(case, response, error):
    body = response.content[:300].decode(errors="replace").replace("\n", " ")
    sent = response.request
    request = f"{case.operation.label} {case.path_parameters or ''} {case.query or ''}"
    detail = f"{sent.headers.get('Content-Type')} {str(sent.body)[:200]}"
    return f"{request} [{detail}] -> {response.status_code}: {body} ({error})"


def fuzz_operation(operation, mode, base, headers, failures):
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case):
        response = case.call(base_url=base, headers=headers, timeout=60)
        try:
            case.validate_response(response, checks=checks())
        except FailureGroup as group:  # keep going: every failure is reported, not the first
            failures.extend(describe(case, response, failure.title) for failure in group.exceptions)

    try:
        run()
    except Unsatisfiable:
        # An operation that takes no input (a list without parameters) has no invalid input to send.
        assert mode is GenerationMode.NEGATIVE, operation.label


@pytest.fixture
def fuzz_data(cluster, alice, bob):
    """Something behind most detail URLs: workloads of both teams, waiting and running."""
    for name, state in (("waiting", State.PENDING), ("running", State.RUNNING)):
        make_workload(cluster.queue_a, f"a-{name}", resource_class=cluster.training, state=state, submitted_by=alice)
        make_workload(cluster.queue_b, f"b-{name}", resource_class=cluster.training, state=state, submitted_by=bob)


@pytest.mark.parametrize("persona", ["alice", "adam"])
def test_no_server_error_and_no_schema_violation_on_any_operation(stack, request, fuzz_data, persona):
    base, _logs = stack
    user = request.getfixturevalue(persona)
    headers = {"Authorization": f"Token {Token.objects.create(user=user).key}"}
    schema = load_schema(base, headers)
    failures, operations = [], 0
    for result in schema.get_all_operations():
        operation = result.ok()
        if ONLY not in operation.label:
            continue
        operations += 1
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            fuzz_operation(operation, mode, base, headers, failures)

    assert operations > (0 if ONLY else 40)
    assert failures == [], "\n".join(failures[:40])
