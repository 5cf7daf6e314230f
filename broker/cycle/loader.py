"""ORM -> Snapshot: one consistent read of everything the decision core needs.

Call it inside the cycle's transaction (broker.cycle.locks.cycle_transaction): on PostgreSQL that
transaction is REPEATABLE READ, so every query below sees the same instant; on SQLite one transaction
already is a snapshot. A dozen queries in all, each a flat values_list (no model instances, no N+1),
because this has to read 100k devices and 20k pending workloads in about a second.
"""

import json
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from datetime import datetime
from itertools import groupby
from operator import itemgetter
from typing import NamedTuple

from django.conf import settings
from django.db import connection
from django.db.models import F, FloatField, TextField
from django.db.models.expressions import RawSQL
from django.db.models.functions import Cast

from broker.cycle.bulk import Background, column_in, pk_in
from broker.cycle.executor import get_executor
from broker.flat_rows import fetch_rows, fetch_sql
from broker.governance.models import ApprovalRequest
from broker.inventory import quantities
from broker.inventory.models import ClusterState, Device, Domain, Health, InventoryRevision, Node, TopologyLevel
from broker.policy.models import Cohort, DeviceClass, Queue, Reservation, ResourceClass, ResourceClassDeviceClass
from broker.scheduler import heap
from broker.scheduler import snapshot as s
from broker.scheduler.claims import claim_from_dra
from broker.workloads import changes
from broker.workloads.models import Allocation, ApprovalState, PodSet, Workload
from broker.workloads.states import HOLDING_STATES, State

WAITING = (State.PENDING, State.AWAITING_APPROVAL)


@dataclass
class LoadedState:
    """What commit needs to know about the snapshot it is committing against."""

    generation: int
    now: object  # the aware datetime of the cycle
    inventory_token: str | None = None  # InventoryRevision.token the inventory was read at
    device_pks: dict = field(default_factory=dict)  # snapshot device id -> Device pk
    devices_by_pk: dict = field(default_factory=dict)  # Device pk -> (snapshot device id, node name)
    device_taints: dict = field(default_factory=dict)  # Device pk -> taints as loaded
    device_class_pks: dict = field(default_factory=dict)  # name -> DeviceClass pk
    pending_states: dict = field(default_factory=dict)  # Workload pk -> state as loaded
    nominated_pending: set = field(default_factory=set)  # pks of Pending workloads loaded with a nomination
    running_ids: set = field(default_factory=set)  # Workload pks holding devices
    horizon: object = None  # changes.Horizon of this snapshot (None on SQLite)
    # How many workloads' rows were read to patch the records kept from the last load, per set (absent:
    # that set was read whole).
    patched: dict = field(default_factory=dict)
    closed_windows: frozenset = frozenset()  # pks of workloads whose approval window is shut (with a log)
    counters: object = None  # loader.Counters of the inventory read (None: none read)
    # Device pk -> numeric capacity of the devices that allow several allocations (the commit's check).
    shared_capacity: dict = field(default_factory=dict)
    load_ms: float = 0.0

    @property
    def pending_count(self):
        return len(self.pending_states)


class JsonCache:
    """One load's parse of each distinct JSON text (thousands of devices share a handful of descriptions)
    and of each distinct pod set row (`pod_set`)."""

    def __init__(self):
        self._parsed = {}
        self._pod_sets = {}

    def pod_set(self, row):
        """`pod_set_from_row(row)`, one record per distinct row: 20,000 queued gangs come in a few dozen
        shapes, and a PodSet is frozen, so gangs of one shape can share it."""
        record = self._pod_sets.get(row)
        if record is None:
            record = self._pod_sets[row] = pod_set_from_row(row, self)
        return record

    def __call__(self, text, default):
        if text is None:
            return default
        value = self._parsed.get(text)
        if value is None:
            value = json.loads(text)
            self._parsed[text] = value
        return value


def as_text(field_name):
    return Cast(F(field_name), output_field=TextField())


def epoch(field_name):
    """A Workload timestamp column as Unix seconds, computed by PostgreSQL (parsing 80k timestamps in
    Python costs a second); elsewhere the column itself, and `seconds` converts it."""
    if connection.vendor != "postgresql":
        return field_name
    column = Workload._meta.get_field(field_name).column
    # date_part, not EXTRACT: EXTRACT gives a numeric (PostgreSQL 14+) that has to be cast back to float8,
    # 15% of reading 50,000 running workloads; both are the double nearest the exact value.
    return RawSQL(f'date_part(\'epoch\', "{Workload._meta.db_table}"."{column}")', (), output_field=FloatField())


def seconds(value):
    """Unix seconds from what `epoch` selected (a float, a datetime or None)."""
    return value.timestamp() if isinstance(value, datetime) else value


def load_snapshot(now, config=None):
    """(Snapshot, LoadedState) for the instant `now` (an aware datetime)."""
    with heap.collector_paused():  # the snapshot's objects all live on (broker.scheduler.heap)
        return _load_snapshot(now, config)


def _load_snapshot(now, config):
    started = time.perf_counter()
    generation = ClusterState.current_generation(settings.CLUSTER_NAME)
    loaded = LoadedState(generation=generation, now=now)
    # Before any row it is the horizon of: what commits after it is read again next time.
    horizon = loaded.horizon = changes.current_horizon()
    inventory = load_inventory()
    loaded.inventory_token = inventory.token
    loaded.device_pks, loaded.devices_by_pk, loaded.device_taints = (
        inventory.device_pks,
        inventory.devices_by_pk,
        inventory.device_taints,
    )
    loaded.counters = inventory.counters
    loaded.shared_capacity = inventory.shared_capacity
    device_classes = load_device_classes(loaded)
    resource_classes, approval_rules = load_resource_classes()
    pending_written, running_written = workloads_to_read(loaded, horizon, approval_rules)
    pending_rows = fetch_pending_rows(loaded, pending_written)
    # The running work's rows (150,000 at 100k devices) come in while the pending records are built.
    running_rows = fetch_running_rows(running_written)
    try:
        pending = load_pending(loaded, approval_rules, pending_rows, pending_written)
    except BaseException:
        running_rows.wait()
        raise
    running = load_running(loaded, running_rows, running_written)
    snapshot = s.Snapshot(
        levels=inventory.levels,
        nodes=inventory.nodes,
        devices=inventory.devices,
        counter_sets=inventory.counters.counter_sets,
        device_classes=device_classes,
        cohorts=load_cohorts(),
        queues=load_queues(),
        resource_classes=resource_classes,
        reservations=load_reservations(now, inventory.domain_paths),
        running=running,
        pending=pending,
        now=now.timestamp(),
        config=config or scheduler_config(),
    )
    loaded.load_ms = (time.perf_counter() - started) * 1000
    return snapshot, loaded


def scheduler_config():
    """The core's settings as this deployment configures them (each cycle's snapshot carries them)."""
    return s.SchedulerConfig(
        backfill_wait_seconds=settings.BACKFILL_WAIT_SECONDS,
        backfill_depth=settings.BACKFILL_DEPTH,
        protected_large_gangs=settings.PROTECTED_LARGE_GANGS,
        large_gang_devices=settings.LARGE_GANG_DEVICES,
        estimate_queue_depth=settings.ESTIMATE_QUEUE_DEPTH,
        preemption_min_runtime_seconds=settings.PREEMPTION_MIN_RUNTIME_SECONDS,
        max_preemptions_per_workload=settings.PREEMPTION_MAX_PER_WORKLOAD,
        shorter_remaining_factor=settings.SHORTER_REMAINING_FACTOR,
        shortest_first_aging_seconds=settings.SHORTEST_FIRST_AGING_SECONDS,
    )


