"""The one place that writes the broker's inventory from what a Kubernetes cluster publishes.

Every function takes plain JSON objects as the API server serves them (a watch event's `raw_object`, a
list's items) in batches, so the initial list of 10,000 nodes is a few bulk statements, not 10,000 saves:

- Nodes: labels -> a domain on each configured topology level (settings.KUBE_TOPOLOGY_LABELS, coarse to
  fine, `level=label key`); `spec.unschedulable` -> cordoned; the Ready condition -> the health of the
  node's devices (False: Unhealthy, Unknown or missing: Unknown).
- ResourceSlices (resource.k8s.io/v1), one node's devices of one pool: each device becomes an inventory
  device with the slice's driver and pool, its attributes (the driver's own domain unqualified, so the
  broker's CEL selectors read `device.attributes["<driver>"].<name>`), its capacities as numbers
  (quantities parsed: 80Gi is 85899345920) and its taints. A slice of devices several nodes share
  (allNodes, a nodeSelector on one topology label's value) is kept on one node of that domain, its
  devices reaching the domain (attribute `reach`, see shared_home).
- DeviceTaintRules: their taint added to every device their selector (driver, pool, device) matches.
- DeviceClasses: their CEL selectors, joined with &&, become the broker's device class of that name.
- ResourceClaims another scheduler allocated (kube-scheduler, another DRA scheduler): each device of
  their `status.allocation` carries a HELD_OUTSIDE_TAINT naming the claim, until the claim lets it go. No
  toleration lifts it, what it consumes of its counter set is taken from the set (broker.cycle.loader),
  finance bills it to nobody and the dashboard counts it busy, held outside the broker.

What the cluster says wins: a device or node that vanished is deleted, unless a workload holds (or held) it:
then it is tainted NoExecute and marked Unhealthy, so the cycle evicts what holds it; its row stays for
the cost history its allocations refer to (they protect it).
Every change here bumps the cluster generation (a cycle on the old inventory refuses to commit) and asks
for a cycle when its transaction commits.
"""

from decimal import Decimal

from django.conf import settings
from django.db import transaction
from kubernetes.utils.quantity import parse_quantity

from broker.audit.models import record
from broker.events import request_cycle_after_commit
from broker.inventory.models import ClusterState, Device, Domain, Health, Node, TopologyLevel
from broker.kube.models import Cluster, MirroredClaim, MirroredDeviceClass, MirroredNode, MirroredSlice, TaintRule
from broker.policy.models import DeviceClass
from broker.scheduler.snapshot import HELD_OUTSIDE_TAINT, REACH_ATTRIBUTE, REACH_CLUSTER
from broker.workloads.models import Allocation

GONE_TAINT = "broker.capacity.io/gone"
EFFECTS = ("NoSchedule", "NoExecute")


class InvalidConfiguration(ValueError):
    pass


def topology_labels(text=None):
    """[(level, node label key)] from KUBE_TOPOLOGY_LABELS, coarse to fine."""
    pairs = []
    for term in filter(None, (part.strip() for part in (text or settings.KUBE_TOPOLOGY_LABELS).split(","))):
        level, sep, key = term.partition("=")
        if not sep or not level.strip() or not key.strip():
            raise InvalidConfiguration(f"KUBE_TOPOLOGY_LABELS: {term!r} is not level=label-key")
        pairs.append((level.strip(), key.strip()))
    return pairs


def level_for_label(key):
    """The broker's topology level a node label key stands for (`kubernetes.io/hostname`: the node)."""
    if key == "kubernetes.io/hostname":
        return "node"
    return next((level for level, label in topology_labels() if label == key), None)


def ensure_levels():
    """{level name: TopologyLevel}, creating the configured levels missing, after those that exist."""
    levels = {level.name: level for level in TopologyLevel.objects.all()}
    order = max((level.order for level in levels.values()), default=-1)
    for name, _ in topology_labels():
        if name not in levels:
            order += 1
            levels[name] = TopologyLevel.objects.create(name=name, order=order)
    return levels


