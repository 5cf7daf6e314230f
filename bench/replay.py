"""A discrete-event replay of a slice of the Philly trace through the pure decision core (issue 5, and
the estimated-start error of issue 4). No database, no clock: simulated seconds only.

The cluster is the 552-machine Philly inventory (cluster_machine_list.csv) with the demo's deterministic
racks, blocks and zones (broker.demo.inventory.place), its device classes and its resource-class menu
(priorities, topology requirements, fallback order). Jobs come from philly.csv in submit order:
`num_gpus` -> pods of up to 8 devices (broker.cycle.replay.pod_shape), the resource class by size and
duration (broker.cycle.replay.resource_class_for), the Philly virtual cluster -> team and queue.

Simplifications, the same for both runs:
- queues have no quota (every virtual cluster may use the whole cluster), fair share with equal
  weights orders them; preemption is off, so what differs between the runs is only the backfill rule;
- every class is open to every team and approvals are granted (no NotEntitled / AwaitingApproval);
- arrivals are compressed `density` times (as the demo's REPLAY_DENSITY does: Philly kept only ~15% of
  its GPUs busy), durations are the trace's own and known to the scheduler (expected = actual);
- a cycle runs every `tick` simulated seconds, but only when something arrived or completed since the
  last one (a cycle on an unchanged state decides the same); completions free devices at the next tick.
"""

from __future__ import annotations

import heapq
import math
import statistics
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from broker.scheduler.cycle import decide
from broker.scheduler.snapshot import (
    Cohort,
    Device,
    DeviceClass,
    Node,
    PendingWorkload,
    PodSet,
    Queue,
    Reservation,
    ResourceClass,
    RunningPod,
    RunningWorkload,
    SchedulerConfig,
    Snapshot,
)

LARGE_GANG = 32  # GPUs: "the largest gangs" of the report
LONG_WAIT = 300.0  # simulated seconds: estimates are judged on work that waited at least this long
DEFAULT_START = datetime(2017, 10, 2)  # the busiest week of the trace's dense part (11k jobs)


@dataclass(frozen=True)
class Job:
    id: str
    submit: float  # simulated seconds since the slice start
    duration: float
    gpus: int
    queue: str
    workload: PendingWorkload


@dataclass
class Cluster:
    levels: tuple
    nodes: tuple
    devices: tuple
    device_classes: tuple
    resource_classes: tuple

    @property
    def usable_devices(self) -> int:
        return len(self.devices)

    def snapshot(self, queues, running: dict, pending: dict, now: float, config, reservations=()) -> Snapshot:
        """The cluster at `now` with this running and pending work, its queues in one cohort."""
        return Snapshot(
            levels=self.levels,
            nodes=self.nodes,
            devices=self.devices,
            device_classes=self.device_classes,
            cohorts=(Cohort("philly"),),
            queues=queues,
            resource_classes=self.resource_classes,
            reservations=reservations,
            running=tuple(running.values()),
            pending=tuple(pending.values()),
            now=now,
            config=config,
        )


def philly_cluster() -> Cluster:
    """The demo's Philly inventory as plain snapshot data (no database)."""
    from broker.demo import inventory as demo

    placed = demo.place(demo.philly_machines())
    nodes, devices = [], []
    for p in placed:
        nodes.append(Node(p.machine.name, {"zone": p.zone, "block": p.block, "rack": p.rack}))
        for index in range(p.machine.devices):
            devices.append(Device(f"{p.machine.name}/{index}", p.machine.name, demo.DRIVER, {**p.machine.attributes}))
    classes = tuple(
        DeviceClass(spec.name, selector=spec.selector, price_per_hour=float(spec.price_per_hour))
        for spec in demo.device_classes_for("philly")
    )
    priorities = {name: value for name, value, _, _ in demo.PRIORITY_CLASSES}
    resource_classes = tuple(
        ResourceClass(
            name=spec["name"],
            device_classes=tuple(demo.MENU["philly"][spec["name"]]),
            topology_required=spec.get("topology_required") or None,
            topology_preferred=spec.get("topology_preferred") or None,
            approval_required=spec.get("approval_required", False),
            default_priority=priorities[spec["priority_class"]],
            preemptible=spec.get("preemptible", True),
            max_devices=spec.get("max_devices"),
            preempts_across_queues=spec.get("preempts_across_queues", False),
        )
        for spec in demo.RESOURCE_CLASSES
    )
    return Cluster(("zone", "block", "rack"), tuple(nodes), tuple(devices), classes, resource_classes)


