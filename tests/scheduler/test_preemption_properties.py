"""Properties of preemption over many cycles (issue 31): no job is preempted more often than the bound or
before its minimum run time since it last (re)started, none by a rule its classes and queues do not
allow; and short work never makes room inside the domain held for a protected large gang."""

from dataclasses import dataclass, field, replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.scheduler.cycle import Cycle, decide
from broker.scheduler.snapshot import (
    Cohort,
    Device,
    DeviceClass,
    Node,
    PendingWorkload,
    PodSet,
    Queue,
    ResourceClass,
    RunningPod,
    RunningWorkload,
    SchedulerConfig,
    Snapshot,
)

BOUNDED = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NOW = 100_000.0
CLASSES = {
    "inference": ResourceClass("inference", ("gpu",), default_priority=1000, preemptible=False,
                               preempts_across_queues=True),
    "interactive": ResourceClass("interactive", ("gpu",), default_priority=500, preemptible=True,
                                 preempts_across_queues=True),
    "training": ResourceClass("training", ("gpu",), topology_required="rack", default_priority=300,
                              preemptible=True),
    "batch": ResourceClass("batch", ("gpu",), default_priority=100, preemptible=True),
}  # fmt: skip
QUEUES = ("qa", "qb", "qc")  # qc stands alone, outside the cohort
RACKS = ("r0", "r1", "r2")
PER_NODE = 4


def inventory():
    nodes = tuple(Node(f"{rack}n{i}", {"rack": rack}) for rack in RACKS for i in range(2))
    devices = tuple(
        Device(f"{node.name}/{i}", node.name, attributes={"model": "g"}) for node in nodes for i in range(4)
    )
    return nodes, devices


def queues(policies):
    return tuple(
        Queue(name, name, cohort=None if name == "qc" else "all", within_queue=policies[name]) for name in QUEUES
    )


def devices_of(workload) -> int:
    return sum(pod_set.gang_size * pod_set.devices_per_pod for pod_set in workload.pod_sets)


@st.composite
def arrivals(draw, count, long_first=0):
    """`count` jobs; the first `long_first` of them batch or training work of hours, to be preempted."""
    jobs = []
    for index in range(count):
        kinds = ("training", "batch") if index < long_first else ("inference", "interactive", "training", "batch")
        kind = draw(st.sampled_from(kinds))
        if kind == "training":
            pods, per_pod = draw(st.sampled_from(((1, 2), (2, 4), (1, 4))))
        else:
            pods, per_pod = 1, draw(st.sampled_from((1, 1, 2)))
        jobs.append(
            PendingWorkload(
                id=f"j{index:02d}",
                queue=draw(st.sampled_from(QUEUES)),
                pod_sets=(PodSet("main", pods, pods, per_pod),),
                resource_class=kind,
                priority=CLASSES[kind].default_priority,
                submitted=NOW + (0 if index < long_first else draw(st.integers(0, 3600))),
                approved=True,
                expected_duration=float(
                    draw(st.sampled_from((14_400, 36_000) if index < long_first else (120, 300, 900, 3600, 14_400)))
                ),
                # Some short work of a PriorityClass that never preempts (Kubernetes preemptionPolicy).
                preemption_policy="PreemptLowerPriority"
                if index < long_first
                else draw(st.sampled_from(("PreemptLowerPriority", "PreemptLowerPriority", "Never"))),
            )
        )
    return sorted(jobs, key=lambda job: (job.submitted, job.id))


@st.composite
def policies(draw):
    config = SchedulerConfig(
        explain=False,
        suggestions=False,
        preemptions_per_queue_per_cycle=draw(st.sampled_from((1, 4))),
        preemption_min_runtime_seconds=draw(st.sampled_from((0.0, 120.0, 600.0))),
        max_preemptions_per_workload=draw(st.sampled_from((None, 1, 2))),
        shorter_remaining_factor=draw(st.sampled_from((None, 2.0, 4.0))),
        shortest_first_aging_seconds=draw(st.sampled_from((None, 600.0))),
        protected_large_gangs=draw(st.sampled_from((0, 1))),
        large_gang_devices=8,
    )
    within = {name: draw(st.sampled_from(("Never", "LowerPriority", "LowerOrNewerEqualPriority"))) for name in QUEUES}
    return config, within


