"""The what-if file format: what it accepts, the one-line errors it gives, and the `whatif` command."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from broker.scheduler.scenario import ScenarioError, load_scenario

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "tests" / "scenarios" / "preemption_queue_and_cohort.yaml"

MINIMAL = """
topology: [rack]
device_classes: {h100: {match: {model: H100}}}
nodes: [{name: n1, rack: r1, devices: 2, attributes: {model: H100}}]
queues: [{name: q}]
"""


def test_it_names_devices_after_their_node():
    snapshot = load_scenario(MINIMAL)
    assert [device.id for device in snapshot.devices] == ["n1/0", "n1/1"]
    assert snapshot.devices[0].driver == "gpu.example.com"
    assert snapshot.queues[0].quota is None and snapshot.queues[0].within_queue == "Never"


@pytest.mark.parametrize(
    ("addition", "message"),
    [
        ("pending: [{name: a, queue: foo}]", "pending[0].queue: unknown queue 'foo'"),
        ("pending: [{name: a, queue: q, pods: two}]", "pending[0].pods: expected a whole number, got 'two'"),
        (
            "pending: [{name: a, queue: q, device_class: tpu}]",
            "pending[0].device_class: unknown device class 'tpu'",
        ),
        ("running: [{name: r, queue: q, pods: [{node: n9}]}]", "running[0].pods[0].node: unknown node 'n9'"),
        ("running: [{name: r, queue: q, pods: [{node: n1, devices: 3}]}]", "node n1 has only 2 devices left"),
        ("pending: [{name: a, queue: q, colour: red}]", "pending[0]: unknown key 'colour'"),
        ("cohorts: {a: 1}", "cohorts: expected a list, got dict"),
    ],
)
def test_it_rejects_malformed_scenarios_with_one_line(addition, message):
    with pytest.raises(ScenarioError) as error:
        load_scenario(MINIMAL + addition)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


PARTITIONED = """
device_classes: {gpu: {}}
queues: [{name: q}]
nodes:
  - name: n1
    devices: 1
    counters: {memory: 2}
"""


@pytest.mark.parametrize(
    ("addition", "message"),
    [
        (
            "    partitions: [{profile: half, count: 2, consumes: {slices: 1}}]",
            "nodes[0].partitions[0].consumes: counter 'slices' is not published by its device (counters: memory)",
        ),
        ("    partitions: [{profile: half, count: 2}]", "a partition must consume some of its device's counters"),
        (
            "    partitions: [{profile: half, consumes: {memory: 1}}, {profile: half, consumes: {memory: 1}}]",
            "nodes[0].partitions[1].profile: duplicate profile 'half'",
        ),
        (
            "    partitions: [{profile: half, count: 2, consumes: {memory: 1}}]\n"
            "running: [{name: r, queue: q, pods: [{node: n1, devices: [0, '0:half#1']}]}]",
            "running 'r': n1/0:half#1 would exceed counter 'memory' of counter set gpu-0 on n1",
        ),
    ],
)
def test_it_rejects_malformed_partitions_with_one_line(addition, message):
    with pytest.raises(ScenarioError) as error:
        load_scenario(PARTITIONED + addition)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


CLAIMED = """
topology: [rack]
device_classes: {h100: {match: {model: H100}}, nic: {match: {kind: nic}}, tpu: {match: {model: TPU}}}
nodes:
  - {name: n1, rack: r1, devices: 2, attributes: {model: H100, root: a}, other_devices: [{kind: nic, count: 1}]}
queues: [{name: q}]
pending:
  - name: a
    queue: q