def trace_jobs(start: datetime, days: float, density: float, cluster: Cluster) -> list[Job]:
    """Jobs submitted in [start, start + days) of the trace, on the compressed simulated clock."""
    from broker.cycle.replay import load_jobs, pod_shape, resource_class_for, trace_path

    end = start + timedelta(days=days)
    rc = {r.name: r for r in cluster.resource_classes}
    jobs = []
    for job in load_jobs(str(trace_path()), None):
        if not start <= job.submitted < end:
            continue
        pods, per_pod = pod_shape(job.num_gpus)
        name = resource_class_for(job.num_gpus, job.duration)
        submit = (job.submitted - start).total_seconds() / density
        workload = PendingWorkload(
            id=f"j{job.index:06d}",
            queue=job.cluster,
            pod_sets=(PodSet("main", pods, pods, per_pod),),
            resource_class=name,
            priority=rc[name].default_priority,
            submitted=submit,
            approved=True,
            expected_duration=float(job.duration),
        )
        jobs.append(Job(workload.id, submit, float(job.duration), pods * per_pod, job.cluster, workload))
    jobs.sort(key=lambda j: (j.submit, j.id))
    return jobs


@dataclass
class Run:
    backfill: bool
    started: dict = field(default_factory=dict)  # job id -> start time
    first_estimate: dict = field(default_factory=dict)  # job id -> estimated start at its first pending cycle
    busy_seconds: float = 0.0
    cycles: int = 0
    decide_seconds: float = 0.0
    max_decide_seconds: float = 0.0
    max_pending: int = 0
    reasons: dict = field(default_factory=dict)


def simulate(
    cluster: Cluster,
    jobs: list[Job],
    backfill: bool,
    tick: float,
    horizon: float,
    depth: int = SchedulerConfig.backfill_depth,
    ahead: bool = True,
    reservations: tuple = (),
) -> Run:
    """Replay `jobs` until `horizon` simulated seconds; returns what happened. `depth`: backfill depth
    (1 = the head of the line only, the rule before issue 27); `ahead`: reservation windows hold their
    nodes before they open (Slurm's rule) or only once open (before issue 27)."""
    queues = tuple(Queue(name, name, cohort="philly") for name in sorted({job.queue for job in jobs}))
    config = SchedulerConfig(
        enable_backfill_protection=backfill,
        backfill_depth=depth,
        reservations_ahead=ahead,
        enable_preemption=False,
        explain=True,
        suggestions=False,
    )
    by_id = {job.id: job for job in jobs}
    run = Run(backfill)
    pending: dict[str, PendingWorkload] = {}
    running: dict[str, RunningWorkload] = {}
    ends: list[tuple[float, str]] = []
    arrival = 0
    now = math.ceil(jobs[0].submit / tick) * tick if jobs else horizon + 1
    while now <= horizon:
        changed = False
        while arrival < len(jobs) and jobs[arrival].submit <= now:
            pending[jobs[arrival].id] = jobs[arrival].workload
            arrival += 1
            changed = True
        while ends and ends[0][0] <= now:
            _, job_id = heapq.heappop(ends)
            running.pop(job_id)
            changed = True
        if changed and pending:
            snapshot = cluster.snapshot(queues, running, pending, now, config, reservations)
            started = time.perf_counter()
            result = decide(snapshot)
            spent = time.perf_counter() - started
            run.cycles += 1
            run.decide_seconds += spent
            run.max_decide_seconds = max(run.max_decide_seconds, spent)
            run.max_pending = max(run.max_pending, len(pending))
            for admission in result.admissions:
                job = by_id[admission.workload_id]
                del pending[job.id]
                run.started[job.id] = now
                end = now + job.duration
                running[job.id] = RunningWorkload(
                    id=job.id,
                    queue=job.queue,
                    pods=tuple(RunningPod(p.pod_set, p.index, p.node, p.device_ids) for p in admission.pods),
                    device_class=admission.device_class,
                    priority=job.workload.priority,
                    preemptible=False,
                    started=now,
                    expected_end=end,
                )
                heapq.heappush(ends, (end, job.id))
                run.busy_seconds += job.gpus * (min(end, horizon) - now)
            for decision in result.pending:
                if decision.workload_id not in run.first_estimate:
                    run.first_estimate[decision.workload_id] = decision.estimated_start
                run.reasons[decision.reason] = run.reasons.get(decision.reason, 0) + 1
        upcoming = [jobs[arrival].submit] if arrival < len(jobs) else []
        if ends:
            upcoming.append(ends[0][0])
        if not upcoming:
            break
        # Compress: the next tick at which something arrives or completes.
        now = max(now + tick, math.ceil(min(upcoming) / tick) * tick)
    return run