class Domains:
    """Finds or creates the domain chain of a node's labels, one query per new domain at most."""

    def __init__(self):
        self.levels = ensure_levels()
        self.known = {(domain.level_id, domain.name): domain for domain in Domain.objects.all()}

    def finest(self, labels):
        parent = None
        for level_name, key in topology_labels():
            value = labels.get(key)
            if not value:
                continue
            level = self.levels[level_name]
            domain = self.known.get((level.pk, value))
            if domain is None:
                domain = Domain.objects.create(level=level, name=value, parent=parent)
                self.known[(level.pk, value)] = domain
            parent = domain
        return parent


def ready_condition(node):
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return condition.get("status") or "Unknown"
    return "Unknown"


def health_of(ready):
    return {"True": Health.HEALTHY, "False": Health.UNHEALTHY}.get(ready, Health.UNKNOWN)


def cluster_named(name=None):
    return Cluster.objects.get_or_create(name=name or settings.KUBE_CLUSTER_NAME)[0]


def changed(reason):
    ClusterState.bump(settings.CLUSTER_NAME)
    request_cycle_after_commit(reason)


# --- nodes ---------------------------------------------------------------------------------------------


def nodes_changed(cluster, objs):
    """Create or update the inventory nodes of Kubernetes Nodes; returns how many rows changed."""
    if not objs:
        return 0
    domains = Domains()
    names = [obj["metadata"]["name"] for obj in objs]
    wanted, mirrors, health = {}, [], {}
    for obj in objs:
        meta, spec = obj["metadata"], obj.get("spec") or {}
        labels = meta.get("labels") or {}
        domain = domains.finest(labels)
        wanted[meta["name"]] = {
            "labels": labels,
            "cordoned": bool(spec.get("unschedulable")),
            "domain_id": domain.pk if domain else None,
        }
        ready = ready_condition(obj)
        health[meta["name"]] = health_of(ready)
        mirrors.append((meta["name"], meta.get("uid", ""), ready, (obj.get("status") or {}).get("conditions") or []))
    # New nodes are inserted whole; an update of thousands of rows at once is a CASE of thousands of
    # branches that each row walks, which took most of the initial sync at 10,000 nodes.
    # ignore_conflicts: a node a slice named before its Node arrived exists already (then updated below).
    known = set(Node.objects.filter(name__in=names).values_list("name", flat=True))
    new = [name for name in names if name not in known]
    Node.objects.bulk_create([Node(name=name, **wanted[name]) for name in new], ignore_conflicts=True, batch_size=2000)
    updated = []
    for node in Node.objects.filter(name__in=names):
        fields = wanted[node.name]
        if any(getattr(node, key) != value for key, value in fields.items()):
            for key, value in fields.items():
                setattr(node, key, value)
            updated.append(node)
    Node.objects.bulk_update(updated, ["labels", "cordoned", "domain", "updated"], batch_size=500)
    by_name = {node.name: node for node in Node.objects.filter(name__in=names)}
    MirroredNode.objects.bulk_create(
        [
            MirroredNode(node=by_name[name], cluster=cluster, uid=uid, ready=ready, conditions=conditions)
            for name, uid, ready, conditions in mirrors
        ],
        update_conflicts=True,
        unique_fields=["node"],
        update_fields=["cluster", "uid", "ready", "conditions", "gone"],
    )
    flipped = 0
    for state in (Health.HEALTHY, Health.UNHEALTHY, Health.UNKNOWN):
        chosen = [by_name[name].pk for name, value in health.items() if value == state]
        if chosen:
            flipped += Device.objects.filter(node_id__in=chosen).exclude(health=state).update(health=state)
    count = len(set(new) - {node.name for node in updated}) + len(updated) + flipped
    if count:
        changed(f"{count} inventory rows changed in cluster {cluster.name}")
    return count


