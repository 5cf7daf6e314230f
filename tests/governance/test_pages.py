"""Governance pages: the menu and its editor, the approvals inbox, the approval on the workload page."""

from decimal import Decimal

import pytest
from django.urls import reverse

from broker.audit.models import AuditEvent
from broker.governance import menu
from broker.governance.models import ApprovalPolicy
from broker.inventory.models import ClusterState
from broker.policy.models import DeviceClass
from broker.workloads import services
from broker.workloads.models import ApprovalState
from broker.workloads.states import State
from tests.governance.helpers import submit


def test_it_describes_a_class_in_plain_words(cluster):
    cluster.reserved.max_devices = 8
    cluster.reserved.topology_required = "rack"
    cluster.reserved.preemptible = True
    cluster.reserved.priority_class = cluster.training.priority_class
    cluster.reserved.save()

    assert menu.describe(cluster.reserved) == (
        "Up to 8 H100-class devices, all in one rack, may be preempted by production work, "
        "$4.00 per device-hour, needs approval"
    )


def test_it_describes_fallbacks_limits_and_every_approval_rule(cluster):
    a100 = DeviceClass.objects.create(name="a100", selector="device.driver == 'x'", price_per_hour="2.00")
    cluster.training.device_class_choices.create(device_class=a100, rank=1)
    cluster.training.approval_threshold_devices = 16
    cluster.training.max_devices_per_pod = 4
    cluster.training.max_duration_seconds = 7200
    cluster.training.save()
    ApprovalPolicy.objects.create(resource_class=cluster.training, cost_threshold_per_hour=Decimal("50"))

    assert menu.describe(cluster.training) == (
        "Any number of H100-class devices (or else A100-class), at most 4 per pod, all in one rack, "
        "may be preempted by production work, runs at most 2 hours, $4.00 per device-hour, "
        "needs approval above 16 devices or above $50.00 per hour"
    )
    assert menu.describe(cluster.inference).endswith("never preempted, $4.00 per device-hour, no approval needed")


def test_it_shows_a_member_only_the_classes_their_team_may_use(client, cluster, alice, bob):
    client.force_login(bob)
    page = client.get(reverse("governance:menu")).content.decode()

    assert 'data-class="distributed-training"' in page and 'data-class="small-inference"' in page
    assert 'data-class="large-reserved-training"' not in page
    assert "$4.00/h" in page and "edit</a>" not in page

    client.force_login(alice)
    assert 'data-class="large-reserved-training"' in client.get(reverse("governance:menu")).content.decode()


def test_it_shows_an_operator_every_class_with_its_teams_and_an_edit_link(client, cluster, olivia):
    client.force_login(olivia)
    page = client.get(reverse("governance:menu")).content.decode()

    assert page.count("data-class=") == 3
    assert reverse("governance:class-edit", args=[cluster.reserved.pk]) in page


def class_form(cluster, **changes):
    data = {
        "name": "distributed-training",
        "display_name": "Distributed training",
        "description": "",
        "device_classes": "h100",
        "topology_required": "rack",
        "topology_preferred": "",
        "sharing": "Exclusive",
        "priority_class": cluster.training.priority_class.pk,
        "preemptible": "on",
        "checkpoint_restart_seconds": "60",
        "max_devices": "",
        "max_devices_per_pod": "",
        "max_duration_seconds": "",
        "cost_label": "",
        "approval_threshold_devices": "",
        "cost_threshold_per_hour": "",
        "reason": "",
    }
    data.update(changes)
    return {key: value for key, value in data.items() if value is not None}