def percentile(values, fraction):
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))
    return ordered[index]


def summarise(run: Run, cluster: Cluster, jobs: list[Job], horizon: float) -> dict:
    arrived = [job for job in jobs if job.submit <= horizon]
    waits = [run.started[job.id] - job.submit for job in arrived if job.id in run.started]
    large = [job for job in arrived if job.gpus >= LARGE_GANG]
    large_started = [run.started[job.id] - job.submit for job in large if job.id in run.started]
    large_unstarted = [horizon - job.submit for job in large if job.id not in run.started]
    errors = [
        abs(run.first_estimate[job.id] - run.started[job.id])
        for job in arrived
        if run.first_estimate.get(job.id) is not None and job.id in run.started
    ]
    # Issue 27: the error as a share of the actual wait, for work that waited at least 5 minutes.
    shares = [
        abs(run.first_estimate[job.id] - run.started[job.id]) / (run.started[job.id] - job.submit)
        for job in arrived
        if run.first_estimate.get(job.id) is not None
        and job.id in run.started
        and run.started[job.id] - job.submit >= LONG_WAIT
    ]
    long_waits = [job for job in arrived if job.id in run.started and run.started[job.id] - job.submit >= LONG_WAIT]
    pended = [job for job in arrived if job.id in run.first_estimate]
    with_estimate = [job for job in pended if run.first_estimate[job.id] is not None]
    return {
        "backfill_protection": run.backfill,
        "jobs_arrived": len(arrived),
        "jobs_started": len(waits),
        "jobs_never_started": len(arrived) - len(waits),
        "utilisation": round(run.busy_seconds / (cluster.usable_devices * horizon), 4),
        "wait_median_s": _round(statistics.median(waits) if waits else None),
        "wait_p99_s": _round(percentile(waits, 0.99)),
        "large_gangs": {
            "min_gpus": LARGE_GANG,
            "arrived": len(large),
            "started": len(large_started),
            "never_started": len(large_unstarted),
            "max_wait_started_s": _round(max(large_started) if large_started else None),
            # Censored at the end of the slice: a gang that never started waited at least this long.
            "max_wait_including_unstarted_s": _round(max(large_started + large_unstarted, default=None)),
        },
        "estimated_start": {
            "workloads_pending_at_least_once": len(pended),
            "with_estimate": len(with_estimate),
            "measured": len(errors),
            "abs_error_median_s": _round(statistics.median(errors) if errors else None),
            "abs_error_p90_s": _round(percentile(errors, 0.9)),
            "waited_at_least_5_min": len(long_waits),
            "measured_waited_at_least_5_min": len(shares),
            "abs_error_share_of_wait_median": _round3(statistics.median(shares) if shares else None),
            "abs_error_share_of_wait_p90": _round3(percentile(shares, 0.9)),
            "target_median_share": 0.25,
        },
        "cycles": run.cycles,
        "decide_seconds_total": round(run.decide_seconds, 2),
        "decide_seconds_max": round(run.max_decide_seconds, 4),
        "max_pending": run.max_pending,
        "pending_reasons_cycle_sum": dict(sorted(run.reasons.items())),
    }


def _round(value):
    return None if value is None else round(value, 1)


def _round3(value):
    return None if value is None else round(value, 3)


def reservation_for(cluster: Cluster, jobs: list[Job], horizon: float) -> Reservation:
    """The replay's reservation: the busiest virtual cluster (team) holds the devices of one block of the
    largest device class from a quarter to a half of the slice."""
    from collections import Counter

    team = Counter(job.queue for job in jobs).most_common(1)[0][0]
    block = sorted({node.domains["block"] for node in cluster.nodes})[0]
    in_block = {node.name for node in cluster.nodes if node.domains["block"] == block}
    count = sum(1 for device in cluster.devices if device.node in in_block) // 2
    from broker.scheduler.selectors import ClassMatcher

    matcher = ClassMatcher(cluster.device_classes)
    in_block_classes = Counter(
        name for device in cluster.devices if device.node in in_block for name in matcher.classes_of(device)
    )
    device_class = in_block_classes.most_common(1)[0][0]
    return Reservation(
        "replay-window", team, device_class, count, domain={"block": block}, start=horizon / 4, end=horizon / 2
    )


