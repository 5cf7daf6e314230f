from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import F

from broker.inventory.quantities import quantity


class Health(models.TextChoices):
    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"
    UNKNOWN = "Unknown"


class TaintEffect(models.TextChoices):
    NO_SCHEDULE = "NoSchedule"
    NO_EXECUTE = "NoExecute"


class ClusterState(models.Model):
    """One row per cluster; `generation` moves whenever inventory changes, so a cycle can tell its
    snapshot went stale before committing."""

    name = models.SlugField(unique=True)
    generation = models.BigIntegerField(default=0)

    def __str__(self):
        return f"{self.name}@{self.generation}"

    @classmethod
    def bump(cls, name="default"):
        state, _ = cls.objects.get_or_create(name=name)
        cls.objects.filter(pk=state.pk).update(generation=F("generation") + 1)

    @classmethod
    def current_generation(cls, name="default"):
        """The generation, 0 before the first bump; read only (a warm-up reads in a read-only transaction)."""
        return cls.objects.filter(name=name).values_list("generation", flat=True).first() or 0


class InventoryRevision(models.Model):
    """One row whose `token` changes with every write to the inventory tables (topology levels, domains,
    nodes, devices), made by database triggers (migration 0003), so bulk updates, the admin and a shell
    move it too. A cycle keeps what it loaded per token and reuses it while the token stands; the
    commit locks the row to know no inventory write landed since its snapshot. A random token rather
    than a counter: a rolled-back or truncated table could bring a counter back to a value already seen."""

    TABLES = ("inventory_topologylevel", "inventory_domain", "inventory_node", "inventory_device")
    SINGLETON = 1

    token = models.CharField(max_length=64)

    @classmethod
    def current(cls, lock=False):
        """The token, or None when the row is missing (a flushed test database before any write)."""
        rows = cls.objects.filter(pk=cls.SINGLETON)
        if lock:
            rows = rows.select_for_update()
        return rows.values_list("token", flat=True).first()


MAX_TOPOLOGY_LEVELS = 8  # as Kueue's Topology (`levels`, at most 8): no datacenter nests deeper


class TopologyLevel(models.Model):
    """One level of the topology, coarse (low order) to fine; the node is always the finest, implicit."""

    name = models.SlugField(max_length=50, unique=True)
    order = models.PositiveSmallIntegerField(unique=True)

    class Meta:
        ordering = ["order"]

    def __str__(self):
        return self.name

    def clean(self):
        # Reports follow a node's domains up every level in one query (SQLite joins at most 64 tables).
        if self.pk is None and TopologyLevel.objects.count() >= MAX_TOPOLOGY_LEVELS:
            raise ValidationError(
                f"A topology has at most {MAX_TOPOLOGY_LEVELS} levels (the node, always the finest, not counted)."
            )


class Domain(models.Model):
    """A domain of one level (a zone, block or rack); its parent is a domain of the level above."""

    level = models.ForeignKey(TopologyLevel, on_delete=models.PROTECT, related_name="domains")
    name = models.CharField(max_length=100)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="children")

    class Meta:
        ordering = ["level__order", "name"]
        constraints = [models.UniqueConstraint(fields=["level", "name"], name="domain_unique_name_per_level")]

    def __str__(self):
        return f"{self.level.name}:{self.name}"

    def clean(self):
        if self.parent_id is None:
            return
        if self.parent.level.order >= self.level.order:
            raise ValidationError({"parent": "The parent must sit on a coarser level."})

    def path(self):
        """{level name: domain name} from this domain up to the root."""
        out = {}
        domain = self
        while domain is not None:
            out[domain.level.name] = domain.name
            domain = domain.parent
        return out


class Node(models.Model):
    name = models.CharField(max_length=253, unique=True)
    domain = models.ForeignKey(
        Domain,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="nodes",
        help_text="The node's domain on the finest topology level; coarser levels follow its parents.",
    )
    labels = models.JSONField(default=dict, blank=True)
    cordoned = models.BooleanField(default=False, help_text="A cordoned node takes no new allocations.")
    # Nullable without a default, as `revision` below: SQLite adds such a column in place. None = no counters.
    shared_counters = models.JSONField(
        null=True,
        blank=True,
        help_text='DRA sharedCounters: {"<counter set>": {"<counter>": value}}, e.g. one set per GPU with its '
        "memory slices; devices consuming a set share its counters (see Device.consumes_counters).",
    )
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)
    # Drawn from one sequence by a trigger on every INSERT and UPDATE (migration 0004, PostgreSQL only):
    # the loader re-reads just the rows above the highest revision it has seen. Not indexed, so a health
    # or taint update stays a HOT update; a sequential scan of the table is cheap enough. Nullable: SQLite
    # adds such a column in place, where a default would rebuild the table and drop its triggers.
    revision = models.BigIntegerField(null=True, editable=False)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    @property
    def schedulable(self):
        return not self.cordoned

    def clean(self):
        problem = validate_shared_counters(self.shared_counters or {})
        if problem:
            raise ValidationError({"shared_counters": problem})


