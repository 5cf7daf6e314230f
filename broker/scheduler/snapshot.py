"""The plain data the decision core reads (one consistent snapshot) and the decisions it returns.

Everything here is a frozen dataclass of built-in values so the ORM side can build it without knowing
anything about scheduling, and tests can write it by hand. Dict fields are treated as read-only.
Times are plain floats (seconds on any monotonic scale shared by all fields, e.g. Unix time); the core
never reads a clock, `Snapshot.now` is the only "now" it knows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import cached_property

DRIVER = "gpu.example.com"

NO_SCHEDULE_EFFECTS = ("NoSchedule", "NoExecute")
# The taint a device another scheduler allocated carries (its value names the claim, one taint a claim):
# no toleration lifts it (the loader drops any naming it), and finance bills it to nobody (accounting).
HELD_OUTSIDE_TAINT = "broker.capacity.io/allocated-outside"


def held_outside(taints) -> bool:
    """Whether taints (Taint records) say another scheduler allocated the device: busy, not the broker's
    to place, heal in a counterfactual, or bill."""
    return any(taint.key == HELD_OUTSIDE_TAINT for taint in taints)


WITHIN_QUEUE_POLICIES = ("Never", "LowerPriority", "LowerOrNewerEqualPriority")
RECLAIM_POLICIES = ("Never", "LowerPriority", "Any")
DISRUPTION_MODES = ("Pod", "PodGroup")
# Kubernetes PriorityClass preemptionPolicy: whether a workload may preempt others to start (Never: it
# waits for room instead; it may still be preempted itself, which `preemptible` says).
PREEMPT_LOWER_PRIORITY, NEVER_PREEMPT = "PreemptLowerPriority", "Never"
PREEMPTION_POLICIES = (PREEMPT_LOWER_PRIORITY, NEVER_PREEMPT)

# Where a device can be used from (group claims, broker.scheduler.group_claims): the device attribute
# naming the topology level of its node whose whole domain reaches it (e.g. "rack" for storage on the
# rack's network), or REACH_CLUSTER for every node (DRA allNodes). Without it a device is node-local.
REACH_ATTRIBUTE = "reach"
REACH_CLUSTER = "cluster"
# A running workload's group-claim devices are held by pseudo-pods of this pod-set prefix plus the claim's
# name (RunningWorkload), so holding, quota, releases and failures count them as its own, once.
GROUP_POD_SET = "podgroup:"


def made(cls, **values):
    """`cls(**values)` for a frozen dataclass without __post_init__, every field given: the same record,
    made without the generated __init__, which sets each field through object.__setattr__ and costs
    twice as much on the tens of thousands of decisions and placements a large cycle returns.
    For records read a few times only: the instance keeps a combined dict (464 bytes for 14 fields
    instead of the shared-key table's 184), and its attributes read 10-20% slower. The snapshot's own
    records, kept across cycles and read all through each, are made by their constructors."""
    record = object.__new__(cls)
    record.__dict__.update(values)
    return record


# Pending reason codes in DESIGN.md §5 order: the first that applies is the primary reason.
REASON_CODES = (
    "InvalidRequest",
    "NotEntitled",
    "AwaitingApproval",
    "QuotaExceeded",
    "DeviceUnhealthy",
    "Reserved",
    "InsufficientCapacity",
    "TopologyFragmented",
    "Priority",
    "PreemptionPending",
)


# --- inventory ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Taint:
    """A device taint (DRA DeviceTaint). Only NoSchedule / NoExecute keep new work off the device."""

    key: str
    value: str | None = None
    effect: str = "NoSchedule"


@dataclass(frozen=True)
class Toleration:
    """A pod toleration. `value=None` tolerates any value of `key` (operator Exists);
    `effect=None` tolerates every effect."""

    key: str
    value: str | None = None
    effect: str | None = None


@dataclass(frozen=True)
class Node:
    """A machine.

    name: unique node name.
    domains: topology level -> domain name for every level of `Snapshot.levels` (e.g. {"rack": "r1"}).
    schedulable: False when cordoned / drained; its devices take no new work.
    labels: free-form node labels (informational for the core).
    """

    name: str
    domains: dict = field(default_factory=dict)
    schedulable: bool = True
    labels: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Device:
    """One accelerator as a DRA ResourceSlice describes it.

    id: globally unique, conventionally "<node>/<index>", e.g. "n1/0".
    node: name of the node holding it.
    driver: DRA driver name; CEL sees attributes as device.attributes[driver][name].
    attributes: plain attribute names -> str | int | float | bool (model, memory, ...).
    capacity: plain capacity names -> number (CEL: device.capacity[driver][name]).
    healthy: False for Unhealthy or Unknown health; such devices take no new work.
    taints: device taints; NoSchedule/NoExecute ones need a matching toleration.
    consumes_counters: DRA consumesCounters, counter set name (a CounterSet of the same node) ->
      {counter: amount} the device takes while allocated. A whole partitionable device and each of its
      partitions consume the device's counters, so no allocation can exceed them: the whole device
      excludes its partitions and partitions of several profiles pack onto one device. A device
      naming a counter set or counter its node does not publish is never allocatable.
    allow_multiple_allocations: DRA allowMultipleAllocations: several allocations may share it, each
      taking an amount of its `capacity` (broker.scheduler.sharing); the amounts never sum past it.
    """

    id: str
    node: str
    driver: str = DRIVER
    attributes: dict = field(default_factory=dict)
    capacity: dict = field(default_factory=dict)
    healthy: bool = True
    taints: tuple[Taint, ...] = ()
    consumes_counters: dict = field(default_factory=dict)
    allow_multiple_allocations: bool = False


@dataclass(frozen=True)
class CounterSet:
    """DRA sharedCounters: a set of counters one node publishes (e.g. one per physical GPU: its memory
    slices and compute units), which the devices consuming it share.

    name: unique on its node (the ResourceSlice pool is the node). counters: counter -> value.
    """

    name: str
    node: str
    counters: dict = field(default_factory=dict)


@dataclass(frozen=True)
class DeviceClass:
    """A named set of devices.

    selector: a DRA CEL expression over `device` (None = no CEL condition).
    match: attribute -> value equality shorthand (None = no condition). Both given: both must hold.
    price_per_hour: price of one device-hour (informational for the core).
    """

    name: str
    selector: str | None = None
    match: dict | None = None
    price_per_hour: float = 0.0


# --- policy ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cohort:
    """A Kueue cohort: queues (and child cohorts) that lend each other unused quota.

    parent: name of the parent cohort for hierarchical cohorts (None = root).
    quota: device class -> extra nominal quota owned by the cohort itself.
    borrowing_limit / lending_limit: device class -> limit towards the parent (None = unlimited).
    """

    name: str
    parent: str | None = None
    quota: dict = field(default_factory=dict)
    borrowing_limit: dict | None = None
    lending_limit: dict | None = None


@dataclass(frozen=True)
class Queue:
    """A team's queue with Kueue ClusterQueue semantics.

    team: owning team (entitlement and reservations are per team).
    cohort: cohort name (None = stands alone, may not borrow).
    quota: device class -> nominal quota in devices; None = unlimited (no quota checks at all).
      A class missing from a quota dict has nominal 0 (it may still borrow).
    borrowing_limit: device class -> most it may borrow above nominal (None / missing = unlimited).
    lending_limit: device class -> most of its unused nominal others may borrow (None / missing = all).
    weight: fair-share weight (a higher weight gets a larger share).
    within_queue: preemption policy inside the queue: Never | LowerPriority | LowerOrNewerEqualPriority.
    reclaim_within_cohort: preempting borrowers of other queues in the cohort: Never | LowerPriority | Any.
    """

    name: str
    team: str
    cohort: str | None = None
    quota: dict | None = None
    borrowing_limit: dict | None = None
    lending_limit: dict | None = None
    weight: float = 1.0
    within_queue: str = "Never"
    reclaim_within_cohort: str = "Never"


@dataclass(frozen=True)
class ResourceClass:
    """The menu item a team submits against.

    device_classes: device classes in fallback order (DRA firstAvailable).
    topology_required / topology_preferred: default topology level names (None = no constraint).
    teams: teams allowed to use it (None = everyone).
    approval_required: workloads need `approved=True` before they are considered.
    default_priority / preemptible: defaults for workloads of this class.
    max_devices: most devices one workload of this class may request (None = no limit).
    preempts_across_queues: its work may preempt preemptible work of strictly lower priority in any queue
      of its cohort tree (rule ClassPriority), not only in its own queue: how the menu lets short,
      interactive work displace batch work that other teams run.
    checkpoint_restart_seconds: what a preemption costs work of this class: the progress since its last
      checkpoint, redone after a restart, counted as this many seconds of its devices (lost work).
    sharing: "Exclusive" | "TimeSliced" | "Partitioned": whether its work may share devices that allow
      several allocations (TimeSliced, by the capacity amounts its pod sets ask) or holds its devices
      alone (broker.scheduler.sharing).
    """

    name: str
    device_classes: tuple[str, ...] = ()
    topology_required: str | None = None
    topology_preferred: str | None = None
    teams: tuple[str, ...] | None = None
    approval_required: bool = False
    default_priority: int = 0
    preemptible: bool = False
    max_devices: int | None = None
    preempts_across_queues: bool = False
    checkpoint_restart_seconds: float = 60.0
    sharing: str = "Exclusive"


@dataclass(frozen=True)
class Reservation:
    """`count` devices of `device_class` held for `team` while start <= now < end.

    queue: optional queue the reservation was made through (the team is what matters).
    domain: level -> domain name pinning the reserved devices (None = anywhere in the cluster).
    Devices the team already uses there count towards the reservation; the rest of the count is taken
    from free devices in device-id order. Other teams may use reserved devices only with preemptible
    work, which the owner may then preempt.
    """

    name: str
    team: str
    device_class: str
    count: int
    queue: str | None = None
    domain: dict | None = None
    start: float = float("-inf")
    end: float = float("inf")


# --- work ----------------------------------------------------------------------------------------------


ALL_DEVICES = "All"  # DRA DeviceAllocationMode: every matching device
ALLOCATION_MODES = ("ExactCount", ALL_DEVICES)


@dataclass(frozen=True)
class DeviceSubRequest:
    """One way to meet a device request (DRA ExactDeviceRequest / DeviceSubRequest): `count` devices of
    `device_class` that also satisfy every CEL expression of `selectors`.

    name: the sub-request's name inside its request's firstAvailable list (the request's own name when
    it is the request's only way).
    allocation_mode: "ExactCount" (`count` devices) or "All" (DRA DeviceAllocationMode): every device of
      the class and selectors the pod reaches on its node, all of them free and usable, at least one;
      `count` is then 1, the least it can take (broker.scheduler.claims).
    """

    name: str
    device_class: str
    count: int = 1
    selectors: tuple[str, ...] = ()
    allocation_mode: str = "ExactCount"

    @property
    def takes_all(self) -> bool:
        return self.allocation_mode == ALL_DEVICES


@dataclass(frozen=True)
class DeviceRequest:
    """A named request of a pod's claim (DRA DeviceRequest): `exactly` one way, or `first_available`,
    ways in order of preference (e.g. 1 x H100, or else 2 x A100), of which the first that fits is taken.
    """

    name: str
    exactly: DeviceSubRequest | None = None
    first_available: tuple[DeviceSubRequest, ...] = ()

    @property
    def alternatives(self) -> tuple[DeviceSubRequest, ...]:
        return (self.exactly,) if self.exactly is not None else self.first_available


@dataclass(frozen=True)
class DeviceConstraint:
    """DRA DeviceConstraint: every device given to the named requests of one pod carries the attribute
    `match_attribute` with one value (e.g. 8 GPUs and a NIC under one PCIe root), or, with
    `distinct_attribute` instead, each a value of its own (two NICs on two physical ports). Exactly one
    of the two is given. requests: request names (a firstAvailable request's name covers all of its
    ways); empty = every request of the claim."""

    match_attribute: str | None
    requests: tuple[str, ...] = ()
    distinct_attribute: str | None = None

    @property
    def attribute(self) -> str:
        """The attribute it constrains, whichever way."""
        return self.match_attribute or self.distinct_attribute or ""


@dataclass(frozen=True)
class GroupClaim:
    """A claim the whole gang owns (Kubernetes 1.36 PodGroup spec.resourceClaims, feature
    DRAWorkloadResourceClaims): allocated once, its devices used by every pod of the gang. `requests` and
    `constraints` are as a pod's claim (PodSet); the pods may only go where every device of it is
    reachable (its REACH_ATTRIBUTE), so a node-local device pins the gang to its node.

    name: unique among the workload's group claims (a DNS label, as PodGroupResourceClaim.name)."""

    name: str
    requests: tuple[DeviceRequest, ...]
    constraints: tuple[DeviceConstraint, ...] = ()


@dataclass(frozen=True)
class PodSet:
    """A group of identical pods of one workload.

    count: pods wanted; min_count: pods that must start together (gang); up to `count` start if they fit.
    devices_per_pod: devices each pod claims.
    device_classes: classes in fallback order (DRA firstAvailable); empty = the resource class's list.
    match_attribute: attribute name all devices of one pod must share (DRA matchAttribute) or None.
    tolerations: tolerations for device taints.
    requests / constraints: each pod's claim as DRA writes it (DeviceRequest, DeviceConstraint): several
      named requests, each of its own device class, and constraints across them. When `requests` is
      given, devices_per_pod, device_classes and match_attribute keep their defaults (the claim says it).
    capacity: (capacity name, amount) pairs each pod takes of each of its devices when its resource class
      shares devices (sharing "TimeSliced", DRA ExactDeviceRequest.capacity); empty: devices whole.
    """

    name: str = "main"
    count: int = 1
    min_count: int | None = None
    devices_per_pod: int = 1
    device_classes: tuple[str, ...] = ()
    match_attribute: str | None = None
    tolerations: tuple[Toleration, ...] = ()
    requests: tuple[DeviceRequest, ...] = ()
    constraints: tuple[DeviceConstraint, ...] = ()
    capacity: tuple[tuple[str, float], ...] = ()

    @property
    def gang_size(self) -> int:
        return self.count if self.min_count is None else self.min_count


@dataclass(frozen=True)
class PendingWorkload:
    """A workload waiting for admission.

    queue: queue name; team: submitting team (None = the queue's team).
    resource_class: resource class name or None (then pod sets must name device classes).
    topology_required / topology_preferred: level names overriding the resource class's defaults
      (None = the resource class's default, "" = explicitly no constraint).
    priority: higher runs first. disruption: "Pod" | "PodGroup" (how it may later be preempted).
    submitted: submission time. approved: None = not decided, False = rejected, True = approved.
    expected_duration: seconds it is expected to run (None = unknown).
    preemptible: None = the resource class's default (False without one).
    nominated_devices: devices its victims freed (or are freeing) for it (kube-scheduler's nominated
      node, Kueue's preemptor): while free they are held for it until its turn in the cycle, so work
      ordered before it cannot take them; at its turn they are free for anyone, itself first.
    name: what messages call it, e.g. "team-a/train-7" ("" = its id): people know names, not ids.
    group_claims: claims owned by the whole gang (GroupClaim), each allocated once for all its pods.
    preemption_policy: PREEMPT_LOWER_PRIORITY, or NEVER_PREEMPT for work that never preempts others
      (Kubernetes PriorityClass preemptionPolicy: Never): it waits for room and takes no one's devices.
    """

    id: str
    queue: str
    pod_sets: tuple[PodSet, ...]
    resource_class: str | None = None
    team: str | None = None
    topology_required: str | None = None
    topology_preferred: str | None = None
    priority: int = 0
    disruption: str = "PodGroup"
    submitted: float = 0.0
    approved: bool | None = None
    expected_duration: float | None = None
    preemptible: bool | None = None
    nominated_devices: tuple[str, ...] = ()
    name: str = ""
    group_claims: tuple[GroupClaim, ...] = ()
    preemption_policy: str = PREEMPT_LOWER_PRIORITY


def label(workload) -> str:
    """What a message calls a pending or running workload: its name, else its id."""
    return workload.name or workload.id


def span(seconds: float) -> str:
    """How long, as a message says it: "450 s", "12 min", "3.5 h" (seconds up to ten minutes, where a
    rounded minute would be a large error)."""
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 600:
        return f"{seconds / 60:.0f} min"
    return f"{max(seconds, 0):.0f} s"


EPOCH_CLOCK_FROM = 1e9  # 2001-09-09: a clock past this is a cycle's (epoch seconds), not a what-if's


def moment(at: float) -> str:
    """When, as a message says it: a UTC time to the minute on a cycle's epoch clock
    ("2026-12-04 21:35 UTC"), "t=100 s" on a what-if's, which starts at 0. Absolute, not "in 5 min": an
    explanation is rewritten only when what it says changes, and a span would change every cycle."""
    if at >= EPOCH_CLOCK_FROM:
        return datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"t={at:g} s"


@dataclass(frozen=True)
class RunningPod:
    """One placed pod of a running workload: the devices it holds on `node`. consumed: the (capacity,
    amount) pairs it takes of each of them when it shares them (broker.scheduler.sharing); empty: it
    holds them alone."""

    pod_set: str
    index: int
    node: str
    device_ids: tuple[str, ...]
    consumed: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class RunningWorkload:
    """An admitted workload holding devices.

    device_class: the class it was admitted with (its quota usage is counted there).
    started: admission time; expected_end: when it should finish (None = unknown).
    evicting: already chosen as a victim and shutting down; it still holds its devices (and its quota),
      is never chosen again, and its devices are held for `evicted_for` while it leaves.
    evicted_for: id of the workload it is being evicted for (its nominated preemptor), None = unknown.
    min_counts: Pod disruption mode: (pod set, gang minimum) pairs; the pods above a pod set's minimum
      may be preempted one by one (`surplus_pods`). A pod set not named needs all its pods.
    part_of: set on the evicting pods of a workload that is being shrunk, split off its record
      (`split_leaving`): the id of the workload they belong to. Their own id is `leaving_id` of it.
    partial: only some of the workload's pods (a preemption search's candidate for shrinking it).
    preemptions: how often it was preempted before this run (a bound protects it from thrashing).
    name: what messages call it ("" = its id); the pods split off it keep it.
    device_classes: (device id, class) of the devices allocated under another class than `device_class`
      (a several-request claim's, each request's class); quota counts each device under its own.
    Its group claims' devices are pods too, of pod set GROUP_POD_SET + the claim's name (one per node of
    its devices): held, charged and freed with it, once; a failure of one stops the whole gang.
    """

    id: str
    queue: str
    pods: tuple[RunningPod, ...]
    device_class: str
    priority: int = 0
    disruption: str = "PodGroup"
    preemptible: bool = True
    started: float = 0.0
    expected_end: float | None = None
    evicting: bool = False
    evicted_for: str | None = None
    min_counts: tuple[tuple[str, int], ...] = ()
    part_of: str | None = None
    partial: bool = False
    preemptions: int = 0
    name: str = ""
    device_classes: tuple[tuple[str, str], ...] = ()

    @cached_property
    def device_count(self) -> int:
        # Kept on the record: quota, fair share and victim searches ask it of 50k workloads every cycle,
        # and the loader hands the same records to the next cycle.
        return sum(len(pod.device_ids) for pod in self.pods)

    @property
    def surplus_pods(self) -> tuple[RunningPod, ...]:
        """Pods that may be preempted without stopping the workload: in Pod disruption mode, those above
        each pod set's gang minimum, the highest indices (the last scaled up go first). Not kept on the
        record: one more cached attribute on 50,000 records makes each instance dict a combined one,
        larger and slower to read (see `made`); it is asked once per cycle, of Pod-mode work only."""
        if self.disruption != "Pod" or not self.min_counts or self.evicting or self.partial:
            return ()
        minimum = dict(self.min_counts)
        by_set: dict[str, list[RunningPod]] = {}
        for pod in self.pods:
            by_set.setdefault(pod.pod_set, []).append(pod)
        surplus = []
        for name, pods in by_set.items():
            keep = minimum.get(name)
            if keep is not None and len(pods) > keep:
                surplus.extend(sorted(pods, key=lambda pod: pod.index)[keep:])
        return tuple(sorted(surplus, key=lambda pod: (pod.pod_set, pod.index)))

    @property
    def workload_id(self) -> str:
        """The workload this record stands for (the whole one, for evicting pods split off it)."""
        return self.part_of or self.id


LEAVING_SUFFIX = "/leaving"


def leaving_id(workload_id: str) -> str:
    """The record id of a workload's evicting pods, split off it (RunningWorkload.part_of)."""
    return workload_id + LEAVING_SUFFIX


def split_leaving(workload: RunningWorkload, leaving: set, evicted_for: str | None) -> tuple[RunningWorkload, ...]:
    """`workload` while some of its pods are being evicted (Pod disruption mode): the pods that stay,
    under its id, and the `leaving` ones ((pod set, index) pairs) as an evicting record of their own,
    held for `evicted_for`. Both count against its queue; the leaving devices are free to nobody but
    the preemptor until they are gone."""
    staying = tuple(pod for pod in workload.pods if (pod.pod_set, pod.index) not in leaving)
    going = tuple(pod for pod in workload.pods if (pod.pod_set, pod.index) in leaving)
    if not going:
        return (workload,)
    if not staying:  # every pod leaving: the workload is being evicted whole
        return (replace(workload, evicting=True, evicted_for=evicted_for),)
    rest = replace(workload, id=leaving_id(workload.id), pods=going, evicting=True, evicted_for=evicted_for,
                   part_of=workload.id, min_counts=())  # fmt: skip
    return (replace(workload, pods=staying), rest)


@dataclass(frozen=True)
class SchedulerConfig:
    """Knobs of one cycle.

    enable_backfill_protection: keep a place for the head of the line (Slurm-style backfill).
    backfill_depth: how many waiting gangs, first in line first, get a planned start and domain that
      work behind them may not delay (Slurm's bf_max_job_test); 1 protects the head of the line only.
    reservations_ahead: keep work that would overrun a reservation window opening later off its nodes
      (Slurm's rule; broker.scheduler.windows). False: a window holds nothing until it opens.
    backfill_wait_seconds: without known durations, how long the head waits before its planned domain
      is kept free.
    protected_large_gangs: how many of the oldest waiting gangs of at least `large_gang_devices` devices
      get a planned start and domain before the line is walked, wherever they stand in it: no admission
      and no preemption that would delay them is made this cycle (0 = none beyond `backfill_depth`).
    large_gang_devices: the devices a gang needs at least to count as large for `protected_large_gangs`.
    enable_preemption: look for victims at all.
    explain: compute explanations, estimated starts and suggestions (False = codes only, for speed).
    suggestions: compute verified suggestions.
    rerun_verification_limit: quota suggestions change the fair-share order, so they are verified by a
      full re-run of the cycle; only done when there are at most this many pending workloads.
    preemption_search_limit: victim sets examined in the exact search before falling back to greedy.
    preemptions_per_queue_per_cycle: workloads of one queue that may choose new victims per cycle (Kueue
      only lets queue heads preempt); the rest wait a cycle, which also keeps a cycle's search bounded.
    estimate_horizon_events: release events simulated for estimated starts.
    estimate_queue_depth: waiting workloads (the first in cluster order) whose start is estimated.
    preemption_min_runtime_seconds: a workload runs at least this long after each (re)start before it may
      be preempted; no preemption can then undo an admission before it did any work.
    max_preemptions_per_workload: a workload preempted this many times is not preempted again (None = no
      bound): it finishes, however often higher-priority work arrives.
    shorter_remaining_factor: None = off; a number lets a pending workload preempt preemptible work of its
      own priority in its cohort tree (rule ShorterRemaining) whose expected remaining device-time is at
      least this many times the preemptor's whole expected device-time (preemptive shortest-remaining-first;
      work of unknown duration is never such a victim).
    shortest_first_aging_seconds: None keeps equal-priority work of a queue in submission order; a number
      orders it by expected remaining device-time, shortest first, each such span of waiting counting as
      much as a factor of e in size, so long work moves up the longer it waits and nobody starves.
    """

    enable_backfill_protection: bool = True
    backfill_depth: int = 4
    reservations_ahead: bool = True
    backfill_wait_seconds: float = 3600.0
    protected_large_gangs: int = 0
    large_gang_devices: int = 32
    enable_preemption: bool = True
    explain: bool = True
    suggestions: bool = True
    rerun_verification_limit: int = 200
    preemption_search_limit: int = 4096
    preemptions_per_queue_per_cycle: int = 1
    estimate_horizon_events: int = 256
    estimate_queue_depth: int = 1000
    preemption_min_runtime_seconds: float = 0.0
    max_preemptions_per_workload: int | None = None
    shorter_remaining_factor: float | None = None
    shortest_first_aging_seconds: float | None = None


@dataclass(frozen=True)
class Snapshot:
    """One consistent view of the cluster for one cycle.

    levels: topology levels coarse -> fine, e.g. ("zone", "block", "rack"); the node is the implicit
      finest level.
    now: the cycle's time (data, never read from a clock).
    """

    levels: tuple[str, ...] = ()
    nodes: tuple[Node, ...] = ()
    devices: tuple[Device, ...] = ()
    counter_sets: tuple[CounterSet, ...] = ()
    device_classes: tuple[DeviceClass, ...] = ()
    cohorts: tuple[Cohort, ...] = ()
    queues: tuple[Queue, ...] = ()
    resource_classes: tuple[ResourceClass, ...] = ()
    reservations: tuple[Reservation, ...] = ()
    running: tuple[RunningWorkload, ...] = ()
    pending: tuple[PendingWorkload, ...] = ()
    now: float = 0.0
    config: SchedulerConfig = field(default_factory=SchedulerConfig)


# --- decisions -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PodPlacement:
    """Where one pod of an admitted workload goes: its node and the exact devices it claims.

    requests: for a pod set with a several-request claim, (request, device ids) pairs in the claim's
    order; a firstAvailable request is named "<request>/<sub-request>" as DRA's allocation result names
    it. Empty for the single-request case (all of `device_ids` then serve it).
    consumed: for a time-sliced pod (broker.scheduler.sharing), the (capacity, amount) pairs it takes of
      each of its devices, which other allocations may share (DRA consumedCapacity); empty: whole devices.
    """

    pod_set: str
    index: int
    node: str
    device_ids: tuple[str, ...]
    requests: tuple[tuple[str, tuple[str, ...]], ...] = ()
    consumed: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Admission:
    """A workload admitted this cycle. domain: level -> domain shared by all its pods (read-only: the
    mapping of a one-node admission is shared by every admission on that node). request_classes: for a
    several-request claim, (request label, device class) of each request its pods' `requests` name: the
    devices of a request are allocated (and charged to quota) under its own class."""

    workload_id: str
    device_class: str
    pods: tuple[PodPlacement, ...]
    domain: Mapping[str, str] = field(default_factory=dict)
    request_classes: tuple[tuple[str, str], ...] = ()
    # Its group claims' devices, allocated once for the gang: ("<claim>/<request>", device ids) pairs in
    # the claims' order (a firstAvailable request as "<claim>/<request>/<sub-request>").
    group_requests: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class Preemption:
    """A running workload to evict so `preemptor_id` can start in a later cycle.

    rule: the policy that allowed it: "WithinQueue" | "ReclaimWithinCohort" | "ReservationReclaim" |
      "ClassPriority" | "ShorterRemaining".
    pods: (pod set, index) of the pods to evict when it is shrunk (Pod disruption mode, pods above its
      gang minimum); empty: the whole workload.
    """

    victim_id: str
    preemptor_id: str
    rule: str
    message: str
    pods: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Eviction:
    """Running work the cycle stops for a cause other than preemption (e.g. a failed device under it).

    reason: "DeviceFailed". pods: (pod set, index) of the pods that leave (Pod disruption mode, its
    gang minimum kept); empty: the whole workload. It keeps its devices while it shuts down, then goes
    back to its queue.
    """

    workload_id: str
    reason: str
    message: str
    pods: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Suggestion:
    """A change that was verified to make the workload start on this snapshot.

    kind: "RelaxTopology" | "FallbackClass" | "ShrinkGang" | "IncreaseQuota".
    change: machine-readable change (see explanation.apply_suggestion).
    """

    kind: str
    description: str
    change: dict


@dataclass(frozen=True)
class PendingDecision:
    """Why a workload was not admitted.

    reason: primary code (first of REASON_CODES that applies); secondary: the others that apply.
    details: the numbers behind the message (needed, free, largest_free_domain, quota, ...).
    position_in_queue / position_in_cluster: 1-based among still-pending workloads (None if unknown queue).
    estimated_start: time it is expected to start, None when it cannot be computed (message says why).
    """

    workload_id: str
    reason: str
    secondary: tuple[str, ...] = ()
    message: str = ""
    details: dict = field(default_factory=dict)
    position_in_queue: int | None = None
    position_in_cluster: int | None = None
    estimated_start: float | None = None
    suggestions: tuple[Suggestion, ...] = ()


@dataclass(frozen=True)
class CycleResult:
    """Every pending input workload appears exactly once, in `admissions` or in `pending`."""

    admissions: tuple[Admission, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    pending: tuple[PendingDecision, ...] = ()
    evictions: tuple[Eviction, ...] = ()
