"""What-if scenario files: a small YAML cluster -> Snapshot, and a CycleResult -> the `whatif --json` dict.

The format (issue 3) is also the format of the scenario tests. Devices of a node are named
"<node>/0" .. "<node>/<n-1>" with driver gpu.example.com.

Partitionable devices (DRA counter sets, issue 26): a node with `counters` publishes one counter set per
device, named "gpu-<index>", holding those counters; each whole device consumes all of its set. Its
`partitions` list profiles cut from every device, e.g.

    counters: {memory: 8, compute: 7}
    partitions:
      - {profile: 1g.10gb, count: 7, consumes: {memory: 1, compute: 1}}
      - {profile: 3g.40gb, count: 2, consumes: {memory: 4, compute: 3}, attributes: {...}}

makes devices "<node>/<index>:<profile>#<k>" (k = 0 .. count-1) with the node's attributes plus
`profile: <profile>` (a whole device gets `profile: whole`), each consuming its `consumes` of its
device's set. A partition consuming a counter its device does not publish is an error. A running pod
names partitions by their name on the node (`devices: ["0:1g.10gb#0"]`); `devices: <count>` takes
whole devices only, and running work that would exceed a counter is an error.

Claims with several requests (DRA DeviceClaim, issue 26): a pod set (or the workload) gives
`requests` instead of devices_per_pod / device_class / match_attribute, and `constraints` across them;
devices of other kinds sit beside a node's accelerators as `other_devices`, e.g.

    other_devices:
      - {kind: nic, count: 2, attributes: {type: efa}, device_attributes: {0: {pcie_root: r0}}}
    ...
    requests:
      - {name: gpu, device_class: h100, count: 8}
      - {name: nic, device_class: efa, selectors: ['device.attributes["gpu.example.com"].speed >= 100']}
      - {name: acc, first_available: [{name: big, device_class: h100}, {name: small, device_class: a100,
         count: 2}]}
    constraints:
      - {match_attribute: pcie_root, requests: [gpu, nic]}

makes devices "<node>/<kind>-<index>" carrying `kind: <kind>`. A request naming an unknown class, a class
selecting no device of the cluster, or a constraint naming an unknown request is an error. In `--json`
such a pod's placement gains `requests`: {request (a firstAvailable one as "<request>/<way>"): [devices]}.
A request (or a firstAvailable way) with `allocation_mode: All` and no `count` takes every device of its
class and selectors on the pod's node (for a group claim: every one reachable from all its pods), and
fails on a node where any of them is busy, broken, tainted, reserved for others or already taken by the
gang; at least one must exist. A constraint gives `distinct_attribute` instead of `match_attribute` to
want a value of its own on every device of the requests it names (e.g. GPUs under two PCIe roots):

    requests:
      - {name: gpus, device_class: h100, count: 2}
      - {name: nics, device_class: efa, allocation_mode: All}
    constraints:
      - {distinct_attribute: pcie_root, requests: [gpus]}

Group claims (Kubernetes 1.36 PodGroup resourceClaims, issue 26): a pending workload's `group_claims`
lists claims the whole gang owns, each allocated once and used by every pod:

    group_claims:
      - name: scratch
        requests: [{name: data, device_class: scratch}]
        constraints: []

with `requests` and `constraints` as a pod's claim above. The pods may only go where every device of its
group claims is reachable: a device is node-local unless its attribute `reach` names a topology level
(`reach: rack`: every node of its node's rack reaches it, as a network-attached device DRA publishes for
a rack's nodeSelector) or is `cluster` (every node, DRA allNodes); so a GPU in a group claim pins the gang
to its node, a rack's storage to its rack. A running workload names its group claims' devices as
`group_claims: {scratch: [n1/scratch-0]}`. In `--json` every entry has `group_requests`: for an admitted
workload {"<claim>/<request>": [devices]}, once for the gang (its pods' `devices` do not repeat them; they
count once in its `details.devices`), else {}.

Shared devices (DRA consumable capacity, issue 26): a node with `shared: true` has devices that allow
several allocations of their `capacity`; a resource class with `sharing: TimeSliced` lets work share
them, each pod taking its pod set's `capacity` amounts (e.g. `capacity: {memory: 20}`) of each of its
devices, and a running pod names what it takes as `consumed: {memory: 30}` (several running pods may
then name one device, within its capacity). In `--json`, such a pod's placement gains `consumed`:
{capacity: amount} it takes of each of its devices (DRA consumedCapacity).

Any malformed input raises ScenarioError with one readable line that says where, e.g.
"pending[2].queue: unknown queue 'foo'".
"""

from __future__ import annotations

import re
from dataclasses import replace

import yaml

from broker.scheduler.claims import Claim, claim_problem
from broker.scheduler.group_claims import group_problem
from broker.scheduler.selectors import ClassMatcher, validate_selector
from broker.scheduler.sharing import SHARING_MODES
from broker.scheduler.snapshot import (
    ALL_DEVICES,
    ALLOCATION_MODES,
    DISRUPTION_MODES,
    DRIVER,
    GROUP_POD_SET,
    PREEMPT_LOWER_PRIORITY,
    PREEMPTION_POLICIES,
    RECLAIM_POLICIES,
    WITHIN_QUEUE_POLICIES,
    Cohort,
    CounterSet,
    CycleResult,
    Device,
    DeviceClass,
    DeviceConstraint,
    DeviceRequest,
    DeviceSubRequest,
    GroupClaim,
    Node,
    PendingWorkload,
    PodSet,
    Queue,
    Reservation,
    ResourceClass,
    RunningPod,
    RunningWorkload,
    SchedulerConfig,
    Snapshot,
    Taint,
    Toleration,
    split_leaving,
)

TOP_KEYS = {
    "topology", "now", "config", "device_classes", "nodes", "queues", "cohorts", "resource_classes",
    "reservations", "running", "pending", "expect", "description",
}  # fmt: skip


class ScenarioError(ValueError):
    """A scenario file that cannot be read; the message is one line naming the place."""