def test_it_lets_an_operator_edit_a_class_and_audits_before_and_after(client, cluster, olivia):
    a100 = DeviceClass.objects.create(name="a100", selector="device.driver == 'x'", price_per_hour="2.00")
    generation = ClusterState.current_generation("default")
    client.force_login(olivia)

    response = client.post(
        reverse("governance:class-edit", args=[cluster.training.pk]),
        class_form(
            cluster,
            device_classes="a100, h100",
            max_devices="16",
            approval_required="on",
            cost_threshold_per_hour="40",
            allowed_teams=[cluster.team_b.pk],
            reason="team-b only from now on",
        ),
    )

    assert response.status_code == 302, response.content.decode()[:2000]
    cluster.training.refresh_from_db()
    assert [dc.name for dc in cluster.training.ordered_device_classes()] == ["a100", "h100"]
    assert list(cluster.training.allowed_teams.all()) == [cluster.team_b]
    assert cluster.training.approval_policy.cost_threshold_per_hour == Decimal("40.00")
    event = AuditEvent.objects.get(action="resourceclass.update")
    assert (event.actor, event.reason) == (olivia, "team-b only from now on")
    assert event.before["device_classes"] == ["h100"] and event.after["device_classes"] == ["a100", "h100"]
    assert (event.before["allowed_teams"], event.after["allowed_teams"]) == ([], ["team-b"])
    assert (event.before["approval_required"], event.after["approval_required"]) == (False, True)
    assert event.after["cost_threshold_per_hour"] == "40.00" and event.after["max_devices"] == 16
    assert ClusterState.current_generation("default") == generation + 1
    assert a100.resource_class_choices.get().rank == 0


def test_it_refuses_unknown_device_classes_and_creates_a_new_class(client, cluster, olivia):
    client.force_login(olivia)
    bad = client.post(reverse("governance:class-new"), class_form(cluster, name="new-one", device_classes="h100, tpu"))
    assert bad.status_code == 200 and "Unknown device class: tpu." in bad.content.decode()

    good = client.post(reverse("governance:class-new"), class_form(cluster, name="new-one", display_name="New one"))
    assert good.status_code == 302
    event = AuditEvent.objects.get(action="resourceclass.create")
    assert event.before is None and event.after["name"] == "new-one"


@pytest.mark.parametrize("persona", ["alice", "fiona", "april"])
def test_it_lets_only_operators_edit_the_menu(client, cluster, request, persona):
    client.force_login(request.getfixturevalue(persona))
    url = reverse("governance:class-edit", args=[cluster.training.pk])
    assert client.get(url).status_code == 403
    assert client.post(url, class_form(cluster, max_devices="1")).status_code == 403
    cluster.training.refresh_from_db()
    assert cluster.training.max_devices is None
    assert not AuditEvent.objects.filter(action__startswith="resourceclass.").exists()


def test_it_lists_requests_and_approves_with_a_comment_from_the_inbox(client, cluster, alice, april):
    workload = submit(cluster, alice)
    client.force_login(april)

    page = client.get(reverse("governance:approvals")).content.decode()
    assert f'data-approval-row="{workload.pk}"' in page and "always needs approval" in page

    missing = client.post(reverse("governance:approve", args=[workload.pk]), {f"w{workload.pk}-comment": " "})
    assert missing.status_code == 302
    workload.refresh_from_db()
    assert workload.approval == ApprovalState.REQUESTED

    client.post(reverse("governance:approve", args=[workload.pk]), {f"w{workload.pk}-comment": "go ahead"})
    workload.refresh_from_db()
    assert (workload.state, workload.approval_decided_by, workload.approval_comment) == (
        State.PENDING,
        april,
        "go ahead",
    )
    page = client.get(reverse("governance:approvals")).content.decode()
    assert f'data-approval-row="{workload.pk}"' not in page and "go ahead" in page


def test_it_rejects_from_the_inbox_and_shows_the_requester_who_and_why(client, cluster, alice, april):
    workload = submit(cluster, alice)
    client.force_login(april)
    client.post(reverse("governance:reject", args=[workload.pk]), {f"w{workload.pk}-comment": "no budget"})

    client.force_login(alice)
    page = client.get(reverse("dashboard:workload", args=[workload.pk])).content.decode()
    assert 'id="approval-decision" data-approval="Rejected"' in page
    assert '<span id="approval-decided-by">april</span>' in page and "“no budget”" in page


