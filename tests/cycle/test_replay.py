from datetime import timedelta

import pytest
from django.utils import timezone

from broker.cycle.replay import PhillyReplay, load_jobs, pod_shape, resource_class_for
from broker.policy.models import PriorityClass
from broker.workloads.models import Workload
from broker.workloads.states import State
from tests.builders import make_resource_class, make_user

TRACE = """timestamp,duration,num_gpus,gpu_time,cluster
2017-10-01 00:02:00,7200.0,16,115200.0,team-a
2017-10-01 00:00:00,100.0,1,100.0,team-b
2017-10-01 00:01:00,1800.0,2,3600.0,team-a
2017-10-01 00:01:00,36000.0,8,288000.0,team-b
2017-10-01 01:00:00,60.0,1,60.0,team-a
2017-10-01 00:03:00,60.0,1,60.0,
"""


@pytest.mark.parametrize(
    "gpus, shape", [(1, (1, 1)), (2, (1, 2)), (8, (1, 8)), (12, (2, 6)), (16, (2, 8)), (24, (3, 8)), (128, (16, 8))]
)
def test_it_splits_gangs_into_pods_of_at_most_eight(gpus, shape):
    assert pod_shape(gpus) == shape


def test_it_picks_the_resource_class_by_size():
    assert resource_class_for(1, 60) == "small-inference"
    assert resource_class_for(1, 1800) == "interactive-experiment"
    assert resource_class_for(2, 7200) == "batch-inference"
    assert resource_class_for(8, 60) == "distributed-training"
    assert resource_class_for(128, 60) == "large-reserved-training"


def test_it_orders_the_trace_by_submit_time_and_drops_jobs_without_a_cluster(tmp_path):
    path = tmp_path / "philly.csv"
    path.write_text(TRACE)
    jobs = load_jobs(str(path), None)
    assert [(job.num_gpus, job.cluster) for job in jobs] == [
        (1, "team-b"),
        (2, "team-a"),
        (8, "team-b"),
        (16, "team-a"),
        (1, "team-a"),
    ]
    assert [job.index for job in jobs] == [0, 1, 2, 3, 4]


@pytest.fixture
def replay_menu(cluster):
    batch = PriorityClass.objects.get(name="batch")
    make_resource_class("interactive-experiment", batch, [cluster.h100])
    make_resource_class("batch-inference", batch, [cluster.h100])
    make_user("member-team-a", roles=["member"], teams=[cluster.team_a])
    make_user("member-team-b", roles=["member"], teams=[cluster.team_b])
    return cluster


def test_it_submits_due_jobs_with_their_shapes_on_the_fast_clock(replay_menu, tmp_path):
    path = tmp_path / "philly.csv"
    path.write_text(TRACE)
    start = timezone.now()
    replay = PhillyReplay.resume(path=path, speed=60, now=start, start=None)

    # 1.5 wall seconds at 60x are 90 trace seconds: the jobs at 00:00, 00:01 and 00:01.
    assert replay.tick(start + timedelta(seconds=1.5)) == 3

    submitted = {w.trace_id: w for w in Workload.objects.filter(trace_id__startswith="philly:")}
    assert set(submitted) == {"philly:000000", "philly:000001", "philly:000002"}
    small, pair, eight = (submitted[f"philly:00000{i}"] for i in range(3))
    assert (small.queue.name, small.resource_class.name, small.expected_duration_seconds) == (
        "team-b",
        "small-inference",
        100,
    )
    assert pair.resource_class.name == "interactive-experiment"
    assert eight.resource_class.name == "distributed-training"
    assert eight.pod_sets.get().replicas == 1 and eight.pod_sets.get().devices_per_pod == 8
    assert all(w.state == State.PENDING for w in submitted.values())
    assert pair.submitted_at == start + timedelta(seconds=1), "stamped with the wall time its trace time maps to"
    assert pair.submitted_by.username == "member-team-a"


def test_it_resumes_after_a_restart_without_repeating_or_skipping(replay_menu, tmp_path):
    path = tmp_path / "philly.csv"
    path.write_text(TRACE)
    start = timezone.now()
    PhillyReplay.resume(path=path, speed=60, now=start, start=None).tick(start + timedelta(seconds=1.5))

    restarted = PhillyReplay.resume(path=path, speed=60, now=start + timedelta(seconds=3), start=None)
    assert restarted.tick(start + timedelta(seconds=3)) == 1

    gang = Workload.objects.get(trace_id="philly:000003")
    pod_set = gang.pod_sets.get()
    assert (pod_set.replicas, pod_set.devices_per_pod, pod_set.min_count) == (2, 8, 2)
    assert gang.resource_class.name == "distributed-training"
    assert Workload.objects.filter(trace_id__startswith="philly:").count() == 4


def test_it_submits_denser_than_the_trace_by_the_replay_density(replay_menu, tmp_path, settings):
    settings.SIMULATION_SPEED = 30
    settings.REPLAY_DENSITY = 2
    path = tmp_path / "philly.csv"
    path.write_text(TRACE)
    start = timezone.now()

    # 1.5 wall seconds at 30x speed and 2x density are the same 90 trace seconds as 60x alone.
    assert PhillyReplay.resume(path=path, now=start, start=None).tick(start + timedelta(seconds=1.5)) == 3
    # Durations are not compressed: the executor still runs them at SIMULATION_SPEED.
    assert Workload.objects.get(trace_id="philly:000000").expected_duration_seconds == 100


def test_it_marks_its_audit_events_as_replayed_and_the_trail_leaves_them_out(replay_menu, tmp_path, client):
    from django.urls import reverse

    from broker.audit.models import AuditEvent, record

    path = tmp_path / "philly.csv"
    path.write_text(TRACE)
    start = timezone.now()
    replay = PhillyReplay.resume(path=path, speed=60, now=start, start=None)
    assert replay.tick(start + timedelta(seconds=1.5)) == 3
    operator = make_user("olivia", roles=["operator"])
    record("node.cordon", replay_menu.nodes[0], actor=operator, reason="firmware", manual_intervention=True)

    submits = AuditEvent.objects.filter(action="workload.submit")
    assert submits.count() == 3 and all(event.replayed for event in submits)
    assert {event.actor_name for event in submits} <= {"member-team-a", "member-team-b"}
    assert not AuditEvent.objects.get(action="node.cordon").replayed

    client.force_login(operator)
    url = reverse("governance:audit")
    shown = [e.action for e in client.get(url).context["page"]]
    assert shown == ["node.cordon"]  # people's actions only, by default
    replayed = list(client.get(url, {"source": "replay"}).context["page"])
    assert len(replayed) >= 3 and all(event.replayed for event in replayed)
    assert len(client.get(url, {"source": "all"}).context["page"]) == len(replayed) + 1
    assert "replayed</span>" in client.get(url, {"source": "replay"}).content.decode()
