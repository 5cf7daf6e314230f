"""The loader after an inventory write: rows written since its last read are patched into the kept
inventory (PostgreSQL's row revisions), anything structural is read whole, and either way the result is
what a worker that just started would read."""

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from broker.cycle.loader import INVENTORY_CACHE, forget_everything_loaded, load_snapshot
from broker.inventory.models import Device, Domain, Health, Node, TopologyLevel
from broker.workloads.models import Workload
from tests.cycle.helpers import pending, running

requires_postgresql = pytest.mark.skipif(
    settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql",
    reason="row revisions are PostgreSQL's; SQLite reads the whole inventory after any write",
)

MAINTENANCE = [{"key": "maintenance", "value": "fan", "effect": "NoSchedule"}]


def device(node, name):
    return Device.objects.filter(node__name=node, name=name)


# Writes that leave the inventory's structure (names, pks, nodes, domains) as it was.
IN_PLACE = {
    "health": lambda: device("n2", "1").update(health=Health.UNHEALTHY),
    "taints": lambda: device("n3", "0").update(taints=MAINTENANCE),
    "cordon": lambda: Node.objects.filter(name="n3").update(cordoned=True),
    "attributes": lambda: device("n1", "2").update(attributes={"model": "H100", "memory": 96}),
    "capacity": lambda: device("n1", "3").update(capacity={"memory": "80Gi"}),
    "labels": lambda: Node.objects.filter(name="n2").update(labels={"pool": "spare"}),
    "several": lambda: (
        device("n4", "0").update(health=Health.UNKNOWN, taints=MAINTENANCE),
        Node.objects.filter(name="n1").update(cordoned=True),
    ),
}

STRUCTURAL = {
    "device added": lambda: Device.objects.create(node=Node.objects.get(name="n1"), name="9"),
    "device deleted": lambda: device("n2", "3").delete(),
    "device renamed": lambda: device("n2", "3").update(name="7"),
    "device moved": lambda: device("n2", "3").update(node=Node.objects.get(name="n1"), name="8"),
    "node added": lambda: Node.objects.create(name="n5", domain=Domain.objects.get(name="r1")),
    "node renamed": lambda: Node.objects.filter(name="n4").update(name="n9"),
    "node moved": lambda: Node.objects.filter(name="n3").update(domain=Domain.objects.get(name="r1")),
    "domain renamed": lambda: Domain.objects.filter(name="r2").update(name="r7"),
    "level renamed": lambda: TopologyLevel.objects.filter(name="rack").update(name="row"),
    # Not structural, but most of the devices: read whole rather than patched.
    "bulk health": lambda: Device.objects.filter(node__name__in=["n1", "n2"]).update(health=Health.UNKNOWN),
}


def read_afresh():
    forget_everything_loaded()
    return load_snapshot(timezone.now())


def assert_same_inventory(snapshot, loaded, fresh, fresh_loaded):
    assert snapshot.levels == fresh.levels
    assert snapshot.nodes == fresh.nodes
    assert snapshot.devices == fresh.devices
    assert [device.id for device in snapshot.devices] == [device.id for device in fresh.devices], "same order"
    assert loaded.device_pks == fresh_loaded.device_pks
    assert loaded.devices_by_pk == fresh_loaded.devices_by_pk
    assert loaded.device_taints == fresh_loaded.device_taints


@pytest.mark.parametrize("change", [*IN_PLACE, *STRUCTURAL])
def test_it_loads_after_an_inventory_write_what_a_fresh_read_finds(cluster, change):
    first, _ = load_snapshot(timezone.now())
    (IN_PLACE | STRUCTURAL)[change]()

    snapshot, loaded = load_snapshot(timezone.now())

    assert (snapshot.levels, snapshot.nodes, snapshot.devices) != (first.levels, first.nodes, first.devices)
    assert_same_inventory(snapshot, loaded, *read_afresh())


def test_it_follows_a_device_through_several_writes_in_a_row(cluster):
    load_snapshot(timezone.now())
    for write in (
        lambda: device("n2", "1").update(health=Health.UNHEALTHY),
        lambda: device("n2", "1").update(taints=MAINTENANCE),
        lambda: device("n2", "1").update(health=Health.HEALTHY, taints=[]),
        lambda: Node.objects.filter(name="n2").update(cordoned=True),
    ):
        write()
        snapshot, loaded = load_snapshot(timezone.now())
    held = {d.id: d for d in snapshot.devices}["n2/1"]

    assert held.healthy and held.taints == ()
    assert loaded.device_taints[device("n2", "1").get().pk] == []
    assert_same_inventory(snapshot, loaded, *read_afresh())


