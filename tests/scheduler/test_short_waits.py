"""Short work waits seconds (issue 31): classes that may preempt across queues, protection from thrashing,
and shortest-first order with aging."""

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.scheduler.cycle import decide
from broker.scheduler.ordering import expected_device_seconds, shortest_first_key
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

NOW = 10_000.0
INTERACTIVE = ResourceClass("interactive", ("gpu",), default_priority=500, preempts_across_queues=True)
BATCH = ResourceClass("batch", ("gpu",), default_priority=100, preemptible=True)


def cluster(devices=2):
    nodes = (Node("n1", {"rack": "r1"}),)
    return {
        "levels": ("rack",),
        "nodes": nodes,
        "devices": tuple(Device(f"n1/{i}", "n1", attributes={"model": "g"}) for i in range(devices)),
        "device_classes": (DeviceClass("gpu", match={"model": "g"}),),
        "cohorts": (Cohort("all"),),
        "queues": (Queue("qa", "team-a", cohort="all"), Queue("qb", "team-b", cohort="all"), Queue("qc", "team-c")),
        "resource_classes": (INTERACTIVE, BATCH),
    }


def batch_job(job_id, queue, device, started=0.0, preemptions=0, preemptible=True, priority=100):
    return RunningWorkload(
        id=job_id,
        queue=queue,
        pods=(RunningPod("main", 0, "n1", (device,)),),
        device_class="gpu",
        priority=priority,
        preemptible=preemptible,
        started=started,
        preemptions=preemptions,
    )


def notebook(job_id="nb", queue="qa", resource_class="interactive", priority=500, submitted=NOW - 5):
    return PendingWorkload(
        id=job_id,
        queue=queue,
        pod_sets=(PodSet("main", 1, None, 1),),
        resource_class=resource_class,
        priority=priority,
        submitted=submitted,
        approved=True,
        expected_duration=600.0,
    )


def snapshot(running, pending, devices=2, **config):
    return Snapshot(**cluster(devices), running=tuple(running), pending=tuple(pending), now=NOW,
                    config=SchedulerConfig(**config))  # fmt: skip


def test_it_lets_an_interactive_class_preempt_batch_work_of_another_queue():
    result = decide(snapshot([batch_job("b1", "qb", "n1/0"), batch_job("b2", "qb", "n1/1")], [notebook()]))

    [preemption] = result.preemptions
    assert preemption.preemptor_id == "nb"
    assert "ClassPriority" in preemption.message
    assert "interactive work of priority 500 may preempt" in preemption.message


def test_it_keeps_other_queues_work_when_the_class_does_not_preempt_across_queues():
    plain = replace(INTERACTIVE, preempts_across_queues=False)
    state = snapshot([batch_job("b1", "qb", "n1/0"), batch_job("b2", "qb", "n1/1")], [notebook()])
    result = decide(replace(state, resource_classes=(plain, BATCH)))

    assert result.preemptions == ()


def test_it_never_crosses_into_another_cohort_or_takes_unpreemptible_or_equal_work():
    running = [
        batch_job("other-cohort", "qc", "n1/0"),
        batch_job("not-preemptible", "qb", "n1/1", preemptible=False),
    ]
    assert decide(snapshot(running, [notebook()])).preemptions == ()
    running = [batch_job("b1", "qb", "n1/0", priority=500), batch_job("b2", "qb", "n1/1", priority=700)]
    assert decide(snapshot(running, [notebook()])).preemptions == ()


def test_it_protects_work_that_started_less_than_the_minimum_run_time_ago():
    running = [batch_job("fresh", "qb", "n1/0", started=NOW - 100), batch_job("old", "qb", "n1/1", started=0.0)]
    result = decide(snapshot(running, [notebook()], preemption_min_runtime_seconds=300))
    assert [p.victim_id for p in result.preemptions] == ["old"]

    running = [batch_job("fresh", "qb", "n1/0", started=NOW - 100), batch_job("fresh2", "qb", "n1/1", started=NOW)]
    assert decide(snapshot(running, [notebook()], preemption_min_runtime_seconds=300)).preemptions == ()


def test_it_stops_preempting_a_workload_after_the_bound():
    running = [batch_job("twice", "qb", "n1/0", preemptions=2), batch_job("once", "qb", "n1/1", preemptions=1)]
    result = decide(snapshot(running, [notebook()], max_preemptions_per_workload=2))
    assert [p.victim_id for p in result.preemptions] == ["once"]

    running = [batch_job("twice", "qb", "n1/0", preemptions=2), batch_job("b", "qb", "n1/1", preemptions=2)]
    assert decide(snapshot(running, [notebook()], max_preemptions_per_workload=2)).preemptions == ()


def sized(job_id, hours, submitted):
    return PendingWorkload(
        id=job_id,
        queue="qa",
        pod_sets=(PodSet("main", 1, None, 1),),
        resource_class="batch",
        priority=100,
        submitted=submitted,
        approved=True,
        expected_duration=hours * 3600.0,
    )


def test_it_serves_the_shortest_equal_priority_work_first_when_asked():
    long_first = [sized("long", 10, NOW - 60), sized("short", 0.1, NOW - 30)]

    by_age = decide(snapshot([], long_first, devices=1))
    shortest = decide(snapshot([], long_first, devices=1, shortest_first_aging_seconds=600))

    assert [a.workload_id for a in by_age.admissions] == ["long"]
    assert [a.workload_id for a in shortest.admissions] == ["short"]


