"""A process killed in the middle of a cycle leaves nothing applied and no lock held.

A real child process runs a cycle against the test database; the moment the commit has written
everything (but before the transaction commits) it is killed with SIGKILL, as the OOM killer or a lost
machine would. PostgreSQL rolls the transaction back and drops the advisory lock with the connection.
"""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.cycle.runner import run_once
from broker.workloads.models import Allocation, SchedulingCycle
from broker.workloads.states import State
from tests.cycle.helpers import pending
from tests.e2e.conftest import stack_env

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

ROOT = Path(__file__).resolve().parents[2]

# Runs the real cycle, but parks inside the commit once every row is written, and says so.
CHILD = """
import sys, time, django
django.setup()
from broker.cycle import commit
from broker.cycle.runner import run_once

real_apply = commit.apply

def apply_then_park(*args, **kwargs):
    delta = real_apply(*args, **kwargs)
    open(sys.argv[1], "w").write(str(len(delta.admitted)))
    time.sleep(600)
    return delta

commit.apply = apply_then_park
run_once()
"""


def test_it_leaves_nothing_applied_when_the_cycle_process_is_killed(cluster, tmp_path):
    workload = pending(cluster.queue_a, "gang", replicas=2, devices_per_pod=4, resource_class=cluster.training)
    marker = tmp_path / "written"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(marker)], cwd=ROOT, env=stack_env(), stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.1)
        assert marker.exists(), child.stderr.read().decode()[-2000:] if child.poll() is not None else "timed out"
        assert marker.read_text() == "1", "the child had admitted the gang inside its transaction"
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()

    workload.refresh_from_db()
    assert workload.state == State.PENDING
    assert not Allocation.objects.exists()
    assert not SchedulingCycle.objects.exists(), "the cycle row was part of the rolled-back transaction"

    # PostgreSQL dropped the advisory lock with the dead connection: the next cycle runs at once.
    deadline = time.monotonic() + 10
    run = run_once()
    while run is None and time.monotonic() < deadline:
        time.sleep(0.2)
        run = run_once()
    assert run is not None and run.admitted == (workload.pk,)
    assert Allocation.objects.filter(workload=workload, released_at__isnull=True).count() == 8
