"""The Kubernetes bridge against the mock API server (issue 28): `python -m bench.run --only kube`.

1. initial sync: list 10,000 Nodes and their ResourceSlices (8 devices each) with the DeviceClass into an
   empty inventory (`Sync.list_all`, the inventory resources), target 60 s;
2. watch latency: with the sync following the nodes on its threads, a Node cordoned in the API server
   until its inventory row says so, 20 times one after another, target 1 s at most;
3. PodGroup to bound: a 64-pod PodGroup (one GPU per pod, one rack) created in the API server until every
   pod is bound and every claim allocated, 10 times, target 3 s at p99. The sync follows the PodGroups,
   pods and claims on its threads; a loop stands in for the trigger, the Celery worker and the applier:
   once the workload exists it runs one cycle and drains the outbox, as the worker does (warmed up first,
   as the worker is when it starts). The cycle's own share is reported beside it. The sync runs as
   `manage.py kube_sync` in a process of its own; the mock API server runs on a thread of the bench's
   process.
"""

from __future__ import annotations

import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NODES, DEVICES, RACK_SIZE = 10_000, 8, 16
QUICK_NODES = 250
GANG, GANGS, EVENTS = 64, 10, 20


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def figures(seconds):
    return {
        "median_ms": round(statistics.median(seconds) * 1000, 1),
        "p99_ms": round(percentile(seconds, 0.99) * 1000, 1),
        "max_ms": round(max(seconds) * 1000, 1),
        "runs": len(seconds),
    }


def fill(apiserver, nodes):
    from tests.kube import objects

    apiserver.create(objects.device_class())
    for i in range(nodes):
        name = f"node-{i:05d}"
        apiserver.create(objects.node(name, rack=f"rack-{i // RACK_SIZE:04d}", block=f"block-{i // 512:02d}"))
        apiserver.create(objects.resource_slice(name, devices=DEVICES))


def policy():
    from broker.policy.models import DeviceClass, PriorityClass, Queue, ResourceClass, ResourceClassDeviceClass, Team

    team = Team.objects.create(name="ml-team")
    Queue.objects.create(name="ml", team=team)
    batch = PriorityClass.objects.create(name="batch", value=100)
    training = ResourceClass.objects.create(
        name="training", display_name="Training", priority_class=batch, topology_required="rack"
    )
    ResourceClassDeviceClass.objects.create(resource_class=training, device_class=DeviceClass.objects.get(name="h100"))


def wait(predicate, timeout=60.0, interval=0.01):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


