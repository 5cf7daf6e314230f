"""Section "waits" (issue 31): does short work wait seconds, not hours, with gangs kept whole and racked?

The same Philly slice as the replay section (bench/replay.py: 552 machines, 2,490 GPUs, 7 trace days from
2017-10-02, arrivals compressed 12x, durations known), replayed through the pure core under two rules:

- today: fair share, priority, age; backfill protection; no preemption (the replay section's rules);
- short waits: the policy of issue 31. Interactive and inference classes preempt preemptible batch and
  training work across queues (ResourceClass.preempts_across_queues, as the demo menu sets it on
  `PREEMPTING_CLASSES`, and set here for this run only); each queue preempts its own lower-priority
  work as the demo's queues do (within_queue LowerPriority: one big virtual cluster runs most of the
  trace, so across queues alone reaches little); a preempted job is requeued at its place in line and pays its class's
  checkpoint-restart cost (60 s of its devices) inside its job completion time; no job is preempted
  before it ran `min_runtime` seconds or more than `max_preemptions` times; among equal priorities the
  shortest expected device-time goes first, aged so nothing starves; the oldest `large_gangs` gangs of
  32+ GPUs keep a planned start and rack that neither admissions nor preemptors may take.

Arrivals stop at the end of the window and the run goes on until every job that arrived has finished, so
job completion time (JCT: finish - submit) covers every job. A cycle runs every `tick` seconds when
something arrived or finished; a cycle that preempts is followed at once by another (as the product asks
for one when victims leave), so a preemptor starts within the tick it was decided in.

Gangs spread over more racks than needed: an admitted job whose pods sit on more racks than the fewest
racks of the cluster that could hold its devices.
"""

from __future__ import annotations

import heapq
import math
import statistics
import time
from dataclasses import dataclass, field, replace

from bench.replay import DEFAULT_START, Cluster, Job, percentile, philly_cluster, trace_jobs
from broker.scheduler.cycle import decide
from broker.scheduler.snapshot import PendingWorkload, PodSet, Queue, RunningPod, RunningWorkload, SchedulerConfig

SIZE_CLASSES = ((1, 1), (2, 4), (5, 8), (9, 31), (32, None))
LARGE_GANG = 32
FOLLOW_UPS = 20  # cycles in a row at one instant, after preemptions, at the most


PREEMPTING_CLASSES = ("small-inference", "interactive-experiment")


@dataclass(frozen=True)
class Rules:
    name: str
    config: SchedulerConfig
    preempting_classes: tuple[str, ...] = ()
    within_queue: str = "Never"  # each queue's own preemption policy (the demo seeds LowerPriority)

    def on(self, cluster: Cluster) -> Cluster:
        """The cluster with this rule's classes preempting across queues."""
        classes = tuple(
            replace(resource_class, preempts_across_queues=resource_class.name in self.preempting_classes)
            for resource_class in cluster.resource_classes
        )
        return replace(cluster, resource_classes=classes)


def today_rules() -> Rules:
    return Rules("today", SchedulerConfig(enable_preemption=False, explain=False, suggestions=False))


def short_wait_rules(
    min_runtime=120.0,
    max_preemptions=3,
    aging=1800.0,
    preemptors_per_queue=64,
    shorter_factor=4.0,
    large_gangs=2,
    within_queue="LowerPriority",
) -> Rules:
    return Rules(
        "short_waits",
        SchedulerConfig(
            enable_preemption=True,
            explain=False,
            suggestions=False,
            preemption_min_runtime_seconds=min_runtime,
            max_preemptions_per_workload=max_preemptions,
            shortest_first_aging_seconds=aging,
            preemptions_per_queue_per_cycle=preemptors_per_queue,
            shorter_remaining_factor=shorter_factor,
            protected_large_gangs=large_gangs,
            large_gang_devices=LARGE_GANG,
        ),
        PREEMPTING_CLASSES,
        within_queue,
    )


