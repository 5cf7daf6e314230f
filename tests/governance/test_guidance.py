"""Wrong-class guidance at submission: said in the API answer and on the page, counted in the audit log."""

import pytest
from django.urls import reverse

from broker.audit.models import AuditEvent
from broker.governance.guidance import AUDIT_ACTION
from broker.inventory.models import Device, Domain, InventoryRevision, Node
from broker.policy.models import DeviceClass
from broker.workloads.states import State
from tests.builders import make_resource_class, make_workload


@pytest.fixture
def budget(cluster):
    """A cheaper class (A100 at $2, one rack per gang) that only team-a may use, on two racks of one
    node with 4 A100 each."""
    block = Domain.objects.get(name="b1")
    for rack_name, node_name in (("r3", "a1"), ("r4", "a2")):
        rack = Domain.objects.create(level_id=Domain.objects.get(name="r1").level_id, name=rack_name, parent=block)
        node = Node.objects.create(name=node_name, domain=rack)
        for index in range(4):
            Device.objects.create(node=node, name=str(index), attributes={"model": "A100", "memory": 40})
    a100 = DeviceClass.objects.create(
        name="a100", selector='device.attributes["gpu.example.com"].model == "A100"', price_per_hour="2.00"
    )
    budget = make_resource_class(
        "budget-training", cluster.training.priority_class, [a100], max_devices=16, topology_required="rack"
    )
    budget.allowed_teams.add(cluster.team_a)
    return budget


@pytest.fixture
def spot(cluster):
    """The cheapest class of all (L4 at $0.90, open to every team), whose devices the cluster has none of."""
    l4 = DeviceClass.objects.create(
        name="l4", selector='device.attributes["gpu.example.com"].model == "L4"', price_per_hour="0.90"
    )
    return make_resource_class("batch-inference", cluster.training.priority_class, [l4], max_devices=16)


