from django.db import models


class PendingSecondsRollup(models.Model):
    """The microseconds workloads waited under a reason within one whole past hour, per team and
    resource class: the part of capacity_broker_pending_seconds_total that lies in that hour.

    Ids, not foreign keys, as the cost rollups: the scrape names them as they are now, the way the
    direct computation names a workload's team and class. Integer microseconds, so the hours add up
    to the direct figure exactly. Progress is kept in broker.costs' RollupProgress under PROGRESS."""

    PROGRESS = "pending_seconds"

    hour = models.DateTimeField()
    reason = models.CharField(max_length=32)
    team_id = models.BigIntegerField(null=True)
    resource_class_id = models.BigIntegerField(null=True)
    us = models.BigIntegerField(default=0)

    class Meta:
        indexes = [models.Index(fields=["hour"])]