def node_deleted(cluster, obj):
    """A Node deleted in the cluster: gone from the inventory, or, while its devices are held, cordoned
    with its devices tainted NoExecute so the cycle evicts what holds them (audited as an intervention)."""
    node = Node.objects.filter(name=obj["metadata"]["name"], kube__cluster=cluster).first()
    if node is None:
        return 0
    devices = list(node.devices.all())
    held = referenced_devices([device.pk for device in devices])
    record(
        "node.vanished",
        node,
        before={"cordoned": node.cordoned, "devices": len(devices)},
        after={"deleted": not held, "held": len(held)},
        reason=f"Node {node.name} was deleted in cluster {cluster.name}",
        manual_intervention=True,
    )
    if held:
        node.cordoned = True
        node.save(update_fields=["cordoned", "updated"])
        MirroredNode.objects.filter(node=node).update(gone=True)
        vanish(devices)
    else:
        node.delete()
    changed(f"node {node.name} vanished from cluster {cluster.name}")
    return 1


def referenced_devices(device_pks):
    """Those of `device_pks` that any allocation, active or past, refers to."""
    return set(Allocation.objects.filter(device_id__in=device_pks).values_list("device_id", flat=True))


def vanish(devices):
    taint = {"key": GONE_TAINT, "value": "deleted in the cluster", "effect": "NoExecute"}
    for device in devices:
        if taint not in device.taints:
            device.taints = [*device.taints, taint]
        device.health = Health.UNHEALTHY
    Device.objects.bulk_update(devices, ["taints", "health"])


# --- resource slices -----------------------------------------------------------------------------------


def attribute_value(attribute):
    for key in ("string", "int", "bool", "version"):
        if attribute.get(key) is not None:
            return attribute[key]
    for key in ("strings", "ints", "bools", "versions"):
        if attribute.get(key) is not None:
            return list(attribute[key])
    return None


def attributes_of(driver, device):
    """DRA attributes as the broker's flat {name: value}: the driver's own domain (or none) unqualified,
    another domain's keep it (`domain/name`)."""
    out = {}
    for name, attribute in (device.get("attributes") or {}).items():
        domain, slash, short = name.rpartition("/")
        key = short if not slash or domain == driver else name
        out[key] = attribute_value(attribute or {})
    return out


def quantity(text):
    value = parse_quantity(text)
    return int(value) if value == value.to_integral_value() else float(Decimal(value))


def counter_set_key(node_name, driver, pool, name):
    """The broker's name of a DRA counter set. DRA's names are unique only within their pool, the broker's
    on the node, where every driver publishes its own pools (a GPU driver and a NIC driver may both name a
    set `0`): so the driver qualifies it, and the pool too unless it is named after the node, as a
    node-local driver's pool is."""
    return f"{driver}/{name}" if pool == node_name else f"{driver}/{pool}/{name}"


def counter_sets_of(shared_counters, key):
    """DRA sharedCounters ([{name, counters: {counter: {value}}}]) as {key(set): {counter: value}}."""
    return {
        key(counter_set["name"]): {
            name: (counter or {}).get("value", "0") for name, counter in (counter_set.get("counters") or {}).items()
        }
        for counter_set in shared_counters
    }


def consumption_of(device, key):
    """DRA consumesCounters as the device's {key(counter set): {counter: amount}}, None when it consumes none."""
    consumed = device.get("consumesCounters") or []
    return {
        key(usage["counterSet"]): {
            name: (counter or {}).get("value", "0") for name, counter in (usage.get("counters") or {}).items()
        }
        for usage in consumed
    } or None


def refresh_counters(node_pks):
    """Set each node's shared counters to the sets its slices publish now: a set whose slice changed or
    went is gone with it (a device still consuming it then consumes a counter its node does not publish,
    which the cycle never allocates). None for a node whose slices publish none."""
    published = {pk: {} for pk in node_pks}
    slices = MirroredSlice.objects.filter(node_id__in=list(node_pks))
    for node_pk, node_name, driver, pool, shared in slices.values_list(
        "node_id", "node__name", "driver", "pool", "shared_counters"
    ):
        if shared:
            published[node_pk].update(
                counter_sets_of(shared, lambda name, n=node_name, d=driver, p=pool: counter_set_key(n, d, p, name))
            )
    changed = 0
    for pk, current in Node.objects.filter(pk__in=list(node_pks)).values_list("pk", "shared_counters"):
        wanted = published[pk] or None
        if current != wanted:
            changed += Node.objects.filter(pk=pk).update(shared_counters=wanted)
    return changed