def submit(api_client, user, name, resource_class, replicas=1, devices_per_pod=1):
    api_client.force_authenticate(user)
    response = api_client.post(
        "/api/workloads/",
        {
            "name": name,
            "resource_class": resource_class,
            "pod_sets": [{"name": "main", "replicas": replicas, "devices_per_pod": devices_per_pod}],
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    return response.json()


def test_it_points_to_a_cheaper_class_the_team_may_use(cluster, alice, api_client, budget):
    body = submit(api_client, alice, "one-gpu", "distributed-training")

    assert [(g["kind"], g["resource_class"]) for g in body["guidance"]] == [("cheaper_class", "budget-training")]
    assert "$2.00 per device-hour instead of $4.00" in body["guidance"][0]["message"]
    event = AuditEvent.objects.get(action=AUDIT_ACTION)
    assert (event.target_id, event.actor, event.after["kinds"]) == (str(body["id"]), alice, ["cheaper_class"])


def test_it_never_suggests_a_class_the_team_is_not_entitled_to(cluster, bob, api_client, budget):
    body = submit(api_client, bob, "one-gpu", "distributed-training")

    assert [(g["kind"], g["resource_class"]) for g in body["guidance"]] == [("smaller_class", "small-inference")]


def test_it_says_nothing_when_the_request_fits_no_cheaper_or_smaller_class(cluster, alice, api_client):
    body = submit(api_client, alice, "full-rack", "distributed-training", replicas=2, devices_per_pod=4)

    assert body["guidance"] == []
    assert not AuditEvent.objects.filter(action=AUDIT_ACTION).exists()


def test_it_does_not_trade_a_class_without_approval_for_one_that_needs_it(cluster, alice, api_client):
    cluster.inference.approval_required = True
    cluster.inference.save()

    body = submit(api_client, alice, "one-gpu", "distributed-training")

    assert body["guidance"] == []


@pytest.mark.parametrize(("failed", "succeeded", "warned"), [(3, 1, True), (2, 2, False), (2, 0, False)])
def test_it_warns_about_a_class_the_team_rarely_succeeds_with(cluster, alice, api_client, failed, succeeded, warned):
    for index in range(failed):
        make_workload(cluster.queue_a, f"failed-{index}", resource_class=cluster.training, state=State.FAILED)
    for index in range(succeeded):
        make_workload(cluster.queue_a, f"ok-{index}", resource_class=cluster.training, state=State.SUCCEEDED)
    make_workload(cluster.queue_b, "other-team-failed", resource_class=cluster.training, state=State.FAILED)

    body = submit(api_client, alice, "again", "distributed-training", replicas=2, devices_per_pod=4)

    kinds = [g["kind"] for g in body["guidance"]]
    assert kinds == (["rarely_succeeds"] if warned else [])
    if warned:
        assert f"{succeeded} succeeded, {failed} failed" in body["guidance"][0]["message"]


def test_it_counts_invalid_requests_as_failures(cluster, alice, api_client):
    from broker.workloads.models import Explanation

    for index in range(4):
        workload = make_workload(cluster.queue_a, f"bad-{index}", resource_class=cluster.training, state=State.PENDING)
        Explanation.objects.create(workload=workload, reason="InvalidRequest", message="no such device")

    body = submit(api_client, alice, "again", "distributed-training", replicas=2, devices_per_pod=4)

    assert "4 could never run here" in body["guidance"][0]["message"]


def test_it_shows_the_guidance_after_a_submission_on_the_page(client, cluster, alice, budget):
    client.force_login(alice)
    response = client.post(
        reverse("dashboard:submit"),
        {
            "name": "page-job",
            "queue": cluster.queue_a.pk,
            "resource_class": cluster.training.pk,
            "replicas": 1,
            "devices_per_pod": 1,
        },
        follow=True,
    )

    assert response.status_code == 200
    assert "would also fit Budget training at $2.00 per device-hour" in response.content.decode()


@pytest.mark.parametrize(
    ("who", "replicas", "devices_per_pod", "advised"),
    [
        # Fits the A100 racks: the cheapest class that could hold it, never the one without devices.
        ("alice", 1, 1, [("cheaper_class", "budget-training")]),
        ("alice", 4, 1, [("cheaper_class", "budget-training")]),
        # Six in one rack: an H100 rack holds it, no A100 rack (4 each) does.
        ("alice", 6, 1, []),
        # Invalid in every class: 8 devices per pod, and no node has more than 4.
        ("alice", 1, 8, []),
        ("bob", 1, 8, []),
        # Not entitled to the A100s: the smaller class, which holds it.
        ("bob", 1, 1, [("smaller_class", "small-inference")]),
    ],
)
def test_it_advises_only_a_class_whose_devices_could_hold_the_request(
    cluster, alice, bob, api_client, budget, spot, who, replicas, devices_per_pod, advised
):
    user = {"alice": alice, "bob": bob}[who]
    name = f"{who}-{replicas}x{devices_per_pod}"
    body = submit(api_client, user, name, "distributed-training", replicas=replicas, devices_per_pod=devices_per_pod)

    assert [(g["kind"], g["resource_class"]) for g in body["guidance"]] == advised
    assert not any("batch-inference" in g["message"] or "Batch inference" in g["message"] for g in body["guidance"])


def test_it_reads_the_inventory_once_while_it_stands_and_again_once_it_changes(cluster, alice, api_client, budget):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def inventory_reads(name, **size):
        with CaptureQueriesContext(connection) as queries:
            body = submit(api_client, alice, name, "distributed-training", **size)
        return body, sum('FROM "inventory_device"' in query["sql"] for query in queries.captured_queries)

    assert inventory_reads("first")[1] == 1
    body, reads = inventory_reads("second")
    assert reads == 0
    assert [g["resource_class"] for g in body["guidance"]] == ["budget-training"]

    # Eight A100 in one rack only once a node joins r3: the budget class holds 2 x 4 from then on.
    assert inventory_reads("two-by-four", replicas=2, devices_per_pod=4)[0]["guidance"] == []
    node = Node.objects.create(name="a3", domain=Domain.objects.get(name="r3"))
    for index in range(4):
        Device.objects.create(node=node, name=str(index), attributes={"model": "A100", "memory": 40})
    body, reads = inventory_reads("two-by-four-again", replicas=2, devices_per_pod=4)
    assert reads == 1
    assert [g["resource_class"] for g in body["guidance"]] == ["budget-training"]


def test_it_reads_the_inventory_for_every_submission_when_no_revision_identifies_it(cluster, alice, api_client, budget):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    InventoryRevision.objects.all().delete()
    for name in ("first", "second"):
        with CaptureQueriesContext(connection) as queries:
            body = submit(api_client, alice, name, "distributed-training")
        assert sum('FROM "inventory_device"' in query["sql"] for query in queries.captured_queries) == 1
        assert [g["resource_class"] for g in body["guidance"]] == ["budget-training"]
