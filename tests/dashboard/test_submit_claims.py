"""The submit form says everything the API's claims say (issue 26): a pod's claim with several requests,
allocationMode All and distinctAttribute constraints, and group claims, written as YAML or JSON in its
advanced section, checked field by field, previewed by the what-if, stored as the API stores them."""

import json

import pytest
from django.urls import reverse

from broker.inventory.models import Device
from broker.policy.models import DeviceClass
from broker.workloads.models import Workload
from tests.builders import make_resource_class

CLAIM = """
requests:
  - {name: gpus, exactly: {deviceClassName: h100, count: 2}}
  - {name: nics, exactly: {deviceClassName: nic, allocationMode: All}}
constraints:
  - {requests: [gpus], distinctAttribute: gpu.example.com/pcie_root}
"""
GROUP_CLAIMS = """
- name: shared
  requests: [{name: gpu, exactly: {deviceClassName: h100}}]
"""


@pytest.fixture
def fabric(cluster):
    """n1's GPUs under roots a (0, 1) and b (2, 3), one NIC beside them; a class offering both."""
    node = cluster.nodes[0]
    for device in Device.objects.filter(node=node):
        device.attributes = {**device.attributes, "pcie_root": "a" if device.name in ("0", "1") else "b"}
        device.save()
    Device.objects.create(node=node, name="nic0", attributes={"kind": "nic"})
    nic = DeviceClass.objects.create(
        name="nic", selector='device.attributes["gpu.example.com"].kind == "nic"', price_per_hour="0.10"
    )
    for queue in (cluster.queue_a, cluster.queue_b):
        queue.nominal_quota = {**queue.nominal_quota, "nic": 2}
        queue.save()
    return make_resource_class("fabric", cluster.training.priority_class, [cluster.h100, nic])


def form(cluster, resource_class, **fields):
    return {
        "name": "claimed",
        "queue": cluster.queue_a.pk,
        "resource_class": resource_class.pk,
        "replicas": 1,
        "devices_per_pod": 1,
        **fields,
    }


def test_it_submits_a_claim_with_several_requests_as_the_api_stores_it(client, alice, cluster, fabric):
    client.force_login(alice)
    page = client.get(reverse("dashboard:submit")).content.decode()
    assert 'id="advanced-claims"' in page and 'name="claim"' in page and 'name="group_claims"' in page
    # The menu says which device classes a claim in each resource class may name.
    assert 'A claim may name: <span class="mono">h100, nic</span>' in page

    response = client.post(reverse("dashboard:submit"), form(cluster, fabric, claim=CLAIM))

    assert response.status_code == 302, response.context["form"].errors
    pod_set = Workload.objects.get(name="claimed").pod_sets.get()
    assert pod_set.claim == {
        "requests": [
            {"name": "gpus", "exactly": {"deviceClassName": "h100", "count": 2}},
            {"name": "nics", "exactly": {"deviceClassName": "nic", "allocationMode": "All"}},
        ],
        "constraints": [{"requests": ["gpus"], "distinctAttribute": "gpu.example.com/pcie_root"}],
    }


def test_it_submits_group_claims_written_as_json(client, alice, cluster):
    client.force_login(alice)
    claims = json.dumps([{"name": "shared", "requests": [{"name": "gpu", "exactly": {"deviceClassName": "h100"}}]}])
    response = client.post(reverse("dashboard:submit"), form(cluster, cluster.training, group_claims=claims))
    assert response.status_code == 302, response.context["form"].errors
    workload = Workload.objects.get(name="claimed")
    assert workload.group_claims == [
        {"name": "shared", "requests": [{"name": "gpu", "exactly": {"deviceClassName": "h100"}}], "constraints": []}
    ]


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"claim": "requests: [\n"}, "claim", "Not YAML or JSON at line"),
        ({"claim": "- just a list"}, "claim", "A claim is a mapping with a list of requests"),
        (
            {"claim": "requests: [{name: nics, exactly: {deviceClassName: nic, allocationMode: All, count: 2}}]"},
            "claim",
            "allocationMode All takes every matching device; give no count",
        ),
        (
            {"claim": "requests: [{name: g, exactly: {deviceClassName: h100}}]\n"
                      "constraints: [{matchAttribute: a, distinctAttribute: a}]"},
            "claim",
            "give one matchAttribute or one distinctAttribute",
        ),
        (
            {"claim": "requests: [{name: g, exactly: {deviceClassName: h100}}]\n"
                      "constraints: [{requests: [nic], distinctAttribute: pcie_root}]"},
            "claim",
            "constraint on pcie_root names unknown request 'nic'",
        ),
        ({"claim": CLAIM, "devices_per_pod": 2}, "claim", "A claim says its devices itself"),
        ({"group_claims": "- name: Not_A_Label\n  requests: [{name: g}]"}, "group_claims", "must be a DNS label"),
        (
            {"group_claims": "- name: shared\n  requests: [{name: g, exactly: {deviceClassName: tpu}}]"},
            "group_claims",
            "Group claim shared: Invalid claim: request g: unknown device class 'tpu'.",
        ),
    ],
)  # fmt: skip
def test_it_refuses_a_bad_claim_with_a_field_error_and_stores_nothing(client, alice, cluster, fabric, fields, field,
                                                                       message):  # fmt: skip
    client.force_login(alice)
    response = client.post(reverse("dashboard:submit"), form(cluster, fabric, **fields))
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert any(message in text for text in errors.get(field, [])), errors
    assert 'id="advanced-claims" open' in response.content.decode()
    assert not Workload.objects.filter(name="claimed").exists()


def test_it_previews_a_claim_in_the_what_if(client, alice, cluster, fabric):
    client.force_login(alice)
    answer = client.post(reverse("dashboard:submit-whatif"), form(cluster, fabric, claim=CLAIM)).json()
    assert answer["ok"] is True and answer["admitted"] is True, answer
    assert answer["nodes"] == [cluster.nodes[0].name]  # the only node with a NIC
    refused = client.post(
        reverse("dashboard:submit-whatif"),
        form(cluster, fabric, claim="requests: [{name: g, exactly: {deviceClassName: nic, allocationMode: Most}}]"),
    )
    assert refused.status_code == 400
    assert "ExactCount or All, not 'Most'" in refused.json()["errors"]["claim"][0]["message"]
    assert not Workload.objects.exists() or not Workload.objects.filter(name="claimed").exists()
