"""GET /api/metrics/ (who may read it, and that it carries the same figures as /metrics), the explanation
history endpoint, and the pending-workloads view's reason, position and estimated start."""

from datetime import timedelta

import pytest
from django.utils import timezone

from broker.workloads.models import Explanation

DT = "distributed-training"


def persona(request, name):
    return None if name == "anonymous" else request.getfixturevalue(name)


def get(api_client, user, url):
    if user is not None:
        api_client.force_authenticate(user)
    return api_client.get(url)


@pytest.mark.parametrize(
    ("name", "status"),
    [
        ("anonymous", 403),
        ("alice", 403),
        ("bob", 403),
        ("april", 403),
        ("olivia", 200),
        ("fiona", 200),
        ("adam", 200),
    ],
)
def test_it_lets_operators_finance_and_admins_read_the_metrics(name, status, cluster, api_client, request):
    assert get(api_client, persona(request, name), "/api/metrics/").status_code == status


def test_it_serves_the_figures_as_json(history, olivia, api_client):
    before = timezone.now()
    body = get(api_client, olivia, "/api/metrics/").json()
    after = timezone.now()

    assert sorted((r["reason"], r["team"], r["resource_class"], r["count"]) for r in body["pending"]["now"]) == [
        ("AwaitingApproval", "team-a", "large-reserved-training", 1),
        ("InvalidRequest", "team-a", DT, 1),
        ("NotYetExplained", "team-a", "small-inference", 1),
        ("QuotaExceeded", "team-b", DT, 1),
    ]
    waits = {(r["team"], r["resource_class"], r["outcome"]): r for r in body["pending"]["waits"]}
    requeued = waits[("team-b", DT, "Admitted")]
    assert (requeued["count"], requeued["sum_seconds"], requeued["mean_seconds"]) == (2, 550, 275)
    assert {b["le"]: b["count"] for b in requeued["buckets"]}[900] == 2

    held = {(r["reason"], r["team"]): r["seconds"] for r in body["pending"]["seconds_by_reason"]}
    assert held[("InsufficientCapacity", "team-a")] == 740
    assert history.since(2000, before) <= held[("QuotaExceeded", "team-b")] <= history.since(2000, after)

    assert {(r["kind"], r["team"]): r["count"] for r in body["wrong_class"]} == {
        ("InvalidRequest", "team-a"): 1,
        ("NotEntitled", "team-b"): 1,
        ("FallbackUsed", "team-b"): 1,
        ("FallbackUsed", "team-a"): 1,
        ("FitsSmallerClass", "team-b"): 1,
    }
    assert {r["device_class"]: r["stranded"] for r in body["stranded"]["latest"]} == {"h100": 3, "a100": 0}
    assert body["stranded"]["device_seconds"]["a100"] == 0
    assert 2000 + 3 * history.since(2000, before) <= body["stranded"]["device_seconds"]["h100"]

    assert {(r["action"], r["role"]): r["count"] for r in body["manual_interventions"]}[
        ("workload.priority", "operator")
    ] == 2
    spans = {(r["level"], r["span"]): (r["count"], r["mean_seconds"]) for r in body["runtime_by_span"]}
    assert spans[("rack", 1)] == (2, 1200)
    assert spans[("rack", 2)] == (1, 3600)

    assert body["cycles"]["by_outcome"] == {"Committed": 3, "Refused": 1, "Failed": 1, "Running": 1}
    assert body["cycles"]["last"]["decide_ms"] == 30
    assert body["cycles"]["decide"] == {"count": 3, "sum_ms": 60}
    assert body["devices"] == {"Healthy": 14, "Unhealthy": 1, "Unknown": 1}
    assert body["workloads"]["Pending"] == 3


def test_it_serves_an_empty_cluster(cluster, fiona, api_client):
    body = get(api_client, fiona, "/api/metrics/").json()
    assert body["pending"]["now"] == []
    assert body["cycles"]["last"] is None
    assert body["stranded"] == {"latest": [], "device_seconds": {}}


def history_url(workload):
    return f"/api/workloads/{workload.pk}/explanation/"


def test_it_shows_a_workload_its_explanation_history_oldest_first(history, alice, api_client):
    trainer = history.workloads["trainer"]
    body = get(api_client, alice, history_url(trainer)).json()
    assert body["workload"] == trainer.pk
    assert body["state"] == "Succeeded"
    assert body["explanation"] is None
    assert [change["reason"] for change in body["history"]] == [
        "InsufficientCapacity",
        "TopologyFragmented",
        "InsufficientCapacity",
        "Admitted",
    ]


def test_it_shows_the_latest_explanation_beside_the_history(history, bob, api_client):
    stuck = history.workloads["stuck"]
    body = get(api_client, bob, history_url(stuck)).json()
    assert body["explanation"]["reason"] == "QuotaExceeded"
    assert body["explanation"]["position_in_queue"] == 1
    assert [(c["reason"], c["message"]) for c in body["history"]] == [("QuotaExceeded", body["explanation"]["message"])]


@pytest.mark.parametrize(
    ("name", "status"),
    [("anonymous", 403), ("alice", 200), ("bob", 404), ("fiona", 403), ("olivia", 200), ("april", 200), ("adam", 200)],
)
def test_it_shows_the_history_to_whoever_may_read_the_workload(name, status, history, api_client, request):
    response = get(api_client, persona(request, name), history_url(history.workloads["trainer"]))
    assert response.status_code == status


def test_it_lists_pending_workloads_with_reason_position_and_estimated_start(history, olivia, api_client):
    start = timezone.now().replace(microsecond=0) + timedelta(hours=2)
    Explanation.objects.filter(workload=history.workloads["stuck"]).update(position_in_cluster=1, estimated_start=start)
    response = get(api_client, olivia, "/api/explanations/?reason=QuotaExceeded")
    assert response.status_code == 200
    (row,) = response.json()["results"]
    assert (row["workload_name"], row["team"], row["queue"], row["resource_class"]) == ("stuck", "team-b", "team-b", DT)
    assert (row["position_in_queue"], row["position_in_cluster"]) == (1, 1)
    assert row["estimated_start"].startswith(start.strftime("%Y-%m-%dT%H:%M:%S"))
    # A cancelled workload keeps its last explanation row, but it is not pending.
    names = {r["workload_name"] for r in get(api_client, olivia, "/api/explanations/").json()["results"]}
    assert names == {"stuck", "toobig"}