@requires_postgresql
@pytest.mark.parametrize("change", IN_PLACE)
def test_it_patches_in_place_changes_keeping_every_other_record(cluster, change):
    devices = list(Device.objects.order_by("node__name", "name"))
    held = running(cluster.queue_a, "held", devices[12:16], cluster.h100, admitted_at=timezone.now())
    waiting = pending(cluster.queue_b, "waiting", replicas=1, devices_per_pod=2, resource_class=cluster.training)
    Workload.objects.filter(pk=waiting.pk).update(nominated_devices=[devices[0].pk, devices[1].pk])
    first, first_loaded = load_snapshot(timezone.now())
    INVENTORY_CACHE.take_rebuilt()
    IN_PLACE[change]()

    second, loaded = load_snapshot(timezone.now())

    assert INVENTORY_CACHE.take_rebuilt() == len(second.devices), "new tuples: the runner freezes what is kept"
    fresh = {d.id: d for d in read_afresh()[0].devices}
    for before, after in zip(first.devices, second.devices, strict=True):
        assert (after is before) == (fresh[after.id] == before), f"{after.id}: kept exactly when unchanged"
    fresh_nodes = {n.name: n for n in read_afresh()[0].nodes}
    for before, after in zip(first.nodes, second.nodes, strict=True):
        assert (after is before) == (fresh_nodes[after.name] == before), f"{after.name}: kept exactly when unchanged"
    assert loaded.devices_by_pk is first_loaded.devices_by_pk, "patched, not read whole"
    assert loaded.device_pks is first_loaded.device_pks
    (kept_running,) = second.running
    assert kept_running is first.running[0] and kept_running.id == str(held.pk)
    (kept_pending,) = second.pending
    assert kept_pending is first.pending[0] and kept_pending.nominated_devices == ("n1/0", "n1/1")


@requires_postgresql
@pytest.mark.parametrize("change", STRUCTURAL)
def test_it_reads_the_inventory_whole_after_a_structural_change(cluster, change):
    _, first_loaded = load_snapshot(timezone.now())
    STRUCTURAL[change]()

    _, loaded = load_snapshot(timezone.now())

    assert loaded.devices_by_pk is not first_loaded.devices_by_pk, "a patch would have kept the very dict"


@requires_postgresql
def test_it_hands_out_the_same_tuples_after_a_write_that_changed_nothing(cluster):
    first, first_loaded = load_snapshot(timezone.now())
    INVENTORY_CACHE.take_rebuilt()
    device("n2", "1").get().save()
    Node.objects.get(name="n3").save()

    second, loaded = load_snapshot(timezone.now())

    assert loaded.inventory_token != first_loaded.inventory_token
    assert second.devices is first.devices
    assert second.nodes is first.nodes
    assert INVENTORY_CACHE.take_rebuilt() is None, "nothing new for the runner to freeze"


def test_it_names_a_renamed_device_in_the_running_work_holding_it(cluster):
    devices = list(Device.objects.filter(node__name="n2").order_by("name"))
    running(cluster.queue_a, "held", devices, cluster.h100, admitted_at=timezone.now())
    load_snapshot(timezone.now())
    device("n2", "3").update(name="7")

    snapshot, _ = load_snapshot(timezone.now())

    (held,) = snapshot.running
    assert held.pods[0].device_ids == ("n2/0", "n2/1", "n2/2", "n2/7")


def test_it_keeps_running_records_through_a_full_read_that_renamed_nothing(cluster):
    devices = list(Device.objects.filter(node__name="n2").order_by("name"))
    running(cluster.queue_a, "held", devices, cluster.h100, admitted_at=timezone.now())
    first, _ = load_snapshot(timezone.now())
    Domain.objects.filter(name="r2").update(name="r7")

    second, _ = load_snapshot(timezone.now())

    assert second.nodes != first.nodes
    assert second.running[0] is first.running[0]


