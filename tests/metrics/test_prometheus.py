"""GET /metrics scraped with the test client, parsed with prometheus_client's own parser, and every
figure held against the history in conftest.py, worked out by hand. Figures that run up to the present
are checked between the clock read just before and just after the scrape."""

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from broker.costs.models import CapacitySample
from broker.metrics import queries
from broker.policy.models import DeviceClass

DT = "distributed-training"
SI = "small-inference"
LRT = "large-reserved-training"
BI = "batch-inference"


def key(**labels):
    return tuple(sorted(labels.items()))


def series(samples, name):
    return {labels: value for (sample_name, labels), value in samples.items() if sample_name == name}


def scrape(client, **headers):
    response = client.get("/metrics", **{"HTTP_AUTHORIZATION": "Bearer s3cret-scrape-token", **headers})
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, key(**sample.labels))] = sample.value
    return samples


@pytest.fixture
def scraped(client, history):
    before = timezone.now()
    samples = scrape(client)
    after = timezone.now()
    return samples, before, after


def test_it_counts_workloads_pending_now_by_reason_team_and_class(scraped):
    samples, _, _ = scraped
    assert series(samples, "capacity_broker_workloads_pending") == {
        key(reason="QuotaExceeded", team="team-b", resource_class=DT): 1,
        key(reason="InvalidRequest", team="team-a", resource_class=DT): 1,
        key(reason="NotYetExplained", team="team-a", resource_class=SI): 1,
        key(reason="AwaitingApproval", team="team-a", resource_class=LRT): 1,
    }


def test_it_histograms_completed_waits_from_submission_or_requeue(scraped):
    samples, _, _ = scraped
    assert series(samples, "capacity_broker_pending_wait_seconds_count") == {
        key(team="team-a", resource_class=DT, outcome="Admitted"): 2,
        key(team="team-a", resource_class=SI, outcome="Admitted"): 2,
        key(team="team-b", resource_class=DT, outcome="Admitted"): 2,
        key(team="team-b", resource_class=BI, outcome="Admitted"): 1,
        key(team="team-b", resource_class=LRT, outcome="Cancelled"): 1,
    }
    sums = series(samples, "capacity_broker_pending_wait_seconds_sum")
    # trainer 1000 + custom 100; infer 200 + broken 100; requeued 50 then 500 after its preemption.
    assert sums[key(team="team-a", resource_class=DT, outcome="Admitted")] == 1100
    assert sums[key(team="team-a", resource_class=SI, outcome="Admitted")] == 300
    assert sums[key(team="team-b", resource_class=DT, outcome="Admitted")] == 550
    assert sums[key(team="team-b", resource_class=BI, outcome="Admitted")] == 30
    assert sums[key(team="team-b", resource_class=LRT, outcome="Cancelled")] == 500
    requeued = {}
    for labels, value in series(samples, "capacity_broker_pending_wait_seconds_bucket").items():
        labels = dict(labels)
        bound = labels.pop("le")
        if labels == {"team": "team-b", "resource_class": DT, "outcome": "Admitted"}:
            requeued[bound] = value
    assert requeued["60.0"] == 1
    assert requeued["300.0"] == 1
    assert requeued["900.0"] == 2
    assert requeued["+Inf"] == 2


def test_it_sums_pending_seconds_by_reason_until_the_next_change_or_the_exit(history, scraped):
    samples, before, after = scraped
    held = series(samples, "capacity_broker_pending_seconds_total")
    ongoing = {
        key(reason="QuotaExceeded", team="team-b", resource_class=DT): 2000,
        key(reason="InvalidRequest", team="team-a", resource_class=DT): 5000,
    }
    for labels, since in ongoing.items():
        assert history.since(since, before) <= held.pop(labels) <= history.since(since, after)
    assert held == {
        key(reason="InsufficientCapacity", team="team-a", resource_class=DT): 740,
        key(reason="TopologyFragmented", team="team-a", resource_class=DT): 200,
        key(reason="Priority", team="team-a", resource_class=SI): 200,
        key(reason="Preempted", team="team-b", resource_class=DT): 100,
        key(reason="Priority", team="team-b", resource_class=DT): 400,
        key(reason="NotEntitled", team="team-b", resource_class=LRT): 500,
    }