def load_scenario(text: str) -> Snapshot:
    """Parse scenario YAML into a Snapshot."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or "not valid YAML"
        raise ScenarioError(f"invalid YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise ScenarioError("a scenario must be a YAML mapping with topology, nodes, queues, pending, ...")
    return _Reader(data).snapshot()


def scenario_expectations(text: str) -> dict:
    """The optional `expect:` block of a scenario file (used by the table-driven tests)."""
    data = yaml.safe_load(text) or {}
    return data.get("expect") or {}


class _Reader:
    def __init__(self, data: dict):
        self.data = data

    def snapshot(self) -> Snapshot:
        _keys("", self.data, TOP_KEYS)
        levels = tuple(_list(self.data.get("topology", []), "topology", str))
        if len(set(levels)) != len(levels):
            raise ScenarioError("topology: levels must be unique")
        device_classes = self.device_classes()
        nodes, devices, counter_sets = self.nodes(levels)
        cohorts = self.cohorts()
        queues = self.queues({cohort.name for cohort in cohorts})
        class_names = {device_class.name for device_class in device_classes}
        resource_classes = self.resource_classes(class_names)
        lookups = {
            "queues": {queue.name: queue for queue in queues},
            "classes": class_names,
            "resource_classes": {rc.name: rc for rc in resource_classes},
            "nodes": {node.name: node for node in nodes},
            "devices": {device.id: device for device in devices},
            "counter_sets": {(counter_set.node, counter_set.name): counter_set for counter_set in counter_sets},
        }
        now = _number(self.data.get("now", 0), "now")
        matcher = ClassMatcher(device_classes)
        selected = set().union(*(matcher.classes_of(device) for device in devices)) if devices else set()
        lookups["selects"] = selected.__contains__
        lookups["shared_use"] = {}  # shared device -> capacity left by the running pods read so far
        running = self.running(lookups, matcher, now)
        _check_counters(running, lookups)
        return Snapshot(
            levels=levels,
            nodes=nodes,
            devices=devices,
            counter_sets=counter_sets,
            device_classes=device_classes,
            cohorts=cohorts,
            queues=queues,
            resource_classes=resource_classes,
            reservations=self.reservations(lookups),
            running=running,
            pending=self.pending(lookups),
            now=now,
            config=self.config(),
        )

    def config(self) -> SchedulerConfig:
        raw = _mapping(self.data.get("config") or {}, "config")
        fields = SchedulerConfig.__dataclass_fields__
        for key in raw:
            if key not in fields:
                raise ScenarioError(f"config: unknown key '{key}' (known: {', '.join(sorted(fields))})")
        return SchedulerConfig(**raw)

    def device_classes(self) -> tuple[DeviceClass, ...]:
        raw = _mapping(self.data.get("device_classes") or {}, "device_classes")
        classes = []
        for name, spec in raw.items():
            where = f"device_classes.{name}"
            spec = _mapping(spec or {}, where)
            _keys(where, spec, {"match", "selector", "price_per_hour"})
            selector = spec.get("selector")
            if selector is not None:
                problem = validate_selector(str(selector))
                if problem:
                    raise ScenarioError(f"{where}.selector: {problem}")
            match = spec.get("match")
            if match is not None:
                match = _mapping(match, where + ".match")
            classes.append(
                DeviceClass(
                    name=str(name),
                    selector=str(selector) if selector is not None else None,
                    match=dict(match) if match is not None else None,
                    price_per_hour=_number(spec.get("price_per_hour", 0.0), where + ".price_per_hour"),
                )
            )
        return tuple(classes)

    def nodes(self, levels) -> tuple[tuple[Node, ...], tuple[Device, ...], tuple[CounterSet, ...]]:
        nodes, devices, counter_sets = [], [], []
        seen = set()
        allowed = {
            "name", "devices", "attributes", "device_attributes", "unhealthy", "cordoned", "taints", "labels",
            "capacity", "counters", "partitions", "other_devices", "shared",
        }  # fmt: skip
        for index, spec in enumerate(_list(self.data.get("nodes") or [], "nodes")):
            where = f"nodes[{index}]"
            spec = _mapping(spec, where)
            _keys(where, spec, allowed | set(levels))
            name = _required_str(spec, "name", where)
            if name in seen:
                raise ScenarioError(f"{where}.name: duplicate node '{name}'")
            seen.add(name)
            missing = [level for level in levels if level not in spec]
            if missing:
                raise ScenarioError(f"{where}: node '{name}' has no {missing[0]} (topology: {', '.join(levels)})")
            count = _int(spec.get("devices", 0), where + ".devices")
            unhealthy = set(_list(spec.get("unhealthy") or [], where + ".unhealthy", int))
            for bad in sorted(unhealthy):
                if not 0 <= bad < count:
                    raise ScenarioError(f"{where}.unhealthy: no device {bad} on a node with {count} devices")
            taints = self.taints(spec.get("taints") or [], where + ".taints", count)
            attributes = dict(_mapping(spec.get("attributes") or {}, where + ".attributes"))
            per_device = _mapping(spec.get("device_attributes") or {}, where + ".device_attributes")
            for key in per_device:
                if not isinstance(key, int) or not 0 <= key < count:
                    raise ScenarioError(f"{where}.device_attributes: no device {key!r} on a node with {count} devices")
            capacity = dict(_mapping(spec.get("capacity") or {}, where + ".capacity"))
            shared = bool(spec.get("shared", False))
            if shared and not capacity:
                raise ScenarioError(f"{where}.shared: shared devices need a capacity to share")
            nodes.append(
                Node(
                    name=name,
                    domains={level: str(spec[level]) for level in levels},
                    schedulable=not bool(spec.get("cordoned", False)),
                    labels=dict(_mapping(spec.get("labels") or {}, where + ".labels")),
                )
            )
            counters = _counts(spec.get("counters") or {}, where + ".counters")
            partitions = self.partitions(spec.get("partitions") or [], where + ".partitions", counters)
            if partitions:
                attributes = {**attributes, "profile": "whole"}
            for device_index in range(count):
                own = (
                    {**attributes, **_mapping(per_device.get(device_index) or {}, where)}
                    if device_index in per_device
                    else attributes
                )
                healthy = device_index not in unhealthy
                device_taints = tuple(taint for taint, indices in taints if indices is None or device_index in indices)
                set_name = f"gpu-{device_index}"
                if counters:
                    counter_sets.append(CounterSet(set_name, name, dict(counters)))
                devices.append(
                    Device(
                        id=f"{name}/{device_index}",
                        node=name,
                        driver=DRIVER,
                        attributes=own,
                        capacity=capacity,
                        healthy=healthy,
                        taints=device_taints,
                        consumes_counters={set_name: dict(counters)} if counters else {},
                        allow_multiple_allocations=shared,
                    )
                )
                for profile, parts, consumes, extra in partitions:
                    for part in range(parts):
                        devices.append(
                            Device(
                                id=f"{name}/{device_index}:{profile}#{part}",
                                node=name,
                                driver=DRIVER,
                                attributes={**own, **extra, "profile": profile},
                                capacity=capacity,
                                healthy=healthy,
                                taints=device_taints,
                                consumes_counters={set_name: dict(consumes)},
                            )
                        )
            devices.extend(self.other_devices(spec.get("other_devices") or [], where + ".other_devices", name))
        return tuple(nodes), tuple(devices), tuple(counter_sets)

    def other_devices(self, raw, where, node) -> list[Device]:
        """Devices of other kinds beside the accelerators (NICs...): "<node>/<kind>-<index>"."""
        devices = []
        kinds = set()
        for index, spec in enumerate(_list(raw, where)):
            here = f"{where}[{index}]"
            spec = _mapping(spec, here)
            _keys(here, spec, {"kind", "count", "attributes", "device_attributes"})
            kind = _required_str(spec, "kind", here)
            if kind in kinds:
                raise ScenarioError(f"{here}.kind: duplicate kind '{kind}'")
            kinds.add(kind)
            count = _int(spec.get("count", 1), here + ".count")
            if count < 1:
                raise ScenarioError(f"{here}.count: must be at least 1")
            attributes = {"kind": kind, **_mapping(spec.get("attributes") or {}, here + ".attributes")}
            per_device = _mapping(spec.get("device_attributes") or {}, here + ".device_attributes")
            for key in per_device:
                if not isinstance(key, int) or not 0 <= key < count:
                    raise ScenarioError(f"{here}.device_attributes: no device {key!r} of {count}")
            for device_index in range(count):
                own = {**attributes, **_mapping(per_device.get(device_index) or {}, here)}
                devices.append(Device(id=f"{node}/{kind}-{device_index}", node=node, driver=DRIVER, attributes=own))
        return devices

    def partitions(self, raw, where, counters) -> list[tuple]:
        """(profile, count, consumes, attributes) of each partition profile."""
        profiles = []
        for index, spec in enumerate(_list(raw, where)):
            here = f"{where}[{index}]"
            spec = _mapping(spec, here)
            _keys(here, spec, {"profile", "count", "consumes", "attributes"})
            profile = _required_str(spec, "profile", here)
            if any(profile == known[0] for known in profiles):
                raise ScenarioError(f"{here}.profile: duplicate profile '{profile}'")
            consumes = _counts(spec.get("consumes") or {}, here + ".consumes")
            if not consumes:
                raise ScenarioError(f"{here}.consumes: a partition must consume some of its device's counters")
            for counter in consumes:
                if counter not in counters:
                    known = ", ".join(sorted(counters)) or "none"
                    raise ScenarioError(
                        f"{here}.consumes: counter '{counter}' is not published by its device (counters: {known})"
                    )
            count = _int(spec.get("count", 1), here + ".count")
            if count < 1:
                raise ScenarioError(f"{here}.count: must be at least 1")
            attributes = dict(_mapping(spec.get("attributes") or {}, here + ".attributes"))
            profiles.append((profile, count, consumes, attributes))
        return profiles

    def taints(self, raw, where, count):
        taints = []
        for index, spec in enumerate(_list(raw, where)):
            here = f"{where}[{index}]"
            spec = _mapping(spec, here)
            _keys(here, spec, {"key", "value", "effect", "devices"})
            effect = str(spec.get("effect", "NoSchedule"))
            if effect not in ("NoSchedule", "NoExecute", "PreferNoSchedule"):
                raise ScenarioError(f"{here}.effect: must be NoSchedule, NoExecute or PreferNoSchedule")
            indices = spec.get("devices")
            if indices is not None:
                indices = set(_list(indices, here + ".devices", int))
            value = spec.get("value")
            taints.append(
                (
                    Taint(_required_str(spec, "key", here), None if value is None else str(value), effect),
                    indices,
                )
            )
        return taints

    def cohorts(self) -> tuple[Cohort, ...]:
        cohorts = []
        for index, spec in enumerate(_list(self.data.get("cohorts") or [], "cohorts")):
            where = f"cohorts[{index}]"
            spec = _mapping(spec, where)
            _keys(where, spec, {"name", "parent", "quota", "borrowing_limit", "lending_limit"})
            cohorts.append(
                Cohort(
                    name=_required_str(spec, "name", where),
                    parent=_optional_str(spec.get("parent")),
                    quota=_counts(spec.get("quota") or {}, where + ".quota"),
                    borrowing_limit=_optional_counts(spec.get("borrowing_limit"), where + ".borrowing_limit"),
                    lending_limit=_optional_counts(spec.get("lending_limit"), where + ".lending_limit"),
                )
            )
        return tuple(cohorts)

    def queues(self, cohort_names) -> tuple[Queue, ...]:
        queues = []
        names = set()
        allowed = {
            "name",
            "team",
            "cohort",
            "quota",
            "borrowing_limit",
            "lending_limit",
            "weight",
            "preemption",
        }
        for index, spec in enumerate(_list(self.data.get("queues") or [], "queues")):
            where = f"queues[{index}]"
            spec = _mapping(spec, where)
            _keys(where, spec, allowed)
            name = _required_str(spec, "name", where)
            if name in names:
                raise ScenarioError(f"{where}.name: duplicate queue '{name}'")
            names.add(name)
            preemption = _mapping(spec.get("preemption") or {}, where + ".preemption")
            _keys(where + ".preemption", preemption, {"within_queue", "reclaim_within_cohort"})
            within = str(preemption.get("within_queue", "Never"))
            reclaim = str(preemption.get("reclaim_within_cohort", "Never"))
            if within not in WITHIN_QUEUE_POLICIES:
                raise ScenarioError(
                    f"{where}.preemption.within_queue: must be one of {', '.join(WITHIN_QUEUE_POLICIES)}"
                )
            if reclaim not in RECLAIM_POLICIES:
                raise ScenarioError(
                    f"{where}.preemption.reclaim_within_cohort: must be one of {', '.join(RECLAIM_POLICIES)}"
                )
            queues.append(
                Queue(
                    name=name,
                    team=str(spec.get("team", name)),
                    cohort=_optional_str(spec.get("cohort")),
                    quota=_optional_counts(spec.get("quota"), where + ".quota"),
                    borrowing_limit=_optional_counts(spec.get("borrowing_limit"), where + ".borrowing_limit"),
                    lending_limit=_optional_counts(spec.get("lending_limit"), where + ".lending_limit"),
                    weight=_number(spec.get("weight", 1.0), where + ".weight"),
                    within_queue=within,
                    reclaim_within_cohort=reclaim,
                )
            )
        return tuple(queues)

    def resource_classes(self, class_names) -> tuple[ResourceClass, ...]:
        classes = []
        allowed = {
            "name", "device_classes", "topology", "teams", "approval", "approval_required",
            "default_priority", "priority", "preemptible", "max_devices", "sharing",
        }  # fmt: skip
        for index, spec in enumerate(_list(self.data.get("resource_classes") or [], "resource_classes")):
            where = f"resource_classes[{index}]"
            spec = _mapping(spec, where)
            _keys(where, spec, allowed)
            device_classes = tuple(_class_list(spec.get("device_classes"), where + ".device_classes", class_names))
            required, preferred = _topology(spec.get("topology"), where + ".topology")
            teams = spec.get("teams")
            classes.append(
                ResourceClass(
                    name=_required_str(spec, "name", where),
                    device_classes=device_classes,
                    topology_required=required,
                    topology_preferred=preferred,
                    teams=None if teams is None else tuple(_list(teams, where + ".teams", str)),
                    approval_required=bool(spec.get("approval", spec.get("approval_required", False))),
                    default_priority=_int(spec.get("default_priority", spec.get("priority", 0)), where + ".priority"),
                    preemptible=bool(spec.get("preemptible", False)),
                    max_devices=None if spec.get("max_devices") is None else _int(spec["max_devices"], where),
                    sharing=_sharing(spec.get("sharing", "Exclusive"), where + ".sharing"),
                )
            )
        return tuple(classes)

    def reservations(self, lookups) -> tuple[Reservation, ...]:
        reservations = []
        allowed = {"name", "queue", "team", "device_class", "count", "domain", "start", "end"}
        for index, spec in enumerate(_list(self.data.get("reservations") or [], "reservations")):
            where = f"reservations[{index}]"
            spec = _mapping(spec, where)
            _keys(where, spec, allowed)
            queue = _optional_str(spec.get("queue"))
            if queue is not None and queue not in lookups["queues"]:
                raise ScenarioError(f"{where}.queue: unknown queue '{queue}'")
            team = _optional_str(spec.get("team")) or (lookups["queues"][queue].team if queue else None)
            if team is None:
                raise ScenarioError(f"{where}: needs a queue or a team")
            device_class = _required_str(spec, "device_class", where)
            if device_class not in lookups["classes"]:
                raise ScenarioError(f"{where}.device_class: unknown device class '{device_class}'")
            domain = spec.get("domain")
            reservations.append(
                Reservation(
                    name=str(spec.get("name", f"reservation-{index}")),
                    team=team,
                    queue=queue,
                    device_class=device_class,
                    count=_int(spec.get("count", 0), where + ".count"),
                    domain=None if domain is None else {k: str(v) for k, v in _mapping(domain, where).items()},
                    start=_number(spec.get("start", float("-inf")), where + ".start"),
                    end=_number(spec.get("end", float("inf")), where + ".end"),
                )
            )
        return tuple(reservations)

    def running(self, lookups, matcher: ClassMatcher, now) -> tuple[RunningWorkload, ...]:
        running = []
        used: set[str] = set()
        allowed = {
            "name", "queue", "priority", "disruption", "device_class", "pods", "started", "expected_end",
            "duration", "evicting", "evicted_for", "preemptible", "min_count", "evicting_pods", "group_claims",
        }  # fmt: skip
        for index, spec in enumerate(_list(self.data.get("running") or [], "running")):
            where = f"running[{index}]"
            spec = _mapping(spec, where)
            _keys(where, spec, allowed)
            name = _required_str(spec, "name", where)
            queue = _required_str(spec, "queue", where)
            if queue not in lookups["queues"]:
                raise ScenarioError(f"{where}.queue: unknown queue '{queue}'")
            pods = self.running_pods(spec.get("pods") or [], where + ".pods", lookups, used)
            pods += self.running_group_devices(spec.get("group_claims") or {}, where + ".group_claims", lookups, used)
            device_class = _optional_str(spec.get("device_class"))
            if device_class is None:
                device_class = _inferred_class(pods, lookups, matcher, where)
            elif device_class not in lookups["classes"]:
                raise ScenarioError(f"{where}.device_class: unknown device class '{device_class}'")
            disruption = str(spec.get("disruption", "PodGroup"))
            if disruption not in DISRUPTION_MODES:
                raise ScenarioError(f"{where}.disruption: must be Pod or PodGroup")
            started = _number(spec.get("started", 0.0), where + ".started")
            expected_end = spec.get("expected_end")
            if expected_end is None and spec.get("duration") is not None:
                expected_end = started + _number(spec["duration"], where + ".duration")
            workload = RunningWorkload(
                id=name,
                queue=queue,
                pods=pods,
                device_class=device_class,
                priority=_int(spec.get("priority", 0), where + ".priority"),
                disruption=disruption,
                preemptible=bool(spec.get("preemptible", True)),
                started=started,
                expected_end=None if expected_end is None else _number(expected_end, where + ".expected_end"),
                evicting=bool(spec.get("evicting", False)),
                evicted_for=_optional_str(spec.get("evicted_for")),
                min_counts=_running_min_counts(spec.get("min_count"), pods, where + ".min_count"),
            )
            leaving = _evicting_pods(spec, pods, where)
            if leaving:
                running.extend(split_leaving(replace(workload, evicted_for=None), leaving, workload.evicted_for))
            else:
                running.append(workload)
        return tuple(running)

    def running_pods(self, raw, where, lookups, used: set[str]) -> tuple[RunningPod, ...]:
        pods = []
        for index, spec in enumerate(_list(raw, where)):
            here = f"{where}[{index}]"
            spec = _mapping(spec, here)
            _keys(here, spec, {"node", "devices", "pod_set", "consumed"})
            node = _required_str(spec, "node", here)
            if node not in lookups["nodes"]:
                raise ScenarioError(f"{here}.node: unknown node '{node}'")
            on_node = sorted(
                (
                    device_id
                    for device_id, device in lookups["devices"].items()
                    if device.node == node and device_id.rsplit("/", 1)[1].isdigit()
                ),
                key=lambda device_id: int(device_id.rsplit("/", 1)[1]),
            )
            devices = spec.get("devices", 1)
            if isinstance(devices, list):
                ids = [f"{node}/{i}" if isinstance(i, str) else f"{node}/{_int(i, here + '.devices')}" for i in devices]
                unknown = [device_id for device_id in ids if device_id not in lookups["devices"]]
                if unknown:
                    raise ScenarioError(f"{here}.devices: no device {unknown[0]}")
            else:
                count = _int(devices, here + ".devices")
                ids = [device_id for device_id in on_node if device_id not in used][:count]
                if len(ids) < count:
                    raise ScenarioError(f"{here}.devices: node {node} has only {len(ids)} devices left, not {count}")
            consumed = tuple(sorted(_amounts(spec.get("consumed"), here + ".consumed").items()))
            if consumed:
                unshared = [d for d in ids if not lookups["devices"][d].allow_multiple_allocations]
                if unshared:
                    raise ScenarioError(f"{here}.consumed: {unshared[0]} is not a shared device")
                shared_use = lookups["shared_use"]
                for device_id in ids:
                    if device_id in used:
                        raise ScenarioError(f"{here}.devices: {device_id} is already held by another running pod")
                    left = shared_use.setdefault(device_id, dict(lookups["devices"][device_id].capacity))
                    for name, amount in consumed:
                        left[name] = left.get(name, 0) - amount
                        if left[name] < 0:
                            raise ScenarioError(f"{here}.consumed: {device_id} has not {amount:g} {name} left")
                pods.append(RunningPod(str(spec.get("pod_set", "main")), index, node, tuple(ids), consumed))
                continue
            taken = [device_id for device_id in ids if device_id in used or device_id in lookups["shared_use"]]
            if taken:
                raise ScenarioError(f"{here}.devices: {taken[0]} is already held by another running pod")
            used.update(ids)
            pods.append(RunningPod(str(spec.get("pod_set", "main")), index, node, tuple(ids)))
        return tuple(pods)

    def running_group_devices(self, raw, where, lookups, used: set[str]) -> tuple[RunningPod, ...]:
        """A running gang's group-claim devices as the pseudo-pods RunningWorkload holds them by: one
        per claim and node, pod set GROUP_POD_SET + the claim's name."""
        pods = []
        for name, ids in _mapping(raw, where).items():
            here = f"{where}.{name}"
            ids = [str(device_id) for device_id in _list(ids, here)]
            by_node: dict[str, list[str]] = {}
            for device_id in ids:
                device = lookups["devices"].get(device_id)
                if device is None:
                    raise ScenarioError(f"{here}: no device {device_id}")
                if device_id in used:
                    raise ScenarioError(f"{here}: {device_id} is already held by another running pod")
                used.add(device_id)
                by_node.setdefault(device.node, []).append(device_id)
            for index, node in enumerate(sorted(by_node, key=_natural)):
                pods.append(RunningPod(GROUP_POD_SET + str(name), index, node, tuple(by_node[node])))
        return tuple(pods)

    def group_claims(self, raw, where, lookups) -> tuple[GroupClaim, ...]:
        claims = []
        for index, spec in enumerate(_list(raw, where)):
            here = f"{where}[{index}]"
            spec = _mapping(spec, here)
            _keys(here, spec, {"name", "requests", "constraints"})
            name = _required_str(spec, "name", here)
            if spec.get("requests") is None:
                raise ScenarioError(f"{here}.requests: a group claim needs requests")
            claim = self.claim(spec, here, lookups)
            claims.append(GroupClaim(name, claim["requests"], claim["constraints"]))
        problem = group_problem(tuple(claims), lookups["classes"])
        if problem:
            raise ScenarioError(f"{where}: {problem}")
        return tuple(claims)

    def pending(self, lookups) -> tuple[PendingWorkload, ...]:
        pending = []
        names = set()
        allowed = {
            "name", "queue", "team", "resource_class", "device_class", "device_classes", "topology", "pods",
            "min_count", "devices_per_pod", "match_attribute", "priority", "disruption", "submitted",
            "approved", "duration", "preemptible", "tolerations", "pod_sets", "nominated", "requests", "constraints",
            "capacity", "group_claims", "preemption_policy",
        }  # fmt: skip
        for index, spec in enumerate(_list(self.data.get("pending") or [], "pending")):
            where = f"pending[{index}]"
            spec = _mapping(spec, where)
            _keys(where, spec, allowed)
            name = _required_str(spec, "name", where)
            if name in names:
                raise ScenarioError(f"{where}.name: duplicate workload '{name}'")
            names.add(name)
            queue = _required_str(spec, "queue", where)
            if queue not in lookups["queues"]:
                raise ScenarioError(f"{where}.queue: unknown queue '{queue}'")
            resource_class = _optional_str(spec.get("resource_class"))
            if resource_class is not None and resource_class not in lookups["resource_classes"]:
                raise ScenarioError(f"{where}.resource_class: unknown resource class '{resource_class}'")
            default_priority = lookups["resource_classes"][resource_class].default_priority if resource_class else 0
            required, preferred = _topology(spec.get("topology"), where + ".topology")
            disruption = str(spec.get("disruption", "PodGroup"))
            if disruption not in DISRUPTION_MODES:
                raise ScenarioError(f"{where}.disruption: must be Pod or PodGroup")
            preemption_policy = str(spec.get("preemption_policy", PREEMPT_LOWER_PRIORITY))
            if preemption_policy not in PREEMPTION_POLICIES:
                raise ScenarioError(f"{where}.preemption_policy: must be PreemptLowerPriority or Never")
            approved = spec.get("approved")
            pending.append(
                PendingWorkload(
                    id=name,
                    queue=queue,
                    pod_sets=self.pod_sets(spec, where, lookups),
                    resource_class=resource_class,
                    team=_optional_str(spec.get("team")),
                    topology_required=required,
                    topology_preferred=preferred,
                    priority=_int(spec.get("priority", default_priority), where + ".priority"),
                    disruption=disruption,
                    submitted=_number(spec.get("submitted", 0.0), where + ".submitted"),
                    approved=None if approved is None else bool(approved),
                    expected_duration=None
                    if spec.get("duration") is None
                    else _number(spec["duration"], where + ".duration"),
                    preemptible=None if spec.get("preemptible") is None else bool(spec["preemptible"]),
                    nominated_devices=self.nominated(spec.get("nominated") or [], where + ".nominated", lookups),
                    group_claims=self.group_claims(spec.get("group_claims") or [], where + ".group_claims", lookups),
                    preemption_policy=preemption_policy,
                )
            )
        return tuple(pending)

    def nominated(self, raw, where, lookups) -> tuple[str, ...]:
        ids = tuple(str(device_id) for device_id in _list(raw, where))
        unknown = [device_id for device_id in ids if device_id not in lookups["devices"]]
        if unknown:
            raise ScenarioError(f"{where}: no device {unknown[0]}")
        return ids

    def pod_sets(self, spec, where, lookups) -> tuple[PodSet, ...]:
        if spec.get("pod_sets") is None:
            return (self.pod_set(spec, where, lookups, "main"),)
        pod_sets = []
        for index, raw in enumerate(_list(spec["pod_sets"], where + ".pod_sets")):
            here = f"{where}.pod_sets[{index}]"
            raw = _mapping(raw, here)
            _keys(
                here,
                raw,
                {"name", "pods", "min_count", "devices_per_pod", "device_class", "device_classes",
                 "match_attribute", "tolerations", "requests", "constraints", "capacity"},
            )  # fmt: skip
            merged = {
                key: spec[key] for key in ("device_class", "device_classes", "tolerations", "capacity") if key in spec
            }
            merged.update(raw)
            pod_sets.append(self.pod_set(merged, here, lookups, str(raw.get("name", f"set{index}"))))
        return tuple(pod_sets)

    def pod_set(self, spec, where, lookups, name) -> PodSet:
        pods = _int(spec.get("pods", 1), where + ".pods")
        min_count = spec.get("min_count")
        classes = spec.get("device_classes", spec.get("device_class"))
        return PodSet(
            name=name,
            count=pods,
            min_count=None if min_count is None else _int(min_count, where + ".min_count"),
            devices_per_pod=_int(spec.get("devices_per_pod", 1), where + ".devices_per_pod"),
            device_classes=tuple(_class_list(classes, where + ".device_class", lookups["classes"]))
            if classes is not None
            else (),
            match_attribute=_optional_str(spec.get("match_attribute")),
            tolerations=self.tolerations(spec.get("tolerations") or [], where + ".tolerations"),
            capacity=tuple(sorted(_amounts(spec.get("capacity"), where + ".capacity").items())),
            **self.claim(spec, where, lookups),
        )

    def claim(self, spec, where, lookups) -> dict:
        """A pod's several-request claim (DRA DeviceClaim): `requests` and `constraints` of PodSet."""
        if spec.get("requests") is None:
            if spec.get("constraints") is not None:
                raise ScenarioError(f"{where}.constraints: constraints need requests")
            return {}
        for key in ("devices_per_pod", "device_class", "device_classes", "match_attribute"):
            if key in spec:
                raise ScenarioError(f"{where}.{key}: a pod set with requests says its devices in them")
        requests = []
        for index, raw in enumerate(_list(spec["requests"], where + ".requests")):
            here = f"{where}.requests[{index}]"
            raw = _mapping(raw, here)
            _keys(here, raw, {"name", "device_class", "count", "selectors", "first_available", "allocation_mode"})
            name = _required_str(raw, "name", here)
            if raw.get("first_available") is not None:
                if any(key in raw for key in ("device_class", "count", "selectors", "allocation_mode")):
                    raise ScenarioError(f"{here}: give device_class and count, or first_available, not both")
                ways = []
                for position, way in enumerate(_list(raw["first_available"], here + ".first_available")):
                    there = f"{here}.first_available[{position}]"
                    way = _mapping(way, there)
                    _keys(there, way, {"name", "device_class", "count", "selectors", "allocation_mode"})
                    ways.append(self.way(way, there, lookups, _required_str(way, "name", there)))
                requests.append(DeviceRequest(name, first_available=tuple(ways)))
            else:
                requests.append(DeviceRequest(name, exactly=self.way(raw, here, lookups, name)))
        constraints = []
        for index, raw in enumerate(_list(spec.get("constraints") or [], where + ".constraints")):
            here = f"{where}.constraints[{index}]"
            raw = _mapping(raw, here)
            _keys(here, raw, {"match_attribute", "distinct_attribute", "requests"})
            names = tuple(str(name) for name in _list(raw.get("requests") or [], here + ".requests"))
            if ("match_attribute" in raw) == ("distinct_attribute" in raw):
                raise ScenarioError(f"{here}: give match_attribute or distinct_attribute, not both or neither")
            if "match_attribute" in raw:
                constraints.append(DeviceConstraint(_required_str(raw, "match_attribute", here), names))
            else:
                distinct = _required_str(raw, "distinct_attribute", here)
                constraints.append(DeviceConstraint(None, names, distinct_attribute=distinct))
        problem = claim_problem(Claim(tuple(requests), tuple(constraints)), lookups["classes"])
        if problem:
            raise ScenarioError(f"{where}: {problem}")
        return {"requests": tuple(requests), "constraints": tuple(constraints)}

    def way(self, raw, where, lookups, name) -> DeviceSubRequest:
        device_class = _required_str(raw, "device_class", where)
        if device_class not in lookups["classes"]:
            raise ScenarioError(f"{where}.device_class: unknown device class '{device_class}'")
        selectors = tuple(str(text) for text in _list(raw.get("selectors") or [], where + ".selectors"))
        for text in selectors:
            problem = validate_selector(text)
            if problem:
                raise ScenarioError(f"{where}.selectors: {problem}")
        if not lookups["selects"](device_class):
            raise ScenarioError(f"{where}.device_class: device class '{device_class}' selects no device of the cluster")
        mode = raw.get("allocation_mode", "ExactCount")
        if mode not in ALLOCATION_MODES:
            raise ScenarioError(f"{where}.allocation_mode: ExactCount or All, not {mode!r}")
        if mode == ALL_DEVICES and "count" in raw:
            raise ScenarioError(f"{where}.count: allocation_mode All takes every matching device; give no count")
        return DeviceSubRequest(name, device_class, _int(raw.get("count", 1), where + ".count"), selectors, mode)

    def tolerations(self, raw, where) -> tuple[Toleration, ...]:
        tolerations = []
        for index, spec in enumerate(_list(raw, where)):
            here = f"{where}[{index}]"
            spec = _mapping(spec, here)
            _keys(here, spec, {"key", "value", "effect"})
            tolerations.append(
                Toleration(
                    _required_str(spec, "key", here),
                    _optional_str(spec.get("value")),
                    _optional_str(spec.get("effect")),
                )
            )
        return tuple(tolerations)