@requires_postgresql
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_it_draws_revisions_in_commit_order_so_a_slow_writer_is_not_missed(cluster):
    """The interleaving that would lose a write: writer A draws a revision, writer B draws a later one
    and commits, the loader reads B's and remembers it, then A commits a row below what the loader has
    seen. Impossible: A holds the revision row from its first inventory statement, so B cannot draw a
    revision (its statement waits; here it times out) until A has committed."""
    import psycopg

    first, _ = load_snapshot(timezone.now())
    early, late = device("n1", "0").get().pk, device("n4", "3").get().pk
    update = "UPDATE inventory_device SET health = 'Unhealthy' WHERE id = %s"
    params = connection.get_connection_params()
    with psycopg.connect(**params) as writer_a, psycopg.connect(**params) as writer_b:
        writer_a.execute(update, [early])  # drew its revision, not committed
        drawn = last_revision_drawn()
        writer_b.execute("SET lock_timeout = '200ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            writer_b.execute(update, [late])
        writer_b.rollback()
        assert last_revision_drawn() == drawn, "B drew no revision while A held the revision row"
        while_a_writes, _ = load_snapshot(timezone.now())
        writer_a.commit()
        writer_b.execute(update, [late])
        writer_b.commit()

    snapshot, loaded = load_snapshot(timezone.now())

    assert while_a_writes.devices is first.devices
    assert {d.id for d in snapshot.devices if not d.healthy} == {"n1/0", "n4/3"}
    assert_same_inventory(snapshot, loaded, *read_afresh())


def last_revision_drawn():
    with connection.cursor() as cursor:
        cursor.execute("SELECT last_value FROM inventory_row_revision")
        return cursor.fetchone()[0]


@requires_postgresql
def test_it_reads_the_inventory_whole_when_the_revisions_went_back_in_time(cluster):
    """A database restored from a backup: its rows carry revisions below what the worker read, and one of
    them differs. Nothing was written since the worker's highest revision, so a patch would change
    nothing: only a full read finds the difference."""
    _, first_loaded = load_snapshot(timezone.now())
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL session_replication_role = replica")  # as pg_restore loads rows: no triggers
        cursor.execute('UPDATE "inventory_device" SET revision = 1')
        cursor.execute('UPDATE "inventory_node" SET revision = 1')
        device("n2", "1").update(health=Health.UNHEALTHY)
        cursor.execute("UPDATE inventory_inventoryrevision SET token = 'restored'")
        cursor.execute("SET LOCAL session_replication_role = origin")

    snapshot, loaded = load_snapshot(timezone.now())

    assert loaded.devices_by_pk is not first_loaded.devices_by_pk, "read whole"
    assert not next(d for d in snapshot.devices if d.id == "n2/1").healthy
    assert_same_inventory(snapshot, loaded, *read_afresh())


def partitioned_and_shared(cluster):
    """Node g: GPU g/0 with DRA counters and two partitions, GPU g/1 cut by parent only, and a shared GPU
    g/2 (allowMultipleAllocations, 80 memory)."""
    node = Node.objects.create(
        name="g", domain=Domain.objects.get(name="r1"), shared_counters={"gpu-0": {"memory": "80Gi"}}
    )
    whole = Device.objects.create(node=node, name="0", consumes_counters={"gpu-0": {"memory": "80Gi"}})
    for index in range(2):
        Device.objects.create(
            node=node, name=f"0-p{index}", parent=whole, consumes_counters={"gpu-0": {"memory": "40Gi"}}
        )
    legacy = Device.objects.create(node=node, name="1")
    for index in range(2):
        Device.objects.create(node=node, name=f"1-p{index}", parent=legacy)
    Device.objects.create(node=node, name="2", capacity={"memory": 80}, allow_multiple_allocations=True)


COUNTED_IN_PLACE = {
    "partition health": lambda: device("g", "0-p1").update(health=Health.UNHEALTHY),
    "whole taints": lambda: device("g", "0").update(taints=MAINTENANCE),
    "legacy partition health": lambda: device("g", "1-p0").update(health=Health.UNHEALTHY),
    "shared health": lambda: device("g", "2").update(health=Health.UNHEALTHY),
    "counted node cordon": lambda: Node.objects.filter(name="g").update(cordoned=True),
}

COUNTED_WHOLE = {
    "node counters": lambda: Node.objects.filter(name="g").update(shared_counters={"gpu-0": {"memory": "96Gi"}}),
    "device consumption": lambda: device("g", "0-p0").update(consumes_counters={"gpu-0": {"memory": "20Gi"}}),
    "shared capacity": lambda: device("g", "2").update(capacity={"memory": 40}),
    "no longer shared": lambda: device("g", "2").update(allow_multiple_allocations=False),
    "counted device held outside": lambda: device("g", "0-p0").update(
        taints=[{"key": "broker.capacity.io/allocated-outside", "value": "ns/claim", "effect": "NoSchedule"}]
    ),
}


def assert_same_counters(snapshot, loaded, fresh, fresh_loaded):
    assert_same_inventory(snapshot, loaded, fresh, fresh_loaded)
    assert snapshot.counter_sets == fresh.counter_sets
    assert loaded.counters.values == fresh_loaded.counters.values
    assert loaded.counters.consumed == fresh_loaded.counters.consumed
    assert loaded.shared_capacity == fresh_loaded.shared_capacity


@requires_postgresql
@pytest.mark.parametrize("change", COUNTED_IN_PLACE)
def test_it_patches_a_health_or_taint_write_on_partitioned_and_shared_devices(cluster, change):
    partitioned_and_shared(cluster)
    first, first_loaded = load_snapshot(timezone.now())
    COUNTED_IN_PLACE[change]()

    snapshot, loaded = load_snapshot(timezone.now())

    assert loaded.devices_by_pk is first_loaded.devices_by_pk, "patched, not read whole"
    assert (snapshot.nodes, snapshot.devices) != (first.nodes, first.devices)
    by_id = {d.id: d for d in snapshot.devices}
    assert by_id["g/0-p0"].consumes_counters and by_id["g/1-p1"].consumes_counters
    assert by_id["g/2"].allow_multiple_allocations
    assert_same_counters(snapshot, loaded, *read_afresh())


@requires_postgresql
@pytest.mark.parametrize("change", COUNTED_WHOLE)
def test_it_reads_whole_a_write_that_changes_counters_or_shares(cluster, change):
    partitioned_and_shared(cluster)
    _, first_loaded = load_snapshot(timezone.now())
    COUNTED_WHOLE[change]()

    snapshot, loaded = load_snapshot(timezone.now())

    assert loaded.devices_by_pk is not first_loaded.devices_by_pk, "a patch would have kept the very dict"
    assert_same_counters(snapshot, loaded, *read_afresh())