def capacity_of(device):
    return {
        name: quantity((capacity or {}).get("value", "0")) for name, capacity in (device.get("capacity") or {}).items()
    }


def taints_of(device):
    return [
        {"key": taint["key"], "value": taint.get("value") or "", "effect": taint.get("effect") or "NoSchedule"}
        for taint in device.get("taints") or []
        if taint.get("effect", "NoSchedule") in EFFECTS
    ]


def rule_matches(rule, driver, pool, device_name):
    return (
        (not rule.driver or rule.driver == driver)
        and (not rule.pool or rule.pool == pool)
        and (not rule.device or rule.device == device_name)
    )


def rule_taint(rule):
    return {**rule.taint, "rule": rule.name}


def shared_home(spec, nodes, kept=None):
    """(node name, reach) of a slice of devices not bound to one node: the broker keeps them on one node
    of the domain they serve (`kept`, where they are, while it is in the domain, else the first by name)
    with the attribute `reach` naming the domain's level (docs/whatif.md, Reach). `allNodes`: the
    cluster. A nodeSelector of one term matching one topology label to one value (a rack's network
    storage): that rack. Another selector: (None, None), left out."""
    if spec.get("allNodes"):
        names = [name for name, _ in nodes]
        return (kept if kept in names else min(names, default=None)), REACH_CLUSTER
    terms = (spec.get("nodeSelector") or {}).get("nodeSelectorTerms") or []
    expressions = terms[0].get("matchExpressions") or [] if len(terms) == 1 and not terms[0].get("matchFields") else []
    if len(expressions) != 1:
        return None, None
    (expression,) = expressions
    level = level_for_label(expression.get("key", ""))
    values = expression.get("values") or []
    if level is None or expression.get("operator") != "In" or len(values) != 1:
        return None, None
    names = [name for name, labels in nodes if labels.get(expression["key"]) == values[0]]
    return (kept if kept in names else min(names, default=None)), level


def homes_of(cluster, objs):
    """{slice name: (node name, reach or None)} of the slices whose devices the broker keeps."""
    homes, nodes, kept = {}, None, {}
    for obj in objs:
        spec = obj.get("spec") or {}
        if spec.get("nodeName"):
            homes[obj["metadata"]["name"]] = (spec["nodeName"], None)
            continue
        if nodes is None:  # read once a batch, and only for the rare slices shared by several nodes
            nodes = list(Node.objects.filter(kube__cluster=cluster).values_list("name", "labels"))
            kept = dict(
                MirroredSlice.objects.filter(
                    cluster=cluster, name__in=[o["metadata"]["name"] for o in objs]
                ).values_list("name", "node__name")
            )
        home, reach = shared_home(spec, nodes, kept.get(obj["metadata"]["name"]))
        if home:
            homes[obj["metadata"]["name"]] = (home, reach)
    return homes


