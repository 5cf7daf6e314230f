"""The production path of the cycle: real Celery workers on the test database and Redis.

A submission through the API asks for a cycle; a worker process runs it and the allocations land in
PostgreSQL. Then two workers race through many cycle tasks and the advisory lock keeps their cycles
from ever overlapping.
"""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.db import connection

from broker.workloads.models import Allocation, SchedulingCycle, Workload
from broker.workloads.states import State
from tests.cycle.helpers import pending
from tests.e2e.conftest import stack_env

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

ROOT = Path(__file__).resolve().parents[2]
DONE = re.compile(r"Task broker\.cycle\.tasks\.run_cycle\[[^\]]+\] succeeded in [0-9.]+s: (.*)")


class Workers:
    def __init__(self, tmp_path):
        self.tmp_path = tmp_path
        self.processes = {}

    def start(self, name):
        log = open(self.tmp_path / f"{name}.log", "w")  # noqa: SIM115  (closed in stop_all)
        process = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "celery"),
                "-A",
                "broker",
                "worker",
                "--pool=solo",
                "-Q",
                "celery",
                "-n",
                f"{name}@%h",
                "--loglevel=INFO",
                "--without-heartbeat",
                "--without-gossip",
                "--without-mingle",
            ],
            cwd=ROOT,
            env=stack_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.processes[name] = (process, log)
        self.wait_for(lambda: "ready." in self.log(name), 30, f"worker {name} did not start")

    def log(self, name):
        return (self.tmp_path / f"{name}.log").read_text()

    def results(self, name):
        return DONE.findall(self.log(name))

    def wait_for(self, condition, timeout, message):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return
            for name, (process, _) in self.processes.items():
                if process.poll() is not None:
                    raise AssertionError(f"worker {name} exited {process.returncode}:\n{self.log(name)[-3000:]}")
            time.sleep(0.2)
        raise AssertionError(message + "\n" + "\n".join(self.log(name)[-2000:] for name in self.processes))

    def stop_all(self):
        for process, _log in self.processes.values():
            if process.poll() is None:
                process.terminate()
        for process, log in self.processes.values():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, 9)
                process.wait()
            log.close()


@pytest.fixture
def workers(tmp_path):
    if not settings.REDIS_URL or connection.vendor != "postgresql":
        pytest.fail("this test runs the production stack: set DATABASE_URL (PostgreSQL) and REDIS_URL")
    redis.Redis.from_url(settings.REDIS_URL).flushdb()
    pool = Workers(tmp_path)
    try:
        yield pool
    finally:
        pool.stop_all()


def test_it_admits_a_workload_submitted_through_the_api_in_a_worker(cluster, alice, api_client, workers):
    workers.start("w1")
    # Before its first task the worker process read and indexed the cluster (runner.warm_up).
    assert re.search(r"warmed up for cycles in \d+ ms", workers.log("w1")), workers.log("w1")[-2000:]
    api_client.force_authenticate(alice)

    response = api_client.post(
        "/api/workloads/",
        {
            "name": "train",
            "resource_class": "distributed-training",
            "pod_sets": [{"name": "main", "replicas": 2, "devices_per_pod": 4}],
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    workload = Workload.objects.get(pk=response.json()["id"])

    workers.wait_for(
        lambda: Allocation.objects.filter(workload=workload, released_at__isnull=True).count() == 8,
        30,
        "the worker's cycle did not admit the workload",
    )
    workload.refresh_from_db()
    assert workload.state in (State.ADMITTED, State.RUNNING)
    cycle = SchedulingCycle.objects.filter(outcome=SchedulingCycle.Outcome.COMMITTED, admitted_count=1).get()
    assert Allocation.objects.filter(workload=workload, cycle=cycle).count() == 8


def test_it_never_runs_two_cycles_at_once_across_workers(cluster, workers):
    from broker.cycle.tasks import run_cycle

    for index in range(40):
        pending(
            cluster.queue_a if index % 2 else cluster.queue_b,
            f"job-{index}",
            replicas=1,
            devices_per_pod=4,
            resource_class=cluster.training,
        )
    workers.start("w1")
    workers.start("w2")
    tasks = 30

    for _ in range(tasks):
        run_cycle.delay(reason="race")
    workers.wait_for(
        lambda: len(workers.results("w1")) + len(workers.results("w2")) >= tasks,
        60,
        "the workers did not finish the cycle tasks",
    )

    assert workers.results("w1") and workers.results("w2"), "both workers must have taken tasks"
    skipped = [result for name in ("w1", "w2") for result in workers.results(name) if result == "None"]
    cycles = list(SchedulingCycle.objects.order_by("started_at").values_list("id", "started_at", "finished_at"))
    assert skipped, "the workers never contended for the lock, so this proved nothing"
    assert len(cycles) + len(skipped) == tasks
    assert all(finished is not None for _, _, finished in cycles)
    for (first, _, first_end), (second, second_start, _) in zip(cycles, cycles[1:], strict=False):
        assert second_start >= first_end, f"cycles {first} and {second} overlapped"
