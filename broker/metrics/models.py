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


class HistoryCheckpoint(models.Model):
    """The history-walking metrics (the wait histogram, the seconds by reason since the rollup, the
    workloads ever pended or wrongly classed by reason, the fallbacks) as they stood at `taken_at`, so a
    scrape computes only the workloads touched since (broker/metrics/checkpoint.py). One row, ROW.

    It holds while the history it was taken from is unchanged: the rows up to each last id are still
    exactly as many (none deleted, none committed late below them), the rollup reaches the same hour and
    the resource classes' first device classes are the same."""

    ROW = 1

    taken_at = models.DateTimeField()
    rolled_until = models.DateTimeField(null=True)
    last_change_id = models.BigIntegerField()
    changes = models.BigIntegerField()
    last_transition_id = models.BigIntegerField()
    transitions = models.BigIntegerField()
    last_workload_id = models.BigIntegerField()
    workloads = models.BigIntegerField()
    menu_heads = models.JSONField(default=dict)
    totals = models.JSONField(default=dict)


class WorkloadCheckpoint(models.Model):
    """One workload's part of HistoryCheckpoint.totals as computed at `taken_at` (the checkpoint's, or an
    earlier one's for a workload untouched since: its open stretches have grown since by as much), to
    take away when it is touched after the checkpoint. An id, not a foreign key: a deleted workload's
    part stays until the next full checkpoint (the checkpoint no longer holds then anyway)."""

    workload_id = models.BigIntegerField(primary_key=True)
    taken_at = models.DateTimeField()
    part = models.JSONField()
