import pytest

from broker.audit.models import AuditEvent, ImmutableError, record


def test_it_refuses_to_edit_or_delete_audit_events(cluster, olivia):
    event = record("node.cordon", cluster.nodes[0], actor=olivia, reason="maintenance", manual_intervention=True)
    event.reason = "rewritten"
    with pytest.raises(ImmutableError):
        event.save()
    with pytest.raises(ImmutableError):
        event.delete()
    with pytest.raises(ImmutableError):
        AuditEvent.objects.all().delete()
    with pytest.raises(ImmutableError):
        AuditEvent.objects.update(reason="x")
    assert AuditEvent.objects.get().reason == "maintenance"
    assert event.actor_name == "olivia"
