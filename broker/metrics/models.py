from django.db import models


class PendingSecondsRollup(models.Model):
    """The microseconds workloads waited under a reason within one whole past hour, per team and
    resource class: the part of capacity_broker_pending_seconds_total that lies in that hour.

    Ids, not foreign keys, as the cost rollups: the scrape names them as they are now, the way the
    direct computation names a workload's team and class. Integer microseconds, so the hours add up
    to the direct figure exactly. How far it reaches is PendingSecondsProgress."""

    hour = models.DateTimeField()
    reason = models.CharField(max_length=32)
    team_id = models.BigIntegerField(null=True)
    resource_class_id = models.BigIntegerField(null=True)
    us = models.BigIntegerField(default=0)

    class Meta:
        indexes = [models.Index(fields=["hour"])]


class PendingSecondsProgress(models.Model):
    """Every hour before `until` is in PendingSecondsRollup (an hour without a row had no waiting).
    One row, ROW; none before the first catch-up."""

    ROW = 1

    until = models.DateTimeField()

    @classmethod
    def reached(cls):
        """`until`, or None before the first catch-up."""
        return cls.objects.filter(pk=cls.ROW).values_list("until", flat=True).first()
