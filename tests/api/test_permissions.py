"""Every persona over every API endpoint: the exact allowed / denied set, written out as a table."""

import pytest

from broker.workloads.models import Allocation, ApprovalState, Explanation, SchedulingCycle
from broker.workloads.states import State
from tests.api import test_inventory, test_policy
from tests.api.base import persona, signed_in
from tests.builders import make_workload

WHO = ("anonymous", "alice", "bob", "olivia", "fiona", "april", "adam")

# alice: member of team-a, bob: member of team-b, olivia: operator, fiona: finance, april: approver,
# adam: admin. Objects under test that belong to a team belong to team-a. 404 means the row exists but
# is invisible to that persona; 405 means the persona may read there but nobody may write.
MATRIX = [
    # endpoint             operation          anon alice bob  olivia fiona april adam
    ("topology-levels", "list", 403, 200, 200, 200, 200, 200, 200),
    ("topology-levels", "detail", 403, 200, 200, 200, 200, 200, 200),
    ("topology-levels", "create", 403, 403, 403, 201, 403, 403, 201),
    ("domains", "list", 403, 200, 200, 200, 200, 200, 200),
    ("domains", "detail", 403, 200, 200, 200, 200, 200, 200),
    ("domains", "create", 403, 403, 403, 201, 403, 403, 201),
    ("nodes", "list", 403, 200, 200, 200, 200, 200, 200),
    ("nodes", "detail", 403, 200, 200, 200, 200, 200, 200),
    ("nodes", "create", 403, 403, 403, 201, 403, 403, 201),
    ("nodes", "cordon", 403, 403, 403, 200, 403, 403, 200),
    ("nodes", "uncordon", 403, 403, 403, 200, 403, 403, 200),
    ("devices", "list", 403, 200, 200, 200, 200, 200, 200),
    ("devices", "detail", 403, 200, 200, 200, 200, 200, 200),
    ("devices", "create", 403, 403, 403, 201, 403, 403, 201),
    ("devices", "mark-unhealthy", 403, 403, 403, 200, 403, 403, 200),
    ("devices", "mark-healthy", 403, 403, 403, 200, 403, 403, 200),
    ("teams", "list", 403, 200, 200, 200, 200, 200, 200),
    ("teams", "detail", 403, 200, 200, 200, 200, 200, 200),
    ("teams", "create", 403, 403, 403, 201, 403, 403, 201),
    ("priority-classes", "list", 403, 200, 200, 200, 200, 200, 200),
    ("priority-classes", "detail", 403, 200, 200, 200, 200, 200, 200),
    ("priority-classes", "create", 403, 403, 403, 201, 403, 403, 201),
    ("device-classes", "list", 403, 200, 200, 200, 200, 200, 200),
    ("device-classes", "detail", 403, 200, 200, 200, 200, 200, 200),
    ("device-classes", "create", 403, 403, 403, 201, 403, 403, 201),
    ("cohorts", "list", 403, 200, 200, 200, 200, 200, 200),
    ("cohorts", "detail", 403, 200, 200, 200, 200, 200, 200),
    ("cohorts", "create", 403, 403, 403, 201, 403, 403, 201),
    ("queues", "list", 403, 200, 200, 200, 200, 200, 200),
    ("queues", "detail", 403, 200, 200, 200, 200, 200, 200),
    ("queues", "create", 403, 403, 403, 201, 403, 403, 201),
    ("resource-classes", "list", 403, 200, 200, 200, 200, 200, 200),
    ("resource-classes", "detail", 403, 200, 200, 200, 200, 200, 200),
    ("resource-classes", "create", 403, 403, 403, 201, 403, 403, 201),
    ("reservations", "list", 403, 200, 200, 200, 200, 200, 200),
    ("reservations", "detail", 403, 200, 200, 200, 200, 200, 200),
    ("reservations", "create", 403, 403, 403, 201, 403, 403, 201),
    ("workloads", "list", 403, 200, 200, 200, 403, 200, 200),
    ("workloads", "detail", 403, 200, 404, 200, 403, 200, 200),
    ("workloads", "create", 403, 201, 201, 403, 403, 403, 201),
    ("workloads", "cancel", 403, 200, 404, 200, 403, 403, 200),
    ("workloads", "approve", 403, 403, 403, 403, 403, 200, 200),
    ("workloads", "reject", 403, 403, 403, 403, 403, 200, 200),
    ("workloads", "priority", 403, 403, 403, 200, 403, 403, 200),
    ("allocations", "list", 403, 200, 200, 200, 403, 200, 200),
    ("allocations", "detail", 403, 200, 404, 200, 403, 200, 200),
    ("allocations", "create", 403, 405, 405, 405, 403, 405, 405),
    ("explanations", "list", 403, 200, 200, 200, 403, 200, 200),
    ("explanations", "detail", 403, 200, 404, 200, 403, 200, 200),
    ("explanations", "create", 403, 405, 405, 405, 403, 405, 405),
    ("cycles", "list", 403, 200, 200, 200, 200, 200, 200),
    ("cycles", "detail", 403, 200, 200, 200, 200, 200, 200),
    ("cycles", "create", 403, 405, 405, 405, 405, 405, 405),
    ("audit-events", "list", 403, 403, 403, 200, 403, 200, 200),
    ("audit-events", "detail", 403, 403, 403, 200, 403, 200, 200),
    ("audit-events", "create", 403, 403, 403, 405, 403, 405, 405),
    ("audit-events", "export", 403, 403, 403, 200, 403, 200, 200),
    ("status", "get", 403, 200, 200, 200, 200, 200, 200),
]

