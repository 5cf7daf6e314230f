import pytest
from django.urls import reverse

from broker.audit.models import AuditEvent
from broker.inventory.models import Device, Health, Node
from broker.workloads.models import Workload
from broker.workloads.states import State

PAGES = ["dashboard:overview", "dashboard:queue", "dashboard:topology", "dashboard:teams", "dashboard:submit"]


@pytest.mark.parametrize("name", PAGES)
def test_it_sends_anonymous_visitors_to_log_in(client, db, name):
    response = client.get(reverse(name))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


@pytest.mark.parametrize("persona", ["alice", "olivia", "fiona", "april", "adam"])
@pytest.mark.parametrize("name", PAGES)
def test_it_shows_every_page_to_every_role(client, scene, request, persona, name):
    client.force_login(request.getfixturevalue(persona))
    assert client.get(reverse(name)).status_code == 200


def test_it_shows_capacity_split_and_pending_reasons_on_the_overview(client, scene, alice):
    client.force_login(alice)
    response = client.get(reverse("dashboard:overview"))
    capacity = {row["device_class"]: row for row in response.context["capacity"]}
    assert capacity["h100"]["busy"] == 6
    assert capacity["h100"]["reserved"] == 2
    assert capacity["h100"]["stranded"] == 7  # big-a's 4 per pod fits no node: secret-b is held by quota
    assert capacity["h100"]["unhealthy"] == 1
    assert capacity["h100"]["free"] == 0
    reasons = {row["reason"]: row for row in response.context["pending"]}
    assert reasons["TopologyFragmented"] == {"reason": "TopologyFragmented", "count": 1, "mine": 1}
    assert reasons["QuotaExceeded"] == {"reason": "QuotaExceeded", "count": 1, "mine": 0}
    content = response.content.decode()
    assert 'data-counter="devices_stranded">7<' in content
    assert "train-a" in content  # admitted in the last cycle, and alice's team's
    assert "serve-b" not in content
    assert "1 of other teams" in content


def test_it_lists_only_the_members_team_and_counts_the_rest(client, scene, alice):
    client.force_login(alice)
    response = client.get(reverse("dashboard:queue"))
    content = response.content.decode()
    assert "big-a" in content
    assert "Needs 8 devices in one rack" in content
    assert "secret-b" not in content
    assert "team-b&#x27;s quota" not in content and "team-b's quota" not in content
    assert "serve-b" not in content
    assert response.context["hidden"] == {"total": 1, "by_reason": {"QuotaExceeded": 1}}
    assert [row["name"] for row in response.context["running"]["rows"]] == ["train-a"]
    assert response.context["running"]["rows"][0]["where"] == "r1: n1 ×4"


def test_it_lists_every_team_for_an_operator_in_a_stable_order(client, scene, olivia):
    client.force_login(olivia)
    response = client.get(reverse("dashboard:queue"))
    assert [row["name"] for row in response.context["pending"]["rows"]] == ["big-a", "secret-b"]
    assert response.context["hidden"] is None
    assert {row["name"] for row in response.context["running"]["rows"]} == {"train-a", "serve-b"}


def test_it_filters_the_queue_by_reason_team_and_class(client, scene, olivia):
    client.force_login(olivia)
    url = reverse("dashboard:queue")
    by_reason = client.get(url, {"reason": "QuotaExceeded"}).context["pending"]["rows"]
    assert [row["name"] for row in by_reason] == ["secret-b"]
    by_team = client.get(url, {"team": "team-a"}).context["pending"]["rows"]
    assert [row["name"] for row in by_team] == ["big-a"]
    by_class = client.get(url, {"resource_class": "small-inference"}).context
    assert by_class["pending"]["rows"] == []
    assert [row["name"] for row in by_class["running"]["rows"]] == ["serve-b"]