@dataclass
class Outcome:
    first_start: dict = field(default_factory=dict)  # job id -> first start
    finish: dict = field(default_factory=dict)
    preemptions: dict = field(default_factory=dict)  # job id -> times preempted
    lost_device_seconds: float = 0.0
    spread: int = 0
    cycles: int = 0
    decide_seconds: float = 0.0


def racks_needed(cluster: Cluster):
    """gpus -> the fewest racks whose devices could hold that many."""
    rack_of = {node.name: node.domains["rack"] for node in cluster.nodes}
    per_rack: dict[str, int] = {}
    for device in cluster.devices:
        per_rack[rack_of[device.node]] = per_rack.get(rack_of[device.node], 0) + 1
    largest = sorted(per_rack.values(), reverse=True)

    def needed(gpus: int) -> int:
        total = 0
        for count, devices in enumerate(largest, start=1):
            total += devices
            if total >= gpus:
                return count
        return len(largest)

    return rack_of, needed


def simulate(cluster: Cluster, jobs: list[Job], rules: Rules, tick: float) -> Outcome:
    cluster = rules.on(cluster)
    names = sorted({job.queue for job in jobs})
    queues = tuple(Queue(name, name, cohort="philly", within_queue=rules.within_queue) for name in names)
    classes = {resource_class.name: resource_class for resource_class in cluster.resource_classes}
    by_id = {job.id: job for job in jobs}
    rack_of, needed = racks_needed(cluster)
    outcome = Outcome()
    pending: dict[str, object] = {}
    running: dict[str, RunningWorkload] = {}
    remaining: dict[str, float] = {job.id: job.duration for job in jobs}
    ends: list[tuple[float, str, float]] = []  # (end, job id, its start): a preempted run's end is stale
    arrival = 0
    now = math.ceil(jobs[0].submit / tick) * tick if jobs else 0.0
    while arrival < len(jobs) or pending or running:
        changed = False
        while arrival < len(jobs) and jobs[arrival].submit <= now:
            pending[jobs[arrival].id] = jobs[arrival].workload
            arrival += 1
            changed = True
        while ends and ends[0][0] <= now:
            end, job_id, started = heapq.heappop(ends)
            run = running.get(job_id)
            if run is None or run.started != started:
                continue
            del running[job_id]
            outcome.finish[job_id] = end
            changed = True
        for _ in range(FOLLOW_UPS):
            if not (changed and pending):
                break
            changed = False
            snapshot = cluster.snapshot(queues, running, pending, now, rules.config)
            started = time.perf_counter()
            result = decide(snapshot)
            outcome.decide_seconds += time.perf_counter() - started
            outcome.cycles += 1
            for admission in result.admissions:
                job = by_id[admission.workload_id]
                workload = pending.pop(job.id)
                outcome.first_start.setdefault(job.id, now)
                end = now + remaining[job.id]
                resource_class = classes[workload.resource_class]
                running[job.id] = RunningWorkload(
                    id=job.id,
                    queue=job.queue,
                    pods=tuple(RunningPod(p.pod_set, p.index, p.node, p.device_ids) for p in admission.pods),
                    device_class=admission.device_class,
                    priority=workload.priority,
                    preemptible=resource_class.preemptible,
                    started=now,
                    expected_end=end,
                    preemptions=outcome.preemptions.get(job.id, 0),
                )
                heapq.heappush(ends, (end, job.id, now))
                if len({rack_of[p.node] for p in admission.pods}) > needed(job.gpus):
                    outcome.spread += 1
            freed: dict[str, list[str]] = {}
            for preemption in result.preemptions:
                victim = running.pop(preemption.victim_id, None)
                if victim is None:
                    continue
                job = by_id[victim.id]
                cost = classes[job.workload.resource_class].checkpoint_restart_seconds
                # The run so far is kept but for the work since the last checkpoint, redone after the restart.
                remaining[job.id] = remaining[job.id] - (now - victim.started) + cost
                outcome.lost_device_seconds += cost * job.gpus
                outcome.preemptions[job.id] = outcome.preemptions.get(job.id, 0) + 1
                # Requeued at its place in line (its submission time), wanting what is left of its run.
                pending[job.id] = replace(job.workload, expected_duration=remaining[job.id])
                devices = [device for pod in victim.pods for device in pod.device_ids]
                freed.setdefault(preemption.preemptor_id, []).extend(devices)
                changed = True
            for preemptor_id, devices in freed.items():
                if preemptor_id in pending:  # what its victims freed is held for it (its nomination)
                    pending[preemptor_id] = replace(pending[preemptor_id], nominated_devices=tuple(sorted(devices)))
        upcoming = [jobs[arrival].submit] if arrival < len(jobs) else []
        if ends:
            upcoming.append(ends[0][0])
        if not upcoming:
            break  # work is left pending that nothing will ever free room for
        now = max(now + tick, math.ceil(min(upcoming) / tick) * tick)
    return outcome