DECLARATIVE_CASES = {
    "topology-levels": test_inventory.TestTopologyLevels,
    "domains": test_inventory.TestDomains,
    "nodes": test_inventory.TestNodes,
    "devices": test_inventory.TestDevices,
    "teams": test_policy.TestTeams,
    "priority-classes": test_policy.TestPriorityClasses,
    "device-classes": test_policy.TestDeviceClasses,
    "cohorts": test_policy.TestCohorts,
    "queues": test_policy.TestQueues,
    "resource-classes": test_policy.TestResourceClasses,
    "reservations": test_policy.TestReservations,
}


def team_a_workload(cluster, name, **fields):
    workload = make_workload(cluster.queue_a, name=name, resource_class=cluster.training, **fields)
    workload.transition(State.PENDING)
    return workload


def awaiting(cluster, name, alice):
    workload = make_workload(
        cluster.queue_a,
        name=name,
        resource_class=cluster.reserved,
        submitted_by=alice,
        approval=ApprovalState.REQUESTED,
    )
    workload.transition(State.AWAITING_APPROVAL)
    return workload


def shared_object(endpoint, cluster, request):
    """The one object every persona's detail request looks at."""
    if endpoint in DECLARATIVE_CASES:
        return DECLARATIVE_CASES[endpoint]().make_object(cluster)
    if endpoint == "workloads":
        return team_a_workload(cluster, "shared")
    if endpoint == "allocations":
        return Allocation.objects.create(
            workload=team_a_workload(cluster, "holder"),
            device=cluster.nodes[0].devices.first(),
            device_class=cluster.h100,
            pod_set="main",
            pod_index=0,
        )
    if endpoint == "explanations":
        return Explanation.objects.create(workload=team_a_workload(cluster, "waiting"), reason="Priority", message="m")
    if endpoint == "cycles":
        return SchedulingCycle.objects.create(outcome="Committed")
    if endpoint == "audit-events":
        from broker.audit.models import record

        return record("node.cordon", cluster.nodes[0], reason="matrix")
    raise AssertionError(endpoint)


def create_body(endpoint, cluster, n, who):
    if endpoint in DECLARATIVE_CASES:
        return DECLARATIVE_CASES[endpoint]().create_data(cluster, n)
    if endpoint == "workloads":
        return {
            "name": f"job-{who}",
            "queue": "team-b" if who == "bob" else "team-a",
            "resource_class": "distributed-training",
            "pod_sets": [{"replicas": 1, "devices_per_pod": 1}],
        }
    return {}


def action_request(endpoint, operation, cluster, n, who, alice):
    """(url, body) for an action; terminal actions get a fresh object per persona."""
    if endpoint == "nodes":
        node = cluster.nodes[n % len(cluster.nodes)]
        node.cordoned = operation == "uncordon"
        node.save()
        return f"/api/nodes/{node.pk}/{operation}/", {}
    if endpoint == "devices":
        device = cluster.nodes[0].devices.all()[n % 4]
        device.health = "Unhealthy" if operation == "mark-healthy" else "Healthy"
        device.save()
        return f"/api/devices/{device.pk}/{operation}/", {}
    if operation in ("approve", "reject"):
        return f"/api/workloads/{awaiting(cluster, f'big-{who}', alice).pk}/{operation}/", {"comment": "matrix"}
    workload = team_a_workload(cluster, f"{operation}-{who}")
    body = {"priority": 7, "reason": "matrix check"} if operation == "priority" else {}
    return f"/api/workloads/{workload.pk}/{operation}/", body


@pytest.mark.parametrize(
    ("endpoint", "operation", "expected"),
    [(endpoint, operation, dict(zip(WHO, codes, strict=True))) for endpoint, operation, *codes in MATRIX],
    ids=[f"{row[0]}-{row[1]}" for row in MATRIX],
)
def test_it_allows_exactly_the_matrix(endpoint, operation, expected, cluster, api_client, request, alice):
    url = "/api/status/" if endpoint == "status" else f"/api/{endpoint}/"
    target = shared_object(endpoint, cluster, request) if operation == "detail" else None
    seen = {}
    for n, who in enumerate(WHO):
        api_client.force_authenticate(None)
        client = api_client if who == "anonymous" else signed_in(api_client, persona(request, who))
        if operation in ("list", "get"):
            response = client.get(url)
        elif operation == "detail":
            response = client.get(f"{url}{target.pk}/")
        elif operation == "create":
            response = client.post(url, create_body(endpoint, cluster, n, who), format="json")
        elif operation == "export":
            response = client.get(f"{url}export/")
        else:
            action_url, body = action_request(endpoint, operation, cluster, n, who, alice)
            response = client.post(action_url, body, format="json")
        seen[who] = response.status_code
    assert seen == expected