# --- inventory ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RowIndex:
    """Where each node and device row of an Inventory sits, and the revision it was read up to: what
    `patched_inventory` needs to put rows written since then in their places."""

    revision: int  # the highest node or device revision read (see migration inventory 0004)
    node_slots: dict  # Node pk -> (position in nodes, domain pk)
    device_slots: dict  # Device pk -> position in devices
    descriptions: dict  # (attributes, capacity, taints) texts -> `device_description` of them


# Descriptions are kept from one read to the next patch up to this many (then the next patch starts
# afresh): a stream of one-off taint texts must not grow them without end.
MAX_KEPT_DESCRIPTIONS = 1024


@dataclass(frozen=True)
class Counters:
    """The shared counters (DRA sharedCounters) of an inventory and the devices consuming them, for the
    core (`counter_sets`, and each device's `consumes_counters`) and for the commit's check (by pk)."""

    counter_sets: tuple = ()  # s.CounterSet records
    values: dict = field(default_factory=dict)  # (node, counter set, counter) -> value
    consumed: dict = field(default_factory=dict)  # Device pk -> (((node, counter set, counter), amount), ...)
    # What they were made from, for patches (patched_nodes, patched_devices): node name -> its
    # sharedCounters as stored, and Device pk -> (its consumesCounters as stored, its parent's pk).
    node_counters: dict = field(default_factory=dict)
    families: dict = field(default_factory=dict)


NO_COUNTERS = Counters()


@dataclass(frozen=True)
class Inventory:
    """Topology, nodes and devices as read at one InventoryRevision token; shared, never mutated."""

    token: str | None
    levels: tuple
    domain_paths: dict
    nodes: tuple
    devices: tuple
    device_pks: dict  # snapshot device id -> Device pk
    devices_by_pk: dict  # Device pk -> (snapshot device id, node name)
    device_taints: dict  # Device pk -> taints as stored
    rows: RowIndex | None = None  # None: no row revisions here (SQLite), a new token means a full read
    counters: Counters = NO_COUNTERS  # the shared counters and who consumes them (see Counters)
    # Device pk -> numeric capacity of the devices that allow several allocations (DRA
    # allowMultipleAllocations), for the commit's check of what their shares take.
    shared_capacity: dict = field(default_factory=dict)


class InventoryCache:
    """The last inventory read, per database, while its revision token stands.

    Devices change rarely and cycles run every few seconds: re-reading and re-parsing 100k device rows
    each time was most of the load. Every write to the inventory tables moves the token (triggers), and
    the token is read in the cycle's snapshot with everything else, so a hit is exactly the rows the
    snapshot would have read. When the token moved, the last inventory is still the base that the rows
    written since are patched into (`patched_inventory`). The decision core keys its own per-inventory
    index on these same tuples."""

    def __init__(self):
        self._lock = threading.Lock()
        self._key = None
        self._inventory = None
        self._rebuilt = None  # devices in an inventory read since the last take_rebuilt()

    def get(self, key):
        with self._lock:
            return self._inventory if key is not None and key == self._key else None

    def latest(self, database):
        """The last inventory kept, if it was read from `database` (whatever its token)."""
        with self._lock:
            return self._inventory if self._key is not None and self._key[:-1] == database else None

    def put(self, key, inventory, rebuilt=True):
        """Keep `inventory` as read at `key`; `rebuilt` False for one that hands out the last one's very
        tuples (nothing new for take_rebuilt to report)."""
        with self._lock:
            self._key, self._inventory = key, inventory
            if inventory is not None and rebuilt:
                self._rebuilt = len(inventory.devices)

    def take_rebuilt(self):
        """How many devices the inventory read since the last call holds (None: nothing was read)."""
        with self._lock:
            rebuilt, self._rebuilt = self._rebuilt, None
            return rebuilt

    def clear(self):
        self.put(None, None)


INVENTORY_CACHE = InventoryCache()


def load_inventory():
    token = InventoryRevision.current()
    # The token alone would do; the database name keeps test databases and the bench's apart for sure.
    database = (connection.alias, connection.settings_dict["NAME"])
    key = None if token is None else (*database, token)
    inventory = INVENTORY_CACHE.get(key)
    if inventory is not None:
        return inventory
    levels = tuple(TopologyLevel.objects.order_by("order").values_list("name", flat=True))
    domain_paths = load_domain_paths()
    previous = None if key is None else INVENTORY_CACHE.latest(database)
    inventory = None if previous is None else patched_inventory(previous, token, levels, domain_paths)
    if inventory is not None:
        # New tuples, however few new records they hold, make the decision core build (or patch) its
        # index anew: what it then keeps is as worth freezing as after a full read (see the runner).
        new_tuples = inventory.devices is not previous.devices or inventory.nodes is not previous.nodes
        INVENTORY_CACHE.put(key, inventory, rebuilt=new_tuples)
        return inventory
    inventory = read_inventory(token, levels, domain_paths)
    if key is not None:
        INVENTORY_CACHE.put(key, inventory)
    return inventory


def read_inventory(token, levels, domain_paths):
    """The whole inventory, every node and device row read and parsed."""
    nodes, node_names, node_slots, node_revision, node_counters = load_nodes(domain_paths)
    devices = load_devices(node_names)
    counters = NO_COUNTERS
    if node_counters or devices.families:
        counters, counted = counters_of(node_counters, devices)
        devices = devices._replace(devices=counted)
    rows = None
    if connection.vendor == "postgresql":  # only there do triggers keep row revisions
        # Kept for patches only while they are the handful they usually are (their texts cost memory).
        descriptions = devices.descriptions if len(devices.descriptions) < MAX_KEPT_DESCRIPTIONS else {}
        rows = RowIndex(max(node_revision, devices.revision), node_slots, devices.slots, descriptions)
    return Inventory(
        token,
        levels,
        domain_paths,
        nodes,
        devices.devices,
        devices.device_pks,
        devices.devices_by_pk,
        devices.device_taints,
        rows,
        counters,
        devices.shared_capacity,
    )


def patched_inventory(previous, token, levels, domain_paths):
    """`previous` with the node and device rows written since it was read put in their places, or None
    when the inventory's structure changed and it has to be read whole: a topology level or domain
    changed, a node or device was added or deleted, renamed or moved (to another domain, to another
    node), or a write changed what counters a node publishes or a device consumes, whether a device is
    shared or its shared capacity, or whether a counted device is held outside the broker. Health,
    taints, attributes, capacity, driver, labels and cordons are patched, on partitioned and shared
    devices too (their counters and shared capacities are kept as read).

    Unchanged records stay the very same objects, in the same order (the decision core patches its
    index by comparing the old and new tuples element by element with `is`), and the device names and
    pks stay the same dicts (running and pending records are kept per those, see load_running)."""
    index = previous.rows
    if index is None or levels != previous.levels or domain_paths != previous.domain_paths:
        return None
    nodes_written = rows_written_since(Node, index.revision)
    devices_written = rows_written_since(Device, index.revision)
    # Deleted rows leave no revision behind: the counts tell (an inserted row is written, and unknown).
    if nodes_written.count != len(index.node_slots) or devices_written.count != len(index.device_slots):
        return None
    revision = max(nodes_written.revision, devices_written.revision)
    if revision < index.revision:
        return None  # the tables went back in time (a restore): the revisions read before mean nothing
    if len(devices_written.pks) > LARGEST_PATCH * len(index.device_slots):
        return None  # a bulk write: reading everything costs about as much and builds tidier
    nodes = patched_nodes(previous, nodes_written.pks)
    patched = None if nodes is None else patched_devices(previous, devices_written.pks)
    if patched is None:
        return None
    devices, device_taints, descriptions = patched
    return Inventory(
        token,
        previous.levels,
        previous.domain_paths,
        nodes,
        devices,
        previous.device_pks,
        previous.devices_by_pk,
        device_taints,
        RowIndex(revision, index.node_slots, index.device_slots, descriptions),
        # Kept as read: a patch refuses any write that would change them (see patched_devices).
        previous.counters,
        previous.shared_capacity,
    )