def test_it_shows_a_workload_with_explanation_history_timeline_and_cost(client, scene, alice):
    client.force_login(alice)
    response = client.get(reverse("dashboard:workload", args=[scene.a_wait.pk]))
    content = response.content.decode()
    assert "TopologyFragmented" in content
    assert "Ask for 1 pod fewer and it starts now." in content
    assert len(response.context["history"]) == 1
    running = client.get(reverse("dashboard:workload", args=[scene.a_run.pk]))
    assert [t.to_state for t in running.context["transitions"]] == ["Pending", "Admitted", "Running"]
    cost = running.context["cost"]
    assert cost["lines"][0]["device_class"] == "h100"
    assert cost["lines"][0]["device_hours"] == pytest.approx(8.0, abs=0.01)  # 4 devices for 2 hours
    assert cost["total"] == pytest.approx(32.0, abs=0.05)  # at $4 per device-hour
    assert running.context["placement_racks"] == [{"id": scene.r1.pk, "name": "r1", "devices": 4}]


def test_it_says_which_pods_of_a_shrunk_workload_are_shutting_down(client, scene, alice):
    from broker.workloads.models import Allocation

    client.force_login(alice)
    url = reverse("dashboard:workload", args=[scene.a_run.pk])
    assert not client.get(url).context["leaving"]
    active = Allocation.objects.filter(workload=scene.a_run, released_at__isnull=True).order_by("id")
    Allocation.objects.filter(pk__in=[a.pk for a in active[:2]]).update(
        eviction_requested_at=active[0].allocated_at, evicted_for=scene.a_wait
    )
    pods = len({allocation.pod_index for allocation in active[:2]})  # pods, not devices
    response = client.get(url)
    assert response.context["leaving"] == [{"for": f"team-a/{scene.a_wait.name}", "pods": pods}]
    noun = "pod" if pods == 1 else "pods"
    assert f"{pods} {noun} shutting down for team-a/{scene.a_wait.name}" in response.content.decode()


def test_it_hides_another_teams_workload_from_a_member(client, scene, alice, olivia):
    client.force_login(alice)
    assert client.get(reverse("dashboard:workload", args=[scene.b_wait.pk])).status_code == 404
    client.force_login(olivia)
    assert client.get(reverse("dashboard:workload", args=[scene.b_wait.pk])).status_code == 200


def test_it_shows_quota_usage_and_borrowing(client, scene, alice):
    client.force_login(alice)
    response = client.get(reverse("dashboard:teams"))
    lines = {q["queue"].name: q["lines"] for q in response.context["queues"]}
    assert lines["team-a"] == [
        {"device_class": "h100", "nominal": 8, "used": 4, "borrowed": 0, "borrowing_limit": None, "percent": 50}
    ]
    usage = response.context["usage"]
    assert usage["teams"]["team-a"][-1] == 4
    assert usage["teams"]["team-a"][0] == 0  # 24 hours ago nothing was held
    assert usage["teams"]["team-b"][-1] == 2


def test_it_offers_only_entitled_resource_classes(client, scene, alice, bob):
    client.force_login(alice)
    alice_classes = {c["rc"].name for c in client.get(reverse("dashboard:submit")).context["classes"]}
    assert alice_classes == {"distributed-training", "small-inference", "large-reserved-training"}
    client.force_login(bob)
    bob_page = client.get(reverse("dashboard:submit"))
    assert {c["rc"].name for c in bob_page.context["classes"]} == {"distributed-training", "small-inference"}
    words = {c["rc"].name: c["words"] for c in bob_page.context["classes"]}
    assert "all pods inside one rack" in words["distributed-training"]
    assert {c["price"] for c in bob_page.context["classes"]} == {4.0}


def test_it_tells_someone_in_no_team_why_there_is_nothing_to_submit_to(client, scene, alice, olivia):
    client.force_login(olivia)  # an operator of the platform, in no team
    page = client.get(reverse("dashboard:submit")).content.decode()
    assert 'id="no-queue"' in page and 'id="submit-button"' not in page
    client.force_login(alice)
    page = client.get(reverse("dashboard:submit")).content.decode()
    assert 'id="no-queue"' not in page and 'id="submit-button"' in page


