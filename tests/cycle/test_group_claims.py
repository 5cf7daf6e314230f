"""Group claims end to end on the database (API -> loader -> decide -> commit): a gang's shared scratch
volume, reachable from one rack, is allocated once (one allocation row), pins the gang to that rack, is
counted once, stays held while the gang runs and is released with it; a stale snapshot is refused; bad
group claims are a 400 that changes nothing."""

import pytest
from django.db import connection
from django.utils import timezone

from broker.cycle.commit import commit_result
from broker.cycle.loader import load_snapshot
from broker.cycle.refusals import StaleSnapshot
from broker.cycle.runner import run_once
from broker.inventory.models import Device, Node
from broker.policy.models import DeviceClass
from broker.scheduler.cycle import decide
from broker.scheduler.snapshot import GROUP_POD_SET
from broker.workloads import services
from broker.workloads.models import Allocation, SchedulingCycle, Workload
from broker.workloads.states import State
from tests.api.base import signed_in

SCRATCH = 'device.attributes["gpu.example.com"].kind == "scratch"'
GROUP_CLAIM = {"name": "data", "requests": [{"name": "volume", "exactly": {"deviceClassName": "scratch"}}]}


def with_scratch(cluster):
    """One scratch volume on n3 (rack r2), reachable from every node of its rack."""
    Device.objects.create(
        node=Node.objects.get(name="n3"), name="scratch0", attributes={"kind": "scratch", "reach": "rack"}
    )
    return DeviceClass.objects.create(name="scratch", selector=SCRATCH, price_per_hour="0.50")


def submit(api_client, user, name="train", group_claims=(GROUP_CLAIM,), replicas=2):
    body = {
        "name": name,
        "resource_class": "distributed-training",
        "pod_sets": [{"name": "workers", "replicas": replicas, "devices_per_pod": 4}],
        "group_claims": list(group_claims),
    }
    return signed_in(api_client, user).post("/api/workloads/", body, format="json")


def test_it_allocates_a_group_claim_once_in_the_rack_that_reaches_it(cluster, api_client, alice):
    with_scratch(cluster)
    cluster.queue_a.nominal_quota = {"h100": 9}
    cluster.queue_a.save()
    response = submit(api_client, alice)
    assert response.status_code == 201, response.data
    assert response.data["group_claims"] == [{**GROUP_CLAIM, "constraints": []}]
    workload = Workload.objects.get(pk=response.data["id"])
    assert response.data["total_devices"] == 9  # 2 pods of 4, and the volume once
    assert workload.group_claims == [{**GROUP_CLAIM, "constraints": []}]

    run_once()

    workload.refresh_from_db()
    assert workload.state == State.ADMITTED
    held = Allocation.objects.filter(workload=workload, released_at__isnull=True)
    assert held.count() == 9  # 8 GPUs and the volume, once
    assert sorted(
        set(held.exclude(pod_set__startswith=GROUP_POD_SET).values_list("device__node__name", flat=True))
    ) == [
        "n3",
        "n4",
    ]
    (volume,) = held.filter(pod_set=GROUP_POD_SET + "data")
    assert volume.device.name == "scratch0"

    # The next cycle reads the volume back as the running gang's: a second gang cannot have it.
    second = submit(api_client, alice, name="second", replicas=1)
    assert second.status_code == 201, second.data
    run_once()
    waiting = Workload.objects.get(pk=second.data["id"])
    assert waiting.state == State.PENDING
    assert "group claim data" in waiting.explanation.message

    # Cancelling the gang releases every device it held, the volume too; the second gang then starts.
    services.cancel_workload(workload, alice)
    assert not Allocation.objects.filter(workload=workload, released_at__isnull=True).exists()
    run_once()
    waiting.refresh_from_db()
    assert waiting.state == State.ADMITTED
    assert Allocation.objects.filter(
        workload=waiting, pod_set=GROUP_POD_SET + "data", released_at__isnull=True
    ).exists()


def test_it_charges_the_group_claim_once_against_quota(cluster, api_client, alice, bob):
    with_scratch(cluster)
    # team-a's 8 h100 and nothing to borrow (team-b uses its own 8): 8 GPUs and the volume do not fit.
    for index in range(2):
        assert submit(api_client, bob, name=f"b{index}", group_claims=(), replicas=1).status_code == 201
    run_once()
    response = submit(api_client, alice)
    run_once()
    workload = Workload.objects.get(pk=response.data["id"])
    assert workload.state == State.PENDING
    assert workload.explanation.reason == "QuotaExceeded", workload.explanation.message


def test_it_refuses_a_stale_snapshot_when_the_volume_was_allocated_meanwhile(cluster, api_client, alice, bob):
    with_scratch(cluster)
    cluster.queue_a.nominal_quota = {"h100": 9}
    cluster.queue_a.save()
    workload = Workload.objects.get(pk=submit(api_client, alice).data["id"])
    other = Workload.objects.get(pk=submit(api_client, bob, name="by-hand", group_claims=(), replicas=1).data["id"])
    snapshot, loaded = load_snapshot(timezone.now())
    result = decide(snapshot)
    (admission,) = [a for a in result.admissions if a.workload_id == str(workload.pk)]
    ((_, (volume,)),) = admission.group_requests
    Allocation.objects.create(
        workload=other, device_id=loaded.device_pks[volume], device_class=cluster.h100, pod_set="main", pod_index=0
    )
    cycle = SchedulingCycle.objects.create()

    expected = f"device {volume} was allocated meanwhile" if connection.vendor == "postgresql" else "refused a write"
    with pytest.raises(StaleSnapshot, match=expected):
        commit_result(result, loaded, cycle)

    workload.refresh_from_db()
    assert workload.state == State.PENDING
    assert not Allocation.objects.filter(workload=workload).exists()