LARGEST_PATCH = 0.25  # the share of devices written beyond which a full read is done instead


class RowsWritten(NamedTuple):
    count: int  # rows in the table
    revision: int  # the highest revision among them (0: none)
    pks: list  # of the rows whose revision is above the one asked about


def rows_written_since(model, revision):
    """RowsWritten of `model`'s table, in one sequential scan (the revision has no index, see the model)."""
    table = model._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f'SELECT count(*), coalesce(max(revision), 0), array_agg(id) FILTER (WHERE revision > %s) FROM "{table}"',
            [revision],
        )
        count, highest, pks = cursor.fetchone()
    return RowsWritten(count, highest, pks or [])


def load_domain_paths():
    """{domain pk: {level: name}} from the domain up to its root; parents sit on coarser levels."""
    rows = Domain.objects.order_by("level__order").values_list("id", "name", "level__name", "parent_id")
    paths = {}
    for pk, name, level, parent_id in rows:
        paths[pk] = {**paths.get(parent_id, {}), level: name}
    return paths


NODE_COLUMNS = ("id", "name", "domain_id", "cordoned", as_text("labels"), "revision", as_text("shared_counters"))


def load_nodes(domain_paths):
    """(nodes, {Node pk: name}, {Node pk: (position, domain pk)}, highest revision read,
    {node name: its shared counters} of the nodes that publish some)."""
    nodes = []
    names = {}
    slots = {}
    revision = 0
    counters = {}
    parse = JsonCache()  # nodes of a rack share their labels
    rows = fetch_rows(Node.objects.order_by("name").values_list(*NODE_COLUMNS))
    for pk, name, domain_id, cordoned, labels, row_revision, shared in rows:
        if shared is not None and shared != "{}":
            counters[name] = parse(shared, {}) or {}
        names[pk] = name
        slots[pk] = (len(nodes), domain_id)
        revision = max(revision, row_revision or 0)  # NULL: written before row revisions, or SQLite
        nodes.append(node_record(name, domain_paths.get(domain_id, {}), cordoned, labels, parse))
    return tuple(nodes), names, slots, revision, counters


def node_record(name, domains, cordoned, labels, parse):
    return s.Node(name=name, domains=domains, schedulable=not cordoned, labels=parse(labels, {}))


def patched_nodes(previous, pks):
    """`previous.nodes` with the rows of `pks` in their places (the same tuple if none differs), or None if
    one is new, renamed or in another domain."""
    if not pks:
        return previous.nodes
    slots = previous.rows.node_slots
    rows = fetch_rows(Node.objects.filter(**pk_in(pks)).values_list(*NODE_COLUMNS))
    nodes = list(previous.nodes)
    replaced = False
    parse = JsonCache()
    for pk, name, domain_id, cordoned, labels, _, shared in rows:
        slot = slots.get(pk)
        if slot is None or slot[1] != domain_id or nodes[slot[0]].name != name:
            return None
        # Counters are made from all of a node's rows at once (counters_of): a node whose own changed is
        # read whole with the rest; one written with the same (a health flap, a cordon) is patched.
        stated = (parse(shared, {}) or {}) if shared is not None and shared != "{}" else None
        if stated != previous.counters.node_counters.get(name):
            return None
        node = node_record(name, previous.domain_paths.get(domain_id, {}), cordoned, labels, parse)
        if node != nodes[slot[0]]:  # a row written again unchanged keeps its record
            nodes[slot[0]] = node
            replaced = True
    return tuple(nodes) if replaced else previous.nodes


class DevicesRead(NamedTuple):
    devices: tuple
    device_pks: dict  # snapshot device id -> Device pk
    devices_by_pk: dict  # Device pk -> (snapshot device id, node name)
    device_taints: dict  # Device pk -> taints as stored
    slots: dict  # Device pk -> position in devices
    descriptions: dict  # (attributes, capacity, taints) texts -> `device_description` of them
    revision: int  # the highest revision read
    # Device pk -> (its consumesCounters, its parent's pk) of the devices with either (the rest consume none)
    families: dict = {}
    shared_capacity: dict = {}  # Device pk -> numeric capacity of the devices allowing several allocations


DEVICE_COLUMNS = (
    "id",
    "node_id",
    "name",
    "driver",
    as_text("attributes"),
    as_text("capacity"),
    "health",
    as_text("taints"),
    "revision",
    as_text("consumes_counters"),
    "parent_id",
    "allow_multiple_allocations",
)
DEVICE_REVISION = DEVICE_COLUMNS.index("revision")


def load_devices(node_names):
    """Every device, as a DevicesRead."""
    parse = JsonCache()
    # A handful of distinct (attributes, capacity, taints) texts among 100k devices: each is parsed once
    # and every device looks its description up once (a worker that just started reads them all).
    descriptions = {}
    devices = []
    device_pks, devices_by_pk, device_taints = {}, {}, {}
    rows = fetch_rows(Device.objects.order_by("node_id", "name").values_list(*DEVICE_COLUMNS))
    make = s.Device
    families = {}
    shared_capacity = {}
    for pk, node_id, name, driver, attributes, capacity, health, taints, _, consumes, parent, shared in rows:
        if parent is not None or (consumes is not None and consumes != "{}"):
            families[pk] = (parse(consumes, {}) or {}, parent)
        node = node_names[node_id]
        device_id = f"{node}/{name}"
        text = (attributes, capacity, taints)
        description = descriptions.get(text)
        if description is None:
            description = descriptions[text] = device_description(parse, attributes, capacity, taints)
        attribute_values, capacity_values, taint_list, taint_records = description
        device_pks[device_id] = pk
        devices_by_pk[pk] = (device_id, node)
        device_taints[pk] = taint_list
        if shared:
            shared_capacity[pk] = capacity_values
            devices.append(
                make(
                    device_id, node, driver, attribute_values, capacity_values, health == Health.HEALTHY,
                    taint_records, allow_multiple_allocations=True,
                )
            )  # fmt: skip
            continue
        devices.append(
            make(device_id, node, driver, attribute_values, capacity_values, health == Health.HEALTHY, taint_records)
        )
    # devices_by_pk was filled in device order.
    slots = dict(zip(devices_by_pk, range(len(devices)), strict=True))
    revision = max((row[DEVICE_REVISION] or 0 for row in rows), default=0)
    return DevicesRead(
        tuple(devices), device_pks, devices_by_pk, device_taints, slots, descriptions, revision, families,
        shared_capacity,
    )  # fmt: skip


