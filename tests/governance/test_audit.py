"""The audit trail: searchable, filterable, exportable, and written once: no API, admin page or page of
ours edits or deletes an event."""

import csv
import io

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from broker.audit.models import AuditEvent, ImmutableError, record
from broker.cycle.runner import run_once
from broker.inventory.models import Device
from broker.policy.models import WithinQueuePolicy
from broker.workloads import services
from tests.cycle.helpers import pending, running
from tests.governance.helpers import submit


@pytest.fixture
def trail(cluster, alice, april, olivia):
    workload = submit(cluster, alice)
    services.reject_workload(workload, april, "no budget for =SUM(A1)")
    record("node.cordon", cluster.nodes[0], actor=olivia, reason="firmware", manual_intervention=True)
    return workload


def rows(response):
    return list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))


def test_it_searches_and_filters_the_trail(client, trail, olivia):
    client.force_login(olivia)

    searched = client.get(reverse("governance:audit"), {"q": "budget"}).content.decode()
    assert 'data-action="workload.reject"' in searched and 'data-action="node.cordon"' not in searched

    manual = client.get(reverse("governance:audit"), {"manual": "yes"}).content.decode()
    assert manual.count("data-event=") == 1 and 'data-action="node.cordon"' in manual

    by_actor = client.get(reverse("governance:audit"), {"actor": "alice", "action": "workload.submit"})
    assert by_actor.content.decode().count("data-event=") == 1


def test_it_exports_the_filtered_trail_as_csv_that_spreadsheets_cannot_run(client, trail, april):
    client.force_login(april)

    response = client.get(reverse("governance:audit-export"), {"action": "workload.reject"})

    assert response["Content-Type"].startswith("text/csv")
    exported = rows(response)
    assert [(row["action"], row["actor_name"]) for row in exported] == [("workload.reject", "april")]
    assert exported[0]["reason"] == "no budget for =SUM(A1)"
    everything = rows(client.get(reverse("governance:audit-export")))
    assert len(everything) == AuditEvent.objects.count()


def test_it_audits_preemptions_made_by_the_cycle(client, cluster, olivia):
    cluster.queue_a.within_queue_preemption = WithinQueuePolicy.LOWER_PRIORITY
    cluster.queue_a.nominal_quota = None
    cluster.queue_a.save()
    hog = running(cluster.queue_a, "hog", list(Device.objects.all()), cluster.h100, priority=1)
    pending(cluster.queue_a, "urgent", replicas=2, devices_per_pod=4, resource_class=cluster.training, priority=100)

    assert run_once().preempted == (hog.pk,)

    event = AuditEvent.objects.get(action="workload.preempt")
    assert (event.target_id, event.actor_name, event.before["state"]) == (str(hog.pk), "system", "Running")
    client.force_login(olivia)
    page = client.get(reverse("governance:audit"), {"action": "workload.preempt"}).content.decode()
    assert page.count("data-event=") == 1
    with pytest.raises(ImmutableError):
        event.delete()


def test_it_refuses_to_change_or_delete_an_event_in_the_model(trail):
    event = AuditEvent.objects.filter(action="workload.reject").get()
    event.reason = "rewritten"
    with pytest.raises(ImmutableError):
        event.save()
    with pytest.raises(ImmutableError):
        event.delete()
    with pytest.raises(ImmutableError):
        AuditEvent.objects.filter(pk=event.pk).update(reason="rewritten")
    with pytest.raises(ImmutableError):
        AuditEvent.objects.all().delete()
    assert AuditEvent.objects.get(pk=event.pk).reason == "no budget for =SUM(A1)"


@pytest.mark.parametrize("persona", ["olivia", "april", "adam"])
def test_it_offers_no_write_through_the_api(api_client, trail, request, persona):
    event = AuditEvent.objects.filter(action="workload.reject").get()
    api_client.force_authenticate(request.getfixturevalue(persona))
    url = f"/api/audit-events/{event.pk}/"

    assert api_client.put(url, {"reason": "x"}, format="json").status_code == 405
    assert api_client.patch(url, {"reason": "x"}, format="json").status_code == 405
    assert api_client.delete(url).status_code == 405
    assert api_client.post("/api/audit-events/", {"action": "fake"}, format="json").status_code == 405
    assert AuditEvent.objects.get(pk=event.pk).reason == "no budget for =SUM(A1)"


def test_it_offers_no_write_in_the_admin_even_to_a_superuser(client, trail):
    root = User.objects.create_superuser("root", "root@example.com", "password")
    client.force_login(root)
    event = AuditEvent.objects.filter(action="workload.reject").get()
    count = AuditEvent.objects.count()

    change = reverse("admin:audit_auditevent_change", args=[event.pk])
    assert client.get(change).status_code == 200  # read-only view
    assert client.post(change, {"reason": "rewritten", "action": "x"}).status_code == 403
    assert client.post(reverse("admin:audit_auditevent_delete", args=[event.pk]), {"post": "yes"}).status_code == 403
    assert client.post(reverse("admin:audit_auditevent_add"), {"action": "fake"}).status_code == 403
    changelist = client.post(
        reverse("admin:audit_auditevent_changelist"),
        {"action": "delete_selected", "_selected_action": [event.pk], "post": "yes"},
    )
    assert changelist.status_code in (200, 302)
    assert AuditEvent.objects.count() == count
    assert AuditEvent.objects.get(pk=event.pk).reason == "no budget for =SUM(A1)"


def test_it_offers_no_write_on_the_audit_pages(client, trail, adam):
    client.force_login(adam)
    count = AuditEvent.objects.count()
    for name in ("governance:audit", "governance:audit-export"):
        assert client.post(reverse(name), {"reason": "x"}).status_code == 405
        assert client.delete(reverse(name)).status_code == 405
    assert AuditEvent.objects.count() == count


@pytest.mark.parametrize(
    "reason", ["=cmd|' /C calc'!A0", "+1+1", "-2+3", "@SUM(A1)", "\t=cmd", "\r=cmd", "\n=1+1", "\uff1d1+1"]
)
def test_it_quotes_every_cell_a_spreadsheet_would_run(client, cluster, olivia, reason):
    record("node.cordon", cluster.nodes[0], actor=olivia, reason=reason, manual_intervention=True)
    client.force_login(olivia)

    exported = rows(client.get(reverse("governance:audit-export"), {"action": "node.cordon"}))

    assert exported[0]["reason"] == "'" + reason