"""


@pytest.mark.parametrize(
    ("addition", "message"),
    [
        (
            "    requests: [{name: gpu, device_class: h100}]\n"
            "    constraints: [{match_attribute: root, requests: [nic]}]",
            "pending[0]: constraint on root names unknown request 'nic'",
        ),
        (
            "    requests: [{name: gpu, device_class: fpga}]",
            "pending[0].requests[0].device_class: unknown device class",
        ),
        (
            "    requests: [{name: gpu, device_class: tpu}]",
            "device class 'tpu' selects no device of the cluster",
        ),
        (
            "    requests: [{name: gpu, device_class: h100}, {name: gpu, device_class: nic}]",
            "pending[0]: request names must be unique",
        ),
        (
            "    requests: [{name: gpu, device_class: h100, first_available: [{name: x, device_class: h100}]}]",
            "give device_class and count, or first_available, not both",
        ),
        ("    devices_per_pod: 2\n    requests: [{name: gpu, device_class: h100}]", "says its devices in them"),
        ("    constraints: [{match_attribute: root}]", "constraints need requests"),
        (
            "    requests: [{name: gpu, device_class: h100, allocation_mode: All, count: 2}]",
            "pending[0].requests[0].count: allocation_mode All takes every matching device; give no count",
        ),
        (
            "    requests: [{name: gpu, device_class: h100, allocation_mode: Some}]",
            "pending[0].requests[0].allocation_mode: ExactCount or All, not 'Some'",
        ),
        (
            "    requests: [{name: gpu, device_class: h100}]\n"
            "    constraints: [{match_attribute: root, distinct_attribute: root}]",
            "pending[0].constraints[0]: give match_attribute or distinct_attribute, not both or neither",
        ),
        (
            "    requests: [{name: gpu, device_class: h100}]\n    constraints: [{requests: [gpu]}]",
            "give match_attribute or distinct_attribute, not both or neither",
        ),
        (
            "    requests: [{name: gpu, device_class: h100}]\n"
            "    constraints: [{distinct_attribute: root, requests: [nic]}]",
            "pending[0]: constraint on root names unknown request 'nic'",
        ),
    ],
)
def test_it_rejects_malformed_claims_with_one_line(addition, message):
    with pytest.raises(ScenarioError) as error:
        load_scenario(CLAIMED + addition)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_it_reads_a_claim_with_several_requests():
    snapshot = load_scenario(
        CLAIMED + "    requests: [{name: gpu, device_class: h100, count: 2}, {name: net, first_available: "
        '[{name: fast, device_class: nic, selectors: [\'device.attributes["gpu.example.com"].kind == "nic"\']}]}]\n'
        "    constraints: [{match_attribute: root}]"
    )
    assert [device.id for device in snapshot.devices] == ["n1/0", "n1/1", "n1/nic-0"]
    assert snapshot.devices[2].attributes == {"kind": "nic"}
    pod_set = snapshot.pending[0].pod_sets[0]
    assert [request.name for request in pod_set.requests] == ["gpu", "net"]
    assert pod_set.requests[0].exactly.count == 2
    assert pod_set.requests[1].first_available[0].selectors
    assert pod_set.constraints[0].match_attribute == "root" and pod_set.constraints[0].requests == ()


def test_it_reads_allocation_mode_all_and_distinct_attribute():
    snapshot = load_scenario(
        CLAIMED + "    requests: [{name: gpu, device_class: h100, count: 2}, {name: net, device_class: nic, "
        "allocation_mode: All}, {name: acc, first_available: [{name: every, device_class: h100, "
        "allocation_mode: All}, {name: one, device_class: h100}]}]\n"
        "    constraints: [{distinct_attribute: root, requests: [gpu]}]"
    )
    gpu, net, acc = snapshot.pending[0].pod_sets[0].requests
    assert not gpu.exactly.takes_all and net.exactly.takes_all and net.exactly.count == 1
    assert [way.allocation_mode for way in acc.first_available] == ["All", "ExactCount"]
    constraint = snapshot.pending[0].pod_sets[0].constraints[0]
    assert (constraint.match_attribute, constraint.distinct_attribute, constraint.requests) == (None, "root", ("gpu",))


SHARED = """
device_classes: {gpu: {match: {model: A100}}}
nodes:
  - {name: n1, devices: 1, attributes: {model: A100}, capacity: {memory: 80}, shared: true}
  - {name: n2, devices: 1, attributes: {model: A100}}
queues: [{name: q}]
"""


@pytest.mark.parametrize(
    ("addition", "message"),
    [
        ("resource_classes: [{name: nb, sharing: Sliced}]", "resource_classes[0].sharing: must be one of Exclusive"),
        (
            "running: [{name: r, queue: q, pods: [{node: n2, devices: [0], consumed: {memory: 10}}]}]",
            "running[0].pods[0].consumed: n2/0 is not a shared device",
        ),
        (
            "running:\n"
            "  - {name: a, queue: q, pods: [{node: n1, devices: [0], consumed: {memory: 50}}]}\n"
            "  - {name: b, queue: q, pods: [{node: n1, devices: [0], consumed: {memory: 40}}]}",
            "running[1].pods[0].consumed: n1/0 has not 40 memory left",
        ),
        (
            "running:\n"
            "  - {name: a, queue: q, pods: [{node: n1, devices: [0]}]}\n"
            "  - {name: b, queue: q, pods: [{node: n1, devices: [0], consumed: {memory: 40}}]}",
            "running[1].pods[0].devices: n1/0 is already held by another running pod",
        ),
        ("pending: [{name: w, queue: q, capacity: {memory: 0}}]", "pending[0].capacity.memory: must be positive"),
    ],
)
def test_it_rejects_malformed_sharing_with_one_line(addition, message):
    with pytest.raises(ScenarioError) as error:
        load_scenario(SHARED + addition)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_it_refuses_shared_devices_without_a_capacity():
    with pytest.raises(ScenarioError, match=r"nodes\[0\].shared: shared devices need a capacity to share"):
        load_scenario("nodes: [{name: n1, devices: 1, shared: true}]")


def test_it_rejects_a_bad_selector_and_bad_yaml():
    with pytest.raises(ScenarioError, match=r"device_classes.x.selector: invalid CEL selector"):
        load_scenario("device_classes: {x: {selector: 'device.attributes['}}")
    with pytest.raises(ScenarioError, match=r"invalid YAML at line 1"):
        load_scenario("nodes: [")


def whatif(*args):
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "whatif", *args], capture_output=True, text=True, cwd=ROOT
    )


def test_it_runs_the_whatif_command_as_json():
    completed = whatif(str(EXAMPLE), "--json")
    assert completed.returncode == 0, completed.stderr
    output = json.loads(completed.stdout)
    assert output["preempted"] == ["ads-b", "research-low"]
    assert {workload["status"] for workload in output["workloads"]} == {"pending", "preempted"}


def test_it_fails_the_whatif_command_with_one_line_and_exit_2(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text(MINIMAL + "pending: [{name: a, queue: foo}]")
    for path in (broken, tmp_path / "missing.yaml"):
        completed = whatif(str(path))
        assert completed.returncode == 2
        assert len(completed.stderr.strip().splitlines()) == 1, completed.stderr


def test_it_fails_the_whatif_command_on_a_bad_all_request_with_one_line(tmp_path):
    broken = tmp_path / "all.yaml"
    broken.write_text(CLAIMED + "    requests: [{name: gpu, device_class: h100, allocation_mode: All, count: 2}]\n")
    completed = whatif(str(broken))
    assert completed.returncode == 2
    (line,) = completed.stderr.strip().splitlines()
    assert line.endswith("pending[0].requests[0].count: allocation_mode All takes every matching device; give no count")