class Device(models.Model):
    """One accelerator (or a partition of one), as a DRA ResourceSlice publishes it."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="devices")
    driver = models.CharField(max_length=253, default="gpu.example.com")
    pool = models.CharField(max_length=253, blank=True)
    name = models.CharField(max_length=63)
    attributes = models.JSONField(default=dict, blank=True)
    capacity = models.JSONField(default=dict, blank=True)
    health = models.CharField(max_length=10, choices=Health.choices, default=Health.HEALTHY)
    taints = models.JSONField(default=list, blank=True, help_text='[{"key": ..., "value": ..., "effect": ...}]')
    parent = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="partitions",
        help_text="For a partition (e.g. a MIG slice): the whole device it is cut from. Without counters on "
        "either, the whole device excludes all its partitions and the partitions share it.",
    )
    consumes_counters = models.JSONField(
        null=True,
        blank=True,
        help_text='DRA consumesCounters: {"<counter set of its node>": {"<counter>": amount}} taken while allocated.',
    )
    allow_multiple_allocations = models.BooleanField(
        default=False,
        help_text="DRA allowMultipleAllocations: several allocations may share it (a time-sliced GPU, a NIC's "
        "bandwidth), each taking an amount of its capacity; the amounts never sum past the capacity.",
    )
    # Drawn from one sequence by a trigger on every INSERT and UPDATE (migration 0004, PostgreSQL only):
    # the loader re-reads just the rows above the highest revision it has seen. Not indexed, so a health
    # or taint update stays a HOT update; a sequential scan of the table is cheap enough. Nullable: SQLite
    # adds such a column in place, where a default would rebuild the table and drop its triggers.
    revision = models.BigIntegerField(null=True, editable=False)

    class Meta:
        ordering = ["node__name", "name"]
        constraints = [models.UniqueConstraint(fields=["node", "name"], name="device_unique_name_per_node")]

    def __str__(self):
        return self.qualified_name

    @property
    def qualified_name(self):
        return f"{self.node.name}/{self.name}"

    def clean(self):
        errors = {}
        if not isinstance(self.attributes, dict):
            errors["attributes"] = "Attributes must be an object of name: value."
        if not isinstance(self.capacity, dict):
            errors["capacity"] = "Capacity must be an object of name: quantity."
        taint_error = validate_taints(self.taints)
        if taint_error:
            errors["taints"] = taint_error
        counters_error = validate_consumption(
            self.consumes_counters or {}, (self.node.shared_counters or {}) if self.node_id else {}
        )
        if counters_error:
            errors["consumes_counters"] = counters_error
        shareable = isinstance(self.capacity, dict) and any(counter_value(v) for v in self.capacity.values())
        if self.allow_multiple_allocations and not shareable:
            errors["allow_multiple_allocations"] = (
                "A device shared by several allocations needs a capacity for them to take amounts of."
            )
        if self.parent_id is not None and self.node_id is not None and self.parent.node_id != self.node_id:
            errors["parent"] = "A partition sits on the node of the device it is cut from."
        if errors:
            raise ValidationError(errors)


def counter_value(value):
    """A counter's value or amount as a number (a Kubernetes quantity such as "40Gi" is read), or None."""
    return quantity(value)


def validate_shared_counters(counter_sets):
    """None, or what is wrong with a node's shared counters."""
    if not isinstance(counter_sets, dict):
        return 'Shared counters must be an object of counter set: {"counter": value}.'
    for name, counters in counter_sets.items():
        if not isinstance(counters, dict) or not counters:
            return f"Counter set {name!r} must be a non-empty object of counter: value."
        for counter, value in counters.items():
            number = counter_value(value)
            if number is None or number < 0:
                return f"Counter {counter!r} of set {name!r} must be a non-negative quantity, not {value!r}."
    return None


def validate_consumption(consumes, counter_sets):
    """None, or what is wrong with a device's consumesCounters against its node's shared counters."""
    if not isinstance(consumes, dict):
        return 'Consumed counters must be an object of counter set: {"counter": amount}.'
    for name, counters in consumes.items():
        if name not in counter_sets:
            known = ", ".join(sorted(counter_sets)) or "none"
            return f"Counter set {name!r} is not published by the device's node (its sets: {known})."
        if not isinstance(counters, dict) or not counters:
            return f"Consumption of counter set {name!r} must be a non-empty object of counter: amount."
        for counter, amount in counters.items():
            if counter not in counter_sets[name]:
                known = ", ".join(sorted(counter_sets[name]))
                return f"Counter {counter!r} is not in counter set {name!r} (its counters: {known})."
            number = counter_value(amount)
            if number is None or number <= 0:
                return f"Amount of counter {counter!r} must be a positive quantity, not {amount!r}."
    return None


def validate_taints(taints):
    if not isinstance(taints, list):
        return "Taints must be a list."
    for index, taint in enumerate(taints):
        if not isinstance(taint, dict) or not taint.get("key"):
            return f"Taint {index} needs a key."
        if taint.get("effect", TaintEffect.NO_SCHEDULE) not in TaintEffect.values:
            return f"Taint {index}: effect must be one of {', '.join(TaintEffect.values)}."
    return None
