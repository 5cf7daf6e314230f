"""Wrong-class guidance at submission: a cheaper or smaller class the team may use that fits the
request, or a class the team rarely succeeds with. Advice only: the submission goes ahead."""

from django.db.models import Count, Q

from broker.audit.models import record
from broker.governance.approvals import approval_reasons, price_per_hour
from broker.inventory.models import Device, Domain, InventoryRevision, Node
from broker.policy.models import DeviceClass, ResourceClass
from broker.scheduler import snapshot as core
from broker.scheduler.gang_search import fits_counts
from broker.scheduler.placement import PodDemand
from broker.scheduler.selectors import ClassMatcher, SelectorCache
from broker.workloads.models import Workload
from broker.workloads.states import State

AUDIT_ACTION = "guidance.wrong_class"
# "Rarely succeeds": at least this many past requests, and more than this share of them went wrong.
MIN_HISTORY = 4
BAD_SHARE = 0.5


def entitled_classes(team):
    return (
        ResourceClass.objects.filter(Q(allowed_teams__isnull=True) | Q(allowed_teams=team))
        .distinct()
        .select_related("priority_class", "approval_policy")
        .prefetch_related("device_class_choices__device_class")
    )


def fits(submission, resource_class):
    """Would the class accept this request as it is (sizes, per-pod limit, duration, device classes)?"""
    offered = {choice.device_class.name for choice in resource_class.device_class_choices.all()}
    if not offered:
        return False
    if resource_class.max_devices and submission.total_devices > resource_class.max_devices:
        return False
    limit = resource_class.max_duration_seconds
    if limit and submission.expected_duration_seconds and submission.expected_duration_seconds > limit:
        return False
    for pod_set in submission.pod_sets:
        if resource_class.max_devices_per_pod and pod_set.devices_per_pod > resource_class.max_devices_per_pod:
            return False
        if any(name not in offered for name in pod_set.device_classes):
            return False
    return True


class ClusterAsBuilt:
    """The cluster with every device healthy, free and unreserved (the decision core's InvalidRequest
    test), read from the inventory only when a class is about to be advised: devices per node by what
    they are (driver, attributes, capacity), matched to device classes once per kind.

    What it reads is kept for the process while the inventory's revision token and the device classes
    stand: the replay submits hundreds of workloads a minute, and reading the inventory and evaluating
    every class's CEL selector for each of them cost 0.2 s a submission on the demo cluster."""

    _kept: dict = {}  # (inventory token, device classes) -> _AsBuilt; one entry, the latest

    def __init__(self):
        self._built = None

    def holds(self, submission, resource_class):
        """Whether the request could ever run in `resource_class`: in one of the device classes it would
        use there, its gang fits the nodes as built of one domain of its required level (the whole
        cluster without one). A bound for pod sets that match an attribute (not checked)."""
        demands = tuple(
            PodDemand(pod_set.name, pod_set.replicas, pod_set.min_count or pod_set.replicas, pod_set.devices_per_pod)
            for pod_set in submission.pod_sets
        )
        level = submission.topology_required
        if level is None:
            level = resource_class.topology_required
        declared = next((pod_set.device_classes for pod_set in submission.pod_sets if pod_set.device_classes), ())
        classes = declared or [device_class.name for device_class in resource_class.ordered_device_classes()]
        built = self._as_built()
        for class_name in classes:
            for counts in built.domains(class_name, level or None).values():
                if fits_counts(demands, counts):
                    return True
        return False

    def devices_of(self, class_name, selectors=()):
        """How many devices of the cluster as built `class_name` selects (those that also meet every CEL
        expression of `selectors`): what a claim's request could ever be given."""
        return self._as_built().devices_of(class_name, tuple(selectors))

    def _as_built(self):
        if self._built is None:
            token = InventoryRevision.current()
            classes = tuple(DeviceClass.objects.order_by("name").values_list("name", "selector"))
            # No token (a flushed database before any inventory write): nothing identifies it, read anew.
            key = None if token is None else (token, classes)
            built = ClusterAsBuilt._kept.get(key) if key is not None else None
            if built is None:
                built = _AsBuilt(classes)
                if key is not None:
                    ClusterAsBuilt._kept = {key: built}
            self._built = built
        return self._built


