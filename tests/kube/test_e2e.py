"""End to end: `manage.py kube_sync` and a real Celery worker (cycles and the applier) on PostgreSQL and
Redis, against the mock API server. 50 nodes with ResourceSlices come in; a PodGroup of 8 pods is
admitted, its claims allocated and its pods bound on one rack; a PodGroup that cannot fit carries the
broker's explanation; a cordon in the cluster reaches the broker, and so does a device another scheduler
allocated; a NoExecute device taint evicts the running group; a worker killed while it binds, then
restarted, binds each pod exactly once."""

import signal
import subprocess
import sys
import time

import pytest

from broker.inventory.models import Device, Node
from broker.kube.models import MirroredPodGroup
from broker.kube.tasks import apply_outbox
from broker.policy.models import DeviceClass, PriorityClass, Queue, ResourceClass, ResourceClassDeviceClass, Team
from broker.scheduler.snapshot import HELD_OUTSIDE_TAINT
from broker.workloads.models import Explanation, Workload, WorkloadTransition
from broker.workloads.states import State
from tests.e2e.conftest import ROOT, stack_env, stop
from tests.kube import objects
from tests.kube.helpers import bound_nodes
from tests.kube_apiserver import MockCluster, to_dict

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True, serialized_rollback=True)]
RACKS, NODES_PER_RACK = 5, 10


