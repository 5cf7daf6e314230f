from django.utils import timezone

from broker.cycle.loader import approved_flag, load_snapshot
from broker.inventory.models import Device, Health
from broker.inventory.quantities import numbers
from broker.workloads.models import ApprovalState, Workload
from broker.workloads.states import State
from tests.cycle.helpers import pending, running


def test_it_maps_the_inventory(cluster):
    Device.objects.filter(node__name="n2", name="1").update(health=Health.UNHEALTHY)
    Device.objects.filter(node__name="n3", name="0").update(
        taints=[{"key": "maintenance", "value": "fan", "effect": "NoSchedule"}], capacity={"memory": "80Gi"}
    )
    cluster.nodes[3].cordoned = True
    cluster.nodes[3].save()

    snapshot, loaded = load_snapshot(timezone.now())

    assert snapshot.levels == ("zone", "block", "rack")
    nodes = {node.name: node for node in snapshot.nodes}
    assert nodes["n1"].domains == {"zone": "z1", "block": "b1", "rack": "r1"}
    assert nodes["n3"].domains["rack"] == "r2"
    assert nodes["n4"].schedulable is False
    devices = {device.id: device for device in snapshot.devices}
    assert len(devices) == 16
    assert devices["n1/0"].attributes == {"model": "H100", "memory": 80}
    assert devices["n1/0"].node == "n1" and devices["n1/0"].driver == "gpu.example.com"
    assert devices["n2/1"].healthy is False
    assert devices["n3/0"].taints[0].key == "maintenance"
    assert devices["n3/0"].capacity == {"memory": 80 * 2**30}
    assert loaded.device_pks["n1/0"] == Device.objects.get(node__name="n1", name="0").pk
    assert [dc.name for dc in snapshot.device_classes] == ["h100"]
    assert 'model == "H100"' in snapshot.device_classes[0].selector


def test_it_maps_queues_and_the_menu(cluster):
    snapshot, _ = load_snapshot(timezone.now())

    queues = {queue.name: queue for queue in snapshot.queues}
    assert queues["team-a"].team == "team-a"
    assert queues["team-a"].cohort == "main"
    assert queues["team-a"].quota == {"h100": 8}
    classes = {rc.name: rc for rc in snapshot.resource_classes}
    assert classes["distributed-training"].topology_required == "rack"
    assert classes["distributed-training"].device_classes == ("h100",)
    assert classes["distributed-training"].teams is None
    assert classes["distributed-training"].default_priority == 100
    assert classes["large-reserved-training"].teams == ("team-a",)
    assert classes["large-reserved-training"].approval_required is True
    assert classes["small-inference"].max_devices == 2


def test_it_maps_pending_and_running_work(cluster):
    gang = pending(cluster.queue_a, "gang", replicas=2, devices_per_pod=4, resource_class=cluster.training, priority=7)
    gang.pod_sets.update(min_count=2, tolerations=[{"key": "maintenance"}])
    waiting = pending(
        cluster.queue_a,
        "big",
        replicas=1,
        devices_per_pod=4,
        resource_class=cluster.reserved,
        state=State.AWAITING_APPROVAL,
        approval=ApprovalState.REQUESTED,
        preemption_policy="Never",
    )
    pending(cluster.queue_a, "done", state=State.SUCCEEDED)
    devices = list(Device.objects.filter(node__name__in=["n3", "n4"]).order_by("node__name", "name"))
    busy = running(cluster.queue_b, "busy", devices, cluster.h100, priority=3, expected_duration_seconds=600)

    snapshot, loaded = load_snapshot(timezone.now())

    by_id = {workload.id: workload for workload in snapshot.pending}
    assert set(by_id) == {str(gang.pk), str(waiting.pk)}
    mapped = by_id[str(gang.pk)]
    assert mapped.queue == "team-a" and mapped.team == "team-a"
    assert mapped.resource_class == "distributed-training"
    assert mapped.priority == 7
    assert mapped.approved is True
    assert mapped.pod_sets[0].count == 2 and mapped.pod_sets[0].gang_size == 2
    assert mapped.pod_sets[0].devices_per_pod == 4
    assert mapped.pod_sets[0].tolerations[0].key == "maintenance"
    assert by_id[str(waiting.pk)].approved is None
    assert (mapped.preemption_policy, by_id[str(waiting.pk)].preemption_policy) == ("PreemptLowerPriority", "Never")
    assert loaded.pending_states == {gang.pk: State.PENDING, waiting.pk: State.AWAITING_APPROVAL}

    (held,) = snapshot.running
    assert held.id == str(busy.pk)
    assert held.device_class == "h100"
    assert held.device_count == 8
    assert [(pod.node, len(pod.device_ids)) for pod in held.pods] == [("n3", 4), ("n4", 4)]
    assert held.expected_end is not None
    assert loaded.running_ids == {busy.pk}