def slices_changed(cluster, objs):
    """Create or update the devices of ResourceSlices; devices a slice no longer lists go (or vanish, held).
    A slice of devices shared by the nodes of a domain (allNodes, a nodeSelector on one topology label's
    value) is kept on one node of the domain, its devices reaching the domain (shared_home); other
    selectors are left out: the broker's devices sit on nodes. Returns how many device rows changed."""
    rules = list(TaintRule.objects.filter(cluster=cluster))
    homes = homes_of(cluster, objs)
    node_names = {home for home, _ in homes.values()}
    nodes = {node.name: node for node in Node.objects.filter(name__in=node_names)}
    missing = [Node(name=name) for name in node_names if name not in nodes]
    if missing:
        # A node whose Node object has not arrived yet (the nodes' sync fills it in); ignore_conflicts:
        # that sync may be making it at this very moment.
        Node.objects.bulk_create(missing, ignore_conflicts=True)
        nodes = {node.name: node for node in Node.objects.filter(name__in=node_names)}
    ready = dict(MirroredNode.objects.filter(node__name__in=node_names).values_list("node__name", "ready"))
    slices = {
        mirrored.name: mirrored
        for mirrored in MirroredSlice.objects.filter(cluster=cluster, name__in=[o["metadata"]["name"] for o in objs])
    }
    # One read of every device these slices' nodes hold, one insert and one update for all of them.
    existing = {
        (device.node_id, device.driver, device.pool, device.name): device
        for device in Device.objects.filter(node__in=list(nodes.values()))
    }
    new, updated, dropped, mirrors = [], [], [], []
    for obj in objs:
        spec = obj.get("spec") or {}
        home, reach = homes.get(obj["metadata"]["name"], (None, None))
        node = nodes.get(home or "")
        if node is None:
            continue
        driver, pool = spec["driver"], (spec.get("pool") or {}).get("name", "")
        wanted = {device["name"]: device for device in spec.get("devices") or []}
        health = health_of(ready.get(node.name, "Unknown"))
        own_taints = {}

        def key(name, node_name=node.name, driver=driver, pool=pool):
            return counter_set_key(node_name, driver, pool, name)

        for name, device in wanted.items():
            taints = taints_of(device)
            own_taints[name] = taints
            row = existing.get((node.pk, driver, pool, name))
            held_outside = [taint for taint in (row.taints if row else []) if taint.get("key") == HELD_OUTSIDE_TAINT]
            attributes = attributes_of(driver, device)
            if reach:
                attributes.setdefault(REACH_ATTRIBUTE, reach)
            fields = {
                "attributes": attributes,
                "capacity": capacity_of(device),
                "consumes_counters": consumption_of(device, key),
                # A republished slice leaves the claims of other schedulers where they were.
                "taints": taints
                + [rule_taint(rule) for rule in rules if rule_matches(rule, driver, pool, name)]
                + held_outside,
                "health": health,
            }
            if row is None:
                new.append(Device(node=node, driver=driver, pool=pool, name=name, **fields))
            elif any(getattr(row, key) != value for key, value in fields.items()):
                for key, value in fields.items():
                    setattr(row, key, value)
                updated.append(row)
        previous = slices.get(obj["metadata"]["name"])
        dropped += [
            existing[(node.pk, driver, pool, name)]
            for name in (previous.devices if previous else [])
            if name not in wanted and (node.pk, driver, pool, name) in existing
        ]
        mirrors.append(
            MirroredSlice(
                cluster=cluster,
                name=obj["metadata"]["name"],
                driver=driver,
                pool=pool,
                node=node,
                devices=sorted(wanted),
                taints=own_taints,
                shared_counters=spec.get("sharedCounters") or [],
            )
        )
    if new:
        # A device published again after another scheduler allocated it (its slice went and came back).
        holders = outside_holders(cluster)
        for device in new:
            device.taints += [
                outside_taint(claim) for claim in holders.get((device.driver, device.pool, device.name), ())
            ]
    Device.objects.bulk_create(new, batch_size=2000)
    Device.objects.bulk_update(
        updated, ["attributes", "capacity", "consumes_counters", "taints", "health"], batch_size=1000
    )
    MirroredSlice.objects.bulk_create(
        mirrors,
        update_conflicts=True,
        unique_fields=["cluster", "name"],
        update_fields=["driver", "pool", "node", "devices", "taints", "shared_counters"],
    )
    count = len(new) + len(updated) + remove_devices(dropped) + refresh_counters({node.pk for node in nodes.values()})
    if count:
        changed(f"{count} devices changed in cluster {cluster.name}")
    return count


def remove_devices(devices):
    held = referenced_devices([device.pk for device in devices])
    vanish([device for device in devices if device.pk in held])
    Device.objects.filter(pk__in=[device.pk for device in devices if device.pk not in held]).delete()
    return len(devices)


