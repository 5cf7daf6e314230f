from django.core.validators import MinValueValidator
from django.db import models


class DeviceClassPrice(models.Model):
    """One price of a device class, in force from `effective_from` until the next row of the class.

    The history is append-only: a new price never changes what was already billed. DeviceClass.price_per_hour
    stays the price in force now (the scheduler and the forms read it); these rows are what the ledger reads.
    """

    device_class = models.ForeignKey("policy.DeviceClass", on_delete=models.CASCADE, related_name="price_history")
    price_per_hour = models.DecimalField(max_digits=10, decimal_places=4, validators=[MinValueValidator(0)])
    effective_from = models.DateTimeField(db_index=True)
    recorded_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["device_class", "effective_from"]
        constraints = [
            models.UniqueConstraint(fields=["device_class", "effective_from"], name="price_unique_per_class_and_time")
        ]

    def __str__(self):
        return f"{self.device_class_id} {self.price_per_hour}/h from {self.effective_from:%Y-%m-%d %H:%M}"


class CapacitySample(models.Model):
    """What the free capacity of one device class looked like at `at`; it holds until the next sample
    of the class. Allocated devices are not sampled: the ledger reads them from Allocation intervals.

    Compact: a row is written only when a count changes, not once per cycle.
    """

    at = models.DateTimeField(db_index=True)
    device_class = models.ForeignKey("policy.DeviceClass", on_delete=models.CASCADE, related_name="capacity_samples")
    total = models.PositiveIntegerField(help_text="Devices billed under this class (allocated or free).")
    unhealthy = models.PositiveIntegerField(default=0, help_text="Free devices that take no new work.")
    reserved_unused = models.PositiveIntegerField(default=0, help_text="Free devices held by reservations.")
    stranded = models.PositiveIntegerField(default=0, help_text="Free healthy devices no pending work can use.")
    reserved_by_team = models.JSONField(default=dict, blank=True, help_text="{team name: reserved unused devices}")
    # Devices several allocations share are counted whole in `total` (as busy); their allocations are
    # billed their shares (broker.scheduler.accounting), so what they leave is free. This says where it
    # goes: {"unhealthy" | "stranded" | "idle": millionths of a device, "over": millionths their shares
    # bill beyond one device each}; empty without shared devices.
    shared = models.JSONField(
        default=dict, blank=True, help_text="{category: millionths of a device} of shared devices' remainders"
    )

    class Meta:
        ordering = ["device_class", "at"]
        constraints = [
            models.UniqueConstraint(fields=["device_class", "at"], name="sample_unique_per_class_and_time"),
        ]
        indexes = [models.Index(fields=["device_class", "at"])]

    def __str__(self):
        return f"{self.device_class_id}@{self.at:%Y-%m-%d %H:%M:%S} total={self.total}"

    def counts(self):
        return (self.total, self.unhealthy, self.reserved_unused, self.stranded, dict(self.reserved_by_team))


class RollupRow(models.Model):
    """Exact ledger amounts of one hour, summed per group: what a report over whole past hours reads
    instead of every allocation, sample and transition of the window (broker/costs/rollup.py).

    Ids, not foreign keys: a row names the workload's team, queue and resource class as they were, and
    a report names them as they are now, the way the direct computation names a workload's lines. Raw
    cost (device-microseconds x price units) reaches 10^19 within an hour of a large class, beyond a
    64-bit integer, and SQLite keeps no exact decimals that large: it is stored as raw_high x 2^40 +
    raw_low, both columns summed exactly in SQL.
    """

    hour = models.DateTimeField()
    device_class_id = models.BigIntegerField()
    device_us = models.BigIntegerField(default=0)
    raw_high = models.BigIntegerField(default=0)
    raw_low = models.BigIntegerField(default=0)
    # Shares of shared devices make amounts Fractions in millionths of a device (ledger.py): the whole
    # units are above, the millionths of a unit here (each below a million, so a month's sum is small).
    device_us_millionths = models.BigIntegerField(default=0)
    raw_millionths = models.BigIntegerField(default=0)

    class Meta:
        abstract = True


class CostGroupRow(RollupRow):
    """Capacity cost: `category` allocated (per team, queue and resource class of the holding workloads),
    or idle, stranded, unhealthy, reserved_unused (per reserving team)."""

    category = models.CharField(max_length=16)
    team_id = models.BigIntegerField(null=True)
    queue_id = models.BigIntegerField(null=True)
    resource_class_id = models.BigIntegerField(null=True)
    reserved_team = models.CharField(max_length=100, blank=True)

    class Meta:
        abstract = True


class PendingGroupRow(RollupRow):
    """Cost of pending: requested devices x time waiting, per team, queue and reason."""

    team_id = models.BigIntegerField()
    queue_id = models.BigIntegerField()
    reason = models.CharField(max_length=64)

    class Meta:
        abstract = True


class CostRollup(CostGroupRow):
    """The capacity cost of one whole past hour (broker/costs/rollup.py)."""

    class Meta:
        indexes = [models.Index(fields=["hour"])]


class PendingRollup(PendingGroupRow):
    """The cost of pending of one whole past hour (broker/costs/rollup.py)."""

    class Meta:
        indexes = [models.Index(fields=["hour"])]


class RollupProgress(models.Model):
    """Every hour before `until` is rolled up (an hour without a row had nothing to bill)."""

    name = models.CharField(max_length=16, primary_key=True)
    until = models.DateTimeField()


class CostCheckpointRow(CostGroupRow):
    """The capacity cost of the hours between the rollup's `until` and the checkpoint's (Checkpoint), each
    row [hour, min(hour + 1 h, checkpoint)): rewritten whole at every checkpoint (broker/costs/checkpoint.py)."""


class PendingCheckpointRow(PendingGroupRow):
    """The cost of pending of the same stretch as CostCheckpointRow."""


class CheckpointOpen(models.Model):
    """What was still open at a checkpoint, per group: devices held (kind "costs": team, queue and resource
    class ids) or requested by waiting work (kind "pending": team, queue and reason). A report bills it on
    from the checkpoint to now, as the history would, unless a workload of the group changed since."""

    kind = models.CharField(max_length=16)
    device_class_id = models.BigIntegerField()
    team_id = models.BigIntegerField(null=True)
    queue_id = models.BigIntegerField(null=True)
    resource_class_id = models.BigIntegerField(null=True)
    reason = models.CharField(max_length=64, blank=True)
    # Shares of shared devices held or requested (ledger.py): whole devices, plus millionths of one as
    # the rollups store amounts (each below a million).
    devices = models.BigIntegerField()
    devices_millionths = models.BigIntegerField(default=0)


class Checkpoint(models.Model):
    """The rollups' checkpoint of kind `name`: CostCheckpointRow or PendingCheckpointRow hold [base, until)
    and CheckpointOpen what was open at `until`. Valid while `base` is the hourly rollup's `until`."""

    name = models.CharField(max_length=16, primary_key=True)
    base = models.DateTimeField()
    until = models.DateTimeField()