def section(quick: bool) -> dict:
    from django.conf import settings
    from django.utils import timezone

    from bench import db
    from broker.cycle.loader import forget_everything_loaded
    from broker.cycle.runner import run_once, warm_up
    from broker.inventory.models import Device, Node
    from broker.kube.applier import Applier
    from broker.kube.models import MirroredPodGroup, OutboxEntry, WatchCursor
    from broker.kube.sync import INVENTORY, WORK, Sync
    from broker.workloads.models import SchedulingCycle
    from tests.kube import objects
    from tests.kube.helpers import bound_nodes
    from tests.kube_apiserver import MockCluster

    nodes = QUICK_NODES if quick else NODES
    db.reset()
    forget_everything_loaded()
    result = {"nodes": nodes, "devices": nodes * DEVICES}
    # The mock server's access log (a line per request, 1,200 in a run) is not the bench's report.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    with MockCluster() as apiserver:
        settings.KUBE_ENABLED = True
        settings.KUBE_API_URL = apiserver.url
        settings.KUBE_CLUSTER_NAME = "bench"
        settings.EXECUTOR = "external"
        started = time.perf_counter()
        fill(apiserver, nodes)
        result["mock_fill_seconds"] = round(time.perf_counter() - started, 1)

        sync = Sync(timeout_seconds=5)
        started = time.perf_counter()
        sync.list_all(INVENTORY)
        initial = time.perf_counter() - started
        assert Device.objects.count() == nodes * DEVICES
        result["initial_sync"] = {
            "seconds": round(initial, 2),
            "target": {"what": "initial sync <= 60 s at 10,000 nodes x 8 devices", "pass": initial <= 60},
        }
        policy()
        sync.list_all(WORK)
        # The sync runs as in production: `manage.py kube_sync`, a process of its own, from its cursors.
        follower = subprocess.Popen(
            [sys.executable, "manage.py", "kube_sync", "--cluster", "bench"],
            cwd=ROOT,
            env={
                **os.environ,
                "DATABASE_URL": os.environ["DATABASE_URL"],
                "KUBE_ENABLED": "True",
                "KUBE_API_URL": apiserver.url,
                "KUBE_WATCH_TIMEOUT_SECONDS": "30",
                "EXECUTOR": "external",
                "CYCLE_MODE": "bench",
            },
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            # Timed from when the sync follows the nodes (a bookmark moved their cursor), not from its
            # process start: a second or more of Django's setup is not a watch event's latency.
            started = timezone.now()
            following = wait(lambda: WatchCursor.objects.filter(resource="nodes", updated_at__gt=started).exists(), 120)
            assert following, "the sync did not start following the nodes"
            latencies = []
            for i in range(EVENTS):
                name = f"node-{(i * 37) % nodes:05d}"
                started = time.perf_counter()
                apiserver.apply(
                    objects.node(name, rack=f"rack-{((i * 37) % nodes) // RACK_SIZE:04d}", unschedulable=True)
                )
                if wait(lambda name=name: Node.objects.filter(name=name, cordoned=True).exists(), 10):
                    latencies.append(time.perf_counter() - started)
            result["watch_event_to_database"] = {
                **figures(latencies),
                "target": {"what": "a watch event reaches the database <= 1 s", "pass": max(latencies) <= 1.0},
            }

            # As the Celery worker does when it starts (CYCLE_WARM_UP): its first cycle then finds the
            # inventory read and indexed, as every later one does, instead of reading 80,000 devices.
            warm_up()
            bound, cycles, cycle_ms = [], [], []
            for g in range(GANGS):
                name = f"gang-{g}"
                started = time.perf_counter()
                objects.gang(apiserver, name, pods=GANG)
                ok = wait(
                    lambda name=name: MirroredPodGroup.objects.filter(name=name, workload__isnull=False).exists(), 30
                )
                if not ok:
                    continue
                mirrored = time.perf_counter() - started
                run = run_once()
                entries = Applier().drain()
                done = time.perf_counter() - started
                nodes_of = bound_nodes(apiserver, f"{name}-")
                if run and entries and len(nodes_of) == GANG and all(nodes_of.values()):
                    bound.append(done)
                    cycle = SchedulingCycle.objects.get(pk=run.cycle_id)
                    cycle_ms.append(cycle.duration_ms)
                    cycles.append(
                        {"mirrored_s": round(mirrored, 3), "cycle_ms": cycle.duration_ms, "bound_s": round(done, 3)}
                    )
                # Free the rack for the next gang: the gang ends in the cluster.
                for i in range(GANG):
                    apiserver.delete("Pod", f"{name}-{i}", "ml")
                wait(
                    lambda name=name: not OutboxEntry.objects.filter(
                        pod_group__name=name, done_at__isnull=True
                    ).exists(),
                    5,
                )
            result["pod_group_to_bound"] = {
                **(figures(bound) if bound else {"runs": 0}),
                "of": GANGS,
                "cycle_ms_median": round(statistics.median(cycle_ms), 1) if cycle_ms else None,
                "cycle_share_of_median": round(statistics.median(cycle_ms) / 1000 / statistics.median(bound), 2)
                if bound
                else None,
                "runs_detail": cycles,
                "target": {
                    "what": f"a {GANG}-pod PodGroup created -> every pod bound, every claim allocated <= 3 s p99",
                    "pass": bool(bound) and len(bound) == GANGS and percentile(bound, 0.99) <= 3.0,
                },
            }
        finally:
            follower.terminate()
            follower.wait(30)
            settings.KUBE_ENABLED = False
    passes = [
        result[key]["target"]["pass"] for key in ("initial_sync", "watch_event_to_database", "pod_group_to_bound")
    ]
    result["target"] = {"what": "initial sync, watch latency and PodGroup-to-bound targets", "pass": all(passes)}
    return result