# --- small readers that say where things went wrong ---


def _check_counters(running, lookups) -> None:
    """Running work may not hold more of a counter than its set publishes (one error, naming the first
    workload that goes over)."""
    left = {key: dict(counter_set.counters) for key, counter_set in lookups["counter_sets"].items()}
    devices = lookups["devices"]
    for workload in running:
        for pod in workload.pods:
            for device_id in pod.device_ids:
                device = devices[device_id]
                for set_name, counters in device.consumes_counters.items():
                    for counter, amount in counters.items():
                        counts = left.get((device.node, set_name), {})
                        if counts.get(counter, 0) < amount:
                            raise ScenarioError(
                                f"running '{workload.id}': {device_id} would exceed counter '{counter}' of "
                                f"counter set {set_name} on {device.node}"
                            )
                        counts[counter] -= amount


def _keys(where: str, spec: dict, allowed: set) -> None:
    for key in spec:
        if key not in allowed:
            prefix = f"{where}: " if where else ""
            raise ScenarioError(f"{prefix}unknown key '{key}' (allowed: {', '.join(sorted(allowed))})")


def _running_min_counts(raw, pods, where) -> tuple[tuple[str, int], ...]:
    """`min_count` of a running workload: one number for every pod set, or {pod set: number}."""
    if raw is None:
        return ()
    sizes: dict[str, int] = {}
    for pod in pods:
        sizes[pod.pod_set] = sizes.get(pod.pod_set, 0) + 1
    wanted = {name: raw for name in sizes} if not isinstance(raw, dict) else _mapping(raw, where)
    counts = []
    for name, value in sorted(wanted.items()):
        if name not in sizes:
            raise ScenarioError(f"{where}: no running pod in pod set '{name}'")
        count = _int(value, f"{where}.{name}" if isinstance(raw, dict) else where)
        if not 1 <= count <= sizes[name]:
            raise ScenarioError(f"{where}: must be between 1 and the {sizes[name]} pods of pod set '{name}'")
        counts.append((str(name), count))
    return tuple(counts)