def patched_devices(previous, pks):
    """(devices, device_taints, descriptions): `previous`'s with the rows of `pks` in their places (the same
    devices tuple if no record differs), or None if one is new, renamed or on another node."""
    index = previous.rows
    if not pks:
        return previous.devices, previous.device_taints, index.descriptions
    rows = fetch_rows(Device.objects.filter(**pk_in(pks)).values_list(*DEVICE_COLUMNS))
    node_names = {pk: previous.nodes[position].name for pk, (position, _) in index.node_slots.items()}
    devices = list(previous.devices)
    device_taints = dict(previous.device_taints)
    descriptions = dict(index.descriptions) if len(index.descriptions) < MAX_KEPT_DESCRIPTIONS else {}
    parse = JsonCache()
    replaced = False
    families, counted = previous.counters.families, previous.counters.consumed
    for pk, node_id, name, driver, attributes, capacity, health, taints, _, consumes, parent, shared in rows:
        # What counters a device consumes, or whether it is shared, is made from every row at once
        # (counters_of, load_devices): a device whose own changed is read whole with the rest.
        family = (parse(consumes, {}) or {}, parent) if parent is not None or consumes not in (None, "{}") else None
        if family != families.get(pk) or bool(shared) != (pk in previous.shared_capacity):
            return None
        position, node = index.device_slots.get(pk), node_names.get(node_id)
        if position is None or node is None:
            return None
        device_id = f"{node}/{name}"
        known = devices[position]
        if known.node != node or known.id != device_id:
            return None
        text = (attributes, capacity, taints)
        description = descriptions.get(text)
        if description is None:
            description = descriptions[text] = device_description(parse, attributes, capacity, taints)
        attribute_values, capacity_values, taint_list, taint_records = description
        if shared and capacity_values != previous.shared_capacity[pk]:
            return None  # the commit checks shares against the capacity read: read whole
        if pk in counted and held_outside(taint_list) != held_outside(previous.device_taints.get(pk)):
            return None  # what is held outside is taken off its counters (counters_of)
        device = s.Device(
            device_id, node, driver, attribute_values, capacity_values, health == Health.HEALTHY, taint_records,
            consumes_counters=known.consumes_counters, allow_multiple_allocations=bool(shared),
        )  # fmt: skip
        # Taints as stored, even under an equal record: the commit compares them with the rows.
        device_taints[pk] = taint_list
        if device != known:  # a row written again unchanged keeps its record
            devices[position] = device
            replaced = True
    return tuple(devices) if replaced else previous.devices, device_taints, descriptions


LEGACY_COUNTER = "partitions"


def held_outside(taints) -> bool:
    """Whether stored taints say another scheduler allocated the device (see counters_of)."""
    return any(taint.get("key") == s.HELD_OUTSIDE_TAINT for taint in taints or ())


def counters_of(node_counters, devices):
    """(Counters, the devices with their consumesCounters) from the nodes' shared counters and the
    devices' own consumption. A device cut into partitions (Device.parent) where neither it nor any
    partition states counters gets a counter set of its own, named after it, with one counter
    "partitions" of value n (its partitions): the whole device consumes n, each partition 1, so the
    whole excludes every partition and the partitions share the device, as DRA would publish it."""
    counter_sets = []
    values = {}
    for node, sets in node_counters.items():
        for set_name, counters in sets.items():
            numbers = quantities.numbers(counters) if isinstance(counters, dict) else {}
            counter_sets.append(s.CounterSet(str(set_name), node, numbers))
            for counter, value in numbers.items():
                values[(node, str(set_name), counter)] = value
    consumption = {}  # Device pk -> {set: {counter: amount}}
    children = {}  # parent pk -> partition pks, of families stating no counters
    for pk, (consumes, parent) in devices.families.items():
        if consumes:
            consumption[pk] = {
                str(name): quantities.numbers(counters) if isinstance(counters, dict) else {}
                for name, counters in consumes.items()
            }
        if parent is not None:
            children.setdefault(parent, []).append(pk)
    for parent, partitions in children.items():
        family = [parent, *partitions]
        if any(pk in consumption for pk in family) or parent not in devices.devices_by_pk:
            continue
        device_id, node = devices.devices_by_pk[parent]
        set_name = device_id.rpartition("/")[2]
        counter_sets.append(s.CounterSet(set_name, node, {LEGACY_COUNTER: len(partitions)}))
        values[(node, set_name, LEGACY_COUNTER)] = len(partitions)
        consumption[parent] = {set_name: {LEGACY_COUNTER: len(partitions)}}
        for pk in partitions:
            consumption[pk] = {set_name: {LEGACY_COUNTER: 1}}
    # What devices another scheduler allocated consume is taken already: the broker sees only the rest.
    for pk, consumes in consumption.items():
        if held_outside(devices.device_taints.get(pk)):
            node = devices.devices_by_pk[pk][1]
            for set_name, counters in consumes.items():
                for counter, amount in counters.items():
                    if (node, set_name, counter) in values:
                        values[(node, set_name, counter)] = max(0, values[(node, set_name, counter)] - amount)
    counter_sets = [
        replace(
            counter_set,
            counters={name: values[(counter_set.node, counter_set.name, name)] for name in counter_set.counters},
        )
        for counter_set in counter_sets
    ]
    records = list(devices.devices)
    consumed = {}
    for pk, consumes in consumption.items():
        position = devices.slots[pk]
        record = records[position]
        records[position] = replace(record, consumes_counters=consumes)
        consumed[pk] = tuple(
            ((record.node, set_name, counter), amount)
            for set_name, counters in consumes.items()
            for counter, amount in counters.items()
        )
    counters = Counters(
        tuple(sorted(counter_sets, key=lambda c: (c.node, c.name))), values, consumed, node_counters, devices.families
    )
    return counters, tuple(records)


def device_description(parse, attributes, capacity, taints):
    """(attributes, numeric capacity, taints as stored, taints as the core's records) from their texts."""
    taint_list = parse(taints, [])
    return (
        parse(attributes, {}),
        quantities.numbers(parse(capacity, {})),
        taint_list,
        tuple(s.Taint(key=t["key"], value=t.get("value"), effect=t.get("effect", "NoSchedule")) for t in taint_list),
    )


# --- policy ------------------------------------------------------------------------------------------


def load_device_classes(loaded):
    classes = []
    for pk, name, selector, price in DeviceClass.objects.order_by("name").values_list(
        "id", "name", "selector", "price_per_hour"
    ):
        loaded.device_class_pks[name] = pk
        classes.append(s.DeviceClass(name=name, selector=selector or None, price_per_hour=float(price)))
    return tuple(classes)


def load_cohorts():
    return tuple(
        s.Cohort(name=name, parent=parent, quota=quota or {})
        for name, parent, quota in Cohort.objects.order_by("name").values_list("name", "parent__name", "nominal_quota")
    )


def load_queues():
    rows = Queue.objects.order_by("name").values_list(
        "name",
        "team__name",
        "cohort__name",
        "nominal_quota",
        "borrowing_limit",
        "lending_limit",
        "fair_share_weight",
        "within_queue_preemption",
        "reclaim_within_cohort",
    )
    return tuple(
        s.Queue(
            name=name,
            team=team,
            cohort=cohort,
            # An empty quota map in the form means "unlimited", as the model's help text promises.
            quota=quota or None,
            borrowing_limit=borrowing or None,
            lending_limit=lending or None,
            weight=weight,
            within_queue=within,
            reclaim_within_cohort=reclaim,
        )
        for name, team, cohort, quota, borrowing, lending, weight, within, reclaim in rows
    )