@dataclass
class Replay:
    """A few cycles of a tiny cluster, with preempted jobs requeued as the bench's waits section does."""

    config: SchedulerConfig
    within: dict
    original: dict  # job id -> its workload as it arrived
    running: dict = field(default_factory=dict)
    pending: dict = field(default_factory=dict)
    remaining: dict = field(default_factory=dict)
    preempted: dict = field(default_factory=dict)  # job id -> times, counted here, not read from the records
    last_start: dict = field(default_factory=dict)

    def snapshot(self, now):
        nodes, devices = inventory()
        return Snapshot(
            levels=("rack",),
            nodes=nodes,
            devices=devices,
            device_classes=(DeviceClass("gpu", match={"model": "g"}),),
            cohorts=(Cohort("all"),),
            queues=queues(self.within),
            resource_classes=tuple(CLASSES.values()),
            running=tuple(self.running.values()),
            pending=tuple(self.pending.values()),
            now=now,
            config=self.config,
        )

    def apply(self, snapshot, result):
        now = snapshot.now
        for admission in result.admissions:
            workload = self.pending.pop(admission.workload_id)
            self.remaining.setdefault(workload.id, workload.expected_duration)
            self.last_start[workload.id] = now
            self.running[workload.id] = RunningWorkload(
                id=workload.id,
                queue=workload.queue,
                pods=tuple(RunningPod(p.pod_set, p.index, p.node, p.device_ids) for p in admission.pods),
                device_class=admission.device_class,
                priority=workload.priority,
                preemptible=CLASSES[workload.resource_class].preemptible,
                started=now,
                expected_end=now + self.remaining[workload.id],
                preemptions=self.preempted.get(workload.id, 0),
            )
        for preemption in result.preemptions:
            victim = self.running.pop(preemption.victim_id)
            self.preempted[victim.id] = self.preempted.get(victim.id, 0) + 1
            self.remaining[victim.id] -= now - victim.started
            self.pending[victim.id] = replace(self.original[victim.id], expected_duration=self.remaining[victim.id])

    def finish(self, now):
        for job_id in [job_id for job_id, run in self.running.items() if run.expected_end <= now]:
            del self.running[job_id]


def check_allowed(preemption, snapshot, config, within):
    """The rule named is one the classes and queues allow, and the victim is not protected from it."""
    victims = {workload.id: workload for workload in snapshot.running}
    preemptors = {workload.id: workload for workload in snapshot.pending}
    victim, preemptor = victims[preemption.victim_id], preemptors[preemption.preemptor_id]
    assert preemptor.preemption_policy != "Never", "work whose class never preempts made room by preempting"
    cohort = {queue.name: queue.cohort for queue in snapshot.queues}
    now = snapshot.now
    assert victim.preemptible and not victim.evicting
    assert now - victim.started >= config.preemption_min_runtime_seconds, "preempted before its minimum run time"
    bound = config.max_preemptions_per_workload
    assert bound is None or victim.preemptions < bound
    same_cohort = cohort[victim.queue] is not None and cohort[victim.queue] == cohort[preemptor.queue]
    if preemption.rule == "WithinQueue":
        assert victim.queue == preemptor.queue
        policy = within[victim.queue]
        assert policy != "Never"
        newer_equal = victim.priority == preemptor.priority and victim.started > preemptor.submitted
        assert victim.priority < preemptor.priority or (policy == "LowerOrNewerEqualPriority" and newer_equal)
    elif preemption.rule == "ClassPriority":
        assert CLASSES[preemptor.resource_class].preempts_across_queues
        assert victim.queue != preemptor.queue and same_cohort
        assert victim.priority < preemptor.priority
    elif preemption.rule == "ShorterRemaining":
        assert config.shorter_remaining_factor is not None
        assert victim.queue == preemptor.queue or same_cohort
        assert victim.priority == preemptor.priority
        wanted = config.shorter_remaining_factor * preemptor.expected_duration * devices_of(preemptor)
        assert (victim.expected_end - now) * victim.device_count >= wanted
    else:  # no quota and no reservation here: the rules that need them have nothing to reclaim
        raise AssertionError(f"unexpected rule {preemption.rule}")