def _evicting_pods(spec, pods, where) -> set[tuple[str, int]]:
    """`evicting_pods`: positions in `pods` of the pods being evicted from a running workload that is
    being shrunk (the rest of it runs on)."""
    raw = spec.get("evicting_pods")
    if raw is None:
        return set()
    here = where + ".evicting_pods"
    if spec.get("evicting"):
        raise ScenarioError(f"{here}: a workload evicted whole (evicting: true) has no separate evicting pods")
    leaving = set()
    for value in _list(raw, here):
        position = _int(value, here)
        if not 0 <= position < len(pods):
            raise ScenarioError(f"{here}: no pod {position} (it has {len(pods)})")
        leaving.add((pods[position].pod_set, pods[position].index))
    return leaving


def _mapping(value, where) -> dict:
    if not isinstance(value, dict):
        raise ScenarioError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _list(value, where, item_type=None) -> list:
    if not isinstance(value, list):
        raise ScenarioError(f"{where}: expected a list, got {type(value).__name__}")
    if item_type is not None:
        for index, item in enumerate(value):
            if item_type is int:
                _int(item, f"{where}[{index}]")
            elif not isinstance(item, item_type):
                raise ScenarioError(f"{where}[{index}]: expected {item_type.__name__}, got {type(item).__name__}")
    return value