def slice_deleted(cluster, obj):
    mirrored = MirroredSlice.objects.filter(cluster=cluster, name=obj["metadata"]["name"]).first()
    if mirrored is None:
        return 0
    devices = list(
        Device.objects.filter(node=mirrored.node, driver=mirrored.driver, pool=mirrored.pool, name__in=mirrored.devices)
    )
    mirrored.delete()
    count = remove_devices(devices) + refresh_counters({mirrored.node_id})
    if count:
        changed(f"{count} devices left cluster {cluster.name} with slice {obj['metadata']['name']}")
    return count


# --- device taint rules --------------------------------------------------------------------------------


def retaint(cluster, rule_names):
    """Recompute the rule taints of every device of the cluster's slices that a named rule touches."""
    rules = list(TaintRule.objects.filter(cluster=cluster))
    devices = Device.objects.filter(node__kube__cluster=cluster)
    updated = []
    for device in devices.iterator():
        if not any(taint.get("rule") in rule_names for taint in device.taints) and not any(
            rule.name in rule_names and rule_matches(rule, device.driver, device.pool, device.name) for rule in rules
        ):
            continue
        taints = [taint for taint in device.taints if not taint.get("rule")]
        taints += [rule_taint(rule) for rule in rules if rule_matches(rule, device.driver, device.pool, device.name)]
        if taints != device.taints:
            device.taints = taints
            updated.append(device)
    Device.objects.bulk_update(updated, ["taints"])
    if updated:
        changed(f"device taint rules {', '.join(sorted(rule_names))} changed {len(updated)} devices")
    return len(updated)


def taint_rules_changed(cluster, objs):
    names = set()
    for obj in objs:
        spec = obj.get("spec") or {}
        selector, taint = spec.get("deviceSelector") or {}, spec.get("taint") or {}
        if taint.get("effect") not in EFFECTS:
            continue  # `None` (a rule that only reports) taints nothing
        TaintRule.objects.update_or_create(
            cluster=cluster,
            name=obj["metadata"]["name"],
            defaults={
                "driver": selector.get("driver") or "",
                "pool": selector.get("pool") or "",
                "device": selector.get("device") or "",
                "taint": {"key": taint["key"], "value": taint.get("value") or "", "effect": taint["effect"]},
            },
        )
        names.add(obj["metadata"]["name"])
    return retaint(cluster, names) if names else 0


def taint_rule_deleted(cluster, obj):
    name = obj["metadata"]["name"]
    deleted, _ = TaintRule.objects.filter(cluster=cluster, name=name).delete()
    return retaint(cluster, {name}) if deleted else 0


# --- device classes ------------------------------------------------------------------------------------


def selector_of(obj):
    expressions = [
        selector["cel"]["expression"].strip()
        for selector in (obj.get("spec") or {}).get("selectors") or []
        if (selector.get("cel") or {}).get("expression")
    ]
    if not expressions:
        return "device.driver != ''"  # DRA: a class without selectors admits every device
    return " && ".join(f"({expression})" if len(expressions) > 1 else expression for expression in expressions)


def device_classes_changed(cluster, objs):
    """DeviceClasses become (or update) the broker's device classes of the same name; a price set by an
    operator is kept. A selector the broker's CEL cannot compile is refused (raises ValidationError)."""
    count = 0
    for obj in objs:
        name = obj["metadata"]["name"][:63]
        selector = selector_of(obj)
        device_class = DeviceClass.objects.filter(name=name).first()
        if device_class is None:
            device_class = DeviceClass(name=name, price_per_hour=Decimal(settings.KUBE_DEFAULT_DEVICE_PRICE))
        if device_class.selector != selector:
            device_class.selector = selector
            device_class.description = f"DeviceClass {obj['metadata']['name']} of cluster {cluster.name}"
            device_class.save()
            count += 1
        MirroredDeviceClass.objects.update_or_create(
            device_class=device_class, defaults={"cluster": cluster, "name": obj["metadata"]["name"]}
        )
    if count:
        changed(f"{count} device classes changed in cluster {cluster.name}")
    return count


