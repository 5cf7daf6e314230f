from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models


class WithinQueuePolicy(models.TextChoices):
    NEVER = "Never"
    LOWER_PRIORITY = "LowerPriority"
    LOWER_OR_NEWER_EQUAL = "LowerOrNewerEqualPriority"


class ReclaimPolicy(models.TextChoices):
    NEVER = "Never"
    LOWER_PRIORITY = "LowerPriority"
    ANY = "Any"


class SharingRule(models.TextChoices):
    EXCLUSIVE = "Exclusive", "Whole devices, never shared"
    TIME_SLICED = "TimeSliced", "Time-sliced between pods"
    PARTITIONED = "Partitioned", "Hardware partitions (e.g. MIG)"


class Team(models.Model):
    name = models.SlugField(max_length=63, unique=True)
    display_name = models.CharField(max_length=200, blank=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="teams")

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.display_name or self.name


class PriorityClass(models.Model):
    """A named priority: the promise a number stands for (who may preempt whom)."""

    name = models.SlugField(max_length=63, unique=True)
    value = models.IntegerField()
    description = models.TextField(blank=True)
    preemptible = models.BooleanField(default=True, help_text="Workloads of this class may be preempted.")

    class Meta:
        ordering = ["-value"]
        verbose_name_plural = "priority classes"

    def __str__(self):
        return f"{self.name} ({self.value})"


class DeviceClass(models.Model):
    """A named set of devices chosen by a CEL selector over DRA attributes, with a price."""

    name = models.SlugField(max_length=63, unique=True)
    description = models.TextField(blank=True)
    selector = models.TextField(
        help_text='A CEL expression as DRA writes it, e.g. device.attributes["gpu.example.com"].model == "H100"',
    )
    price_per_hour = models.DecimalField(
        max_digits=10, decimal_places=4, validators=[MinValueValidator(0)], help_text="Price per device-hour."
    )

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "device classes"

    def __str__(self):
        return self.name

    def save(self, *args, **kwargs):
        self.clean()
        super().save(*args, **kwargs)

    def clean(self):
        from broker.scheduler.selectors import validate_selector

        error = validate_selector(self.selector)
        if error:
            raise ValidationError({"selector": error})


class Cohort(models.Model):
    """A group of queues that lend each other unused quota; cohorts nest (Kueue's hierarchical cohorts)."""

    name = models.SlugField(max_length=63, unique=True)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="children")
    nominal_quota = models.JSONField(default=dict, blank=True, help_text="{device class: devices} of its own.")

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    def clean(self):
        errors = {}
        seen = {self.pk}
        parent = self.parent
        while parent is not None:
            if parent.pk in seen:
                errors["parent"] = "Cohorts cannot form a cycle."
                break
            seen.add(parent.pk)
            parent = parent.parent
        quota_error = validate_quota_map(self.nominal_quota)
        if quota_error:
            errors["nominal_quota"] = quota_error
        if errors:
            raise ValidationError(errors)


def validate_quota_map(value, allow_none=False):
    """A quota map is {device class name: non-negative integer}; returns an error string or None."""
    if value is None and allow_none:
        return None
    if not isinstance(value, dict):
        return "Must be an object of device class name: number of devices."
    known = set(DeviceClass.objects.filter(name__in=list(value)).values_list("name", flat=True))
    for name, amount in value.items():
        if name not in known:
            return f"Unknown device class '{name}'."
        if not isinstance(amount, int) or isinstance(amount, bool) or amount < 0:
            return f"'{name}' must be a whole number of devices, 0 or more."
    return None


class Queue(models.Model):
    """A team's queue with quota per device class (Kueue's ClusterQueue)."""

    name = models.SlugField(max_length=63, unique=True)
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="queues")
    cohort = models.ForeignKey(Cohort, null=True, blank=True, on_delete=models.SET_NULL, related_name="queues")
    nominal_quota = models.JSONField(null=True, blank=True, help_text="{device class: devices}; empty means unlimited.")
    borrowing_limit = models.JSONField(null=True, blank=True, help_text="{device class: devices}; empty: no limit.")
    lending_limit = models.JSONField(null=True, blank=True, help_text="{device class: devices}; empty: no limit.")
    fair_share_weight = models.FloatField(default=1.0, validators=[MinValueValidator(0.0)])
    within_queue_preemption = models.CharField(
        max_length=32, choices=WithinQueuePolicy.choices, default=WithinQueuePolicy.NEVER
    )
    reclaim_within_cohort = models.CharField(max_length=16, choices=ReclaimPolicy.choices, default=ReclaimPolicy.NEVER)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    def clean(self):
        errors = {}
        for field in ("nominal_quota", "borrowing_limit", "lending_limit"):
            error = validate_quota_map(getattr(self, field), allow_none=True)
            if error:
                errors[field] = error
        if errors:
            raise ValidationError(errors)