def _int(value, where) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScenarioError(f"{where}: expected a whole number, got {value!r}")
    return value


def _number(value, where) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ScenarioError(f"{where}: expected a number, got {value!r}")
    return float(value)


def _required_str(spec, key, where) -> str:
    if spec.get(key) is None:
        raise ScenarioError(f"{where}: missing '{key}'")
    return str(spec[key])


def _optional_str(value) -> str | None:
    return None if value is None else str(value)


def _counts(value, where) -> dict:
    counts = _mapping(value, where)
    return {str(name): _int(count, f"{where}.{name}") for name, count in counts.items()}


def _amounts(value, where) -> dict:
    """Capacity amounts (name -> positive number)."""
    amounts = {str(name): _number(amount, f"{where}.{name}") for name, amount in _mapping(value or {}, where).items()}
    for name, amount in amounts.items():
        if amount <= 0:
            raise ScenarioError(f"{where}.{name}: must be positive")
    return amounts


def _sharing(value, where) -> str:
    if value not in SHARING_MODES:
        raise ScenarioError(f"{where}: must be one of {', '.join(SHARING_MODES)}")
    return str(value)


def _optional_counts(value, where) -> dict | None:
    return None if value is None else _counts(value, where)


def _class_list(value, where, class_names) -> list[str]:
    if value is None:
        return []
    names = [value] if isinstance(value, str) else _list(value, where, str)
    for name in names:
        if name not in class_names:
            raise ScenarioError(f"{where}: unknown device class '{name}'")
    return [str(name) for name in names]