@dataclass(frozen=True)
class ApprovalRule:
    required: bool
    threshold: int | None

    def needs_approval(self, devices):
        return self.required or (self.threshold is not None and devices > self.threshold)


def load_resource_classes():
    """(resource classes, {name: ApprovalRule}). A class with a size threshold is approval-gated in the
    snapshot too; the loader then marks small requests approved (see `approved_flag`)."""
    choices = defaultdict(list)
    for rc_id, class_name in ResourceClassDeviceClass.objects.order_by("resource_class_id", "rank").values_list(
        "resource_class_id", "device_class__name"
    ):
        choices[rc_id].append(class_name)
    teams = defaultdict(list)
    for rc_id, team in ResourceClass.allowed_teams.through.objects.values_list("resourceclass_id", "team__name"):
        teams[rc_id].append(team)
    classes = []
    rules = {}
    for (
        pk,
        name,
        required,
        preferred,
        approval,
        threshold,
        priority,
        preemptible,
        max_devices,
        preempts_across_queues,
        checkpoint_restart_seconds,
        sharing,
    ) in ResourceClass.objects.order_by("name").values_list(
        "id",
        "name",
        "topology_required",
        "topology_preferred",
        "approval_required",
        "approval_threshold_devices",
        "priority_class__value",
        "preemptible",
        "max_devices",
        "preempts_across_queues",
        "checkpoint_restart_seconds",
        "sharing",
    ):
        rules[name] = ApprovalRule(approval, threshold)
        classes.append(
            s.ResourceClass(
                name=name,
                device_classes=tuple(choices[pk]),
                topology_required=required or None,
                topology_preferred=preferred or None,
                teams=tuple(sorted(teams[pk])) if teams[pk] else None,
                approval_required=approval or threshold is not None,
                default_priority=priority,
                preemptible=preemptible,
                max_devices=max_devices,
                preempts_across_queues=preempts_across_queues,
                checkpoint_restart_seconds=float(checkpoint_restart_seconds),
                sharing=sharing,
            )
        )
    return tuple(classes), rules


def load_reservations(now, domain_paths):
    rows = Reservation.objects.filter(end__gt=now).values_list(
        "name", "team__name", "device_class__name", "count", "domain_id", "start", "end"
    )
    reservations = []
    for name, team, device_class, count, domain_id, start, end in rows:
        domain = None
        if domain_id is not None:
            # The domain's own level pins it; its ancestors follow from the node's path.
            path = domain_paths.get(domain_id, {})
            domain = dict(list(path.items())[-1:])
        reservations.append(
            s.Reservation(
                name=name,
                team=team,
                device_class=device_class,
                count=count,
                domain=domain,
                start=start.timestamp(),
                end=end.timestamp(),
            )
        )
    return tuple(sorted(reservations, key=lambda r: r.name))


# --- work --------------------------------------------------------------------------------------------


def approved_flag(state, approval, rule, devices):
    """The core's `approved`: True, False (rejected) or None (undecided). A workload still awaiting
    approval is never approved, whatever its flag says; one that needs no approval counts as approved."""
    if approval == ApprovalState.REJECTED:
        return False
    if state == State.AWAITING_APPROVAL:
        return None
    if approval == ApprovalState.APPROVED:
        return True
    if rule is not None and rule.needs_approval(devices):
        return None
    return True


def workloads_to_read(loaded, horizon, approval_rules):
    """(pending pks, running pks): the workloads whose rows this load reads to patch the records kept
    from the last one, for each set, or None for a set read whole (see BuiltFromRows.patch). Notes the
    approval windows shut now in `loaded.closed_windows`."""
    pending_scope, running_scope = pending_records_scope(loaded), running_records_scope(loaded)
    # Each set since its own horizon: one that was dropped or read whole alone leaves the other patchable.
    # The two are nearly always the same: one query then.
    read_since = {}
    for kept in (RUNNING_RECORDS, PENDING_RECORDS):
        if kept.horizon not in read_since:
            read_since[kept.horizon] = changes.written_since(kept.horizon, horizon)
    loaded.closed_windows = closed_windows(loaded)
    running = RUNNING_RECORDS.patch(running_scope, read_since[RUNNING_RECORDS.horizon])
    written = read_since[PENDING_RECORDS.horizon]
    if written is not None:
        # An approval window opens or shuts with time, no write: such a workload enters or leaves the
        # queue all the same.
        written = written | (loaded.closed_windows ^ PENDING_RECORDS.windows)
    pending = PENDING_RECORDS.patch(pending_scope, written, condition=approval_rules)
    for name, pks in (("pending", pending), ("running", running)):
        if pks is not None:
            loaded.patched[name] = len(pks)
    return pending, running


def closed_windows(loaded):
    """The pks of workloads whose approval window is shut now (outside_window), when there is a change
    log to patch records with; else empty (the pending query leaves them out itself)."""
    if loaded.horizon is None:
        return frozenset()
    return frozenset(ApprovalRequest.objects.outside_window(loaded.now).values_list("workload_id", flat=True))


def fetch_pending_rows(loaded, pks=None):
    """(workload rows, {workload pk: pod set rows}) of the waiting workloads, as load_pending reads them;
    of those among `pks` only, unless it is None."""
    workloads = Workload.objects.filter(state__in=WAITING)
    if pks is not None:
        workloads = workloads.filter(**pk_in(pks))
    rows = fetch_rows(
        # An approval granted for a window keeps the workload out of the cycle while the window is shut.
        workloads.exclude(pk__in=ApprovalRequest.objects.outside_window(loaded.now))
        .order_by("id")
        .values_list(
            "id",
            "state",
            "queue__name",
            "team__name",
            "resource_class__name",
            "topology_required",
            "topology_preferred",
            "priority",
            "disruption_mode",
            epoch("submitted_at"),
            "approval",
            "expected_duration_seconds",
            "preemptible",
            # As text, parsed once per distinct value: nearly every row holds "[]".
            as_text("nominated_devices"),
            "name",
            as_text("group_claims"),  # "[]" on nearly every row, parsed once
            "preemption_policy",
        )
    )
    return rows, load_pod_set_rows(WAITING, pks)


def pending_records_scope(loaded):
    # What a record takes from the inventory: the names of nominated devices (see RUNNING_RECORDS).
    return (loaded.devices_by_pk, get_executor().wall_seconds(HOUR))