def reserved_team_wait(run: Run, jobs: list[Job], reservation: Reservation) -> dict:
    """Waits of the reserving team's jobs submitted while its window was open."""
    waits = [
        run.started[job.id] - job.submit
        for job in jobs
        if job.queue == reservation.team and reservation.start <= job.submit < reservation.end and job.id in run.started
    ]
    return {
        "team": reservation.team,
        "jobs_in_window": sum(
            1 for j in jobs if j.queue == reservation.team and reservation.start <= j.submit < reservation.end
        ),
        "wait_median_s": _round(statistics.median(waits) if waits else None),
        "wait_p90_s": _round(percentile(waits, 0.9)),
    }


def replay_section(quick: bool, days: float | None = None, density: float | None = None, tick: float = 60.0):
    """Both runs (protection on and off) on the same slice, and the ratios between them."""
    days = days if days is not None else (1.0 if quick else 7.0)
    density = density if density is not None else 12.0
    cluster = philly_cluster()
    jobs = trace_jobs(DEFAULT_START, days, density, cluster)
    horizon = days * 86400.0 / density
    reservation = reservation_for(cluster, jobs, horizon)
    # protection on (the default depth, windows held ahead: the rules now), the rules before issue 27 (the head of
    # the line only, a window holds nothing until it opens), and protection off; one reservation in all.
    variants = {
        "protection_on": {"backfill": True},
        "before_issue_27": {"backfill": True, "depth": 1, "ahead": False},
        "protection_off": {"backfill": False},
    }
    runs = {}
    for name, options in variants.items():
        started = time.perf_counter()
        depth = options.get("depth", SchedulerConfig.backfill_depth)
        run = simulate(
            cluster, jobs, options["backfill"], tick, horizon, depth, options.get("ahead", True), (reservation,)
        )
        runs[name] = summarise(run, cluster, jobs, horizon)
        runs[name]["backfill_depth"] = depth if options["backfill"] else 0
        runs[name]["reservations_ahead"] = options.get("ahead", True)
        runs[name]["reserved_team"] = reserved_team_wait(run, jobs, reservation)
        runs[name]["wall_seconds"] = round(time.perf_counter() - started, 1)
    on, off, before = runs["protection_on"], runs["protection_off"], runs["before_issue_27"]
    return {
        "slice": {
            "trace": "philly/philly.csv",
            "start": DEFAULT_START.isoformat(),
            "days": days,
            "density": density,
            "simulated_hours": round(horizon / 3600, 1),
            "tick_s": tick,
            "cluster": {"machines": len(cluster.nodes), "devices": cluster.usable_devices},
            "jobs": len(jobs),
            "preemption": False,
            "quota": "none (fair share between virtual clusters only)",
        },
        "reservation": {
            "team": reservation.team,
            "devices": reservation.count,
            "domain": reservation.domain,
            "window_s": [reservation.start, reservation.end],
        },
        "protection_on": on,
        "before_issue_27": before,
        "protection_off": off,
        "ratios": {
            "utilisation_on_over_before": _ratio(on["utilisation"], before["utilisation"]),
            "large_max_wait_on_over_before": _ratio(
                on["large_gangs"]["max_wait_including_unstarted_s"],
                before["large_gangs"]["max_wait_including_unstarted_s"],
            ),
            "reserved_team_wait_median_on_over_before": _ratio(
                on["reserved_team"]["wait_median_s"], before["reserved_team"]["wait_median_s"]
            ),
            "utilisation_on_over_off": _ratio(on["utilisation"], off["utilisation"]),
            "wait_median_on_over_off": _ratio(on["wait_median_s"], off["wait_median_s"]),
            "large_max_wait_on_over_off": _ratio(
                on["large_gangs"]["max_wait_including_unstarted_s"],
                off["large_gangs"]["max_wait_including_unstarted_s"],
            ),
        },
    }


def _ratio(a, b):
    if a is None or b in (None, 0):
        return None
    return round(a / b, 3)