def test_it_lets_long_work_overtake_once_it_waited_long_enough():
    # 100 times the device-time: ln(100) = 4.6 aging spans of extra waiting make up for it.
    aging = 600.0
    long_job, short_job = sized("long", 10, NOW - 5 * aging), sized("short", 0.1, NOW)
    key = shortest_first_key(NOW, aging)
    assert key(long_job) < key(short_job)
    assert shortest_first_key(NOW - aging, aging)(replace(long_job, submitted=NOW - 4 * aging)) > key(short_job)

    result = decide(snapshot([], [short_job, long_job], devices=1, shortest_first_aging_seconds=aging))
    assert [a.workload_id for a in result.admissions] == ["long"]


def test_it_ranks_unknown_durations_after_short_and_before_long_work():
    unknown = replace(sized("unknown", 1, NOW), expected_duration=None)
    assert expected_device_seconds(sized("short", 1, NOW)) < expected_device_seconds(unknown)
    assert expected_device_seconds(unknown) < expected_device_seconds(sized("long", 48, NOW))


@st.composite
def contested(draw):
    """Two nodes' worth of batch work in three queues (two in one cohort), some of it fresh or often
    preempted, and a few interactive and batch arrivals."""
    queues = ("qa", "qb", "qc")
    running = []
    for index in range(draw(st.integers(1, 4))):
        running.append(
            batch_job(
                f"r{index}",
                draw(st.sampled_from(queues)),
                f"n1/{index}",
                started=draw(st.sampled_from((0.0, NOW - 200, NOW - 400, NOW))),
                preemptions=draw(st.integers(0, 3)),
                preemptible=draw(st.booleans()),
                priority=draw(st.sampled_from((50, 100, 500))),
            )
        )
        running[-1] = replace(running[-1], expected_end=draw(st.sampled_from((None, NOW + 600, NOW + 86400))))
    pending = []
    for index in range(draw(st.integers(1, 3))):
        interactive = draw(st.booleans())
        pending.append(
            notebook(
                job_id=f"p{index}",
                queue=draw(st.sampled_from(queues)),
                resource_class="interactive" if interactive else "batch",
                priority=500 if interactive else 100,
            )
        )
    config = {
        "preemption_min_runtime_seconds": draw(st.sampled_from((0.0, 300.0))),
        "max_preemptions_per_workload": draw(st.sampled_from((None, 1, 2))),
        "preemptions_per_queue_per_cycle": 3,
        "shorter_remaining_factor": draw(st.sampled_from((None, 4.0))),
    }
    queue_policies = {name: draw(st.sampled_from(("Never", "LowerPriority"))) for name in queues}
    return running, pending, config, queue_policies


@settings(max_examples=150, deadline=None)
@given(contested())
def test_it_never_preempts_what_the_rules_protect(case):
    running, pending, config, policies = case
    state = snapshot(running, pending, devices=4, **config)
    state = replace(state, queues=tuple(replace(q, within_queue=policies[q.name]) for q in state.queues))
    result = decide(state)

    by_id = {workload.id: workload for workload in running}
    preemptors = {workload.id: workload for workload in pending}
    cohort = {queue.name: queue.cohort for queue in state.queues}
    for preemption in result.preemptions:
        victim, preemptor = by_id[preemption.victim_id], preemptors[preemption.preemptor_id]
        assert victim.preemptible
        assert NOW - victim.started >= config["preemption_min_runtime_seconds"]
        bound = config["max_preemptions_per_workload"]
        assert bound is None or victim.preemptions < bound
        if preemption.rule == "ShorterRemaining":
            assert config["shorter_remaining_factor"] is not None
            assert victim.priority == preemptor.priority
            remaining = (victim.expected_end - NOW) * victim.device_count
            assert remaining >= config["shorter_remaining_factor"] * preemptor.expected_duration
            continue
        assert victim.priority < preemptor.priority
        if victim.queue == preemptor.queue:
            assert policies[victim.queue] == "LowerPriority"
        else:
            # No quota in these queues: only a class that preempts across queues may, inside its cohort.
            assert preemptor.resource_class == "interactive"
            assert cohort[victim.queue] is not None and cohort[victim.queue] == cohort[preemptor.queue]


def long_running(job_id, queue, device, hours_left, priority=100):
    return replace(batch_job(job_id, queue, device, priority=priority), expected_end=NOW + hours_left * 3600)


def test_it_lets_short_work_preempt_much_longer_work_of_its_own_priority_when_asked():
    running = [long_running("days", "qb", "n1/0", 48), long_running("hour", "qb", "n1/1", 1)]
    short = sized("short", 0.25, NOW)  # 15 min on one device: "days" expects 192 times that

    assert decide(snapshot(running, [short])).preemptions == ()
    result = decide(snapshot(running, [short], shorter_remaining_factor=4))

    [preemption] = result.preemptions
    assert preemption.victim_id == "days"
    assert "ShorterRemaining" in preemption.message
    assert "48.0 h more" in preemption.message


def test_it_spares_work_whose_remaining_time_is_not_long_enough_or_unknown():
    unknown = replace(batch_job("unknown", "qb", "n1/0"), expected_end=None)
    running = [unknown, long_running("hour", "qb", "n1/1", 0.75)]
    short = sized("short", 0.25, NOW)  # 3 times: under the factor of 4

    assert decide(snapshot(running, [short], shorter_remaining_factor=4)).preemptions == ()
    # Not of another priority either: higher is never a victim, lower is the classes' business.
    running = [long_running("higher", "qb", "n1/0", 48, priority=300), long_running("c", "qc", "n1/1", 48)]
    assert decide(snapshot(running, [short], shorter_remaining_factor=4)).preemptions == ()
