"""A pending workload resolved against the policy: its queue, team, device classes, topology and gang.

Defaults from the resource class are filled in here once, and anything that can never be valid
(unknown names, impossible counts) is turned into one readable InvalidRequest message.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from operator import attrgetter

from broker.scheduler.capacity import NODE_LEVEL, Access
from broker.scheduler.claims import Claim, claim_problem
from broker.scheduler.group_claims import group_problem
from broker.scheduler.placement import PodDemand, minimum_devices
from broker.scheduler.snapshot import PendingWorkload, PodSet, Queue, ResourceClass, Snapshot


class _once:
    """A property computed on first use and kept in the instance (functools.cached_property without its
    lock, which costs more than these small computations)."""

    def __init__(self, function):
        self.function = function
        self.name = function.__name__
        self.__doc__ = function.__doc__

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        value = instance.__dict__[self.name] = self.function(instance)
        return value


@dataclass(frozen=True)
class Request:
    """What the cycle needs to know about one pending workload."""

    workload: PendingWorkload
    queue: Queue
    team: str
    resource_class: ResourceClass | None
    classes: tuple[str, ...]
    demands: tuple[PodDemand, ...]
    required: str | None
    preferred: str | None
    preemptible: bool
    tolerations: tuple

    @_once
    def id(self) -> str:
        return self.workload.id

    @_once
    def needed(self) -> int:
        return minimum_devices(self.demands)

    @_once
    def quota_needed(self) -> int:
        """Devices it charges at least: its gang's and, once, its group claims' (the fewest of each)."""
        group = self.workload.group_claims
        if not group:
            return self.needed
        return self.needed + sum(Claim(claim.requests, claim.constraints).fewest_devices() for claim in group)

    @_once
    def simple(self) -> bool:
        """One pod set whose pods all must start, no matchAttribute, no topology: placement's common case."""
        demands = self.demands
        return (
            len(demands) == 1
            and demands[0].count == demands[0].min_count
            and not demands[0].match_attribute
            and demands[0].claim is None
            and self.required is None
            and self.preferred is None
        )

    @_once
    def shared_amounts(self) -> dict | None:
        """The capacity amounts each of its pods takes of each device when its class shares devices by
        time-slicing (broker.scheduler.sharing), else None (devices whole)."""
        resource_class = self.resource_class
        if resource_class is None or resource_class.sharing != "TimeSliced":
            return None
        amounts = next((pod_set.capacity for pod_set in self.workload.pod_sets if pod_set.capacity), ())
        return dict(amounts) or None

    @_once
    def claimed(self) -> bool:
        """Its pods claim devices with several named requests (broker.scheduler.claims)."""
        return self.demands[0].claim is not None

    @_once
    def default_access(self) -> Access:
        """`access()` made once (an Access is never changed after it is made)."""
        return self.access()

    def access(self, healed=False, unreserved=False) -> Access:
        return Access(self.team, self.preemptible, self.tolerations, healed=healed, unreserved=unreserved)

    def with_demands(self, demands) -> Request:
        return _replace(self, demands=tuple(demands))

    def with_classes(self, classes) -> Request:
        return _replace(self, classes=tuple(classes))

    def with_group_claims(self, group_claims) -> Request:
        """The same request as if its workload had these group claims (explanations ask without)."""
        return _replace(self, workload=replace(self.workload, group_claims=tuple(group_claims)))

    def with_topology(self, required, preferred) -> Request:
        return _replace(self, required=required, preferred=preferred)


def _replace(request: Request, **changes) -> Request:
    values = {name: getattr(request, name) for name in Request.__dataclass_fields__}
    values.update(changes)
    return Request(**values)


_pod_set_fields = attrgetter(*(field.name for field in fields(PodSet)))


def all_levels(snapshot: Snapshot) -> tuple[str, ...]:
    """Topology levels coarse to fine with the node as the finest."""
    levels = tuple(snapshot.levels)
    return levels if NODE_LEVEL in levels else levels + (NODE_LEVEL,)


def resolve(workload: PendingWorkload, snapshot: Snapshot, lookups: dict, memo: dict | None = None) -> Request | str:
    """A Request, or the InvalidRequest message saying what can never be met.

    With `memo` (one dict per cycle), workloads of one shape (queue, resource class, pod sets, topology,
    team, preemptible: everything resolution reads) are resolved once; each gets a copy of the shape's
    Request with its own workload, sharing what was already computed from the shape (needed, access)."""
    if memo is None:
        return _resolve(workload, snapshot, lookups)
    # First by the pod sets' identities: the loader hands gangs of one shape the same PodSet records, and
    # the snapshot keeps them alive for the whole cycle, so an identity stands for its values. (A tuple of
    # ints here, of field tuples in the key below: the two kinds of key never meet in `memo`.)
    identity = _shape_key(workload, tuple(map(id, workload.pod_sets)))
    shape = memo.get(identity)
    if shape is None:
        shape = _shape(workload, snapshot, lookups, memo)
        memo[identity] = shape
    if isinstance(shape, str):
        return shape
    if shape.workload is workload:
        return shape
    # A frozen dataclass copy without re-running its __init__: same fields, another workload.
    request = object.__new__(Request)
    values = request.__dict__
    values.update(shape.__dict__)
    values["workload"] = workload
    values["id"] = workload.id  # its own, whether or not the shape's was computed yet (asked at once anyway)
    return request


