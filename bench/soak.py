"""The soak (issue 30): 20 concurrent users read pages and the API and submit gangs for SOAK_SECONDS (180)
against the production stack (daphne, a Celery worker and beat, PostgreSQL, Redis) while the worker is
killed with SIGKILL and restarted twice and every PostgreSQL backend of the bench database is
terminated once. Local only: it kills processes it started itself, nothing else.

Reported: requests per second, p50 / p95 / p99 latency, errors (server errors and failed connections)
inside and outside the fault windows, cycles committed, and a check of the database afterwards: no
device held twice, no partial gang, no quota overrun, no admitted workload without devices, no
accepted submission lost. Target: no invariant broken, no submission lost, no error outside the fault
windows (a fault window is the FAULT_WINDOW_SECONDS after a fault starts).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import db
from tests.servers import free_port, wait_for_port

ROOT = Path(__file__).resolve().parent.parent
USERS = 20
MEMBERS = 16  # the rest are operators: they read every team's work
FAULT_WINDOW_SECONDS = 20.0
WORKER_DOWN_SECONDS = 5.0
SUBMIT_SHARE = 0.3
READ_URLS = (
    "/api/workloads/?state=Pending&limit=20",
    "/api/explanations/?limit=20",
    "/api/status/",
    "/dashboard/api/overview/",
    "/dashboard/api/queue/",
    "/queue/",
    "/",
)


def percentile(values, fraction):
    ordered = sorted(values)
    if not ordered:
        return None
    return round(ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered) + 0.5) - 1))], 1)


# ---- the cluster and the users ------------------------------------------------------------------------


def prepare(nodes: int) -> dict:
    """A half-busy synthetic cluster (no pending work), members of the first teams and a few operators,
    each with a session cookie (pages) and an API token (writes: a session would need CSRF)."""
    from django.conf import settings
    from django.contrib.auth.models import Group, User
    from django.test import Client
    from rest_framework.authtoken.models import Token

    from broker.policy import roles
    from broker.policy.models import Team
    from broker.scheduler.synthetic import synthetic_snapshot

    db.reset()
    db.populate(synthetic_snapshot(nodes=nodes, devices_per_node=8, pending=0, busy=0.5))
    teams = list(Team.objects.order_by("name"))
    users = []
    for index in range(USERS):
        member = index < MEMBERS
        user = User.objects.create_user(f"soak-{index:02d}", f"soak-{index:02d}@example.com", "soak-password")
        user.groups.add(Group.objects.get_or_create(name=roles.MEMBER if member else roles.OPERATOR)[0])
        if member:
            teams[index % 8].members.add(user)
        client = Client()
        client.force_login(user)
        users.append(
            {
                "name": user.username,
                "member": member,
                "cookie": {settings.SESSION_COOKIE_NAME: client.cookies[settings.SESSION_COOKIE_NAME].value},
                "token": Token.objects.create(user=user).key,
            }
        )
    return {"users": users, "teams": len(teams)}


# ---- the stack ----------------------------------------------------------------------------------------


def stack_env() -> dict:
    return {
        **os.environ,
        "CYCLE_MODE": "celery",
        "SIMULATION_SPEED": os.environ.get("SOAK_SIMULATION_SPEED", "120"),
        "CYCLE_DEBOUNCE_SECONDS": "0.5",
        "PYTHONUNBUFFERED": "1",
        "DJANGO_SETTINGS_MODULE": "broker.settings",
    }


class Stack:
    """daphne, a Celery worker and beat, each in its own process group (so SIGKILL takes a worker's
    children too), logging to `log_dir`."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.bin = Path(sys.executable).parent
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.processes = {}
        self.logs = []
        self.worker_starts = 0

    def spawn(self, name, argv):
        log = open(self.log_dir / f"soak-{name}.log", "a")  # noqa: SIM115 (closed in stop)
        self.logs.append(log)
        self.processes[name] = subprocess.Popen(
            argv, cwd=ROOT, env=stack_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        return self.processes[name]

    def start(self):
        server = self.spawn(
            "daphne", [str(self.bin / "daphne"), "-b", "127.0.0.1", "-p", str(self.port), "broker.asgi:application"]
        )
        self.start_worker()
        schedule = Path(tempfile.mkdtemp(prefix="soak-beat-")) / "schedule"
        self.spawn(
            "beat", [str(self.bin / "celery"), "-A", "broker", "beat", "--loglevel=WARNING", "-s", str(schedule)]
        )
        wait_for_port(self.port, server, timeout=60)

    def start_worker(self):
        self.worker_starts += 1
        self.spawn(
            "worker",
            [
                str(self.bin / "celery"),
                "-A",
                "broker",
                "worker",
                "--concurrency=1",
                "--loglevel=WARNING",
                "--without-heartbeat",
                "--without-gossip",
                "--without-mingle",
            ],
        )

    def kill_worker(self):
        """SIGKILL to the worker's whole process group: no shutdown, no acknowledgement, mid-cycle if
        one is running."""
        process = self.processes["worker"]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def stop(self):
        for process in self.processes.values():
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                    process.wait(timeout=15)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
        for log in self.logs:
            log.close()


def terminate_backends() -> int:
    """pg_terminate_backend for every other session on the bench database: daphne's, the worker's."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


# ---- the load -----------------------------------------------------------------------------------------


class Load:
    """USERS threads, each a person reading and (members) submitting until `stop` is set."""

    def __init__(self, base: str, users: list[dict], started: float):
        self.base = base
        self.users = users
        self.started = started
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.samples = []  # (seconds since start, ms, status or 0 for a failed connection, kind)
        self.accepted = []  # workload ids answered 201
        self.unanswered = 0  # submissions whose answer never came (stored or not: a fault cut them)

    def record(self, at, ms, status, kind):
        with self.lock:
            self.samples.append((at, ms, status, kind))

    def person(self, index: int, user: dict):
        import requests

        chance = random.Random(index)
        pages = requests.Session()
        pages.cookies.update(user["cookie"])
        api = requests.Session()
        api.headers["Authorization"] = f"Token {user['token']}"
        serial = 0
        while not self.stop.is_set():
            submit = user["member"] and chance.random() < SUBMIT_SHARE
            began = time.perf_counter()
            status = 0
            try:
                if submit:
                    serial += 1
                    body = {
                        "name": f"{user['name']}-{serial}",
                        "resource_class": "batch",
                        "pod_sets": [
                            {"replicas": chance.choice((1, 2, 4)), "devices_per_pod": chance.choice((1, 2, 8))}
                        ],
                        "expected_duration_seconds": chance.choice((600, 1800, 3600)),
                    }
                    response = api.post(f"{self.base}/api/workloads/", json=body, timeout=30)
                    status = response.status_code
                    if status == 201:
                        with self.lock:
                            self.accepted.append(response.json()["id"])
                else:
                    url = chance.choice(READ_URLS)
                    session = api if url.startswith("/api/") else pages
                    status = session.get(f"{self.base}{url}", timeout=30).status_code
            except requests.RequestException:
                if submit:
                    with self.lock:
                        self.unanswered += 1
            finished = time.perf_counter()
            self.record(finished - self.started, (finished - began) * 1000, status, "submit" if submit else "read")
            time.sleep(chance.uniform(0.05, 0.25))

    def start(self):
        self.threads = [
            threading.Thread(target=self.person, args=(index, user), daemon=True)
            for index, user in enumerate(self.users)
        ]
        for thread in self.threads:
            thread.start()

    def finish(self):
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)


# ---- the check ----------------------------------------------------------------------------------------


def invariants(accepted: list[int]) -> dict:
    """Each invariant as the number of rows that break it (0 everywhere is the target)."""
    from collections import defaultdict

    from django.db.models import Count, Q

    from broker.policy.models import Queue
    from broker.workloads.models import Allocation, PodSet, Workload
    from broker.workloads.states import HOLDING_STATES

    active = Allocation.objects.filter(released_at__isnull=True)
    held_twice = active.values("device_id").annotate(n=Count("id")).filter(n__gt=1).count()

    holding = Workload.objects.filter(state__in=HOLDING_STATES)
    held = dict(active.filter(workload__in=holding).values_list("workload_id").annotate(n=Count("id")))
    without_devices = holding.exclude(pk__in=list(held)).count()
    gang = defaultdict(int)
    for workload_id, replicas, min_count, per_pod in PodSet.objects.filter(workload__in=holding).values_list(
        "workload_id", "replicas", "min_count", "devices_per_pod"
    ):
        gang[workload_id] += (min_count or replicas) * per_pod
    partial = sum(1 for workload_id, needed in gang.items() if 0 < held.get(workload_id, 0) < needed)
    # Allocations of workloads that hold nothing any more (ended, requeued) and are not being evicted.
    stray = active.exclude(workload__state__in=HOLDING_STATES).filter(eviction_requested_at__isnull=True).count()

    overrun = quota_overruns(Queue.objects.all(), active)
    stored = set(Workload.objects.filter(pk__in=accepted).values_list("pk", flat=True))
    return {
        "device_held_twice": held_twice,
        "partial_gang": partial,
        "quota_overrun": overrun,
        "admitted_without_devices": without_devices,
        "allocations_of_workloads_not_holding": stray,
        "submissions_lost": len(set(accepted) - stored),
        "submissions_duplicated": len(accepted) - len(set(accepted)),
        "_checked": {
            "active_allocations": active.count(),
            "holding_workloads": holding.count(),
            "pending_workloads": Workload.objects.filter(
                ~Q(state__in=HOLDING_STATES), finished_at__isnull=True
            ).count(),
        },
    }


def quota_overruns(queues, active) -> int:
    """Queues holding more devices of a class than their nominal quota plus what they may borrow: their
    borrowing limit, or with none every other queue's and cohort's quota of that class."""
    from collections import Counter

    from broker.policy.models import Cohort

    used = Counter(
        (queue_id, device_class)
        for queue_id, device_class in active.values_list("workload__queue_id", "device_class__name").iterator()
    )
    queues = list(queues)
    everyone = Counter()
    for holder in [*queues, *Cohort.objects.all()]:
        for device_class, amount in (holder.nominal_quota or {}).items():
            everyone[device_class] += amount
    overruns = 0
    for queue in queues:
        if not queue.nominal_quota:
            continue  # unlimited
        for device_class, amount in (queue.nominal_quota or {}).items():
            borrow = (queue.borrowing_limit or {}).get(device_class)
            ceiling = amount + (borrow if borrow is not None else everyone[device_class] - amount)
            if used[(queue.pk, device_class)] > ceiling:
                overruns += 1
    return overruns


# ---- the section --------------------------------------------------------------------------------------


def in_window(at: float, faults: list[dict]) -> bool:
    return any(fault["at"] <= at <= fault["at"] + FAULT_WINDOW_SECONDS for fault in faults)


def summarize(load: Load, seconds: float, faults: list[dict]) -> dict:
    samples = load.samples
    errors = [(at, status) for at, _ms, status, _kind in samples if status == 0 or status >= 500]
    outside = [error for error in errors if not in_window(error[0], faults)]
    latencies = [ms for _at, ms, status, _kind in samples if status]
    statuses = {}
    for _at, _ms, status, kind in samples:
        key = f"{kind} {status or 'no answer'}"
        statuses[key] = statuses.get(key, 0) + 1
    return {
        "requests": len(samples),
        "requests_per_second": round(len(samples) / seconds, 1),
        "latency_ms": {
            "p50": percentile(latencies, 0.5),
            "p95": percentile(latencies, 0.95),
            "p99": percentile(latencies, 0.99),
        },
        "statuses": dict(sorted(statuses.items())),
        "errors": len(errors),
        "errors_outside_fault_windows": len(outside),
        "errors_outside_at_seconds": [round(at, 1) for at, _ in outside[:20]],
        "submissions_accepted": len(load.accepted),
        "submissions_unanswered": load.unanswered,
    }


def section(quick: bool, log_dir: Path) -> dict:
    from django.conf import settings
    from django.utils import timezone

    from broker.workloads.models import SchedulingCycle

    if not settings.REDIS_URL:
        return {"skipped": "REDIS_URL is not set: the soak runs Celery and the channel layer on Redis"}
    seconds = float(os.environ.get("SOAK_SECONDS", "30" if quick else "180"))
    setup = prepare(nodes=16 if quick else 64)
    log_dir.mkdir(parents=True, exist_ok=True)
    stack = Stack(log_dir)
    faults = []
    began_at = timezone.now()
    stack.start()
    try:
        started = time.perf_counter()
        load = Load(stack.base, setup["users"], started)
        load.start()
        plan = [(0.2, "worker killed"), (0.45, "database backends terminated"), (0.7, "worker killed")]
        for fraction, what in plan:
            time.sleep(max(0.0, started + fraction * seconds - time.perf_counter()))
            fault = {"what": what, "at": round(time.perf_counter() - started, 1)}
            if what == "worker killed":
                stack.kill_worker()
                time.sleep(WORKER_DOWN_SECONDS)
                stack.start_worker()
            else:
                fault["backends"] = terminate_backends()
            faults.append(fault)
        time.sleep(max(0.0, started + seconds - time.perf_counter()))
        load.finish()
        elapsed = time.perf_counter() - started
        time.sleep(5)  # the last submissions' cycle
    finally:
        stack.stop()
    from django.db import connection

    connection.close()  # its backend was terminated with the others
    result = summarize(load, elapsed, faults)
    cycles = SchedulingCycle.objects.filter(started_at__gte=began_at)
    result["cycles_committed"] = cycles.filter(outcome=SchedulingCycle.Outcome.COMMITTED).count()
    result["cycles_not_committed"] = cycles.exclude(outcome=SchedulingCycle.Outcome.COMMITTED).count()
    result["invariants"] = invariants(load.accepted)
    broken = {name: n for name, n in result["invariants"].items() if not name.startswith("_") and n}
    result.update(
        {
            "seconds": round(elapsed, 1),
            "users": USERS,
            "faults": faults,
            "fault_window_seconds": FAULT_WINDOW_SECONDS,
            "worker_starts": stack.worker_starts,
            "target": {
                "what": "0 invariant violations, 0 lost submissions, 0 server errors outside the fault windows",
                "broken": broken,
                "pass": not broken and result["errors_outside_fault_windows"] == 0,
            },
        }
    )
    return result