@BOUNDED
@given(
    policies(),
    arrivals(24, long_first=14),
    st.lists(st.sampled_from((0.0, 60.0, 300.0, 900.0)), min_size=10, max_size=10),
)
def test_it_never_preempts_beyond_the_bound_the_minimum_run_time_or_the_rules(policy, jobs, steps):
    config, within = policy
    replay = Replay(config, within, {job.id: job for job in jobs})
    now, arrived = NOW, 0
    for step in steps:
        now += step
        replay.finish(now)
        while arrived < len(jobs) and jobs[arrived].submitted <= now:
            replay.pending[jobs[arrived].id] = jobs[arrived]
            arrived += 1
        snapshot = replay.snapshot(now)
        result = decide(snapshot)
        for preemption in result.preemptions:
            check_allowed(preemption, snapshot, config, within)
            # Counted over the whole replay, not only from the record's own count.
            assert now - replay.last_start[preemption.victim_id] >= config.preemption_min_runtime_seconds
        replay.apply(snapshot, result)
        bound = config.max_preemptions_per_workload
        assert bound is None or max(replay.preempted.values(), default=0) <= bound


@st.composite
def protected_cases(draw):
    """Racks busy with single-node work that ends at various times, one or two waiting large gangs
    (one whole rack each), short work that may preempt, and the policies."""
    config, within = draw(policies())
    config = replace(config, protected_large_gangs=draw(st.sampled_from((1, 2))), preemptions_per_queue_per_cycle=8)
    running = []
    for rack in RACKS:
        for position in range(2):
            node, first = f"{rack}n{position}", 0
            while first < PER_NODE:  # full: short work makes room by preempting, or waits
                count = draw(st.integers(1, PER_NODE - first))
                running.append(
                    RunningWorkload(
                        id=f"run-{node}-{first}",
                        queue=draw(st.sampled_from(QUEUES)),
                        pods=(RunningPod("main", 0, node, tuple(f"{node}/{i}" for i in range(first, first + count))),),
                        device_class="gpu",
                        priority=draw(st.sampled_from((100, 100, 300))),
                        preemptible=draw(st.integers(0, 5)) > 0,
                        started=NOW - draw(st.sampled_from((60, 3600, 7200))),
                        expected_end=NOW + draw(st.sampled_from((300, 1800, 7200, 36_000))),
                    )
                )
                first += count
    gangs = [
        PendingWorkload(
            id=f"gang{index}",
            queue=draw(st.sampled_from(QUEUES)),
            pod_sets=(PodSet("main", 2, 2, 4),),
            resource_class="training",
            priority=300,
            submitted=NOW - draw(st.integers(600, 7200)),
            approved=True,
            expected_duration=36_000.0,
        )
        for index in range(draw(st.integers(1, 2)))
    ]
    short = [replace(job, submitted=NOW - 5) for job in draw(arrivals(draw(st.integers(2, 8)))) if devices_of(job) < 8]
    return running, gangs + short, config, within


@BOUNDED
@given(protected_cases())
def test_it_never_lets_short_work_make_room_in_a_protected_large_gangs_domain(case):
    running, pending, config, within = case
    nodes, devices = inventory()
    snapshot = Snapshot(
        levels=("rack",),
        nodes=nodes,
        devices=devices,
        device_classes=(DeviceClass("gpu", match={"model": "g"}),),
        cohorts=(Cohort("all"),),
        queues=queues(within),
        resource_classes=tuple(CLASSES.values()),
        running=tuple(running),
        pending=tuple(pending),
        now=NOW,
        config=config,
    )
    cycle = Cycle(snapshot)
    result = cycle.run()

    node_index = {name: index for index, name in enumerate(cycle.state.node_names)}
    victims = {workload.id: workload for workload in running}
    # The oldest large gangs are protected before anything is decided: every decision comes after them.
    first = [protection for protection in cycle.protections if protection.workload_id in cycle.protected_first]
    assert len(first) <= config.protected_large_gangs
    for protection in first:
        start = protection.planned_start
        # Work that ends before the gang's planned start delays nothing: it may use the gang's nodes.
        past = {workload.id for workload in pending if start is None or NOW + workload.expected_duration > start} - {
            protection.workload_id
        }
        for preemption in result.preemptions:
            if preemption.preemptor_id in past:
                victim_nodes = {node_index[pod.node] for pod in victims[preemption.victim_id].pods}
                assert victim_nodes.isdisjoint(protection.nodes), (preemption, protection)
        for admission in result.admissions:
            if admission.workload_id in past:
                assert {node_index[pod.node] for pod in admission.pods}.isdisjoint(protection.nodes)
