"""What governance adds to a workload and a resource class: the approval request's life (escalation,
granted window, reservation) and a cost threshold for approval. The decision itself (who, when, the
comment) stays on the workload, where the API and the scheduler's loader already read it."""

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import F, Q
from django.utils import timezone


class ApprovalPolicy(models.Model):
    """Approval rules of a resource class beyond the class's own flag and device threshold."""

    resource_class = models.OneToOneField(
        "policy.ResourceClass", on_delete=models.CASCADE, related_name="approval_policy"
    )
    cost_threshold_per_hour = models.DecimalField(
        max_digits=12,
        decimal_places=2,
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        help_text="Requests whose devices cost more than this per hour need approval; empty: no cost rule.",
    )

    class Meta:
        verbose_name_plural = "approval policies"

    def __str__(self):
        return f"approval policy of {self.resource_class.name}"


class ApprovalRequestQuerySet(models.QuerySet):
    def outside_window(self, now):
        """Workload ids the cycle must not schedule at `now`: their approval window is not open. A
        values() subquery, so the loader's and the pages' pending queries stay one round trip each."""
        return self.filter(Q(not_before__gt=now) | Q(not_after__lte=now)).values("workload_id")


class ApprovalRequest(models.Model):
    """One request for approval: why it was needed, when it escalates, and what the approval granted."""

    workload = models.OneToOneField("workloads.Workload", on_delete=models.CASCADE, related_name="approval_request")
    requested_at = models.DateTimeField(default=timezone.now)
    due_at = models.DateTimeField(db_index=True, help_text="Escalated to admins if still undecided then.")
    reasons = models.JSONField(default=list, help_text="Why approval is needed, in plain words.")
    cost_per_hour = models.DecimalField(max_digits=14, decimal_places=2, null=True, blank=True)
    escalated_at = models.DateTimeField(null=True, blank=True)
    not_before = models.DateTimeField(null=True, blank=True, help_text="Not schedulable before this.")
    not_after = models.DateTimeField(null=True, blank=True, help_text="Not schedulable after this.")
    reservation = models.ForeignKey(
        "policy.Reservation", null=True, blank=True, on_delete=models.SET_NULL, related_name="approval_requests"
    )
    window_expired_at = models.DateTimeField(null=True, blank=True)

    objects = ApprovalRequestQuerySet.as_manager()

    class Meta:
        ordering = ["requested_at", "id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(not_before__isnull=True) | Q(not_after__isnull=True) | Q(not_after__gt=F("not_before")),
                name="approval_window_ends_after_start",
            )
        ]

    def __str__(self):
        return f"approval request for {self.workload}"

    def clean(self):
        if self.not_before and self.not_after and self.not_after <= self.not_before:
            raise ValidationError({"not_after": "The window must end after it starts."})

    @property
    def has_window(self):
        return self.not_before is not None or self.not_after is not None

    def window_open(self, now):
        return (self.not_before is None or self.not_before <= now) and (self.not_after is None or now < self.not_after)
