"""The checks tests/e2e/test_fuzz_api.py runs on every answer do fail on what they must catch."""

import json

import pytest
import requests
import schemathesis
from drf_spectacular.generators import SchemaGenerator
from schemathesis.core.failures import FailureGroup
from schemathesis.core.transport import Response

from tests.e2e.test_fuzz_api import checks


@pytest.fixture(scope="module")
def status_operation():
    raw = json.loads(json.dumps(SchemaGenerator().get_schema(request=None, public=True), default=str))
    return schemathesis.openapi.from_dict(raw)["/api/status/"]["GET"]


def answer(status, body, content_type="application/json"):
    return Response(
        status_code=status,
        headers={"content-type": [content_type]},
        content=body,
        request=requests.Request("GET", "http://testserver/api/status/").prepare(),
        elapsed=0.01,
        verify=False,
    )


@pytest.mark.parametrize(
    "response",
    [
        answer(500, b"<h1>Server Error</h1>", "text/html"),
        answer(200, json.dumps({"generation": "not a number"}).encode()),
    ],
    ids=["server-error", "schema-violation"],
)
def test_the_fuzz_checks_catch_a_server_error_and_a_schema_violation(status_operation, response):
    with pytest.raises(FailureGroup):
        status_operation.Case().validate_response(response, checks=checks())


def test_the_fuzz_checks_pass_a_documented_refusal(status_operation):
    status_operation.Case().validate_response(answer(403, b'{"detail": "no"}'), checks=checks())