def test_it_submits_through_the_service_and_shows_the_workload(client, scene, alice, cluster):
    client.force_login(alice)
    response = client.post(
        reverse("dashboard:submit"),
        {
            "name": "new-job",
            "queue": cluster.queue_a.pk,
            "resource_class": cluster.training.pk,
            "replicas": 2,
            "devices_per_pod": 2,
            "min_count": 2,
        },
    )
    workload = Workload.objects.get(name="new-job")
    assert response.status_code == 302
    assert response["Location"] == reverse("dashboard:workload", args=[workload.pk])
    assert workload.state == State.PENDING
    assert workload.pod_sets.get().min_count == 2
    assert AuditEvent.objects.filter(action="workload.submit", target_id=str(workload.pk)).exists()


def test_it_refuses_a_submission_to_another_teams_queue(client, scene, alice, cluster):
    client.force_login(alice)
    response = client.post(
        reverse("dashboard:submit"),
        {
            "name": "sneaky",
            "queue": cluster.queue_b.pk,
            "resource_class": cluster.training.pk,
            "replicas": 1,
            "devices_per_pod": 1,
        },
    )
    assert response.status_code == 200
    assert "queue" in response.context["form"].errors
    assert not Workload.objects.filter(name="sneaky").exists()


# --- operator actions ----------------------------------------------------------------------------------


def test_it_lets_an_operator_cordon_and_uncordon_a_node(client, scene, olivia, cluster):
    client.force_login(olivia)
    node = cluster.nodes[1]
    url = reverse("dashboard:node-cordon", args=[node.pk])
    assert client.post(url, {"cordoned": "true", "reason": "bad fan"}).status_code == 302
    assert Node.objects.get(pk=node.pk).cordoned
    event = AuditEvent.objects.get(action="node.cordon")
    assert event.manual_intervention and event.actor == olivia and event.reason == "bad fan"
    client.post(url, {"cordoned": "false"})
    assert not Node.objects.get(pk=node.pk).cordoned


def test_it_lets_an_operator_mark_a_device_unhealthy(client, scene, olivia, cluster):
    client.force_login(olivia)
    device = cluster.nodes[3].devices.get(name="1")
    client.post(reverse("dashboard:device-health", args=[device.pk]), {"health": "Unhealthy"})
    assert Device.objects.get(pk=device.pk).health == Health.UNHEALTHY
    assert AuditEvent.objects.get(action="device.mark_unhealthy").manual_intervention


@pytest.mark.parametrize("persona", ["alice", "fiona", "april"])
def test_it_refuses_inventory_actions_to_non_operators(client, scene, request, persona, cluster):
    client.force_login(request.getfixturevalue(persona))
    node = cluster.nodes[1]
    assert client.post(reverse("dashboard:node-cordon", args=[node.pk]), {"cordoned": "true"}).status_code == 403
    device = node.devices.first()
    response = client.post(reverse("dashboard:device-health", args=[device.pk]), {"health": "Unhealthy"})
    assert response.status_code == 403
    assert not Node.objects.get(pk=node.pk).cordoned
    assert not AuditEvent.objects.filter(manual_intervention=True).exists()


def test_it_refuses_actions_by_get(client, scene, olivia, cluster):
    client.force_login(olivia)
    assert client.get(reverse("dashboard:node-cordon", args=[cluster.nodes[0].pk])).status_code == 405


def test_it_lets_a_member_cancel_their_own_but_not_another_teams_workload(client, scene, alice):
    client.force_login(alice)
    assert client.post(reverse("dashboard:workload-cancel", args=[scene.b_wait.pk])).status_code == 404
    assert Workload.objects.get(pk=scene.b_wait.pk).state == State.PENDING
    client.post(reverse("dashboard:workload-cancel", args=[scene.a_run.pk]), {"reason": "done early"})
    workload = Workload.objects.get(pk=scene.a_run.pk)
    assert workload.state == State.CANCELLED
    assert not workload.allocations.filter(released_at__isnull=True).exists()
    assert not AuditEvent.objects.get(action="workload.cancel").manual_intervention  # it was their own


