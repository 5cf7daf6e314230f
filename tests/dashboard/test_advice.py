"""Advice on the pending workload's page is what its viewer can apply (issue 27): a member resubmits
with the change through the submit form, an operator changes a quota; nobody is shown the rest."""

from urllib.parse import parse_qs, urlsplit

import pytest
from django.urls import reverse

from broker.policy.models import PriorityClass
from broker.workloads.models import Explanation, Workload
from broker.workloads.states import State
from tests.builders import make_resource_class

QUOTA = {
    "kind": "IncreaseQuota",
    "description": "raise queue team-a's h100 quota from 8 to 12: starts now",
    "change": {"queue": "team-a", "device_class": "h100", "nominal": 12},
}


@pytest.fixture
def quota_too(scene):
    explanation = Explanation.objects.get(workload=scene.a_wait)
    explanation.suggestions = [*explanation.suggestions, QUOTA]
    explanation.save(update_fields=["suggestions"])
    return scene


def advice(client, user, workload):
    client.force_login(user)
    response = client.get(reverse("dashboard:workload", args=[workload.pk]))
    assert response.status_code == 200
    return response.context["advice"]


def test_it_offers_a_member_a_resubmission_and_no_quota_change(client, quota_too, alice):
    shown = advice(client, alice, quota_too.a_wait)

    assert [(item["kind"], item["action"]) for item in shown] == [("ShrinkGang", "resubmit")]
    link = urlsplit(shown[0]["url"])
    assert link.path == reverse("dashboard:submit")
    assert parse_qs(link.query) == {"from": [str(quota_too.a_wait.pk)], "replicas": ["1"], "min_count": ["1"]}
    page = client.get(reverse("dashboard:workload", args=[quota_too.a_wait.pk])).content.decode()
    assert "Resubmit with this change" in page
    assert "quota from 8 to 12" not in page


def test_it_offers_an_operator_the_quota_change_and_no_resubmission(client, quota_too, olivia):
    shown = advice(client, olivia, quota_too.a_wait)

    assert [(item["kind"], item["action"]) for item in shown] == [("IncreaseQuota", "quota")]
    assert shown[0]["url"] == reverse("queue-detail", args=[quota_too.a_wait.queue_id])
    where = client.get(shown[0]["url"], HTTP_ACCEPT="text/html")  # the browsable API's form writes the quota
    assert where.status_code == 200 and "nominal_quota" in where.content.decode()
    page = client.get(reverse("dashboard:workload", args=[quota_too.a_wait.pk])).content.decode()
    assert "Change queue team-a's quota" in page
    assert "Ask for 1 pod fewer" not in page  # olivia is in no team: she cannot submit to team-a's queue


def test_it_offers_an_admin_both(client, quota_too, adam):
    assert [item["action"] for item in advice(client, adam, quota_too.a_wait)] == ["resubmit", "quota"]


def test_it_offers_an_approver_nothing(client, quota_too, april):
    assert advice(client, april, quota_too.a_wait) == []
    page = client.get(reverse("dashboard:workload", args=[quota_too.a_wait.pk])).content.decode()
    assert "What would make it start" not in page


def test_it_offers_no_resubmission_of_a_workload_that_no_longer_waits(client, scene, alice):
    scene.a_wait.transition(State.ADMITTED)
    assert advice(client, alice, scene.a_wait) == []


def test_it_opens_the_form_filled_in_and_the_resubmission_replaces_the_original(client, scene, alice):
    client.force_login(alice)
    url = advice(client, alice, scene.a_wait)[0]["url"]

    page = client.get(url)
    form = page.context["form"]
    assert page.context["replacing"] == scene.a_wait
    assert {name: form[name].value() for name in ("name", "replicas", "devices_per_pod", "min_count")} == {
        "name": "big-a-2",
        "replicas": "1",
        "devices_per_pod": 4,
        "min_count": "1",
    }
    assert str(form["resource_class"].value()) == str(scene.a_wait.resource_class_id)
    assert 'name="replaces"' in page.content.decode()

    posted = client.post(reverse("dashboard:submit"), filled(form) | {"replaces": scene.a_wait.pk})

    again = Workload.objects.get(team=scene.a_wait.team, name="big-a-2")
    assert posted.status_code == 302 and posted.url == reverse("dashboard:workload", args=[again.pk])
    main = again.pod_sets.get()
    assert (main.replicas, main.min_count, main.devices_per_pod) == (1, 1, 4)
    assert again.topology_required == "rack"  # the class's promise, as the original had it
    scene.a_wait.refresh_from_db()
    assert scene.a_wait.state == State.CANCELLED
    assert scene.a_wait.transitions.last().reason == "replaced by big-a-2"