def test_it_only_calls_a_workload_approved_when_it_may_run():
    class Rule:
        def __init__(self, needs):
            self.needs = needs

        def needs_approval(self, devices):
            return self.needs

    assert approved_flag(State.PENDING, ApprovalState.NOT_REQUIRED, Rule(False), 4) is True
    assert approved_flag(State.PENDING, ApprovalState.APPROVED, Rule(True), 64) is True
    assert approved_flag(State.PENDING, ApprovalState.NOT_REQUIRED, Rule(True), 64) is None
    assert approved_flag(State.AWAITING_APPROVAL, ApprovalState.REQUESTED, Rule(True), 64) is None
    assert approved_flag(State.AWAITING_APPROVAL, ApprovalState.APPROVED, Rule(True), 64) is None
    assert approved_flag(State.AWAITING_APPROVAL, ApprovalState.REJECTED, Rule(True), 64) is False


def test_it_reads_kubernetes_quantities():
    assert numbers({"memory": "24Gi", "cores": 4, "bw": "1.5k", "odd": "lots"}) == {
        "memory": 24 * 2**30,
        "cores": 4,
        "bw": 1500,
    }
    assert numbers(None) == {}


def test_it_loads_in_a_number_of_queries_that_does_not_grow_with_the_work(cluster):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def queries_with(count):
        for index in range(count):
            name = f"job-{count}-{index}"
            pending(cluster.queue_a, name, replicas=2, devices_per_pod=2, resource_class=cluster.training)
        with CaptureQueriesContext(connection) as context:
            load_snapshot(timezone.now())
        return len(context)

    queries_with(0)  # the first load creates the cluster's state row
    few = queries_with(2)
    assert queries_with(40) == few
    assert few <= 20


def test_it_reuses_the_inventory_while_no_inventory_row_changes(cluster):
    first, _ = load_snapshot(timezone.now())
    pending(cluster.queue_a, "new-work", replicas=1, devices_per_pod=1, resource_class=cluster.training)
    second, _ = load_snapshot(timezone.now())

    assert second.devices is first.devices, "work changed, the inventory did not: the same tuples"
    assert second.nodes is first.nodes
    assert len(second.pending) == len(first.pending) + 1


def test_it_reads_the_inventory_again_after_a_plain_update(cluster):
    first, _ = load_snapshot(timezone.now())
    device = Device.objects.order_by("pk").first()
    # A queryset update sends no signal and bumps no generation: the triggers still move the token.
    Device.objects.filter(pk=device.pk).update(health=Health.UNHEALTHY)
    second, loaded = load_snapshot(timezone.now())

    assert second.devices is not first.devices
    unhealthy = [d.id for d in second.devices if not d.healthy]
    assert unhealthy == [f"{device.node.name}/{device.name}"]
    assert loaded.device_pks[unhealthy[0]] == device.pk


def test_it_moves_the_revision_token_on_every_inventory_table(cluster):
    from broker.inventory.models import Domain, InventoryRevision, Node, TopologyLevel

    tokens = [InventoryRevision.current()]
    Node.objects.filter(pk=Node.objects.first().pk).update(cordoned=True)
    tokens.append(InventoryRevision.current())
    Domain.objects.filter(pk=Domain.objects.first().pk).update(name="renamed")
    tokens.append(InventoryRevision.current())
    TopologyLevel.objects.filter(pk=TopologyLevel.objects.first().pk).update(name="region")
    tokens.append(InventoryRevision.current())
    Device.objects.filter(pk=Device.objects.last().pk).delete()
    tokens.append(InventoryRevision.current())

    assert None not in tokens
    assert len(set(tokens)) == len(tokens)


def test_it_reuses_running_records_whose_rows_did_not_change(cluster):
    devices = list(Device.objects.order_by("pk"))
    steady = running(cluster.queue_a, "steady", devices[:4], cluster.h100, admitted_at=timezone.now())
    moved = running(cluster.queue_b, "moved", devices[4:8], cluster.h100, admitted_at=timezone.now())
    first, _ = load_snapshot(timezone.now())
    Workload.objects.filter(pk=moved.pk).update(priority=77)

    second, _ = load_snapshot(timezone.now())

    before = {workload.id: workload for workload in first.running}
    after = {workload.id: workload for workload in second.running}
    assert after[str(steady.pk)] is before[str(steady.pk)]
    assert after[str(moved.pk)] is not before[str(moved.pk)]
    assert after[str(moved.pk)].priority == 77