def _topology(value, where) -> tuple[str | None, str | None]:
    if value is None:
        return None, None
    spec = _mapping(value, where)
    _keys(where, spec, {"required", "preferred"})
    return _optional_str(spec.get("required")), _optional_str(spec.get("preferred"))


def _inferred_class(pods, lookups, matcher: ClassMatcher, where) -> str:
    for pod in pods:
        for device_id in pod.device_ids:
            names = sorted(matcher.classes_of(lookups["devices"][device_id]))
            if names:
                return names[0]
    raise ScenarioError(f"{where}: no device_class given and its devices match none")


# --- result -> JSON ---


def result_to_json(snapshot: Snapshot, result: CycleResult) -> dict:
    """The exact `whatif --json` shape: {"workloads": [...], "preempted": [...], "evicted": [...]};
    `evicted` holds {"name", "reason", "message"} of running work stopped for any cause but preemption."""
    admissions = {admission.workload_id: admission for admission in result.admissions}
    decisions = {decision.workload_id: decision for decision in result.pending}
    workloads = []
    for workload in snapshot.pending:
        if workload.id in admissions:
            workloads.append(_admitted_json(workload, admissions[workload.id]))
        elif workload.id in decisions:
            workloads.append(_pending_json(decisions[workload.id]))
    preempted = sorted({preemption.victim_id for preemption in result.preemptions})
    by_victim = {}
    for preemption in result.preemptions:
        by_victim.setdefault(preemption.victim_id, preemption)
    for victim_id in preempted:
        workloads.append(_preempted_json(by_victim[victim_id]))
    evicted = [
        {"name": eviction.workload_id, "reason": eviction.reason, "message": eviction.message}
        for eviction in sorted(result.evictions, key=lambda eviction: eviction.workload_id)
    ]
    return {"workloads": workloads, "preempted": preempted, "evicted": evicted}


