"""The benchmark's own PostgreSQL database, and a fast way to fill it with a synthetic cluster.

`prepare_environment()` runs before django.setup(): it (re)creates the database BENCH_DATABASE_NAME
(default bench_capacity_broker) on the server DATABASE_URL names and points DATABASE_URL at it, so the
bench never touches the development or test databases. `migrate()` builds the schema once; `reset()`
empties it between sizes (TRUNCATE, much faster than migrating again).

`populate(snapshot)` writes a broker.scheduler.synthetic snapshot as rows: topology, device classes,
resource classes, cohorts, teams, queues, nodes, devices, running workloads with their allocations and
pending workloads with their pod sets. The big tables go in with PostgreSQL COPY (psycopg 3); every
column the bench does not set gets the model field's default, so new model fields with defaults need
no change here.
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from urllib.parse import urlsplit, urlunsplit

BENCH_DB = os.getenv("BENCH_DATABASE_NAME", "bench_capacity_broker")
KEEP_TABLES = {"django_migrations", "django_content_type", "auth_permission", "auth_group", "auth_group_permissions"}
OPERATOR = "bench-operator"
PASSWORD = "bench-password"


class NoDatabase(RuntimeError):
    pass


# The workload columns every COPY here fills, in the order the row builders emit them.
WORKLOAD_COLUMNS = [
    "id",
    "name",
    "team_id",
    "queue_id",
    "resource_class_id",
    "priority",
    "preemptible",
    "topology_required",
    "expected_duration_seconds",
    "state",
    "submitted_at",
    "state_changed_at",
    "admitted_at",
    "started_at",
    "chosen_device_class_id",
]


def server_url() -> str:
    url = os.getenv("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        raise NoDatabase("DATABASE_URL must name a PostgreSQL server for the cycle, pages and browser sections")
    return url


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


def prepare_environment(name: str = BENCH_DB) -> str:
    """Drop and create the bench database; DATABASE_URL points at it afterwards. Returns its URL."""
    import psycopg

    url = server_url()
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    bench_url = with_database(url, name)
    os.environ["DATABASE_URL"] = bench_url
    return bench_url


def drop(name: str = BENCH_DB, url: str | None = None) -> None:
    import psycopg

    with psycopg.connect(url or server_url(), autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def migrate() -> float:
    from django.core.management import call_command

    started = time.perf_counter()
    call_command("migrate", verbosity=0, interactive=False)
    return time.perf_counter() - started


def reset() -> None:
    """Empty every table the bench fills (roles and content types stay)."""
    from django.db import connection

    tables = [t for t in connection.introspection.django_table_names(only_existing=True) if t not in KEEP_TABLES]
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE " + ", ".join(f'"{t}"' for t in tables) + " RESTART IDENTITY CASCADE")


# --- COPY ----------------------------------------------------------------------------------------------


def _default(field):
    if field.has_default():
        return field.get_default()
    if field.null:
        return None
    if getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False):
        from django.utils import timezone

        return timezone.now()
    if field.blank and field.get_internal_type() in ("CharField", "TextField", "SlugField"):
        return ""
    raise ValueError(f"{field.model.__name__}.{field.name} needs a value")


def copy_rows(model, columns, rows) -> int:
    """COPY `rows` (tuples in the order of `columns`, attnames) into `model`'s table; other columns get
    their field defaults. JSON fields take Python values."""
    from django.db import connection, models

    fields = list(model._meta.concrete_fields)
    by_attname = {f.attname: f for f in fields}
    given = [by_attname[name] for name in columns]
    # Columns not given take the field default; an auto primary key not given comes from its sequence.
    rest = [
        f
        for f in fields
        if f.attname not in set(columns) and not (f.primary_key and f.get_internal_type().endswith("AutoField"))
    ]
    defaults = tuple(_encode(f, _default(f)) for f in rest)
    is_json = [isinstance(f, models.JSONField) for f in given]
    names = ", ".join(f'"{f.column}"' for f in given + rest)
    count = 0
    sql = f'COPY "{model._meta.db_table}" ({names}) FROM STDIN'
    with connection.cursor() as cursor, cursor.cursor.copy(sql) as copy:
        for row in rows:
            values = tuple(
                json.dumps(v) if json_field and v is not None else v for v, json_field in zip(row, is_json, strict=True)
            )
            copy.write_row(values + defaults)
            count += 1
    return count


def _encode(field, value):
    from django.db import models

    if isinstance(field, models.JSONField) and value is not None:
        return json.dumps(value)
    return value


def fix_sequences(*models) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        for model in models:
            table = model._meta.db_table
            cursor.execute(
                f"SELECT setval(pg_get_serial_sequence('\"{table}\"', 'id'), "
                f'COALESCE((SELECT MAX(id) FROM "{table}"), 0) + 1, false)'
            )


# --- a synthetic snapshot as rows ----------------------------------------------------------------------


def selector_of(device_class) -> str:
    """The synthetic classes use the `match` shorthand; the database stores CEL."""
    from broker.scheduler.snapshot import DRIVER

    parts = []
    if device_class.selector:
        parts.append(f"({device_class.selector})")
    for key, value in sorted((device_class.match or {}).items()):
        literal = json.dumps(value) if isinstance(value, str) else str(value)
        parts.append(f'device.attributes["{DRIVER}"].{key} == {literal}')
    return " && ".join(parts)


def populate(snapshot, now=None) -> dict:
    """Write `snapshot` into the (empty) bench database; returns row counts and seconds."""
    from django.conf import settings
    from django.db import transaction
    from django.utils import timezone

    from broker.inventory.models import ClusterState, Device, Domain, Node, TopologyLevel
    from broker.policy.models import (
        Cohort,
        DeviceClass,
        PriorityClass,
        Queue,
        ResourceClass,
        ResourceClassDeviceClass,
        Team,
    )
    from broker.workloads.models import Allocation, PodSet, Workload
    from broker.workloads.states import State

    started = time.perf_counter()
    now = now or timezone.now()

    def at(seconds):
        # Snapshot times are seconds on the synthetic clock whose "now" is snapshot.now.
        return now - timedelta(seconds=snapshot.now - seconds)

    counts = {}
    with transaction.atomic():
        ClusterState.objects.update_or_create(name=settings.CLUSTER_NAME, defaults={"generation": 1})
        levels = {
            name: TopologyLevel.objects.create(name=name, order=order) for order, name in enumerate(snapshot.levels)
        }
        domain_ids = {}
        parents = {}
        for depth, level in enumerate(snapshot.levels):
            wanted = {}
            for node in snapshot.nodes:
                key = tuple(node.domains[name] for name in snapshot.levels[: depth + 1])
                wanted.setdefault(key, None)
            rows = [
                Domain(level=levels[level], name=key[-1], parent_id=domain_ids.get(key[:-1]) if depth else None)
                for key in wanted
            ]
            for key, domain in zip(wanted, Domain.objects.bulk_create(rows, batch_size=2000), strict=True):
                domain_ids[key] = domain.pk
                parents[key] = domain.parent_id
        counts["domains"] = len(domain_ids)
        classes = {
            dc.name: DeviceClass.objects.create(
                name=dc.name, selector=selector_of(dc), price_per_hour=f"{dc.price_per_hour:.2f}"
            )
            for dc in snapshot.device_classes
        }
        priorities = {}
        for rc in snapshot.resource_classes:
            value = rc.default_priority
            if value not in priorities:
                priorities[value] = PriorityClass.objects.create(
                    name=f"bench-{value}", value=value, preemptible=rc.preemptible
                )
        resource_classes = {}
        for rc in snapshot.resource_classes:
            resource_classes[rc.name] = ResourceClass.objects.create(
                name=rc.name,
                display_name=rc.name,
                topology_required=rc.topology_required or "",
                topology_preferred=rc.topology_preferred or "",
                priority_class=priorities[rc.default_priority],
                preemptible=rc.preemptible,
                max_devices=rc.max_devices,
                approval_required=rc.approval_required,
            )
            for rank, name in enumerate(rc.device_classes):
                ResourceClassDeviceClass.objects.create(
                    resource_class=resource_classes[rc.name], device_class=classes[name], rank=rank
                )
        cohorts = {c.name: Cohort.objects.create(name=c.name, nominal_quota=c.quota or {}) for c in snapshot.cohorts}
        teams, queues = {}, {}
        for q in snapshot.queues:
            team = teams.get(q.team) or Team.objects.create(name=q.team)
            teams[q.team] = team
            queues[q.name] = Queue.objects.create(
                name=q.name,
                team=team,
                cohort=cohorts.get(q.cohort),
                nominal_quota=q.quota,
                borrowing_limit=q.borrowing_limit,
                lending_limit=q.lending_limit,
                fair_share_weight=q.weight,
                within_queue_preemption=q.within_queue,
                reclaim_within_cohort=q.reclaim_within_cohort,
            )
        # Nodes and devices.
        node_ids = {node.name: index + 1 for index, node in enumerate(snapshot.nodes)}
        shared_counters: dict[str, dict] = {}
        for counter_set in snapshot.counter_sets:
            shared_counters.setdefault(counter_set.node, {})[counter_set.name] = dict(counter_set.counters)
        counts["nodes"] = copy_rows(
            Node,
            ["id", "name", "domain_id", "cordoned", "labels", "shared_counters", "created", "updated"],
            (
                (
                    node_ids[n.name],
                    n.name,
                    domain_ids[tuple(n.domains[name] for name in snapshot.levels)],
                    not n.schedulable,
                    {"inventory": "bench"},
                    shared_counters.get(n.name),
                    now,
                    now,
                )
                for n in snapshot.nodes
            ),
        )
        counts["counter_sets"] = len(snapshot.counter_sets)
        device_ids = {device.id: index + 1 for index, device in enumerate(snapshot.devices)}
        counts["devices"] = copy_rows(
            Device,
            [
                "id",
                "node_id",
                "driver",
                "pool",
                "name",
                "attributes",
                "capacity",
                "health",
                "taints",
                "parent_id",
                "consumes_counters",
            ],
            (
                (
                    device_ids[d.id],
                    node_ids[d.node],
                    d.driver,
                    d.node,
                    d.id.rsplit("/", 1)[1],
                    d.attributes,
                    d.capacity,
                    "Healthy" if d.healthy else "Unhealthy",
                    [{"key": t.key, "value": t.value, "effect": t.effect} for t in d.taints],
                    device_ids.get(partition_parent(d.id)),
                    d.consumes_counters or None,
                )
                for d in snapshot.devices
            ),
        )
        # Running workloads, their pod sets and allocations.
        queue_team = {q.name: q.team for q in snapshot.queues}
        running_rows = []
        pod_rows = []
        allocation_rows = []
        next_id = 1
        for w in snapshot.running:
            started_at = at(w.started)
            duration = None if w.expected_end is None else max(1, round(w.expected_end - w.started))
            running_rows.append(
                (
                    next_id,
                    f"bench-{w.id}",
                    teams[queue_team[w.queue]].pk,
                    queues[w.queue].pk,
                    resource_classes["batch"].pk if "batch" in resource_classes else None,
                    w.priority,
                    w.preemptible,
                    "",
                    duration,
                    State.RUNNING,
                    started_at,
                    started_at,
                    started_at,
                    started_at,
                    classes[w.device_class].pk,
                )
            )
            per_pod = max(len(pod.device_ids) for pod in w.pods)
            pod_rows.append((next_id, "main", len(w.pods), None, per_pod, [], {}))
            for pod in w.pods:
                for device in pod.device_ids:
                    allocation_rows.append(
                        (next_id, device_ids[device], classes[w.device_class].pk, "main", pod.index, started_at)
                    )
            next_id += 1
        counts["running"] = copy_rows(Workload, WORKLOAD_COLUMNS, running_rows)
        pending_rows, next_id = pending_workload_rows(snapshot.pending, next_id, teams, queues, resource_classes, at)
        counts["pending"] = copy_rows(Workload, WORKLOAD_COLUMNS, [row for row, _ in pending_rows])
        pod_rows.extend(pod for _, pods in pending_rows for pod in pods)
        counts["pod_sets"] = copy_rows(PodSet, POD_SET_COLUMNS, pod_rows)
        counts["allocations"] = copy_rows(
            Allocation,
            ["workload_id", "device_id", "device_class_id", "pod_set", "pod_index", "allocated_at"],
            allocation_rows,
        )
        fix_sequences(Node, Device, Workload, PodSet, Allocation)
    ensure_operator()
    analyze()
    counts["seconds"] = round(time.perf_counter() - started, 2)
    return counts


POD_SET_COLUMNS = ["workload_id", "name", "replicas", "min_count", "devices_per_pod", "device_classes", "claim"]


def partition_parent(device_id: str) -> str | None:
    """The whole device a synthetic partition ("<node>/<index>:<profile>#<k>") is cut from, or None."""
    whole, cut, _ = device_id.partition(":")
    return whole if cut else None


def claim_as_dra(pod_set) -> dict:
    """A synthetic pod set's several-request claim as resource.k8s.io/v1 writes it (what the API stores
    in PodSet.claim and the loader reads with claims.claim_from_dra); {} without one."""
    from broker.scheduler.snapshot import DRIVER

    if not pod_set.requests:
        return {}

    def way(sub_request, named):
        written = {"deviceClassName": sub_request.device_class, "count": sub_request.count}
        if sub_request.selectors:
            written["selectors"] = [{"cel": {"expression": cel}} for cel in sub_request.selectors]
        return {"name": sub_request.name, **written} if named else written

    requests = [
        {"name": request.name, "exactly": way(request.exactly, named=False)}
        if request.exactly is not None
        else {"name": request.name, "firstAvailable": [way(sub, named=True) for sub in request.first_available]}
        for request in pod_set.requests
    ]
    constraints = [
        {
            **({"requests": list(constraint.requests)} if constraint.requests else {}),
            "matchAttribute": f"{DRIVER}/{constraint.match_attribute}",
        }
        for constraint in pod_set.constraints
    ]
    return {"requests": requests, **({"constraints": constraints} if constraints else {})}


def pending_workload_rows(pending, next_id, teams, queues, resource_classes, at):
    """[(workload row, [pod set rows])] for synthetic pending workloads, ids from `next_id` on."""
    from broker.workloads.states import State

    team_of = {name: queue.team_id for name, queue in queues.items()}
    rows = []
    for p in pending:
        submitted = at(p.submitted)
        rc = resource_classes.get(p.resource_class)
        rows.append(
            (
                (
                    next_id,
                    f"bench-{next_id}",
                    team_of[p.queue],
                    queues[p.queue].pk,
                    rc.pk if rc else None,
                    p.priority,
                    rc.preemptible if rc and p.preemptible is None else bool(p.preemptible),
                    p.topology_required or "",
                    None if p.expected_duration is None else round(p.expected_duration),
                    State.PENDING,
                    submitted,
                    submitted,
                    None,
                    None,
                    None,
                ),
                [
                    (
                        next_id,
                        ps.name,
                        ps.count,
                        ps.min_count,
                        ps.devices_per_pod,
                        list(ps.device_classes),
                        claim_as_dra(ps),
                    )
                    for ps in p.pod_sets
                ],
            )
        )
        next_id += 1
    return rows, next_id


def add_pending(pending) -> int:
    """Insert more pending workloads (synthetic PendingWorkload) into the populated database."""
    from django.db import transaction
    from django.db.models import Max
    from django.utils import timezone

    from broker.policy.models import Queue, ResourceClass
    from broker.workloads.models import PodSet, Workload

    now = timezone.now()
    queues = {q.name: q for q in Queue.objects.all()}
    resource_classes = {rc.name: rc for rc in ResourceClass.objects.all()}
    start = (Workload.objects.aggregate(top=Max("id"))["top"] or 0) + 1
    horizon = max((p.submitted for p in pending), default=0.0)

    def at(seconds):
        # Newer than everything already queued, in the synthetic order.
        return now - timedelta(seconds=horizon - seconds) / 1000

    rows, _ = pending_workload_rows(pending, start, None, queues, resource_classes, at)
    with transaction.atomic():
        count = copy_rows(Workload, WORKLOAD_COLUMNS, [row for row, _ in rows])
        copy_rows(PodSet, POD_SET_COLUMNS, [pod for _, pods in rows for pod in pods])
        fix_sequences(Workload, PodSet)
    analyze()
    return count


def analyze() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def ensure_operator():
    from django.contrib.auth.models import Group, User

    from broker.policy import roles

    user = User.objects.filter(username=OPERATOR).first()
    if user is None:
        user = User.objects.create_user(OPERATOR, f"{OPERATOR}@example.com", PASSWORD)
        user.groups.add(Group.objects.get_or_create(name=roles.OPERATOR)[0])
    return user