def test_it_keeps_the_rows_a_reused_record_was_built_from_not_the_equal_new_ones(cluster):
    """Equal new rows kept in their place would be new long-lived objects every cycle for the cyclic
    collector to walk; the kept ones are freed only when their record is rebuilt."""
    from broker.cycle import loader

    devices = list(Device.objects.order_by("pk"))
    held = running(cluster.queue_a, "held", devices[:4], cluster.h100, admitted_at=timezone.now())
    waiting = pending(cluster.queue_b, "waiting", replicas=2, devices_per_pod=2, resource_class=cluster.training)
    load_snapshot(timezone.now())
    kept_running = loader.RUNNING_RECORDS._records[held.pk]
    kept_pending = loader.PENDING_RECORDS._records[waiting.pk]

    load_snapshot(timezone.now())

    assert loader.RUNNING_RECORDS._records[held.pk] is kept_running
    assert loader.PENDING_RECORDS._records[waiting.pk] is kept_pending
    Workload.objects.filter(pk=waiting.pk).update(priority=9)
    load_snapshot(timezone.now())
    assert loader.PENDING_RECORDS._records[waiting.pk] is not kept_pending
    assert loader.PENDING_RECORDS._records[waiting.pk][1].priority == 9


def test_it_drops_a_running_record_once_its_devices_are_released(cluster):
    from broker.workloads.models import Allocation

    devices = list(Device.objects.order_by("pk"))
    done = running(cluster.queue_a, "done", devices[:4], cluster.h100, admitted_at=timezone.now())
    load_snapshot(timezone.now())
    Allocation.objects.filter(workload=done).update(released_at=timezone.now())

    snapshot, loaded = load_snapshot(timezone.now())

    assert snapshot.running == ()
    assert done.pk not in loaded.running_ids


def test_it_reuses_pending_records_whose_rows_did_not_change(cluster):
    steady = pending(cluster.queue_a, "steady", replicas=2, devices_per_pod=2, resource_class=cluster.training)
    moved = pending(cluster.queue_a, "moved", replicas=2, devices_per_pod=2, resource_class=cluster.training)
    first, _ = load_snapshot(timezone.now())
    Workload.objects.filter(pk=moved.pk).update(priority=55)
    moved.pod_sets.update(replicas=3)

    second, _ = load_snapshot(timezone.now())

    before = {workload.id: workload for workload in first.pending}
    after = {workload.id: workload for workload in second.pending}
    assert after[str(steady.pk)] is before[str(steady.pk)]
    assert after[str(moved.pk)].priority == 55
    assert after[str(moved.pk)].pod_sets[0].count == 3


def test_it_recomputes_approval_when_only_the_policy_changed(cluster):
    waiting = pending(cluster.queue_a, "big", replicas=2, devices_per_pod=4, resource_class=cluster.training)
    first, _ = load_snapshot(timezone.now())
    cluster.training.approval_threshold_devices = 4
    cluster.training.save()

    second, _ = load_snapshot(timezone.now())

    assert [w.approved for w in first.pending if w.id == str(waiting.pk)] == [True]
    assert [w.approved for w in second.pending if w.id == str(waiting.pk)] == [None]


def test_it_reads_everything_again_after_forgetting_what_it_loaded(cluster):
    from broker.cycle.loader import forget_everything_loaded

    first, _ = load_snapshot(timezone.now())
    forget_everything_loaded()

    second, _ = load_snapshot(timezone.now())

    assert second.devices is not first.devices
    assert second.devices == first.devices


def test_it_counts_devices_a_finished_workload_still_holds(cluster):
    devices = list(Device.objects.order_by("pk"))
    stray = running(cluster.queue_a, "stray", devices[:2], cluster.h100, state=State.SUCCEEDED)

    snapshot, loaded = load_snapshot(timezone.now())

    (held,) = snapshot.running
    assert held.id == str(stray.pk)
    assert held.device_count == 2
    assert held.preemptible is False, "a workload that should not hold devices is never a victim"
    assert stray.pk in loaded.running_ids


def test_it_names_the_device_class_of_running_work_after_a_rename(cluster):
    devices = list(Device.objects.order_by("pk"))
    running(cluster.queue_a, "steady", devices[:4], cluster.h100, admitted_at=timezone.now())
    load_snapshot(timezone.now())
    cluster.h100.name = "h100-sxm"
    cluster.h100.save()

    snapshot, _ = load_snapshot(timezone.now())

    assert [workload.device_class for workload in snapshot.running] == ["h100-sxm"]


