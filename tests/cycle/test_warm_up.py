"""A process that runs cycles reads and indexes the cluster before its first one (runner.warm_up)."""

from django.utils import timezone

from broker.audit.models import AuditEvent
from broker.cycle import loader
from broker.cycle import runner as runner_module
from broker.cycle.embedded import Runner
from broker.cycle.loader import load_snapshot
from broker.cycle.runner import run_once, warm_up
from broker.inventory.models import Device
from broker.scheduler.capacity import InventoryIndex
from broker.workloads.models import Allocation, Explanation, ExplanationChange, SchedulingCycle, Workload
from tests.cycle.helpers import pending, running


def written_rows():
    return {
        model.__name__: model.objects.count()
        for model in (SchedulingCycle, Explanation, ExplanationChange, Allocation, AuditEvent)
    }


def test_it_warms_a_new_process_up_without_writing_anything(cluster):
    devices = list(Device.objects.order_by("pk"))
    held = running(cluster.queue_a, "held", devices[:4], cluster.h100, admitted_at=timezone.now())
    waiting = pending(cluster.queue_b, "waiting", replicas=2, devices_per_pod=4, resource_class=cluster.training)
    loader.forget_everything_loaded()
    before = written_rows()

    elapsed = warm_up()

    assert elapsed is not None and elapsed > 0
    assert written_rows() == before
    assert Workload.objects.get(pk=waiting.pk).state == "Pending"
    kept_running = loader.RUNNING_RECORDS.previous(loader.RUNNING_RECORDS._scope)[held.pk][1]
    kept_pending = loader.PENDING_RECORDS.previous(loader.PENDING_RECORDS._scope)[waiting.pk][1]
    snapshot, _ = load_snapshot(timezone.now())
    assert snapshot.running[0] is kept_running
    assert snapshot.pending[0] is kept_pending
    # The cluster as built, which explanations of requests that can never run ask for, is made already.
    index = InventoryIndex._last
    assert index.serves(snapshot, index.class_names) and index._as_built is not None


def test_it_leaves_the_first_cycle_to_read_everything_when_the_warm_up_fails(cluster, monkeypatch, caplog):
    pending(cluster.queue_a, "fits", replicas=1, devices_per_pod=4, resource_class=cluster.training)
    loader.forget_everything_loaded()

    def unreachable(now):
        raise RuntimeError("the database is not there yet")

    monkeypatch.setattr(runner_module, "load_snapshot", unreachable)
    assert warm_up() is None
    assert "warm-up before the first cycle failed" in caplog.text
    monkeypatch.undo()

    assert run_once().outcome == SchedulingCycle.Outcome.COMMITTED


def test_it_warms_a_celery_worker_process_up_before_its_first_task_unless_told_not_to(settings, monkeypatch):
    from broker import celery as celery_module

    calls = []
    monkeypatch.setattr(runner_module, "warm_up", lambda: calls.append("warm") or 12.5)

    settings.CYCLE_WARM_UP = False
    assert celery_module.warm_up_for_cycles() is None
    settings.CYCLE_WARM_UP = True
    assert celery_module.warm_up_for_cycles() == 12.5
    assert calls == ["warm"]


def test_it_connects_the_warm_up_to_every_celery_worker_process_start():
    from celery.signals import worker_process_init

    from broker import celery as celery_module

    receivers = [receiver() for _, receiver in worker_process_init.receivers]
    assert celery_module.warm_up_for_cycles in receivers


def test_it_warms_the_embedded_loop_up_before_its_first_step(db, settings, monkeypatch):
    from broker.cycle import embedded

    steps = []
    monkeypatch.setattr(embedded, "warm_up", lambda: steps.append("warm up"))
    monkeypatch.setattr(Runner, "step", lambda self, executor: steps.append("step") or self.stop())
    monkeypatch.setattr(embedded, "wait_for_request", lambda interval: None)

    settings.CYCLE_WARM_UP = True
    Runner(interval=0.01).run()
    settings.CYCLE_WARM_UP = False
    Runner(interval=0.01).run()

    assert steps == ["warm up", "step", "step"]