class ResourceClass(models.Model):
    """One entry of the menu teams choose from, and the policy behind it."""

    name = models.SlugField(max_length=63, unique=True)
    display_name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    topology_required = models.CharField(max_length=50, blank=True, help_text="Level all pods must share.")
    topology_preferred = models.CharField(max_length=50, blank=True, help_text="Level pods should share.")
    sharing = models.CharField(max_length=16, choices=SharingRule.choices, default=SharingRule.EXCLUSIVE)
    priority_class = models.ForeignKey(PriorityClass, on_delete=models.PROTECT, related_name="resource_classes")
    preemptible = models.BooleanField(default=True)
    preempts_across_queues = models.BooleanField(
        default=False,
        help_text="Its work may preempt preemptible work of lower priority in any queue of its cohort, "
        "not only in its own queue (for short, interactive work).",
    )
    checkpoint_restart_seconds = models.PositiveIntegerField(
        default=60,
        validators=[MaxValueValidator(86_400)],
        help_text="Work a preemption costs this class: seconds of its devices redone after a restart.",
    )
    max_devices = models.PositiveIntegerField(null=True, blank=True, help_text="Largest request, in devices.")
    max_devices_per_pod = models.PositiveIntegerField(null=True, blank=True)
    max_duration_seconds = models.PositiveIntegerField(null=True, blank=True)
    cost_label = models.CharField(max_length=63, blank=True)
    approval_required = models.BooleanField(default=False)
    approval_threshold_devices = models.PositiveIntegerField(
        null=True, blank=True, help_text="Requests larger than this need approval even if the class does not."
    )
    allowed_teams = models.ManyToManyField(
        Team, blank=True, related_name="resource_classes", help_text="Empty means every team may use it."
    )

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "resource classes"

    def __str__(self):
        return self.display_name or self.name

    def ordered_device_classes(self):
        return [choice.device_class for choice in self.device_class_choices.select_related("device_class")]

    def is_entitled(self, team):
        if not self.allowed_teams.exists():
            return True
        return self.allowed_teams.filter(pk=team.pk).exists()

    def needs_approval(self, total_devices):
        if self.approval_required:
            return True
        return self.approval_threshold_devices is not None and total_devices > self.approval_threshold_devices

    def clean(self):
        from broker.inventory.models import TopologyLevel

        errors = {}
        levels = set(TopologyLevel.objects.values_list("name", flat=True)) | {"node"}
        for field in ("topology_required", "topology_preferred"):
            value = getattr(self, field)
            if value and value not in levels:
                errors[field] = f"Unknown topology level '{value}'; levels are {', '.join(sorted(levels))}."
        if errors:
            raise ValidationError(errors)


class ResourceClassDeviceClass(models.Model):
    """A device class of a resource class, in fallback order (DRA's firstAvailable)."""

    resource_class = models.ForeignKey(ResourceClass, on_delete=models.CASCADE, related_name="device_class_choices")
    device_class = models.ForeignKey(DeviceClass, on_delete=models.PROTECT, related_name="resource_class_choices")
    rank = models.PositiveSmallIntegerField(default=0)

    class Meta:
        ordering = ["resource_class", "rank"]
        constraints = [
            models.UniqueConstraint(fields=["resource_class", "device_class"], name="rcdc_unique_pair"),
            models.UniqueConstraint(fields=["resource_class", "rank"], name="rcdc_unique_rank"),
        ]

    def __str__(self):
        return f"{self.resource_class.name}#{self.rank}: {self.device_class.name}"


class Reservation(models.Model):
    """Capacity held for a team over a time window, optionally pinned to one topology domain."""

    name = models.SlugField(max_length=63, unique=True)
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="reservations")
    device_class = models.ForeignKey(DeviceClass, on_delete=models.PROTECT, related_name="reservations")
    count = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    domain = models.ForeignKey(
        "inventory.Domain", null=True, blank=True, on_delete=models.PROTECT, related_name="reservations"
    )
    start = models.DateTimeField()
    end = models.DateTimeField()
    reason = models.TextField(blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)

    class Meta:
        ordering = ["start", "name"]
        constraints = [
            models.CheckConstraint(condition=models.Q(end__gt=models.F("start")), name="reservation_ends_after_start")
        ]

    def __str__(self):
        return self.name

    def clean(self):
        if self.start and self.end and self.end <= self.start:
            raise ValidationError({"end": "The end must come after the start."})
