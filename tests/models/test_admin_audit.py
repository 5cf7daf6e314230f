from django.contrib.auth.models import User
from django.urls import reverse

from broker.audit.models import AuditEvent
from broker.inventory.models import ClusterState
from broker.policy.models import Queue


def superuser(client):
    user = User.objects.create_superuser("root", "root@example.com", "password")
    client.force_login(user)
    return user


def queue_form(queue, **changes):
    data = {
        "name": queue.name,
        "team": queue.team_id,
        "cohort": queue.cohort_id or "",
        "nominal_quota": '{"h100": 8}',
        "borrowing_limit": "null",
        "lending_limit": "null",
        "fair_share_weight": "1.0",
        "within_queue_preemption": queue.within_queue_preemption,
        "reclaim_within_cohort": queue.reclaim_within_cohort,
    }
    data.update(changes)
    return data


def test_it_audits_a_quota_edit_in_the_admin_as_a_manual_intervention(client, cluster):
    root = superuser(client)
    generation = ClusterState.current_generation()
    url = reverse("admin:policy_queue_change", args=[cluster.queue_a.pk])

    response = client.post(url, queue_form(cluster.queue_a, nominal_quota='{"h100": 12}'))

    assert response.status_code == 302, response.content.decode()[:2000]
    assert Queue.objects.get(pk=cluster.queue_a.pk).nominal_quota == {"h100": 12}
    event = AuditEvent.objects.get(action="queue.update")
    assert (event.actor, event.target_id, event.manual_intervention) == (root, str(cluster.queue_a.pk), True)
    assert event.before["nominal_quota"] == {"h100": 8}
    assert event.after["nominal_quota"] == {"h100": 12}
    assert ClusterState.current_generation() > generation


def test_it_writes_nothing_when_the_admin_refuses_the_form(client, cluster):
    superuser(client)
    url = reverse("admin:policy_queue_change", args=[cluster.queue_a.pk])

    response = client.post(url, queue_form(cluster.queue_a, nominal_quota='{"no-such-class": 1}'))

    assert response.status_code == 200
    assert "Unknown device class" in response.content.decode()
    assert not AuditEvent.objects.exists()
    assert Queue.objects.get(pk=cluster.queue_a.pk).nominal_quota == {"h100": 8}


def test_it_audits_deletions_in_the_admin(client, cluster):
    superuser(client)
    team = cluster.team_a.__class__.objects.create(name="temporary")
    url = reverse("admin:policy_team_delete", args=[team.pk])

    response = client.post(url, {"post": "yes"})

    assert response.status_code == 302
    event = AuditEvent.objects.get(action="team.delete")
    assert event.before["name"] == "temporary"
