from contextlib import contextmanager
from contextvars import ContextVar

from django.conf import settings
from django.db import models
from django.utils import timezone


class ImmutableError(Exception):
    pass


class AuditEventQuerySet(models.QuerySet):
    def update(self, **kwargs):
        raise ImmutableError("Audit events cannot be changed.")

    def delete(self):
        raise ImmutableError("Audit events cannot be deleted.")


class AuditEvent(models.Model):
    """Who did what to what, when and why. Written once; never edited or deleted."""

    at = models.DateTimeField(default=timezone.now, db_index=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    actor_name = models.CharField(max_length=150, help_text="Kept even if the user is later removed.")
    action = models.CharField(max_length=64, db_index=True)
    target_type = models.CharField(max_length=64, db_index=True)
    target_id = models.CharField(max_length=64, blank=True)
    target_repr = models.CharField(max_length=255, blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    reason = models.TextField(blank=True)
    manual_intervention = models.BooleanField(
        default=False, help_text="An operator changed a placement, health, priority or quota by hand."
    )
    replayed = models.BooleanField(
        default=False,
        help_text="Written by the demo's trace replay on a member's behalf, not by the person named.",
    )

    objects = AuditEventQuerySet.as_manager()

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self):
        return f"{self.at:%Y-%m-%d %H:%M} {self.actor_name} {self.action} {self.target_repr}"

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise ImmutableError("Audit events cannot be changed.")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise ImmutableError("Audit events cannot be deleted.")


# Set while the demo's trace replay acts for a member (broker.cycle.replay): its events say so.
_replaying = ContextVar("audit_replaying", default=False)


@contextmanager
def replaying():
    """Everything recorded inside is marked as replayed activity."""
    token = _replaying.set(True)
    try:
        yield
    finally:
        _replaying.reset(token)


def record(action, target, actor=None, before=None, after=None, reason="", manual_intervention=False):
    """Write one audit event about `target` (a model instance) and return it."""
    written = event(action, target, actor, before, after, reason, manual_intervention)
    written.save()
    return written


def record_all(events):
    """Write the unsaved `events` (see `event`) in one statement: a cycle that stops hundreds of
    workloads audits each of them."""
    return AuditEvent.objects.bulk_create(events)


def event(action, target, actor=None, before=None, after=None, reason="", manual_intervention=False):
    """The audit event `record` would write, unsaved (for `record_all`)."""
    return AuditEvent(
        replayed=_replaying.get(),
        actor=actor if actor is not None and actor.is_authenticated else None,
        actor_name=actor.get_username() if actor is not None and actor.is_authenticated else "system",
        action=action,
        target_type=target._meta.label_lower,
        target_id=str(target.pk),
        target_repr=str(target)[:255],
        before=before,
        after=after,
        reason=reason,
        manual_intervention=manual_intervention,
    )