def load_pending(loaded, approval_rules, fetched, pks=None):
    """The pending records of `fetched` (fetch_pending_rows); with `pks`, `fetched` holds the rows of
    those workloads only, and the records kept from the last load stand for every other one."""
    rows, pod_set_rows = fetched
    scope = pending_records_scope(loaded)
    # The approval rules decide a record's `approved`: part of what it is built from.
    read = None if pks is not None else (rows, pod_set_rows, approval_rules)
    built = PENDING_RECORDS.unchanged_since(scope, read) if pks is None else None
    if built is None:
        records, renewed = pending_records(loaded, approval_rules, rows, pod_set_rows, scope, pks)
        if pks is not None and not renewed:
            built = PENDING_RECORDS.kept_result()
    if built is not None:
        pending, states, nominated = built
        loaded.pending_states.update(states)
        loaded.nominated_pending.update(nominated)
        PENDING_RECORDS.advance(loaded.horizon, loaded.closed_windows)
        return pending
    pending = []
    for pk, (source, workload) in records.items():
        state = source[0][1]
        loaded.pending_states[pk] = state
        if source[0][13] != "[]" and state == State.PENDING:
            loaded.nominated_pending.add(pk)
        pending.append(workload)
    pending = tuple(pending)
    whole = (pending, dict(loaded.pending_states), frozenset(loaded.nominated_pending))
    PENDING_RECORDS.keep(
        scope, records, whole, read, loaded.horizon, condition=approval_rules, windows=loaded.closed_windows
    )
    return pending


def pending_records(loaded, approval_rules, rows, pod_set_rows, scope, pks):
    """({pk: (source, record)} in pk order, whether any record is new or gone since the last load): the
    records kept from the last load whose rows were read equal, the others built from `rows`; with
    `pks`, the kept records of workloads not among them too."""
    executor = get_executor()
    previous = PENDING_RECORDS.previous(scope)
    records = {} if pks is None else {pk: kept for pk, kept in previous.items() if pk not in pks}
    renewed = False
    parse = JsonCache()
    for row in rows:
        pk, state, rc = row[0], row[1], row[4]
        sets = pod_set_rows.get(pk, ())
        # The approval rule comes from the policy, not the row: its answer is part of the source. Only a
        # rule asks how many devices the gang wants.
        rule = approval_rules.get(rc)
        devices = 0 if rule is None else sum(replicas * per_pod for _, replicas, _, per_pod, *_ in sets)
        approved = approved_flag(state, row[10], rule, devices)
        source = (row, sets, approved)
        known = previous.get(pk)
        if known is not None and known[0] == source:
            # The kept pair, not the equal new rows: see BuiltFromRows.
            records[pk] = known
        else:
            records[pk] = (source, pending_workload(row, sets, approved, loaded, executor, parse))
            renewed = True
    if pks is None:
        return records, True
    # Every record kept or read equal, and as many as before: the same set.
    renewed = renewed or len(records) != len(previous)
    # In pk order, as the full read orders its rows: the same snapshot, whichever way it was read.
    return {pk: records[pk] for pk in sorted(records)}, renewed


def pending_workload(row, pod_set_rows, approved, loaded, executor, parse):
    """One PendingWorkload from its workload row and its pod set rows."""
    pk, _, queue, team, rc, required, preferred, priority, disruption, submitted, _, duration = row[:12]
    preemptible, nominated, name, group_claims, preemption_policy = row[12], row[13], row[14], row[15], row[16]
    return s.PendingWorkload(
        id=str(pk),
        queue=queue,
        pod_sets=tuple(parse.pod_set(pod_set) for pod_set in pod_set_rows),
        resource_class=rc,
        team=team,
        topology_required=required or None,
        topology_preferred=preferred or None,
        priority=priority,
        disruption=disruption,
        submitted=seconds(submitted),
        approved=approved,
        expected_duration=executor.wall_seconds(duration),
        preemptible=preemptible,
        nominated_devices=nominated_ids(parse(nominated, ()), loaded),
        name=f"{team}/{name}",
        group_claims=() if group_claims == "[]" else group_claims_from_rows(parse(group_claims, ())),
        preemption_policy=preemption_policy,
    )


def group_claims_from_rows(stored):
    """GroupClaim records from Workload.group_claims ([{name, requests, constraints}] as the API keeps
    them). One written past the API's checks (the admin, SQL) becomes a request the cycle's resolution
    calls invalid, as a pod set's claim does."""
    claims = []
    for position, entry in enumerate(stored or ()):
        name = entry.get("name") if isinstance(entry, dict) else None
        name = name if isinstance(name, str) and name else f"claim-{position}"
        try:
            body = {key: value for key, value in entry.items() if key != "name"}
            requests, constraints = claim_from_dra(body)
        except (ValueError, AttributeError) as error:
            requests, constraints = (s.DeviceRequest(f"invalid claim: {error}"),), ()
        claims.append(s.GroupClaim(name, requests, constraints))
    return tuple(claims)


def nominated_ids(device_pks, loaded):
    """Snapshot ids of the devices a preemptor's victims freed for it (unknown pks are skipped)."""
    if not device_pks:
        return ()
    known = loaded.devices_by_pk
    return tuple(known[pk][0] for pk in device_pks if pk in known)


def load_pod_set_rows(states, pks=None):
    """{workload pk: (pod set row, ...)} of every workload in `states` (of those among `pks` only, unless
    it is None), by a join rather than a 20k-long IN list; rows as `pod_set_from_row` reads them."""
    pod_sets = PodSet.objects.filter(workload__state__in=states)
    if pks is not None:
        pod_sets = pod_sets.filter(**column_in("workload", pks))
    rows = fetch_rows(
        pod_sets.order_by("workload_id", "id").values_list(
            "workload_id",
            "name",
            "replicas",
            "min_count",
            "devices_per_pod",
            as_text("device_classes"),
            "match_attribute",
            as_text("tolerations"),
            as_text("claim"),
            as_text("capacity"),
        )
    )
    return {workload_id: tuple(row[1:] for row in group) for workload_id, group in groupby(rows, key=itemgetter(0))}


def pod_set_from_row(row, parse):
    name, replicas, min_count, per_pod, classes, match_attribute, tolerations, claim, capacity = row
    requests, constraints = (), ()
    claim = parse(claim, None)
    if claim:
        try:
            requests, constraints = claim_from_dra(claim)
        except ValueError as error:
            # Written past the API's checks (the admin, SQL): the cycle's resolution calls it invalid.
            requests = (s.DeviceRequest(f"invalid claim: {error}"),)
    return s.PodSet(
        name=name,
        count=replicas,
        min_count=min_count,
        devices_per_pod=per_pod,
        device_classes=tuple(parse(classes, None) or ()),
        match_attribute=match_attribute or None,
        tolerations=tuple(
            s.Toleration(key=t["key"], value=t.get("value"), effect=t.get("effect"))
            for t in parse(tolerations, [])
            if t.get("key")
        ),
        requests=requests,
        constraints=constraints,
        capacity=tuple(sorted(quantities.numbers(parse(capacity, None) or {}).items())),
    )


def fetch_in_background(*querysets):
    """A Background whose result is `[fetch_rows(queryset) for queryset in querysets]`: on PostgreSQL
    the queries run, and their rows come in, while this thread builds records from rows it already has
    (SQLite: read here and now)."""
    if connection.vendor != "postgresql":
        return Background.finished([list(queryset) for queryset in querysets])
    # Compiled here: the helper thread has a Django connection of its own, outside this transaction.
    statements = [queryset.query.sql_with_params() for queryset in querysets]
    return Background(lambda cursor: [fetch_sql(cursor.connection, *statement) for statement in statements])