def wait(predicate, what, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; the broker has: {state()}")


def state():
    groups = [
        (g.name, g.refused, g.refused_message, g.workload.state if g.workload else None, len(g.pods))
        for g in MirroredPodGroup.objects.select_related("workload")
    ]
    explanations = list(Explanation.objects.values_list("workload__name", "reason", "message"))
    return f"groups {groups}; explanations {explanations}"


def start(args, env, log):
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


@pytest.fixture
def kube_stack(settings, tmp_path):
    from django.db import connection

    if not settings.REDIS_URL or connection.vendor != "postgresql":
        pytest.fail("the end-to-end tests run the production stack: set DATABASE_URL (PostgreSQL) and REDIS_URL")
    with MockCluster() as apiserver:
        env = {
            **stack_env(),
            "KUBE_ENABLED": "True",
            "KUBE_API_URL": apiserver.url,
            "KUBE_CLUSTER_NAME": "lab",
            "KUBE_WATCH_TIMEOUT_SECONDS": "5",
            "EXECUTOR": "external",
            "CYCLE_WARM_UP": "False",
        }
        settings.KUBE_ENABLED = True
        settings.KUBE_API_URL = apiserver.url
        bin_dir = sys.executable.rsplit("/", 1)[0]
        worker_args = [f"{bin_dir}/celery", "-A", "broker", "worker", "--pool=solo", "--loglevel=INFO",
                       "--without-heartbeat", "--without-gossip", "--without-mingle"]  # fmt: skip
        logs = open(tmp_path / "stack.log", "w")  # noqa: SIM115
        processes = {
            "sync": start([sys.executable, "manage.py", "kube_sync"], env, logs),
            "worker": start(worker_args, env, logs),
        }
        try:
            yield apiserver, processes, lambda: start(worker_args, env, logs)
        finally:
            for process in processes.values():
                stop(process)
            logs.close()
            (ROOT / "test-artifacts").mkdir(exist_ok=True)
            (ROOT / "test-artifacts" / "e2e-kube-stack.log").write_text((tmp_path / "stack.log").read_text())


def held_outside(node, device):
    taints = Device.objects.get(node__name=node, name=device).taints
    return [taint["value"] for taint in taints if taint["key"] == HELD_OUTSIDE_TAINT]


def policy():
    team = Team.objects.create(name="ml-team")
    Queue.objects.create(name="ml", team=team)
    batch = PriorityClass.objects.create(name="batch", value=100)
    training = ResourceClass.objects.create(
        name="training", display_name="Training", priority_class=batch, topology_required="rack"
    )
    ResourceClassDeviceClass.objects.create(resource_class=training, device_class=DeviceClass.objects.get(name="h100"))


def test_it_brokers_a_cluster_end_to_end(kube_stack):
    apiserver, processes, restart_worker = kube_stack
    apiserver.create(objects.device_class())
    for r in range(RACKS):
        for n in range(NODES_PER_RACK):
            name = f"node-{r}-{n}"
            apiserver.create(objects.node(name, rack=f"rack-{r}"))
            apiserver.create(objects.resource_slice(name))
    wait(lambda: Device.objects.count() == RACKS * NODES_PER_RACK * 8, "400 devices in the inventory")
    wait(lambda: DeviceClass.objects.filter(name="h100").exists(), "the device class")
    policy()

    # A gang of 8 pods, one GPU each: admitted, claims allocated, pods bound, all on one rack.
    objects.gang(apiserver, "train", pods=8)
    wait(
        lambda: all(bound_nodes(apiserver, "train-").values()) and len(bound_nodes(apiserver, "train-")) == 8, "binding"
    )
    racks = {Node.objects.get(name=node).domain.name for node in bound_nodes(apiserver, "train-").values()}
    assert len(racks) == 1
    assert all(apiserver.get("ResourceClaim", f"train-{i}-gpus", "ml")["status"]["allocation"] for i in range(8))
    train = MirroredPodGroup.objects.get(name="train").workload
    wait(lambda: Workload.objects.get(pk=train.pk).state == State.RUNNING, "Running")

    # A gang larger than any rack stays pending and says why, in the broker's words, in its condition.
    objects.gang(apiserver, "huge", pods=11, devices_per_pod=8)

    def explained():
        group = MirroredPodGroup.objects.filter(name="huge", workload__isnull=False).first()
        status = (apiserver.get("PodGroup", "huge", "ml") or {}).get("status") or {}
        explanation = group and Explanation.objects.filter(workload=group.workload).first()
        return explanation and status.get("conditions") and status["conditions"][0]["message"] == explanation.message

    wait(explained, "the pending PodGroup's condition")

    # A cordon in the cluster reaches the broker.
    apiserver.apply(objects.node("node-4-9", rack="rack-4", unschedulable=True))
    wait(lambda: Node.objects.get(name="node-4-9").cordoned, "the cordon")

    # A claim another scheduler allocated holds its device in the broker until it is deallocated.
    apiserver.create(objects.claim("serving", "web"))
    apiserver.set_status("ResourceClaim", "serving", to_dict(objects.allocated([("node-4-8", "gpu-0")])), "web")
    wait(lambda: held_outside("node-4-8", "gpu-0") == ["web/serving"], "the device held outside")
    apiserver.set_status("ResourceClaim", "serving", {"allocation": None}, "web")
    wait(lambda: held_outside("node-4-8", "gpu-0") == [], "the device released")

    # A worker killed while it binds a gang (the API server hangs on one of its bindings), then restarted:
    # each pod is bound exactly once.
    apiserver.fail("POST", "binding", 503, after=2, hang=30)
    objects.gang(apiserver, "second", pods=8)
    # The applier binds a gang's pods in parallel: the other 7 are bound, the third hangs.
    wait(lambda: len(apiserver.requests("POST", "binding")) == 8 + 8, "the hanging binding")
    processes["worker"].send_signal(signal.SIGKILL)
    processes["worker"].wait(10)
    processes["worker"] = restart_worker()
    time.sleep(2)
    apply_outbox.delay()  # what beat does every few seconds
    wait(lambda: all(bound_nodes(apiserver, "second-").values()), "binding after the restart", timeout=90)
    second = [path for _, path in apiserver.requests("POST", "binding") if "/second-" in path]
    assert len(second) == 9, "8 bindings and the one the killed worker left hanging"
    assert len({path for path in second}) == 8

    # A NoExecute taint on a device of the running gang evicts it, whole, through the Eviction API.
    node = bound_nodes(apiserver, "train-")["train-0"]
    apiserver.create(objects.taint_rule("broken", pool=node))
    wait(lambda: len([p for _, p in apiserver.requests("POST", "eviction") if "/train-" in p]) == 8, "eviction")
    wait(lambda: not bound_nodes(apiserver, "train-"), "the evicted pods gone")
    # Requeued once its pods are gone (the next cycle may admit it again at once: it waits for its pods).
    wait(
        lambda: WorkloadTransition.objects.filter(
            workload=train, from_state=State.PREEMPTED, to_state=State.PENDING
        ).exists(),
        "the group requeued",
    )
    assert all(process.poll() is None for process in processes.values())