def test_it_keeps_the_original_waiting_when_the_box_is_unticked(client, scene, alice):
    client.force_login(alice)
    form = client.get(advice(client, alice, scene.a_wait)[0]["url"]).context["form"]

    client.post(reverse("dashboard:submit"), filled(form))

    assert Workload.objects.filter(team=scene.a_wait.team, name="big-a-2").exists()
    scene.a_wait.refresh_from_db()
    assert scene.a_wait.state == State.PENDING


def test_it_never_cancels_another_teams_workload_through_a_resubmission(client, scene, bob, cluster):
    client.force_login(bob)
    page = client.get(reverse("dashboard:submit"), {"from": scene.a_wait.pk, "replicas": 1})
    assert page.context["replacing"] is None
    assert page.context["form"]["name"].value() is None  # nothing of team-a's request leaks into the form

    data = {"name": "mine", "queue": cluster.queue_b.pk, "resource_class": cluster.inference.pk, "replicas": 1}
    client.post(reverse("dashboard:submit"), data | {"devices_per_pod": 1, "replaces": scene.a_wait.pk})

    assert Workload.objects.filter(team=cluster.team_b, name="mine").exists()
    scene.a_wait.refresh_from_db()
    assert scene.a_wait.state == State.PENDING


def test_it_offers_a_relaxed_topology_the_class_allows_and_submits_it(client, scene, alice, cluster):
    flexible = make_resource_class("flexible", PriorityClass.objects.get(name="batch"), [cluster.h100])
    waiting = Workload.objects.create(
        name="wide",
        team=cluster.team_a,
        queue=cluster.queue_a,
        resource_class=flexible,
        submitted_by=alice,
        topology_required="rack",
    )
    waiting.pod_sets.create(name="main", replicas=3, devices_per_pod=2)
    waiting.transition(State.PENDING)
    Explanation.objects.create(
        workload=waiting,
        cycle=scene.cycle,
        reason="TopologyFragmented",
        message="needs 6 devices in one rack; r2 has 5 free",
        suggestions=[
            {
                "kind": "RelaxTopology",
                "description": "require one block instead of one rack (prefer one rack): starts now in one block",
                "change": {"topology_required": "block", "topology_preferred": "rack"},
            }
        ],
    )

    (offered,) = advice(client, alice, waiting)
    form = client.get(offered["url"]).context["form"]
    assert (form["topology_required"].value(), form["topology_preferred"].value()) == ("block", "rack")
    client.post(reverse("dashboard:submit"), filled(form) | {"replaces": waiting.pk})

    again = Workload.objects.get(team=cluster.team_a, name="wide-2")
    assert (again.topology_required, again.topology_preferred) == ("block", "rack")


def test_it_refuses_to_relax_the_topology_a_class_promises(client, scene, alice, cluster):
    client.force_login(alice)
    data = {"name": "loose", "queue": cluster.queue_a.pk, "resource_class": cluster.training.pk, "replicas": 1}
    data |= {"devices_per_pod": 1}

    refused = client.post(reverse("dashboard:submit"), data | {"topology_required": "anywhere"})
    assert "topology_required" in refused.context["form"].errors
    assert not Workload.objects.filter(name="loose").exists()

    client.post(reverse("dashboard:submit"), data | {"topology_required": "node"})  # finer than the rack: kept
    assert Workload.objects.get(name="loose").topology_required == "node"


def test_it_says_a_device_class_the_class_does_not_offer_on_its_field(client, scene, alice, cluster):
    from broker.policy.models import DeviceClass

    DeviceClass.objects.create(
        name="a100", price_per_hour="2.00", selector='device.attributes["gpu.example.com"].model == "A100"'
    )
    client.force_login(alice)
    data = {"name": "odd", "queue": cluster.queue_a.pk, "resource_class": cluster.training.pk, "replicas": 1}

    refused = client.post(reverse("dashboard:submit"), data | {"devices_per_pod": 1, "device_class": "a100"})

    assert "device_class" in refused.context["form"].errors


def filled(form):
    """What a browser posts for the form as it was opened: each field's shown value."""
    data = {}
    for name in form.fields:
        value = form[name].value()
        if value is not None:
            data[name] = value
    return data