def size_class(gpus: int) -> str:
    for low, high in SIZE_CLASSES:
        if gpus >= low and (high is None or gpus <= high):
            return f"{low}+" if high is None else (f"{low}" if low == high else f"{low}-{high}")
    raise ValueError(gpus)


def wait_figures(waits: list[float]) -> dict:
    return {
        "jobs": len(waits),
        "mean_s": _round(statistics.fmean(waits) if waits else None),
        "median_s": _round(statistics.median(waits) if waits else None),
        "p99_s": _round(percentile(waits, 0.99)),
    }


def summarise(outcome: Outcome, jobs: list[Job]) -> dict:
    done = [job for job in jobs if job.id in outcome.finish]
    jct = [outcome.finish[job.id] - job.submit for job in done]
    waits = {job.id: outcome.first_start[job.id] - job.submit for job in jobs if job.id in outcome.first_start}
    by_size: dict[str, list[float]] = {}
    for job in jobs:
        if job.id in waits:
            by_size.setdefault(size_class(job.gpus), []).append(waits[job.id])
    large = [waits[job.id] for job in jobs if job.gpus >= LARGE_GANG and job.id in waits]
    return {
        "jobs": len(jobs),
        "jobs_finished": len(done),
        "jct_mean_s": _round(statistics.fmean(jct) if jct else None),
        "jct_median_s": _round(statistics.median(jct) if jct else None),
        "wait": wait_figures(list(waits.values())),
        "wait_by_size": {name: wait_figures(by_size[name]) for name in sorted(by_size, key=_size_order)},
        "preemptions": sum(outcome.preemptions.values()),
        "jobs_preempted": len(outcome.preemptions),
        "most_preemptions_of_one_job": max(outcome.preemptions.values(), default=0),
        "lost_device_hours": round(outcome.lost_device_seconds / 3600, 2),
        "gangs_spread_over_extra_racks": outcome.spread,
        "large_gangs": {
            "min_gpus": LARGE_GANG,
            "started": len(large),
            "wait_max_s": _round(max(large) if large else None),
            "wait_mean_s": _round(statistics.fmean(large) if large else None),
        },
        "cycles": outcome.cycles,
        "decide_seconds_total": round(outcome.decide_seconds, 2),
    }


def _size_order(name: str) -> int:
    return int(name.split("-")[0].rstrip("+"))


def _round(value):
    return None if value is None else round(value, 1)


def compare(cluster: Cluster, jobs: list[Job], tick: float) -> dict:
    runs = {}
    for rules in (today_rules(), short_wait_rules()):
        started = time.perf_counter()
        runs[rules.name] = summarise(simulate(cluster, jobs, rules, tick), jobs)
        runs[rules.name]["wall_seconds"] = round(time.perf_counter() - started, 1)
        runs[rules.name]["config"] = {
            key: getattr(rules.config, key)
            for key in (
                "enable_preemption",
                "preemption_min_runtime_seconds",
                "max_preemptions_per_workload",
                "shortest_first_aging_seconds",
                "preemptions_per_queue_per_cycle",
                "shorter_remaining_factor",
                "protected_large_gangs",
                "large_gang_devices",
            )
        }
        runs[rules.name]["within_queue"] = rules.within_queue
    today, short = runs["today"], runs["short_waits"]
    return {
        "tick_s": tick,
        "today": today,
        "short_waits": short,
        "target": target(today, short) if tick == 300.0 else None,
    }


