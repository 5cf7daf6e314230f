"""Group claims (PodGroup resourceClaims, issue 26) in the core: quota counts them once, a failure of
one of their devices stops the whole gang, reach pins pods, bad claims are InvalidRequest."""

from dataclasses import replace

import pytest

from broker.scheduler.cycle import decide
from broker.scheduler.scenario import ScenarioError, load_scenario
from broker.scheduler.snapshot import GROUP_POD_SET
from tests.scheduler.invariants import assert_valid_result

CLUSTER = """
topology: [rack]
device_classes:
  h100: {match: {model: H100}}
  scratch: {match: {kind: scratch}}
nodes:
  - {name: n1, rack: r1, devices: 4, attributes: {model: H100},
     other_devices: [{kind: scratch, count: 2, attributes: {reach: rack}}]}
  - {name: n2, rack: r1, devices: 4, attributes: {model: H100}}
  - {name: n3, rack: r2, devices: 4, attributes: {model: H100}}
queues:
  - {name: research, team: research, quota: {h100: QUOTA}}
"""

GANG = """
pending:
  - name: train
    queue: research
    device_class: h100
    pods: 2
    devices_per_pod: 4
    group_claims:
      - {name: data, requests: [{name: volume, device_class: scratch, count: VOLUMES}]}
"""


def scenario(quota=100, volumes=1, extra=GANG):
    return load_scenario((CLUSTER + extra).replace("QUOTA", str(quota)).replace("VOLUMES", str(volumes)))


def test_it_pins_the_gang_to_the_domain_its_group_claim_reaches():
    snapshot = scenario()
    result = decide(snapshot)
    assert_valid_result(snapshot, result)
    (admission,) = result.admissions
    assert {pod.node for pod in admission.pods} == {"n1", "n2"}  # rack r1: n3 cannot reach the volume
    assert admission.group_requests == (("data/volume", ("n1/scratch-0",)),)


@pytest.mark.parametrize(("quota", "admitted"), [(9, True), (8, False)])
def test_it_counts_a_group_claim_once_against_quota(quota, admitted):
    snapshot = scenario(quota=quota)
    result = decide(snapshot)
    assert bool(result.admissions) is admitted
    if not admitted:
        (decision,) = result.pending
        assert decision.reason == "QuotaExceeded", decision.message


def test_it_charges_a_running_gang_its_group_devices_once():
    running = """
running:
  - name: holder
    queue: research
    device_class: h100
    pods: [{node: n3, devices: 1}, {node: n3, devices: 1}]
    group_claims: {data: [n1/scratch-0, n1/scratch-1]}
pending:
  - {name: one, queue: research, device_class: h100}
"""
    # holder charges 2 pods + 2 volumes = 4 of the quota of 5: one more device fits, not two.
    snapshot = scenario(quota=5, extra=running)
    assert [admission.workload_id for admission in decide(snapshot).admissions] == ["one"]
    bigger = replace(
        snapshot,
        pending=(
            replace(snapshot.pending[0], pod_sets=(replace(snapshot.pending[0].pod_sets[0], devices_per_pod=2),)),
        ),
    )
    assert decide(bigger).pending[0].reason == "QuotaExceeded"


def test_it_evicts_the_whole_gang_when_its_group_device_fails():
    running = """
running:
  - name: holder
    queue: research
    device_class: h100
    disruption: Pod
    min_count: 1
    pods: [{node: n1, devices: 1}, {node: n2, devices: 1}]
    group_claims: {data: [n1/scratch-0]}
"""
    snapshot = scenario(extra=running)
    failed = tuple(
        replace(device, healthy=False) if device.id == "n1/scratch-0" else device for device in snapshot.devices
    )
    result = decide(replace(snapshot, devices=failed))
    (eviction,) = result.evictions
    assert eviction.workload_id == "holder"
    assert eviction.pods == ()  # whole: a group claim serves every pod
    assert "n1/scratch-0" in eviction.message


def test_it_names_the_group_claim_when_no_reachable_device_is_left():
    busy = """
running:
  - {name: busy, queue: research, device_class: h100, pods: [{node: n2, devices: 4}]}
"""
    # 8 h100 are free (n1 and n3), but only r1 reaches the volumes and it has 4 free.
    result = decide(scenario(extra=busy + GANG))
    (decision,) = result.pending
    assert decision.reason == "TopologyFragmented"
    assert decision.message == "group claim data: no 1 scratch (volume) reachable from a rack with 8 free h100"
    # The cluster has two volumes in all: three are too few anywhere.
    (decision,) = decide(scenario(volumes=3)).pending
    assert decision.reason == "InsufficientCapacity"
    assert decision.message.startswith("group claim data: too few free devices for 3 scratch (volume)")


def test_it_keeps_group_devices_of_running_gangs_from_new_work():
    running = """
running:
  - name: holder
    queue: research
    device_class: h100
    pods: [{node: n3, devices: 1}]
    group_claims: {data: [n1/scratch-0, n1/scratch-1]}
"""
    snapshot = scenario(extra=running + GANG)
    result = decide(snapshot)
    assert not result.admissions
    assert result.pending[0].reason == "InsufficientCapacity", result.pending[0].message
    assert any(pod.pod_set == GROUP_POD_SET + "data" for pod in snapshot.running[0].pods)


@pytest.mark.parametrize(
    ("claims", "message"),
    [
        ("[{name: data, requests: [{name: v, device_class: nope}]}]", "unknown device class 'nope'"),
        (
            "[{name: data, requests: [{name: v, device_class: scratch}], "
            "constraints: [{match_attribute: rack, requests: [w]}]}]",
            "names unknown request 'w'",
        ),
        (
            "[{name: data, requests: [{name: v, device_class: scratch}]}, "
            "{name: data, requests: [{name: v, device_class: scratch}]}]",
            "group claim names must be unique",
        ),
    ],
)
def test_it_refuses_bad_group_claims_in_one_line(claims, message):
    text = (
        CLUSTER.replace("QUOTA", "9")
        + f"""
pending:
  - {{name: bad, queue: research, device_class: h100, group_claims: {claims}}}
"""
    )
    with pytest.raises(ScenarioError) as raised:
        load_scenario(text)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)
