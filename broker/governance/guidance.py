"""Wrong-class guidance at submission: a cheaper or smaller class the team may use that fits the
request, or a class the team rarely succeeds with. Advice only: the submission goes ahead."""

from django.db.models import Count, Q

from broker.audit.models import record
from broker.governance.approvals import approval_reasons, price_per_hour
from broker.policy.models import ResourceClass
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
    if not found:
        return None
    best = min(found, key=lambda row: row[:4])
    return best[4], best[5]


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