class BuiltFromRows:
    """Snapshot records kept from the last load with the rows they were built from, so the next load
    reuses every record whose rows did not change. Running work keeps its allocations for hours and
    queued work waits through many cycles, and building 70k frozen records each cycle cost more than
    reading their rows. The scope holds what a record depends on besides its rows (the inventory's
    device names, the executor's clock); a new scope starts empty.

    On PostgreSQL the next load need not even read the rows of records that did not change: the
    records are kept with the horizon of the snapshot they were read at (broker.workloads.changes), and a
    load that knows which workloads were written since then patches them (`patch`).

    A reused record keeps the rows it was built from, not the equal ones just read: those are freed as
    soon as the load ends, so a steady cycle does not hand the cyclic collector 250,000 new long-lived
    row tuples to walk through its generations after it."""

    def __init__(self):
        self._renewed = 0  # records in the sets kept since the last take_renewed()
        self.forget()

    def previous(self, scope):
        return self._records if scope == self._scope else {}

    def keep(
        self, scope, records, result=None, read=None, horizon=None, condition=None, rebuild=frozenset(), windows=()
    ):
        """Keep `records` ({workload pk: (source rows, record)}) built in `scope`.

        - `result`: what the load made of them all (None when some record was built but not kept): a
          later load that changes none of them takes it as it is;
        - `read`: the load's complete input, when it read everything: a later full read equal to it, in
          this scope, takes `result` at once (`unchanged_since`);
        - `horizon`: the changes.Horizon of the snapshot the rows were read at (None: not patchable);
        - `condition`: what else the records were built from (the approval rules), which a patch needs
          unchanged;
        - `rebuild`: pks of records built but not kept, which every patch reads again;
        - `windows`: the pks of workloads whose approval window was shut (closed_windows)."""
        self._scope, self._records, self._result, self._read = scope, records, result, read
        self._horizon, self._condition, self._rebuild, self.windows = horizon, condition, rebuild, frozenset(windows)
        self._renewed += len(records)

    def advance(self, horizon, windows=()):
        """The records kept stand as they are at `horizon` too: a load found nothing to change in them."""
        self._horizon, self.windows = horizon, frozenset(windows)

    def forget(self):
        self.keep(None, {})
        self._renewed = 0

    @property
    def horizon(self):
        return self._horizon

    def take_renewed(self):
        """How many records the sets kept since the last call hold: each kept set is a new dict, and a new
        result, of all of them, even when one record in it changed (see runner.keep_out_of_collections)."""
        renewed, self._renewed = self._renewed, 0
        return renewed

    def unchanged_since(self, scope, read):
        """What was built last time, if `read` (the complete input of a load) equals last time's and
        the scope holds: one comparison of the rows in C instead of one per record in Python (a steady
        load compared 30,000 running workloads' rows one by one, ~0.1 s)."""
        if self._result is None or self._read is None or scope != self._scope or self._read != read:
            return None
        return self._result

    def patch(self, scope, written, condition=None):
        """The pks whose rows a load must read to bring the kept records up to date, given `written`
        (changes.written_since this set's horizon): those plus `rebuild`. None when it must read
        everything: nothing patchable is kept, the scope or condition changed, or so much was written
        that reading it by id would cost more than reading it all."""
        if written is None or self._horizon is None or scope != self._scope or condition != self._condition:
            return None
        pks = written | self._rebuild
        if len(pks) > max(LARGEST_RECORDS_PATCH * len(self._records), SMALL_PATCH):
            return None
        return pks

    def kept_result(self):
        """What the last load made of its records, for a patch that found each of them as it was and no
        other (None if that load built records it did not keep)."""
        return None if self._rebuild else self._result


# The share of kept records written since, beyond which a load reads every row instead (a refill after a
# burst of submissions and starts): fetched by id, one costs several times a row of a full scan.
LARGEST_RECORDS_PATCH = 0.25
SMALL_PATCH = 100  # so many are read by id in a few milliseconds, however few records are kept


# Running and pending records take from the inventory only device names and nodes by Device pk
# (`devices_by_pk`: a running pod's devices and node, a preemptor's nominated devices, unknown pks
# skipped), so that dict is their inventory scope, not the revision token: a health, taint or cordon
# change keeps them. A patched inventory hands on the very same dict (the scope compares at once); a
# full read makes a new one, compared by value, so records survive a re-read that renamed nothing.
RUNNING_RECORDS = BuiltFromRows()
PENDING_RECORDS = BuiltFromRows()


def forget_everything_loaded():
    """Drop every cache the loader and the decision core keep between cycles: the next cycle reads and
    indexes everything, as a newly started worker does (benchmarks and tests use it)."""
    from broker.scheduler.capacity import InventoryIndex

    INVENTORY_CACHE.clear()
    INVENTORY_CACHE.take_rebuilt()
    RUNNING_RECORDS.forget()
    PENDING_RECORDS.forget()
    InventoryIndex._last = None


HOUR = 3600.0


def fetch_running_rows(pks=None):
    """The rows of load_running, fetched in the background (fetch_in_background): the active allocations
    and their holders, the Admitted and Running workloads (an index scan); of the workloads among `pks`
    only, unless it is None."""
    allocations = Allocation.objects.filter(released_at__isnull=True)
    holders = Workload.objects.filter(state__in=HOLDING_STATES)
    if pks is not None:
        allocations = allocations.filter(**column_in("workload", pks))
        holders = holders.filter(**pk_in(pks))
    return fetch_in_background(
        allocations.order_by("workload_id", "pod_set", "pod_index", "device_id").values_list(
            "workload_id", "pod_set", "pod_index", "device_id", "device_class_id", as_text("consumed_capacity")
        ),
        holder_rows(holders),
    )


def running_records_scope(loaded):
    # A record names its device class: a renamed class is a new scope.
    class_names = tuple(sorted((pk, name) for name, pk in loaded.device_class_pks.items()))
    return (loaded.devices_by_pk, get_executor().wall_seconds(HOUR), class_names)


def load_running(loaded, fetched, pks=None):
    """Every workload holding an active allocation, whatever its state: a held device is never free.
    `fetched`: fetch_running_rows(pks), begun in this transaction; with `pks`, the records kept from
    the last load stand for every workload not among them."""
    allocations, holders = fetched.result()
    # Should a bug leave devices with a workload in another state than the holders', those few are
    # fetched by id.
    info = {row[0]: row[1:] for row in holders}
    strays = {row[0] for row in allocations} - info.keys()
    if strays:
        info.update((row[0], row[1:]) for row in fetch_rows(holder_rows(Workload.objects.filter(**pk_in(strays)))))
    shrinking = shrinking_rows(info)
    for workload_id, extra in shrinking.items():
        info[workload_id] = info[workload_id] + extra
    executor = get_executor()
    class_names = {pk: name for name, pk in loaded.device_class_pks.items()}
    scope = running_records_scope(loaded)
    read = None if pks is not None else (allocations, info)
    built = RUNNING_RECORDS.unchanged_since(scope, read) if pks is None else None
    if built is None:
        previous = RUNNING_RECORDS.previous(scope)
        records = {} if pks is None else {pk: kept for pk, kept in previous.items() if pk not in pks}
        built_now = {}  # the records built and not kept
        renewed = False
        for workload_id, rows in groupby(allocations, key=itemgetter(0)):
            source = (tuple(rows), info[workload_id])
            known = previous.get(workload_id)
            if known is not None and known[0] == source:
                records[workload_id] = known  # the kept pair, not the equal new rows: see BuiltFromRows
            else:
                renewed = True
                record = running_records(workload_id, *source, loaded, class_names, executor)
                if source[1][ADMITTED_AT] is not None or source[1][STARTED_AT] is not None:
                    records[workload_id] = (source, record)
                else:  # it started "now": not reusable
                    built_now[workload_id] = record
        # Every record kept or read equal, and as many as before: the same set (see pending_records).
        if pks is not None and not renewed and len(records) == len(previous):
            built = RUNNING_RECORDS.kept_result()
    if built is not None:
        running, holders = built
        loaded.running_ids.update(holders)
        RUNNING_RECORDS.advance(loaded.horizon)
        return running
    # In workload pk order, as the full read orders its rows: the same snapshot, whichever way it was read.
    order = sorted({*records, *built_now}) if pks is not None or built_now else records
    running = []
    for workload_id in order:
        kept = records.get(workload_id)
        built = kept[1] if kept is not None else built_now[workload_id]
        loaded.running_ids.add(workload_id)
        if type(built) is tuple:  # a workload being shrunk: the pods staying, the pods leaving
            running.extend(built)
        else:
            running.append(built)
    running, holders = tuple(running), frozenset(loaded.running_ids)
    # Only a result made of kept records can be taken whole: one that started "now" is built anew.
    result = None if built_now else (running, holders)
    RUNNING_RECORDS.keep(scope, records, result, read, loaded.horizon, rebuild=frozenset(built_now))
    return running