def _shape_key(workload: PendingWorkload, pod_sets: tuple) -> tuple:
    """Everything resolution reads of a workload, its pod sets as the caller tells them apart."""
    return (
        workload.queue,
        workload.resource_class,
        pod_sets,
        workload.topology_required,
        workload.topology_preferred,
        workload.preemptible,
        workload.team,
        workload.group_claims,
    )


def _shape(workload: PendingWorkload, snapshot: Snapshot, lookups: dict, memo: dict) -> Request | str:
    """The resolved shape of `workload` by the values of everything resolution reads."""
    # Each pod set by its field values: what PodSet's generated __eq__ compares, hashed and compared in C
    # rather than through its Python __hash__ and __eq__ for each of the tens of thousands.
    key = _shape_key(workload, tuple(map(_pod_set_fields, workload.pod_sets)))
    try:
        shape = memo.get(key)
    except TypeError:  # something unhashable in the pod sets: resolve this one on its own
        return _resolve(workload, snapshot, lookups)
    if shape is None:
        shape = memo[key] = _resolve(workload, snapshot, lookups)
        if not isinstance(shape, str):  # computed once per shape: its copies share them
            _ = (
                shape.needed,
                shape.quota_needed,
                shape.simple,
                shape.claimed,
                shape.shared_amounts,
                shape.default_access,
            )
    return shape


def _resolve(workload: PendingWorkload, snapshot: Snapshot, lookups: dict) -> Request | str:
    queue = lookups["queues"].get(workload.queue)
    if queue is None:
        return f"unknown queue '{workload.queue}'"
    resource_class = None
    if workload.resource_class is not None:
        resource_class = lookups["resource_classes"].get(workload.resource_class)
        if resource_class is None:
            return f"unknown resource class '{workload.resource_class}'"
    problem = _pod_set_problem(workload)
    if problem:
        return problem
    if workload.group_claims:
        problem = group_problem(workload.group_claims, lookups["device_classes"])
        if problem:
            return problem
        if resource_class is not None and resource_class.sharing == "TimeSliced":
            return f"group claims go with whole devices; resource class '{resource_class.name}' shares them"
    asked = {pod_set.capacity for pod_set in workload.pod_sets}
    if len(asked) > 1:
        return "all pod sets must ask the same capacity amounts of their devices"
    if any(asked):
        if resource_class is None or resource_class.sharing != "TimeSliced":
            name = f"resource class '{resource_class.name}'" if resource_class else "no resource class"
            return f"asks capacity amounts of shared devices, but {name} shares none (sharing: TimeSliced)"
        if any(pod_set.requests for pod_set in workload.pod_sets):
            return "capacity amounts go with devices_per_pod, not with a claim's requests"
        if any(amount <= 0 for _, amount in next(iter(asked))):
            return "capacity amounts must be positive"
    claimed = [pod_set for pod_set in workload.pod_sets if pod_set.requests]
    if claimed:
        return _resolve_claims(workload, snapshot, lookups, queue, resource_class, claimed)
    declared = [pod_set.device_classes for pod_set in workload.pod_sets if pod_set.device_classes]
    if any(classes != declared[0] for classes in declared):
        return "all pod sets must claim the same device classes"
    offered = tuple(resource_class.device_classes) if resource_class else ()
    classes = tuple(declared[0]) if declared else offered
    if not classes:
        return "names no device class and no resource class that offers one"
    for name in classes:
        if name not in lookups["device_classes"]:
            return f"unknown device class '{name}'"
        if resource_class is not None and offered and name not in offered:
            return f"device class '{name}' is not offered by resource class '{resource_class.name}'"
    demands = tuple(
        PodDemand(pod_set.name, pod_set.count, pod_set.gang_size, pod_set.devices_per_pod, pod_set.match_attribute)
        for pod_set in workload.pod_sets
    )
    return _finish(workload, snapshot, lookups, queue, resource_class, classes, demands)