def test_it_counts_distinct_workloads_per_reason_not_history_rows(scraped):
    samples, _, _ = scraped
    pended = series(samples, "capacity_broker_workloads_pended_total")
    # trainer was InsufficientCapacity twice: one workload.
    assert pended[key(reason="InsufficientCapacity", team="team-a", resource_class=DT)] == 1
    assert pended == {
        key(reason="InsufficientCapacity", team="team-a", resource_class=DT): 1,
        key(reason="TopologyFragmented", team="team-a", resource_class=DT): 1,
        key(reason="Priority", team="team-a", resource_class=SI): 1,
        key(reason="Preempted", team="team-b", resource_class=DT): 1,
        key(reason="Priority", team="team-b", resource_class=DT): 1,
        key(reason="NotEntitled", team="team-b", resource_class=LRT): 1,
        key(reason="QuotaExceeded", team="team-b", resource_class=DT): 1,
        key(reason="InvalidRequest", team="team-a", resource_class=DT): 1,
    }


def test_it_counts_wrong_class_requests_by_kind(scraped):
    samples, _, _ = scraped
    assert series(samples, "capacity_broker_wrong_class_requests_total") == {
        key(kind="InvalidRequest", team="team-a", resource_class=DT): 1,
        key(kind="NotEntitled", team="team-b", resource_class=LRT): 1,
        # batch ran on its class's second choice; custom asked a100 first in its own pod set, ran on h100.
        key(kind="FallbackUsed", team="team-b", resource_class=BI): 1,
        key(kind="FallbackUsed", team="team-a", resource_class=DT): 1,
        key(kind="FitsSmallerClass", team="team-b", resource_class=BI): 1,
    }


def test_it_reports_stranded_devices_now_and_device_seconds_over_time(history, scraped):
    samples, before, after = scraped
    assert series(samples, "capacity_broker_stranded_devices") == {
        key(device_class="h100"): 3,
        key(device_class="a100"): 0,
    }
    device_seconds = series(samples, "capacity_broker_stranded_device_seconds_total")
    assert device_seconds[key(device_class="a100")] == 0
    # 2 devices for 1000 s, none for 1000 s, then 3 devices ever since.
    low, high = (2000 + 3 * history.since(2000, t) for t in (before, after))
    assert low <= device_seconds[key(device_class="h100")] <= high


def test_it_counts_manual_interventions_by_action_and_role(scraped):
    samples, _, _ = scraped
    assert series(samples, "capacity_broker_manual_interventions_total") == {
        key(action="device.health", role="operator"): 1,
        key(action="workload.priority", role="operator"): 2,
        key(action="queue.update", role="admin"): 1,
        key(action="node.cordon", role="system"): 1,
        key(action="node.cordon", role="unknown"): 1,
    }


def test_it_relates_the_span_of_the_last_placement_to_runtime(scraped):
    samples, _, _ = scraped
    counts = series(samples, "capacity_broker_workload_runtime_seconds_count")
    sums = series(samples, "capacity_broker_workload_runtime_seconds_sum")
    # requeued first ran on two racks, but finished on one: only the last placement counts.
    expected = {
        ("zone", "1"): (3, 6000),
        ("block", "1"): (3, 6000),
        ("rack", "1"): (2, 2400),
        ("rack", "2"): (1, 3600),
        ("node", "1"): (2, 2400),
        ("node", "2"): (1, 3600),
    }
    assert {(dict(k)["level"], dict(k)["span"]): (v, sums[k]) for k, v in counts.items()} == expected


def test_it_reports_cycles_devices_and_workloads(history, scraped):
    samples, _, _ = scraped
    assert series(samples, "capacity_broker_cycles_total") == {
        key(outcome="Committed"): 3,
        key(outcome="Refused"): 1,
        key(outcome="Failed"): 1,
        key(outcome="Running"): 1,
    }
    assert series(samples, "capacity_broker_last_cycle_seconds") == {
        key(phase="load"): 0.005,
        key(phase="decide"): 0.030,
        key(phase="commit"): 0.007,
        key(phase="total"): pytest.approx(0.042),
    }
    assert samples[("capacity_broker_last_cycle_timestamp_seconds", ())] == history.at(51).timestamp()
    assert samples[("capacity_broker_cycle_decide_seconds_count", ())] == 3
    assert samples[("capacity_broker_cycle_decide_seconds_sum", ())] == pytest.approx(0.060)
    assert series(samples, "capacity_broker_devices") == {
        key(health="Healthy"): 14,
        key(health="Unhealthy"): 1,
        key(health="Unknown"): 1,
    }
    assert series(samples, "capacity_broker_workloads") == {
        key(state="Succeeded"): 3,
        key(state="Running"): 2,
        key(state="Pending"): 3,
        key(state="AwaitingApproval"): 1,
        key(state="Cancelled"): 1,
        key(state="Failed"): 1,
    }