def shrinking_rows(info):
    """What Pod disruption mode adds to a holder's row, by workload id: (gang minimums, pods leaving,
    their preemptor) for the few holders that are in Pod mode or have pods being evicted (both small
    index reads). Others are left out, and their records stay as they were."""
    extra = {}
    elastic = [workload_id for workload_id, row in info.items() if row[DISRUPTION] == "Pod"]
    minimums = defaultdict(list)
    if elastic:
        pod_sets = PodSet.objects.filter(**column_in("workload", elastic), min_count__isnull=False)
        for workload_id, name, min_count in pod_sets.values_list("workload_id", "name", "min_count"):
            minimums[workload_id].append((name, min_count))
    leaving = defaultdict(set)
    leaving_for = {}
    evicting = Allocation.objects.filter(released_at__isnull=True, eviction_requested_at__isnull=False)
    for workload_id, pod_set, index, evicted_for in evicting.values_list(
        "workload_id", "pod_set", "pod_index", "evicted_for_id"
    ):
        leaving[workload_id].add((pod_set, index))
        leaving_for[workload_id] = evicted_for
    for workload_id in {*minimums, *leaving}.intersection(info):
        extra[workload_id] = (
            tuple(sorted(minimums.get(workload_id, ()))),
            frozenset(leaving.get(workload_id, ())),
            leaving_for.get(workload_id),
        )
    return extra


# Where each value sits in a holder's info: its holder_rows row without the id, then, for a workload in
# Pod disruption mode or with pods being evicted, what shrinking_rows adds.
HOLDER_TIMESTAMPS = ("admitted_at", "started_at", "eviction_requested_at")
HOLDER_FIELDS = (
    "queue__name",
    "priority",
    "disruption_mode",
    "preemptible",
    "state",
    "admitted_at",
    "started_at",
    "expected_duration_seconds",
    "eviction_requested_at",
    "evicted_for_id",
    "preemption_count",
    "team__name",
    "name",
)
ADMITTED_AT, STARTED_AT, DISRUPTION = (HOLDER_FIELDS.index(f) for f in ("admitted_at", "started_at", "disruption_mode"))
MIN_COUNTS, LEAVING, LEAVING_FOR = range(len(HOLDER_FIELDS), len(HOLDER_FIELDS) + 3)


def holder_rows(workloads):
    """What a RunningWorkload needs from its workload row, id first, then HOLDER_FIELDS (no ORDER BY:
    the rows become a dict)."""
    fields = (epoch(name) if name in HOLDER_TIMESTAMPS else name for name in HOLDER_FIELDS)
    return workloads.order_by().values_list("id", *fields)


def running_records(workload_id, rows, info, loaded, class_names, executor):
    """`running_workload`, or for a workload with pods being evicted the tuple `split_leaving` makes."""
    workload = running_workload(workload_id, rows, info, loaded, class_names, executor)
    if len(info) > LEAVING and info[LEAVING]:
        leaving_for = info[LEAVING_FOR]
        return s.split_leaving(workload, set(info[LEAVING]), None if leaving_for is None else str(leaving_for))
    return workload


def running_workload(workload_id, rows, info, loaded, class_names, executor):
    """One RunningWorkload from its active allocation rows (ordered) and its workload row (plus, in Pod
    disruption mode, what `shrinking_rows` adds)."""
    (
        queue,
        priority,
        disruption,
        preemptible,
        state,
        admitted_at,
        started_at,
        duration,
        eviction_requested_at,
        evicted_for,
        preemptions,
        team,
        name,
    ) = info[:MIN_COUNTS]
    min_counts = info[MIN_COUNTS] if len(info) > MIN_COUNTS else ()
    # Device and class names come from what was loaded already: no join per allocation.
    devices_by_pk = loaded.devices_by_pk
    if len(rows) == 1 and rows[0][5] is None:  # most running work is one whole device: nothing to group
        row = rows[0]
        device_id, node = devices_by_pk[row[3]]
        placed = (s.RunningPod(pod_set=row[1], index=row[2], node=node, device_ids=(device_id,)),)
    else:
        pods = defaultdict(list)
        consumed = {}  # (pod set, index, node) -> what the pod takes of each device it shares
        for row in rows:
            device_id, node = devices_by_pk[row[3]]
            pods[(row[1], row[2], node)].append(device_id)
            if row[5] is not None:
                amounts = quantities.numbers(json.loads(row[5]) or {})
                consumed[(row[1], row[2], node)] = tuple(sorted(amounts.items()))
        placed = []
        for key, ids in sorted(pods.items()):
            pod_set, index, node = key
            placed.append(s.RunningPod(pod_set, index, node, tuple(ids), consumed.get(key, ())))
        placed = tuple(placed)
    device_class, device_classes = rows[0][4], ()
    if len(rows) > 1 and any(row[4] != device_class for row in rows):
        # A several-request claim's devices, each under its request's class: the most held is the
        # workload's, the others are named device by device.
        counts = Counter(row[4] for row in rows)
        device_class = max(counts, key=lambda pk: (counts[pk], -pk))
        device_classes = tuple(
            (devices_by_pk[row[3]][0], class_names[row[4]]) for row in rows if row[4] != device_class
        )
    started = seconds(started_at if started_at is not None else admitted_at)
    started = loaded.now.timestamp() if started is None else started
    expected = executor.wall_seconds(duration)
    return s.RunningWorkload(
        id=str(workload_id),
        queue=queue,
        pods=placed,
        device_class=class_names[device_class],
        device_classes=device_classes,
        priority=priority,
        disruption=disruption,
        # A workload in a final state still holding devices (a bug elsewhere) must not be a victim.
        preemptible=preemptible and state in (State.ADMITTED, State.RUNNING),
        started=started,
        expected_end=None if expected is None else started + expected,
        # A victim shutting down keeps its devices; the core neither preempts it again nor
        # counts its devices as free, and holds them for `evicted_for`.
        evicting=eviction_requested_at is not None,
        evicted_for=None if evicted_for is None else str(evicted_for),
        min_counts=min_counts,
        preemptions=preemptions,
        name=f"{team}/{name}",
    )