class _AsBuilt:
    """The inventory as read at one revision token, with what was derived from it so far."""

    def __init__(self, classes):
        rows = (
            Device.objects.order_by()
            .values_list("node_id", "driver", "attributes", "capacity")
            .annotate(count=Count("id"))
        )
        self._kinds, self._per_node, self._matched = {}, [], {}
        for node_id, driver, attributes, capacity, count in rows:
            kind = (driver, _key(attributes), _key(capacity))
            self._kinds.setdefault(kind, (driver, attributes or {}, capacity or {}))
            self._per_node.append((node_id, kind, count))
        self._matcher = ClassMatcher(
            tuple(core.DeviceClass(name, selector=selector or None) for name, selector in classes)
        )
        self._domains: dict = {}
        self._node_domains: dict = {}

    def devices_of(self, class_name, selectors):
        found = self._domains.get((class_name, selectors, "total"))
        if found is None:
            cache = SelectorCache()
            found = sum(
                count
                for _, kind, count in self._per_node
                if class_name in self._classes_of(kind)
                and (not selectors or cache.matches(selectors, self._kinds[kind][1]))
            )
            self._domains[(class_name, selectors, "total")] = found
        return found

    def domains(self, class_name, level):
        """{domain: [devices of the class per node as built]} at `level` (None: the whole cluster)."""
        found = self._domains.get((class_name, level))
        if found is None:
            found = self._domains[(class_name, level)] = self._count_domains(class_name, level)
        return found

    def _count_domains(self, class_name, level):
        per_node: dict[int, int] = {}
        for node_id, kind, count in self._per_node:
            if class_name in self._classes_of(kind):
                per_node[node_id] = per_node.get(node_id, 0) + count
        if level is None:
            return {None: list(per_node.values())}
        if level == "node":
            return {node_id: [count] for node_id, count in per_node.items()}
        domain_of = self._domains_at(level)
        domains: dict = {}
        for node_id, count in per_node.items():
            domain = domain_of.get(node_id)
            if domain is not None:
                domains.setdefault(domain, []).append(count)
        return domains

    def _classes_of(self, kind):
        found = self._matched.get(kind)
        if found is None:
            driver, attributes, capacity = self._kinds[kind]
            device = core.Device("as-built", "as-built", driver, attributes, capacity)
            found = self._matched[kind] = self._matcher.classes_of(device)
        return found

    def _domains_at(self, level):
        """{node id: id of its domain at `level`}, through the domains' parents."""
        found = self._node_domains.get(level)
        if found is not None:
            return found
        domains = {
            pk: (level_name, parent)
            for pk, level_name, parent in Domain.objects.values_list("pk", "level__name", "parent_id")
        }

        def at_level(domain):
            while domain is not None:
                level_name, parent = domains[domain]
                if level_name == level:
                    return domain
                domain = parent
            return None

        found = self._node_domains[level] = {
            node_id: at_level(domain) for node_id, domain in Node.objects.values_list("pk", "domain_id")
        }
        return found


def _key(mapping):
    return tuple(sorted((str(name), repr(value)) for name, value in (mapping or {}).items()))


def first_price(resource_class):
    choices = sorted(resource_class.device_class_choices.all(), key=lambda choice: choice.rank)
    return choices[0].device_class.price_per_hour if choices else None


def smaller(candidate, chosen):
    if candidate.max_devices is None:
        return False
    return chosen.max_devices is None or candidate.max_devices < chosen.max_devices