def test_it_measures_up_to_the_given_moment(history):
    now = history.at(10_000)
    held = {(r["reason"], r["team"]): r["seconds"] for r in queries.pending_seconds_by_reason(now)}
    assert held[("QuotaExceeded", "team-b")] == 8000
    assert held[("InvalidRequest", "team-a")] == 5000
    # Half-way between two samples the earlier one holds until that moment, not until the next sample.
    assert queries.stranded_device_seconds(history.at(1500)) == {"h100": 2000, "a100": 0}
    assert queries.stranded_device_seconds(history.at(3000)) == {"h100": 5000, "a100": 0}


def test_it_counts_what_shared_devices_leave_stranded(history):
    """A time-sliced GPU half used, with no pending work for the rest, is half a stranded device: the
    latest count and the device-seconds include shared devices' remainders, not only whole devices."""
    h100 = DeviceClass.objects.get(name="h100")
    CapacitySample.objects.create(
        at=history.at(2500), device_class=h100, total=16, stranded=1, unhealthy=1,
        shared={"stranded": 500_000, "unhealthy": 250_000, "idle": 250_000},
    )  # fmt: skip
    latest = {row["device_class"]: row for row in queries.latest_capacity()}
    assert (latest["h100"]["stranded"], latest["h100"]["unhealthy"]) == (1.5, 1.25)
    assert latest["a100"]["stranded"] == 0
    # 2 for 1000 s, 0 for 1000 s, 3 for 500 s, then 1.5 for 500 s.
    assert queries.stranded_device_seconds(history.at(3000)) == {"h100": 4250, "a100": 0}


def test_it_scrapes_a_cluster_with_no_history(client, cluster):
    samples = scrape(client)
    assert series(samples, "capacity_broker_devices") == {key(health="Healthy"): 16}
    assert series(samples, "capacity_broker_workloads_pending") == {}
    assert series(samples, "capacity_broker_last_cycle_seconds") == {}
    assert samples[("capacity_broker_cycle_decide_seconds_count", ())] == 0


def test_it_is_closed_to_strangers_by_default(client, cluster, settings):
    settings.METRICS_TOKEN = ""
    refused = client.get("/metrics")
    assert refused.status_code == 401
    assert b"capacity_broker" not in refused.content
    # No token configured: an empty bearer matches nothing.
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 401


def test_it_is_open_when_made_public(client, cluster, settings):
    settings.METRICS_PUBLIC = True
    assert client.get("/metrics").status_code == 200


def test_it_wants_the_bearer_token_when_one_is_configured(client, cluster):
    refused = client.get("/metrics")
    assert refused.status_code == 401
    assert refused["WWW-Authenticate"].startswith("Bearer")
    assert b"capacity_broker" not in refused.content
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Token s3cret-scrape-token").status_code == 401
    samples = scrape(client)
    assert series(samples, "capacity_broker_devices") == {key(health="Healthy"): 16}


@pytest.mark.parametrize(("persona", "status"), [("olivia", 200), ("fiona", 200), ("adam", 200), ("alice", 401)])
def test_it_opens_to_the_sessions_that_read_the_metrics_api(client, cluster, request, persona, status):
    client.force_login(request.getfixturevalue(persona))
    assert client.get("/metrics").status_code == status


def test_it_opens_to_a_staff_session(client, cluster, alice):
    alice.is_staff = True
    alice.save()
    client.force_login(alice)
    assert client.get("/metrics").status_code == 200


def test_it_refuses_writes(client, cluster):
    assert client.post("/metrics").status_code == 405
