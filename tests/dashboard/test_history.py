"""A member's own workloads, finished ones too, sortable (as Slurm's sacct)."""

from datetime import timedelta

from django.urls import reverse

from broker.workloads.states import State
from tests.builders import make_user, make_workload


def names(response):
    return [row["workload"].name for row in response.context["history"]["rows"]]


def finished(queue, name, user, waited_minutes, ran_minutes):
    workload = make_workload(queue, name, submitted_by=user, minutes_ago=waited_minutes + ran_minutes + 1)
    start = workload.submitted_at + timedelta(minutes=waited_minutes)
    workload.transition(State.PENDING, at=workload.submitted_at)
    workload.transition(State.ADMITTED, at=start)
    workload.transition(State.RUNNING, at=start)
    workload.transition(State.SUCCEEDED, at=start + timedelta(minutes=ran_minutes))
    return workload


def test_it_lists_a_members_own_workloads_finished_and_waiting_newest_first(client, cluster, alice, bob):
    finished(cluster.queue_a, "done-long-ago", alice, waited_minutes=90, ran_minutes=150)
    make_workload(cluster.queue_a, "waiting-now", submitted_by=alice, minutes_ago=5).transition(State.PENDING)
    make_workload(cluster.queue_b, "bobs", submitted_by=bob)
    client.force_login(alice)

    response = client.get(reverse("dashboard:history"))

    assert names(response) == ["waiting-now", "done-long-ago"]
    page = response.content.decode()
    assert "1 h 30 min" in page and "2 h 30 min" in page  # waited, ran: in hours, not seconds
    assert "bobs" not in page
    assert response.context["history"]["by_state"] == {"Pending": 1, "Succeeded": 1}


def test_it_sorts_by_any_column_both_ways_and_ignores_an_unknown_sort(client, cluster, alice):
    for name in ("beta", "alpha", "gamma"):
        make_workload(cluster.queue_a, name, submitted_by=alice)
    client.force_login(alice)
    url = reverse("dashboard:history")
    assert names(client.get(url, {"sort": "name"})) == ["alpha", "beta", "gamma"]
    assert names(client.get(url, {"sort": "-name"})) == ["gamma", "beta", "alpha"]
    response = client.get(url, {"sort": "password"})
    assert response.status_code == 200 and response.context["sort"] == "-submitted"


def test_it_shows_the_teams_workloads_on_request(client, cluster, alice):
    teammate = make_user("amy", roles=["member"], teams=[cluster.team_a])
    make_workload(cluster.queue_a, "mine", submitted_by=alice, minutes_ago=2)
    make_workload(cluster.queue_a, "amys", submitted_by=teammate, minutes_ago=1)
    make_workload(cluster.queue_b, "other-team", minutes_ago=0)
    client.force_login(alice)
    url = reverse("dashboard:history")
    assert names(client.get(url)) == ["mine"]
    assert names(client.get(url, {"scope": "team"})) == ["amys", "mine"]
    assert 'href="/history/"' in client.get(reverse("dashboard:overview")).content.decode()