def test_it_counts_an_operators_cancel_as_a_manual_intervention(client, scene, olivia):
    client.force_login(olivia)
    client.post(reverse("dashboard:workload-cancel", args=[scene.b_run.pk]), {"reason": "freeing capacity"})
    assert Workload.objects.get(pk=scene.b_run.pk).state == State.CANCELLED
    assert AuditEvent.objects.get(action="workload.cancel").manual_intervention


def test_it_lets_only_operators_change_a_priority(client, scene, alice, olivia):
    url = reverse("dashboard:workload-priority", args=[scene.a_wait.pk])
    client.force_login(alice)
    assert client.post(url, {"priority": "5000"}).status_code == 403
    client.force_login(olivia)
    client.post(url, {"priority": "5000", "reason": "deadline"})
    assert Workload.objects.get(pk=scene.a_wait.pk).priority == 5000
    event = AuditEvent.objects.get(action="workload.priority")
    assert event.manual_intervention and event.after == {"priority": 5000}


def test_it_shows_action_forms_with_a_confirmation_only_to_those_allowed(client, scene, alice, olivia, fiona):
    url = reverse("dashboard:workload", args=[scene.a_wait.pk])
    client.force_login(alice)
    content = client.get(url).content.decode()
    assert "Cancel workload" in content and "data-confirm=" in content
    assert "Set priority" not in content
    client.force_login(olivia)
    assert "Set priority" in client.get(url).content.decode()


def test_it_tells_an_evicting_workload_who_it_is_evicted_for(client, scene, alice):
    from django.utils import timezone

    Workload.objects.filter(pk=scene.a_run.pk).update(
        eviction_requested_at=timezone.now(), evicted_for=scene.a_wait, eviction_rule="WithinQueue"
    )
    client.force_login(alice)
    content = client.get(reverse("dashboard:workload", args=[scene.a_run.pk])).content.decode()
    assert f'Being evicted for <a href="{reverse("dashboard:workload", args=[scene.a_wait.pk])}">' in content
    assert "under rule WithinQueue" in content