def result_table(snapshot: Snapshot, result: CycleResult) -> str:
    """A plain-text table of the decisions, for people."""
    rows = [("WORKLOAD", "STATUS", "REASON", "WHERE / WHY")]
    for workload in result_to_json(snapshot, result)["workloads"]:
        if workload["status"] == "admitted":
            nodes = sorted({pod["node"] for pod in workload["placement"]}, key=_natural)
            where = ", ".join(f"{level} {name}" for level, name in workload["domain"].items())
            detail = f"{where + ': ' if where else ''}{', '.join(nodes)} ({workload['details']['device_class']})"
        else:
            detail = workload["message"]
            if workload["suggestions"]:
                detail += " | try: " + "; ".join(s["description"] for s in workload["suggestions"])
        rows.append((workload["name"], workload["status"], workload["reason"] or "-", detail))
    for eviction in result.evictions:
        rows.append((eviction.workload_id, "evicted", eviction.reason, eviction.message))
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True)) + "  " + row[3]
             for row in rows]  # fmt: skip
    return "\n".join(line.rstrip() for line in lines)


def _natural(text: str) -> tuple:
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))


def _admitted_json(workload: PendingWorkload, admission) -> dict:
    order = {pod_set.name: position for position, pod_set in enumerate(workload.pod_sets)}
    pods = sorted(admission.pods, key=lambda pod: (order.get(pod.pod_set, len(order)), pod.index))
    placement = [
        {"pod": index, "pod_set": pod.pod_set, "node": pod.node, "devices": list(pod.device_ids)}
        for index, pod in enumerate(pods)
    ]
    for entry, pod in zip(placement, pods, strict=True):
        if pod.requests:  # a several-request claim: which devices serve which request
            entry["requests"] = {label: list(device_ids) for label, device_ids in pod.requests}
        if pod.consumed:  # a time-sliced pod: what it takes of each of its devices
            entry["consumed"] = dict(pod.consumed)
    where = ", ".join(f"{level} {name}" for level, name in admission.domain.items()) or "the cluster"
    devices = sum(len(pod.device_ids) for pod in pods)
    group = admission.group_requests
    devices += sum(len(device_ids) for _, device_ids in group)
    # A several-request claim's devices are of several classes: `requests` in placement says which.
    what = "devices" if any(pod.requests for pod in pods) or group else admission.device_class
    return {
        "name": workload.id,
        "status": "admitted",
        "reason": None,
        "message": f"admitted: {len(pods)} pods, {devices} {what} in {where}",
        "placement": placement,
        "domain": dict(admission.domain),
        "secondary": [],
        "details": {"device_class": admission.device_class, "devices": devices},
        "position": None,
        "estimated_start": None,
        "suggestions": [],
        "group_requests": {label: list(device_ids) for label, device_ids in group},
    }