def _resolve_claims(workload, snapshot, lookups, queue, resource_class, claimed) -> Request | str:
    """A workload whose pods claim devices with several named requests (DRA DeviceClaim)."""
    if len(claimed) != len(workload.pod_sets):
        return "all pod sets must claim devices the same way: by requests, or by devices per pod"
    offered = tuple(resource_class.device_classes) if resource_class else ()
    most = all_bound(workload.pod_sets, resource_class.max_devices if resource_class is not None else None)
    classes: list[str] = []
    demands = []
    for pod_set in workload.pod_sets:
        if pod_set.devices_per_pod != 1 or pod_set.device_classes or pod_set.match_attribute:
            return (
                f"pod set '{pod_set.name}': a claim with requests says its devices itself "
                "(no devices_per_pod, device_classes or match_attribute)"
            )
        claim = Claim(tuple(pod_set.requests), tuple(pod_set.constraints), most)
        problem = claim_problem(claim, lookups["device_classes"])
        if problem:
            return f"pod set '{pod_set.name}': {problem}"
        for name in claim.classes():
            if resource_class is not None and offered and name not in offered:
                return f"device class '{name}' is not offered by resource class '{resource_class.name}'"
            if name not in classes:
                classes.append(name)
        demands.append(PodDemand(pod_set.name, pod_set.count, pod_set.gang_size, claim.fewest_devices(), None, claim))
    return _finish(workload, snapshot, lookups, queue, resource_class, tuple(classes), tuple(demands))


def all_bound(pod_sets, max_devices: int | None) -> int | None:
    """The most devices one allocationMode All request may take so that the whole gang stays within its
    resource class's `max_devices`: what its other requests take at least is set aside, and the rest is
    shared equally among the All requests of all its pods (None: no limit)."""
    if max_devices is None:
        return None
    fixed = every = 0
    for pod_set in pod_sets:
        for request in pod_set.requests:
            if any(way.takes_all for way in request.alternatives):
                every += pod_set.count
            else:
                fixed += pod_set.count * min((way.count for way in request.alternatives), default=0)
    return max(0, max_devices - fixed) // every if every else max_devices


def _finish(workload, snapshot, lookups, queue, resource_class, classes, demands) -> Request | str:
    required = _own_or_default(workload.topology_required, resource_class, "topology_required")
    preferred = _own_or_default(workload.topology_preferred, resource_class, "topology_preferred")
    levels = lookups.get("levels") or all_levels(snapshot)
    for level in (required, preferred):
        if level is not None and level not in levels:
            return f"unknown topology level '{level}' (levels: {', '.join(levels)})"
    if resource_class is not None and resource_class.max_devices is not None:
        total = minimum_devices(demands)
        if total > resource_class.max_devices:
            return (
                f"requests {total} devices; resource class '{resource_class.name}' allows at most "
                f"{resource_class.max_devices}"
            )
    preemptible = workload.preemptible
    if preemptible is None:
        preemptible = resource_class.preemptible if resource_class else False
    tolerations = ()
    if any(pod_set.tolerations for pod_set in workload.pod_sets):
        tolerations = tuple(sorted({t for pod_set in workload.pod_sets for t in pod_set.tolerations}, key=repr))
    return Request(
        workload=workload,
        queue=queue,
        team=workload.team or queue.team,
        resource_class=resource_class,
        classes=classes,
        demands=demands,
        required=required,
        preferred=preferred,
        preemptible=bool(preemptible),
        tolerations=tolerations,
    )


def _own_or_default(value: str | None, resource_class: ResourceClass | None, field_name: str) -> str | None:
    # None means "as the resource class says"; "" means explicitly no constraint.
    if value is None:
        value = getattr(resource_class, field_name) if resource_class else None
    return value or None


def _pod_set_problem(workload: PendingWorkload) -> str | None:
    if not workload.pod_sets:
        return "has no pods"
    names = [pod_set.name for pod_set in workload.pod_sets]
    if len(set(names)) != len(names):
        return "pod set names must be unique"
    for pod_set in workload.pod_sets:
        if pod_set.count < 1:
            return f"pod set '{pod_set.name}' needs at least 1 pod (count {pod_set.count})"
        if not 1 <= pod_set.gang_size <= pod_set.count:
            bounds = f"between 1 and {pod_set.count}"
            return f"pod set '{pod_set.name}': min_count {pod_set.gang_size} must be {bounds}"
        if pod_set.devices_per_pod < 1:
            return f"pod set '{pod_set.name}' needs at least 1 device per pod"
    return None


def entitlement_problem(request: Request) -> str | None:
    resource_class = request.resource_class
    if resource_class is None or resource_class.teams is None or request.team in resource_class.teams:
        return None
    allowed = ", ".join(resource_class.teams) or "nobody"
    return f"team {request.team} may not use resource class {resource_class.name} (allowed: {allowed})"


def approval_problem(request: Request) -> str | None:
    resource_class = request.resource_class
    if resource_class is None or not resource_class.approval_required or request.workload.approved is True:
        return None
    if request.workload.approved is False:
        return f"the request for resource class {resource_class.name} was rejected"
    return f"resource class {resource_class.name} needs approval; none given yet"