def test_it_counts_a_large_cycles_changes_in_the_database_and_loads_only_the_rows_it_shows(
    cluster, scene, alice, olivia
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from broker.workloads.models import ExplanationChange
    from dashboard import queries
    from tests.builders import make_workload

    for index in range(25):
        workload = make_workload(cluster.queue_a, f"many-a-{index}", resource_class=cluster.training)
        ExplanationChange.objects.create(workload=workload, cycle=scene.cycle, reason="Pending", message="waits")
    for index in range(3):
        workload = make_workload(cluster.queue_b, f"many-b-{index}", resource_class=cluster.training)
        ExplanationChange.objects.create(workload=workload, cycle=scene.cycle, reason="Pending", message="waits")

    with CaptureQueriesContext(connection) as queried:
        for_alice = queries.last_cycle_changes(alice)["changed"]
    for_olivia = queries.last_cycle_changes(olivia)["changed"]

    # The scene's cycle also explained big-a (team-a) and secret-b (team-b).
    assert (len(for_alice["shown"]), for_alice["more"], for_alice["hidden"]) == (20, 6, 4)
    assert (len(for_olivia["shown"]), for_olivia["more"], for_olivia["hidden"]) == (20, 10, 0)
    assert {workload.team.name for workload in for_alice["shown"]} == {cluster.team_a.name}
    rows = [q["sql"] for q in queried.captured_queries if q["sql"].startswith('SELECT "workloads_workload"."id"')]
    assert rows and all("LIMIT 20" in sql for sql in rows)


def test_it_lists_a_cycles_admissions_once_each_and_not_among_its_changed_explanations(scene, olivia):
    from dashboard import queries

    changes = queries.last_cycle_changes(olivia)
    # train-a holds 4 devices, serve-b 2: one entry each, from the cycle's history rows.
    assert sorted(w.name for w in changes["admitted"]["shown"]) == ["serve-b", "train-a"]
    assert (changes["admitted"]["more"], changes["admitted"]["hidden"]) == (0, 0)
    assert sorted(w.name for w in changes["changed"]["shown"]) == ["big-a", "secret-b"]


def current_section(response):
    """The label of the top bar's link marked as the current page (None: none is)."""
    for link in response.context["nav_links"]:
        if link.current:
            return link.label
    return None


def test_it_marks_the_queue_as_current_on_a_workload_page(client, scene, alice):
    client.force_login(alice)
    assert current_section(client.get(reverse("dashboard:workload", args=[scene.a_wait.pk]))) == "Queue"
    assert current_section(client.get(reverse("dashboard:topology"))) == "Topology"


def test_it_marks_a_form_reached_from_the_menu_as_the_menu(client, scene, olivia):
    client.force_login(olivia)
    assert current_section(client.get(reverse("governance:class-new"))) == "Menu"
    assert current_section(client.get(reverse("governance:audit"))) == "Audit"


def test_it_names_its_icon_on_every_page_and_answers_browsers_that_ask_for_favicon_ico(client, db):
    from django.contrib.staticfiles import finders
    from django.templatetags.static import static

    icon = static("img/favicon.svg")
    assert f'<link rel="icon" href="{icon}" type="image/svg+xml">' in client.get(reverse("login")).content.decode()
    response = client.get("/favicon.ico")
    assert (response.status_code, response["Location"]) == (301, icon)
    assert finders.find("img/favicon.svg")


def test_it_refuses_a_name_over_100_characters_instead_of_cutting_it(client, scene, alice, cluster):
    client.force_login(alice)
    page = client.get(reverse("dashboard:submit")).content.decode()
    assert 'maxlength="100"' not in page  # the browser would cut a pasted name without a word
    response = client.post(
        reverse("dashboard:submit"),
        {
            "name": "n" * 101,
            "queue": cluster.queue_a.pk,
            "resource_class": cluster.training.pk,
            "replicas": 1,
            "devices_per_pod": 1,
        },
    )
    assert response.status_code == 200
    assert "at most 100 characters (it has 101)" in response.content.decode()
    assert not Workload.objects.filter(name__startswith="nnnn").exists()


def test_it_submits_a_request_for_one_partition_profile_of_a_class(client, scene, alice, cluster):
    from broker.policy.models import DeviceClass
    from tests.builders import make_resource_class

    profiles = [
        DeviceClass.objects.create(
            name=f"mig-{size}",
            selector=f'device.attributes["gpu.example.com"].profile == "{size}"',
            price_per_hour="1.00",
        )
        for size in ("1g", "2g")
    ]
    slices = make_resource_class("gpu-slice", cluster.inference.priority_class, profiles, max_devices_per_pod=1)
    client.force_login(alice)
    page = client.get(reverse("dashboard:submit"))
    choices = [label for _, label in page.context["form"].fields["device_class"].choices]
    assert "mig-2g" in choices and "h100" in choices
    # The page tells its script which device classes each resource class offers.
    assert f'value="{slices.pk}" data-name="gpu-slice"' in page.content.decode()
    assert 'data-device-classes="mig-1g mig-2g "' in page.content.decode()

    response = client.post(
        reverse("dashboard:submit"),
        {"name": "eval", "queue": cluster.queue_a.pk, "resource_class": slices.pk, "device_class": "mig-2g",
         "replicas": 2, "devices_per_pod": 1},
    )  # fmt: skip

    assert response.status_code == 302
    assert Workload.objects.get(name="eval").pod_sets.get().device_classes == ["mig-2g"]
    refused = client.post(
        reverse("dashboard:submit"),
        {"name": "wrong", "queue": cluster.queue_a.pk, "resource_class": slices.pk, "device_class": "h100",
         "replicas": 1, "devices_per_pod": 1},
    )  # fmt: skip
    assert refused.status_code == 200
    assert "does not offer h100" in str(refused.context["form"].errors["device_class"])
    assert not Workload.objects.filter(name="wrong").exists()
