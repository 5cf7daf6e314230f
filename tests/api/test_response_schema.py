"""What the API answers, checked against the OpenAPI schema it serves: a generated client parses
responses by that schema, so a null where it promises a string breaks the client, not the server.

Every GET without path parameters (lists and summaries) is called as an admin on a cluster holding the
awkward cases (a workload with no resource class, submitter, chosen class or approver; a reservation
nobody created through the API), and so are the details of those rows. Each 200 must validate against
the documented 200 response."""

from datetime import timedelta

import pytest
import yaml
from django.utils import timezone
from jsonschema import Draft202012Validator

from broker.policy.models import Reservation
from broker.workloads.models import ApprovalState
from tests.cycle.helpers import pending, running


def as_json_schema(node):
    """OpenAPI 3.0's `nullable: true` as JSON Schema says it (a null is allowed besides the type)."""
    if isinstance(node, list):
        return [as_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    converted = {key: as_json_schema(value) for key, value in node.items() if key != "nullable"}
    if node.get("nullable") is True:
        return {"anyOf": [converted, {"type": "null"}]}
    return converted


@pytest.fixture
def schema(api_client, adam):
    api_client.force_authenticate(adam)
    return yaml.safe_load(api_client.get("/api/schema/").content)


@pytest.fixture
def awkward_rows(cluster, adam):
    """Rows whose optional relations are all empty, and one of each kind with them set."""
    unassigned = pending(cluster.queue_a, "unassigned")  # no resource class, submitter or chosen class
    decided = pending(
        cluster.queue_a,
        "decided",
        resource_class=cluster.training,
        submitted_by=adam,
        approval=ApprovalState.APPROVED,
        approval_decided_by=adam,
    )
    devices = list(cluster.nodes[0].devices.order_by("name"))[:2]
    busy = running(cluster.queue_b, "busy", devices, cluster.h100, admitted_at=timezone.now())
    now = timezone.now()
    reservation = Reservation.objects.create(
        name="drill",
        team=cluster.team_a,
        device_class=cluster.h100,
        count=2,
        start=now,
        end=now + timedelta(hours=1),
        reason="drill",
    )
    return {"workloads": [unassigned, decided, busy], "reservations": [reservation]}


def response_validator(schema, path, status="200", method="get"):
    documented = schema["paths"][path][method]["responses"][status]["content"]["application/json"]["schema"]
    # The components travel with the response's schema, so its $refs resolve inside it.
    return Draft202012Validator({**as_json_schema(documented), "components": as_json_schema(schema["components"])})


def violations(schema, path, response, status="200", method="get"):
    validator = response_validator(schema, path, status, method)
    return [f"{'/'.join(map(str, error.absolute_path))}: {error.message}" for error in validator.iter_errors(response)]


def collection_paths(schema):
    return [
        path
        for path, operations in schema["paths"].items()
        if "get" in operations
        and "{" not in path
        and "200" in operations["get"]["responses"]
        and "application/json" in operations["get"]["responses"]["200"].get("content", {})
    ]


def test_it_answers_every_collection_as_its_schema_says(api_client, adam, schema, awkward_rows):
    paths = collection_paths(schema)
    assert "/api/workloads/" in paths and "/api/reservations/" in paths
    found, refused = {}, {}
    for path in paths:
        response = api_client.get(path)
        if response.status_code != 200:
            refused[path] = response.status_code
            continue
        problems = violations(schema, path, response.json())
        if problems:
            found[path] = problems[:3]
    assert found == {}
    # Only reports that need parameters may refuse a bare GET, and only as bad input: anything else
    # (a lost sign-in, a crash) would leave their answers unchecked.
    assert set(refused.values()) <= {400}, refused
    assert len(refused) < len(paths) / 4, refused


@pytest.mark.parametrize(
    ("kind", "path"), [("workloads", "/api/workloads/{id}/"), ("reservations", "/api/reservations/{id}/")]
)
def test_it_answers_a_row_with_empty_relations_as_its_schema_says(api_client, schema, awkward_rows, kind, path):
    for row in awkward_rows[kind]:
        response = api_client.get(path.replace("{id}", str(row.pk)))
        assert response.status_code == 200
        assert violations(schema, path, response.json()) == []


def test_it_would_catch_a_null_the_schema_does_not_allow(schema):
    validator = response_validator(schema, "/api/workloads/{id}/")
    assert not validator.is_valid({"id": 1, "name": None})


# --- the error answers (broker.api.schema.document_errors) ------------------------------------------------


def test_it_documents_the_errors_each_operation_can_give(schema):
    operations = schema["paths"]
    assert {"400", "403"} <= operations["/api/workloads/"]["post"]["responses"].keys()
    assert {"400", "403"} <= operations["/api/workloads/"]["get"]["responses"].keys()  # its filters
    assert {"403", "404"} <= operations["/api/workloads/{id}/"]["get"]["responses"].keys()
    assert "400" not in operations["/api/workloads/{id}/"]["get"]["responses"]  # nothing to validate
    assert {"404", "409"} <= operations["/api/queues/{id}/"]["delete"]["responses"].keys()
    assert {"404", "409"} <= operations["/api/workloads/{id}/approve/"]["post"]["responses"].keys()
    undocumented = [
        f"{method.upper()} {path}"
        for path, methods in operations.items()
        for method, operation in methods.items()
        if "403" not in operation["responses"] or ("{" in path and "404" not in operation["responses"])
    ]
    assert undocumented == []


def test_it_answers_field_errors_as_documented(api_client, schema, alice, cluster):
    api_client.force_authenticate(alice)
    response = api_client.post("/api/workloads/", {"name": "Not A Slug!", "queue": "nope"}, format="json")

    assert response.status_code == 400
    assert violations(schema, "/api/workloads/", response.json(), "400", "post") == []
    assert response.json() != {}


ERROR_ANSWERS = {
    "a bad filter": ("/api/workloads/?state=Sleeping", 400, "/api/workloads/"),
    "a missing object": ("/api/workloads/999999/", 404, "/api/workloads/{id}/"),
    "a null character searched for": ("/api/domains/?search=%00rack", 400, "/api/domains/"),
    "an unknown format": ("/api/audit-events/export/?format=xml", 400, "/api/audit-events/export/"),
}


@pytest.mark.parametrize("case", ERROR_ANSWERS)
def test_it_answers_bad_reads_as_documented(api_client, schema, adam, case):
    url, status, documented_path = ERROR_ANSWERS[case]

    response = api_client.get(url)

    assert response.status_code == status
    assert violations(schema, documented_path, response.json(), str(status)) == []


def test_it_answers_a_deletion_still_in_use_as_documented(api_client, schema, awkward_rows, cluster):
    response = api_client.delete(f"/api/queues/{cluster.queue_a.pk}/")

    assert response.status_code == 409
    assert violations(schema, "/api/queues/{id}/", response.json(), "409", "delete") == []


def test_it_answers_a_stranger_as_documented(schema, client):
    response = client.get("/api/workloads/")

    assert response.status_code == 403
    assert violations(schema, "/api/workloads/", response.json(), "403") == []


def test_it_names_the_search_parameter_it_refuses(api_client, adam):
    api_client.force_authenticate(adam)
    response = api_client.get("/api/domains/?search=%00rack")

    assert response.json() == {"search": ["Null characters are not allowed."]}


def test_it_refuses_an_unknown_format_as_bad_input(api_client, adam):
    api_client.force_authenticate(adam)
    response = api_client.get("/api/audit-events/export/?format=xml")

    assert response.json() == {"format": ["Unknown format; one of: json, csv."]}
    assert api_client.get("/api/audit-events/export/?format=json").status_code == 200