def device_class_deleted(cluster, obj):
    """A DeviceClass deleted in the cluster selects nothing any more (its row stays: allocations and
    quotas refer to it)."""
    mirrored = MirroredDeviceClass.objects.filter(cluster=cluster, name=obj["metadata"]["name"]).first()
    if mirrored is None:
        return 0
    device_class = mirrored.device_class
    device_class.selector = "device.driver == '' && device.driver != ''"
    device_class.description = f"DeviceClass {obj['metadata']['name']} was deleted in cluster {cluster.name}"
    device_class.save()
    mirrored.delete()
    changed(f"device class {device_class.name} deleted in cluster {cluster.name}")
    return 1


@transaction.atomic
def forget_missing(cluster, resource, present):
    """After a list: delete what the mirror holds of `resource` that the cluster no longer lists (deletes
    missed while the sync was away); `present` holds (namespace, name) pairs. Returns how many went."""
    present = {name for _, name in present}
    if resource == "nodes":
        names = set(
            MirroredNode.objects.filter(cluster=cluster, gone=False).values_list("node__name", flat=True)
        ) - set(present)
        return sum(node_deleted(cluster, {"metadata": {"name": name}}) for name in names)
    if resource == "resourceslices":
        names = set(MirroredSlice.objects.filter(cluster=cluster).values_list("name", flat=True)) - set(present)
        return sum(slice_deleted(cluster, {"metadata": {"name": name}}) for name in names)
    if resource == "deviceclasses":
        names = set(MirroredDeviceClass.objects.filter(cluster=cluster).values_list("name", flat=True)) - set(present)
        return sum(device_class_deleted(cluster, {"metadata": {"name": name}}) for name in names)
    if resource == "devicetaintrules":
        names = set(TaintRule.objects.filter(cluster=cluster).values_list("name", flat=True)) - set(present)
        return sum(taint_rule_deleted(cluster, {"metadata": {"name": name}}) for name in names)
    return 0


# --- devices other schedulers allocated ----------------------------------------------------------------


def outside_taint(claim):
    return {"key": HELD_OUTSIDE_TAINT, "value": claim, "effect": "NoSchedule"}


def outside_holders(cluster):
    """{(driver, pool, device): [claim]} of every claim of the cluster allocated outside the broker."""
    holders = {}
    claims = MirroredClaim.objects.filter(cluster=cluster, outside=True).order_by("namespace", "name")
    for namespace, name, devices in claims.values_list("namespace", "name", "allocated_devices"):
        for key in devices:
            holders.setdefault(tuple(key), []).append(f"{namespace}/{name}")
    return holders


def hold_outside(cluster, before, after):
    """Move the taints of claims allocated outside the broker: `before` {claim: [[driver, pool, device]]}
    as last marked, `after` as they are now (a claim missing there holds nothing any more). A device may
    carry several, one per claim (shared devices). Returns how many devices changed."""
    claims = set(before) | set(after)
    keys = {tuple(key) for devices in (*before.values(), *after.values()) for key in devices}
    if not keys:
        return 0
    holders = {}
    for claim, devices in after.items():
        for key in devices:
            holders.setdefault(tuple(key), []).append(claim)
    candidates = Device.objects.filter(
        driver__in={key[0] for key in keys}, pool__in={key[1] for key in keys}, name__in={key[2] for key in keys}
    )
    updated = []
    for device in candidates:
        key = (device.driver, device.pool, device.name)
        if key not in keys:
            continue
        taints = [
            taint
            for taint in device.taints
            if not (taint.get("key") == HELD_OUTSIDE_TAINT and taint.get("value") in claims)
        ]
        taints += [outside_taint(claim) for claim in sorted(holders.get(key, ()))]
        if taints != device.taints:
            device.taints = taints
            updated.append(device)
    Device.objects.bulk_update(updated, ["taints"])
    if updated:
        changed(f"{len(updated)} devices allocated outside the broker changed in cluster {cluster.name}")
    return len(updated)