def target(today: dict, short: dict) -> dict:
    large_today, large_short = today["large_gangs"]["wait_max_s"], short["large_gangs"]["wait_max_s"]
    checks = {
        "p99_wait_at_most_300_s": short["wait"]["p99_s"] is not None and short["wait"]["p99_s"] <= 300,
        "mean_jct_at_most_10470_s": short["jct_mean_s"] is not None and short["jct_mean_s"] <= 10_470,
        "no_gang_spread_over_extra_racks": short["gangs_spread_over_extra_racks"] == 0,
        "no_large_gang_waits_longer_than_today": (large_short or 0) <= (large_today or 0),
    }
    return {
        "what": "at a 300 s tick: p99 wait <= 300 s, mean JCT <= 10,470 s (lost work inside), 0 gangs spread "
        "over extra racks, no 32+ GPU gang waiting longer than today",
        "checks": checks,
        "pass": all(checks.values()),
    }


def known_preemption(cluster: Cluster, tick: float = 300.0) -> dict:
    """One machine of the Philly cluster, filled by batch work of ten hours from one queue; ten minutes
    later a two-minute small-inference job of another queue arrives. Today's rules let it wait for the
    batch work to end; the short-waits rules preempt exactly one batch job for it, which costs its
    class's checkpoint-restart seconds on one GPU. The full slice's figures cannot tell a lost-work count
    that is never kept from one that is right when nothing was preempted (a quick run preempts
    nothing): this case's known answer can."""
    node = next(node for node in cluster.nodes if sum(device.node == node.name for device in cluster.devices) >= 2)
    devices = tuple(device for device in cluster.devices if device.node == node.name)
    small = replace(cluster, nodes=(node,), devices=devices)
    classes = {resource_class.name: resource_class for resource_class in small.resource_classes}

    def job(job_id, queue, resource_class, submit, duration):
        workload = PendingWorkload(
            id=job_id,
            queue=queue,
            pod_sets=(PodSet("main", 1, 1, 1),),
            resource_class=resource_class,
            priority=classes[resource_class].default_priority,
            submitted=submit,
            approved=True,
            expected_duration=duration,
        )
        return Job(job_id, submit, duration, 1, queue, workload)

    jobs = [job(f"batch{index}", "vc-batch", "batch-inference", 0.0, 36_000.0) for index in range(len(devices))]
    jobs.append(job("inference", "vc-serving", "small-inference", 600.0, 120.0))
    runs = {}
    for rules in (today_rules(), short_wait_rules()):
        outcome = simulate(small, jobs, rules, tick)
        runs[rules.name] = {
            "preemptions": sum(outcome.preemptions.values()),
            "lost_device_seconds": outcome.lost_device_seconds,
            "inference_wait_s": outcome.first_start["inference"] - 600.0,
        }
    return {
        "machine": node.name,
        "gpus": len(devices),
        "tick_s": tick,
        **runs,
        "expected_short_waits": {
            "preemptions": 1,
            "lost_device_seconds": classes["batch-inference"].checkpoint_restart_seconds,
        },
    }


def section(quick: bool, days: float | None = None, density: float = 12.0, ticks=(300.0, 60.0)) -> dict:
    days = days if days is not None else (1.0 if quick else 7.0)
    cluster = philly_cluster()
    jobs = trace_jobs(DEFAULT_START, days, density, cluster)
    comparisons = [compare(cluster, jobs, tick) for tick in ticks]
    headline = next(c for c in comparisons if c["tick_s"] == ticks[0])
    return {
        "slice": {
            "trace": "philly/philly.csv",
            "start": DEFAULT_START.isoformat(),
            "days": days,
            "density": density,
            "jobs": len(jobs),
            "cluster": {"machines": len(cluster.nodes), "devices": cluster.usable_devices},
        },
        "comparisons": comparisons,
        "known_preemption": known_preemption(cluster),
        "target": headline["target"] or {"what": "measured at 300 s only", "pass": None},
    }