def _pending_json(decision) -> dict:
    return {
        "name": decision.workload_id,
        "status": "pending",
        "reason": decision.reason,
        "message": decision.message,
        "placement": [],
        "domain": {},
        "secondary": list(decision.secondary),
        "details": _plain(decision.details),
        "position": {"queue": decision.position_in_queue, "cluster": decision.position_in_cluster},
        "estimated_start": decision.estimated_start,
        "suggestions": [
            {"kind": s.kind, "description": s.description, "change": _plain(s.change)} for s in decision.suggestions
        ],
        "group_requests": {},
    }


def _preempted_json(preemption) -> dict:
    details = {"rule": preemption.rule, "preemptor": preemption.preemptor_id}
    if preemption.pods:  # shrunk: these pods leave, the rest of it runs on
        details["pods"] = [{"pod_set": pod_set, "index": index} for pod_set, index in preemption.pods]
    return {
        "name": preemption.victim_id,
        "status": "preempted",
        "reason": None,
        "message": preemption.message,
        "placement": [],
        "domain": {},
        "secondary": [],
        "details": details,
        "position": None,
        "estimated_start": None,
        "suggestions": [],
        "group_requests": {},
    }


def _plain(value):
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value) if isinstance(value, set | frozenset) else value
        return [_plain(item) for item in items]
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return None
    return value
