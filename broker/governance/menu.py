"""The resource-class menu: which classes a user may pick, and each described in plain words."""

from django.db.models import Q

from broker.governance.approvals import cost_threshold, price_per_hour
from broker.policy import roles
from broker.policy.models import PriorityClass, ResourceClass, SharingRule

SHARING_WORDS = {
    SharingRule.EXCLUSIVE: "",
    SharingRule.TIME_SLICED: "devices time-sliced with other pods",
    SharingRule.PARTITIONED: "hardware partitions of devices (e.g. MIG)",
}


def sees_whole_menu(user):
    """Operators, approvers, finance and admins look at every class; members at their teams' classes."""
    return roles.is_operator(user) or roles.is_approver(user) or roles.is_finance(user)


def classes_for(user):
    classes = (
        ResourceClass.objects.select_related("priority_class", "approval_policy")
        .prefetch_related("device_class_choices__device_class", "allowed_teams")
        .order_by("name")
    )
    if sees_whole_menu(user):
        return classes
    return classes.filter(Q(allowed_teams__isnull=True) | Q(allowed_teams__in=roles.team_ids(user))).distinct()


def device_words(resource_class):
    names = [f"{choice.device_class.name.upper()}-class" for choice in resource_class.device_class_choices.all()]
    if not names:
        return "devices"
    return names[0] + " devices" + "".join(f" (or else {name})" for name in names[1:])


def preemption_words(resource_class, higher):
    if not resource_class.preemptible or not resource_class.priority_class.preemptible:
        return "never preempted"
    if higher:
        return f"may be preempted by {' or '.join(higher)} work"
    return "may be preempted"


def approval_words(resource_class):
    rules = []
    if resource_class.approval_required:
        return "needs approval"
    if resource_class.approval_threshold_devices is not None:
        rules.append(f"above {resource_class.approval_threshold_devices} devices")
    limit = cost_threshold(resource_class)
    if limit is not None:
        rules.append(f"above ${limit:.2f} per hour")
    return "needs approval " + " or ".join(rules) if rules else "no approval needed"


def describe(resource_class, higher_priorities=None):
    """e.g. "Up to 8 H100-class devices, all in one rack, may be preempted by production work, $4.00 per
    device-hour, needs approval". `higher_priorities`: names of priority classes above this class's
    (computed once per page by `describe_all`)."""
    if higher_priorities is None:
        value = resource_class.priority_class.value
        higher_priorities = list(
            PriorityClass.objects.filter(value__gt=value).order_by("value").values_list("name", flat=True)
        )
    size = f"Up to {resource_class.max_devices}" if resource_class.max_devices else "Any number of"
    parts = [f"{size} {device_words(resource_class)}"]
    if resource_class.max_devices_per_pod:
        parts.append(f"at most {resource_class.max_devices_per_pod} per pod")
    if resource_class.topology_required:
        parts.append(f"all in one {resource_class.topology_required}")
    elif resource_class.topology_preferred:
        parts.append(f"kept in one {resource_class.topology_preferred} when possible")
    sharing = SHARING_WORDS.get(resource_class.sharing, "")
    if sharing:
        parts.append(sharing)
    parts.append(preemption_words(resource_class, higher_priorities))
    if resource_class.max_duration_seconds:
        parts.append(f"runs at most {hours(resource_class.max_duration_seconds)}")
    price = price_per_hour(resource_class)
    if price is not None:
        parts.append(f"${price:.2f} per device-hour")
    parts.append(approval_words(resource_class))
    return ", ".join(parts)


def hours(seconds):
    value = seconds / 3600
    return f"{value:g} hour" + ("" if value == 1 else "s")


def describe_all(classes):
    """[(class, plain words, price per device-hour)] with one query for the priority ladder."""
    ladder = list(PriorityClass.objects.order_by("value").values_list("name", "value"))
    rows = []
    for resource_class in classes:
        value = resource_class.priority_class.value
        higher = [name for name, other in ladder if other > value]
        rows.append((resource_class, describe(resource_class, higher), price_per_hour(resource_class)))
    return rows


def may_preempt(preemptor, victim):
    """Whether work of class `preemptor` may ever evict work of class `victim`: only strictly higher
    priority, and only victims whose class and priority class are preemptible. Queue policies
    (within-queue and cohort reclaim) narrow this further per queue; they never widen it."""
    if not victim.preemptible or not victim.priority_class.preemptible:
        return False
    return preemptor.priority_class.value > victim.priority_class.value


def preemption_matrix(classes):
    """[(preemptor, [(victim, may it preempt)])], highest priority first: the promise the menu makes."""
    ordered = sorted(classes, key=lambda rc: (-rc.priority_class.value, rc.name))
    return [(row, [(column, may_preempt(row, column)) for column in ordered]) for row in ordered]