def test_it_offers_no_decision_on_an_approvers_own_request(client, cluster, paula, april):
    workload = submit(cluster, paula)
    client.force_login(paula)

    row = client.get(reverse("governance:approval-row", args=[workload.pk])).content.decode()
    assert "another approver must decide" in row and "<form" not in row

    client.post(reverse("governance:approve", args=[workload.pk]), {f"w{workload.pk}-comment": "mine, fine"})
    workload.refresh_from_db()
    assert workload.approval == ApprovalState.REQUESTED

    client.force_login(april)
    assert "<form" in client.get(reverse("governance:approval-row", args=[workload.pk])).content.decode()


def test_it_grants_a_window_with_a_reservation_from_the_inbox(client, cluster, alice, april):
    workload = submit(cluster, alice)
    client.force_login(april)
    client.post(
        reverse("governance:approve", args=[workload.pk]),
        {
            f"w{workload.pk}-comment": "tonight",
            f"w{workload.pk}-not_before": "2099-01-01T20:00",
            f"w{workload.pk}-not_after": "2099-01-02T06:00",
            f"w{workload.pk}-reserve": "on",
        },
    )

    client.force_login(alice)
    page = client.get(reverse("dashboard:workload", args=[workload.pk])).content.decode()
    assert "from Jan 1, 20:00" in page and "until Jan 2, 06:00" in page
    assert "8 devices held for team-a" in page


def test_it_answers_a_gone_row_for_a_decided_request(client, cluster, alice, april):
    workload = submit(cluster, alice)
    services.approve_workload(workload, april, "ok")
    client.force_login(april)
    row = client.get(reverse("governance:approval-row", args=[workload.pk])).content.decode()
    assert 'data-gone="true"' in row


def test_it_derives_who_may_preempt_whom_from_priorities_and_preemptibility(cluster):
    classes = [cluster.training, cluster.inference, cluster.reserved]
    allowed = {
        (row.name, column.name) for row, cells in menu.preemption_matrix(classes) for column, may in cells if may
    }
    assert allowed == {
        ("small-inference", "distributed-training"),
        ("large-reserved-training", "distributed-training"),
    }


def test_it_follows_an_operators_priority_change(cluster):
    cluster.training.priority_class.value = 5000
    cluster.training.priority_class.save()
    cluster.inference.preemptible = True
    cluster.inference.priority_class.preemptible = True
    cluster.inference.priority_class.save()
    cluster.inference.save()

    assert menu.may_preempt(cluster.training, cluster.inference)
    assert not menu.may_preempt(cluster.inference, cluster.training)


def test_it_shows_the_preemption_matrix_on_the_menu_page(client, cluster, olivia):
    client.force_login(olivia)
    html = client.get(reverse("governance:menu")).content.decode()
    assert 'id="preemption-matrix"' in html
    row = html.split('<tr data-preemptor="small-inference">')[-1].split("</tr>")[0]
    assert 'data-victim="distributed-training">may preempt' in row
    assert 'data-victim="large-reserved-training">—' in row


def test_it_offers_only_rejection_of_a_request_its_team_may_not_use(client, cluster, alice, april):
    workload = submit(cluster, alice)
    cluster.reserved.allowed_teams.set([cluster.team_b])  # the menu changed after the request
    client.force_login(april)

    row = client.get(reverse("governance:approval-row", args=[workload.pk])).content.decode()
    assert "team-a may not use large-reserved-training" in row
    assert 'class="approve"' not in row and 'class="danger reject"' in row
    response = client.post(reverse("governance:approve", args=[workload.pk]), {f"w{workload.pk}-comment": "ok"})
    assert response.status_code == 302
    workload.refresh_from_db()
    assert workload.state == State.AWAITING_APPROVAL  # refused, with the reason in a message
    page = client.get(reverse("governance:approvals")).content.decode()
    assert "may not use large-reserved-training" in page