@pytest.mark.parametrize(
    ("group_claim", "field", "message"),
    [
        (
            {"name": "data", "requests": [{"name": "volume", "exactly": {"deviceClassName": "nope"}}]},
            "requests",
            "unknown device class 'nope'",
        ),
        (
            {**GROUP_CLAIM, "constraints": [{"requests": ["volume", "nic"], "matchAttribute": "rack"}]},
            "constraints",
            "names unknown request 'nic'",
        ),
        (
            {"name": "data", "requests": [{"name": "volume", "exactly": {"deviceClassName": "scratch", "count": 2}}]},
            "requests",
            "no device class can ever meet it",
        ),
        ({"name": "Not_A_Label", "requests": GROUP_CLAIM["requests"]}, "name", ""),
    ],
)
def test_it_refuses_bad_group_claims_with_field_errors(cluster, api_client, alice, group_claim, field, message):
    with_scratch(cluster)
    response = submit(api_client, alice, group_claims=(group_claim,))
    assert response.status_code == 400, response.data
    errors = response.data["group_claims"][0]
    assert field in errors, errors
    assert message in str(errors[field])
    assert not Workload.objects.filter(name="train").exists()


def test_it_refuses_a_bad_group_claim_in_the_admin_and_keeps_a_good_one(cluster):
    import json

    from django.forms.models import model_to_dict

    from broker.workloads.admin import WorkloadAdminForm
    from tests.builders import make_workload

    with_scratch(cluster)
    workload = make_workload(cluster.queue_a, resource_class=cluster.training)

    def form(group_claims):
        data = {key: value for key, value in model_to_dict(workload).items() if value is not None}
        data["group_claims"] = json.dumps(group_claims)
        return WorkloadAdminForm(instance=workload, data=data)

    bad = form([{**GROUP_CLAIM, "constraints": [{"requests": ["nic"], "matchAttribute": "rack"}]}])
    assert not bad.is_valid()
    assert "names unknown request 'nic'" in " ".join(bad.errors["group_claims"])
    good = form([GROUP_CLAIM])
    assert good.is_valid(), good.errors


def test_it_calls_a_group_claim_written_past_the_api_invalid(cluster):
    with_scratch(cluster)
    workload = Workload.objects.create(
        name="raw",
        team=cluster.team_a,
        queue=cluster.queue_a,
        state=State.PENDING,
        group_claims=[{"name": "data", "requests": [{"name": "volume"}]}],
    )
    workload.pod_sets.create(name="main", replicas=1, devices_per_pod=1, device_classes=["h100"])

    run_once()

    workload.refresh_from_db()
    assert workload.state == State.PENDING
    assert workload.explanation.reason == "InvalidRequest"
    assert "group claim data" in workload.explanation.message
    assert "give exactly or firstAvailable" in workload.explanation.message


def test_it_evicts_the_whole_gang_when_its_volume_fails_and_frees_it_after(cluster, api_client, alice):
    from broker.cycle.executor import complete_evictions
    from broker.workloads.models import PodSet

    with_scratch(cluster)
    cluster.queue_a.nominal_quota = {"h100": 9}
    cluster.queue_a.save()
    workload = Workload.objects.get(pk=submit(api_client, alice).data["id"])
    Workload.objects.filter(pk=workload.pk).update(disruption_mode="Pod")
    PodSet.objects.filter(workload=workload).update(min_count=1)  # Pod mode could shrink it: not for this
    run_once()
    Device.objects.filter(name="scratch0").update(health="Unhealthy")

    run_once()

    workload.refresh_from_db()
    assert workload.eviction_rule == "DeviceFailed"
    assert workload.eviction_requested_at is not None, "a group claim serves every pod: the gang goes whole"
    assert workload.eviction_message == "evicted: device n3/scratch0 failed (unhealthy)"
    complete_evictions([workload.pk], timezone.now())
    assert not Allocation.objects.filter(workload=workload, released_at__isnull=True).exists()
    workload.refresh_from_db()
    assert workload.state == State.PENDING


def test_it_preempts_the_reader_of_its_volume_and_then_takes_the_volume(cluster, api_client, alice, settings):
    """The only volume is read by `reader` (priority 1): the gang (priority 100) preempts it through the
    database, waits while it leaves, and is then admitted with the volume it freed."""
    from datetime import timedelta

    from broker.cycle.executor import SimulatedExecutor
    from broker.workloads.models import Explanation
    from tests.cycle.helpers import preempting_within, running

    settings.EVICTION_GRACE_SECONDS = 60  # one second of wall time at 60x
    scratch = with_scratch(cluster)
    preempting_within(cluster.queue_a)
    volume = Device.objects.get(name="scratch0")
    reader = running(cluster.queue_a, "reader", [volume], scratch, priority=1)
    response = submit(api_client, alice)
    assert response.status_code == 201, response.data
    gang = Workload.objects.get(pk=response.data["id"])
    Workload.objects.filter(pk=gang.pk).update(priority=100)
    start = timezone.now()

    first = run_once(now=start)

    assert (first.preempted, first.admitted) == ((reader.pk,), ())
    gang.refresh_from_db()
    assert gang.nominated_devices == [volume.pk]
    explanation = Explanation.objects.get(workload=gang)
    assert explanation.reason == "PreemptionPending"
    assert f"{reader} (WithinQueue, priority 1)" in explanation.message

    SimulatedExecutor(speed=60).advance(start + timedelta(seconds=1))
    second = run_once(now=start + timedelta(seconds=2))

    assert second.admitted == (gang.pk,)
    group = Allocation.objects.get(workload=gang, pod_set=GROUP_POD_SET + "data", released_at__isnull=True)
    assert group.device_id == volume.pk