def better_class(submission):
    """(kind, class) of the best alternative the team may use — cheapest first, then smallest — or None.
    An alternative that would add an approval step the chosen class does not need is no better."""
    chosen = submission.resource_class
    devices = submission.total_devices
    chosen_price = price_per_hour(chosen)
    chosen_needs_approval = bool(approval_reasons(chosen, devices))
    found = []
    for candidate in entitled_classes(submission.queue.team):
        if candidate.pk == chosen.pk or not fits(submission, candidate):
            continue
        if approval_reasons(candidate, devices) and not chosen_needs_approval:
            continue
        price = first_price(candidate)
        if price is not None and chosen_price is not None and price < chosen_price:
            found.append((0, price, candidate.max_devices or 0, candidate.name, "cheaper_class", candidate))
        elif smaller(candidate, chosen):
            found.append((1, price or 0, candidate.max_devices, candidate.name, "smaller_class", candidate))
    # Best first, and only a class whose devices could ever hold the request: "would also fit" a class
    # where it is an InvalidRequest is advice nobody can take (a request invalid everywhere gets none).
    cluster = ClusterAsBuilt()
    for row in sorted(found, key=lambda row: row[:4]):
        if cluster.holds(submission, row[5]):
            return row[4], row[5]
    return None


def class_advice(submission):
    best = better_class(submission)
    if best is None:
        return None
    kind, candidate = best
    chosen = submission.resource_class
    devices = submission.total_devices
    chosen_price, price = price_per_hour(chosen), first_price(candidate)
    if kind == "cheaper_class":
        saving = (chosen_price - price) * devices
        message = (
            f"Your {devices}-device request would also fit {candidate} at ${price:.2f} per device-hour instead of "
            f"${chosen_price:.2f} in {chosen}: about ${saving:.2f} less per hour."
        )
    else:
        message = (
            f"Your {devices}-device request would fit {candidate} (up to {candidate.max_devices} devices), a "
            f"smaller class than {chosen}"
            + (" that needs no approval for it." if approval_reasons(chosen, devices) else ".")
        )
    return {"kind": kind, "resource_class": candidate.name, "message": message}


def team_history(team, resource_class):
    """Counts of the team's past requests in the class: finished, and how each went wrong."""
    rows = Workload.objects.filter(team=team, resource_class=resource_class).aggregate(
        succeeded=Count("id", filter=Q(state=State.SUCCEEDED)),
        failed=Count("id", filter=Q(state=State.FAILED)),
        cancelled=Count("id", filter=Q(state=State.CANCELLED) & ~Q(explanation__reason="InvalidRequest")),
        invalid=Count("id", filter=Q(explanation__reason="InvalidRequest")),
    )
    rows["total"] = rows["succeeded"] + rows["failed"] + rows["cancelled"] + rows["invalid"]
    return rows


def history_advice(submission):
    team, chosen = submission.queue.team, submission.resource_class
    history = team_history(team, chosen)
    bad = history["failed"] + history["cancelled"] + history["invalid"]
    if history["total"] < MIN_HISTORY or bad <= history["total"] * BAD_SHARE:
        return None
    message = (
        f"{team} rarely succeeds in {chosen}: of its last {history['total']} requests there, "
        f"{history['succeeded']} succeeded, {history['failed']} failed, {history['cancelled']} were cancelled and "
        f"{history['invalid']} could never run here. Check that the class fits the job."
    )
    return {"kind": "rarely_succeeds", "resource_class": chosen.name, "message": message, "history": history}


def for_submission(submission):
    """Every piece of advice for this submission, as dicts with kind, resource_class and message."""
    return [advice for advice in (class_advice(submission), history_advice(submission)) if advice]


def count(workload, actor, advice):
    """One audit event per submission that got advice, so the metrics can count wrong-class picks."""
    if advice:
        record(
            AUDIT_ACTION,
            workload,
            actor=actor,
            after={"kinds": [item["kind"] for item in advice], "team": workload.team.name, "advice": advice},
            reason="; ".join(item["message"] for item in advice),
        )