def test_it_reads_timestamps_as_the_same_seconds_python_computes(cluster):
    """The database turns timestamps into Unix seconds (parsing 80,000 datetimes in Python cost a second);
    they must be the very floats `datetime.timestamp()` gives, or a record would differ from its source."""
    from datetime import UTC, datetime

    instants = [
        datetime(2026, 11, 30, 14, 25, 17, 123457, tzinfo=UTC),
        datetime(2031, 2, 3, 4, 5, 6, 999999, tzinfo=UTC),
        datetime(1999, 12, 31, 23, 59, 59, 1, tzinfo=UTC),
    ]
    made = [
        pending(cluster.queue_a, f"at-{index}", replicas=1, devices_per_pod=1, resource_class=cluster.training)
        for index in range(len(instants))
    ]
    for workload, instant in zip(made, instants, strict=True):
        Workload.objects.filter(pk=workload.pk).update(submitted_at=instant)

    snapshot, _ = load_snapshot(timezone.now())

    submitted = {workload.id: workload.submitted for workload in snapshot.pending}
    assert [submitted[str(workload.pk)] for workload in made] == [instant.timestamp() for instant in instants]


def test_it_takes_a_read_equal_to_the_last_one_whole(cluster):
    devices = list(Device.objects.order_by("pk"))
    held = running(cluster.queue_a, "held", devices[:4], cluster.h100, admitted_at=timezone.now())
    waiting = pending(cluster.queue_b, "waiting", replicas=2, devices_per_pod=2, resource_class=cluster.training)
    first, first_loaded = load_snapshot(timezone.now())

    second, second_loaded = load_snapshot(timezone.now())

    assert second.running is first.running and second.pending is first.pending
    assert second_loaded.running_ids == first_loaded.running_ids == {held.pk}
    assert second_loaded.pending_states == first_loaded.pending_states == {waiting.pk: State.PENDING}


def test_it_builds_again_what_changed_since_a_read_taken_whole(cluster):
    devices = list(Device.objects.order_by("pk"))
    held = running(cluster.queue_a, "held", devices[:4], cluster.h100, admitted_at=timezone.now())
    waiting = pending(cluster.queue_b, "waiting", replicas=2, devices_per_pod=2, resource_class=cluster.training)
    load_snapshot(timezone.now())
    load_snapshot(timezone.now())  # taken whole
    Workload.objects.filter(pk=held.pk).update(priority=31)
    Workload.objects.filter(pk=waiting.pk).update(priority=32)

    snapshot, _ = load_snapshot(timezone.now())

    assert [w.priority for w in snapshot.running] == [31]
    assert [w.priority for w in snapshot.pending] == [32]


def test_it_never_takes_whole_a_running_workload_without_a_start_time(cluster):
    """Its start is the load's `now` (see running_workload): a new one each time."""
    from datetime import timedelta

    devices = list(Device.objects.order_by("pk"))
    running(cluster.queue_a, "unstamped", devices[:4], cluster.h100, admitted_at=None, started_at=None)
    now = timezone.now()
    first, _ = load_snapshot(now)

    second, _ = load_snapshot(now + timedelta(seconds=30))

    assert second.running[0].started == first.running[0].started + 30


def test_it_notes_which_pending_workloads_carry_a_nomination_read_whole_or_not(cluster):
    devices = list(Device.objects.order_by("pk"))
    nominated = pending(cluster.queue_a, "nominated", nominated_devices=[devices[0].pk])
    pending(cluster.queue_a, "plain")
    pending(cluster.queue_b, "gone-device", nominated_devices=[10**9])  # a device since removed
    waiting = pending(
        cluster.queue_a, "waiting", state=State.AWAITING_APPROVAL, approval=ApprovalState.REQUESTED,
        nominated_devices=[devices[1].pk],
    )  # fmt: skip

    _, first = load_snapshot(timezone.now())
    _, second = load_snapshot(timezone.now())  # taken whole

    gone = Workload.objects.get(name="gone-device").pk
    assert first.nominated_pending == second.nominated_pending == {nominated.pk, gone}
    assert waiting.pk in first.pending_states


def test_it_gives_gangs_of_one_shape_one_pod_set_record(cluster):
    first = pending(cluster.queue_a, "first", replicas=2, devices_per_pod=4, resource_class=cluster.training)
    second = pending(cluster.queue_b, "second", replicas=2, devices_per_pod=4, resource_class=cluster.training)
    other = pending(cluster.queue_b, "other", replicas=3, devices_per_pod=4, resource_class=cluster.training)

    snapshot, _ = load_snapshot(timezone.now())

    pod_sets = {workload.id: workload.pod_sets[0] for workload in snapshot.pending}
    assert pod_sets[str(first.pk)] is pod_sets[str(second.pk)]
    assert pod_sets[str(other.pk)].count == 3 and pod_sets[str(first.pk)].count == 2
