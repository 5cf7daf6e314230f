"""What people do to workloads: submit, cancel, approve, reject, reprioritise.

Each operation is one transaction that changes the workload, records its state transition and an audit
event, and asks for a scheduling cycle once the transaction has committed. The API and the dashboard
both call these; they check *who* may act, these check *whether* the workload allows it.
"""

from dataclasses import dataclass, field

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from broker import events
from broker.audit.models import record
from broker.events import request_cycle_after_commit
from broker.governance import approvals, guidance
from broker.inventory.models import Device, TopologyLevel
from broker.inventory.quantities import quantity
from broker.limits import PRIORITY_MAX, PRIORITY_MIN
from broker.policy import roles
from broker.policy.models import DeviceClass, Queue, ResourceClass, SharingRule
from broker.scheduler.claims import Claim, claim_from_dra, claim_problem
from broker.workloads.models import (
    Allocation,
    ApprovalState,
    PodSet,
    PreemptionPolicy,
    Workload,
    group_claim_devices,
)
from broker.workloads.states import FINAL_STATES, State


class ActionRefused(Exception):
    """The workload's current state does not allow the action (the API answers 409)."""


class InvalidSubmission(Exception):
    """A submission that must not be stored; `errors` is {field: [messages]}, pod sets by index."""

    def __init__(self, errors):
        super().__init__(errors)
        self.errors = errors


@dataclass(frozen=True)
class PodSetRequest:
    name: str
    replicas: int
    devices_per_pod: int
    min_count: int | None = None
    device_classes: tuple = ()
    match_attribute: str = ""
    # Each pod's claim as resource.k8s.io/v1 writes it (requests, constraints); empty: devices_per_pod
    # devices of device_classes. Not hashed: a submission is never a key.
    claim: dict = field(default_factory=dict, hash=False)
    # What each pod takes of each of its devices when its resource class shares them (TimeSliced), as
    # DRA's ExactDeviceRequest capacity.requests writes it, e.g. {"memory": "20Gi"}; empty: devices whole.
    capacity: dict = field(default_factory=dict, hash=False)

    @property
    def devices(self):
        if self.claim:
            try:
                return self.replicas * Claim(*claim_from_dra(self.claim)).fewest_devices()
            except ValueError:
                return 0  # pod_set_errors says why
        return self.replicas * self.devices_per_pod

    def most_devices(self, all_bound):
        """The most devices its pods can take, each allocationMode All request as `all_bound`."""
        if self.claim:
            try:
                return self.replicas * Claim(*claim_from_dra(self.claim)).most_devices(all_bound)
            except ValueError:
                return 0
        return self.devices


@dataclass(frozen=True)
class Submission:
    name: str
    queue: Queue
    resource_class: ResourceClass
    pod_sets: tuple = field(default_factory=tuple)
    priority: int | None = None
    disruption_mode: str = ""
    preemption_policy: str = ""  # "" = PreemptLowerPriority
    topology_required: str | None = None
    topology_preferred: str | None = None
    expected_duration_seconds: int | None = None
    # Claims the whole gang owns (PodGroup resourceClaims): [{name, requests, constraints}], requests and
    # constraints as a pod set's claim; each allocated once for all its pods.
    group_claims: tuple = field(default_factory=tuple, hash=False)

    @property
    def total_devices(self):
        return sum(pod_set.devices for pod_set in self.pod_sets) + sum(
            group_claim_devices(claim) for claim in self.group_claims
        )

    def approval_devices(self):
        """What an approval threshold judges: the most devices the gang can take. An allocationMode All
        request takes every matching device of its node (of the gang's region for a group claim), which
        its count does not say: it counts as its resource class's max_devices, the most All may take, or
        without one as the most devices of one node (every device, for a group claim). Plain requests
        count as asked."""
        pod_claims = [(pod_set, parsed_claim(pod_set.claim)) for pod_set in self.pod_sets]
        group_claims = [parsed_claim(_claim_body(claim)) for claim in self.group_claims if isinstance(claim, dict)]
        pods_ask_all = any(claim and claim.asks_all() for _, claim in pod_claims)
        group_asks_all = any(claim and claim.asks_all() for claim in group_claims)
        if not (pods_ask_all or group_asks_all):
            return self.total_devices
        limit = self.resource_class.max_devices
        # The inventory is read only for the kind of claim that asks All.
        node_bound = limit or (largest_node_devices() if pods_ask_all else 0)
        region_bound = limit or (Device.objects.count() if group_asks_all else 0)
        total = sum(
            pod_set.replicas * claim.most_devices(node_bound) if claim else pod_set.most_devices(node_bound)
            for pod_set, claim in pod_claims
        )
        # A group claim that does not parse counts nothing: submission_errors says why.
        return total + sum(claim.most_devices(region_bound) for claim in group_claims if claim)


def parsed_claim(data):
    """The Claim a claim's JSON asks for, or None without one or where it does not parse (pod_set_errors
    and submission_errors say why)."""
    if not data:
        return None
    try:
        return Claim(*claim_from_dra(data))
    except (ValueError, AttributeError, TypeError):
        return None


def largest_node_devices():
    """The most devices any one node has (0 with no inventory)."""
    row = Device.objects.values("node").annotate(devices=Count("id")).order_by("-devices").first()
    return row["devices"] if row else 0


def _claim_body(claim):
    return {key: value for key, value in claim.items() if key != "name"}


def default_queue(user):
    """The queue a member submits to when they name none: their only team's queue named after the team,
    else that team's only queue. None when it is ambiguous."""
    teams = list(user.teams.all())
    if len(teams) != 1:
        return None
    queues = list(Queue.objects.filter(team=teams[0]))
    same_name = [queue for queue in queues if queue.name == teams[0].name]
    if same_name:
        return same_name[0]
    return queues[0] if len(queues) == 1 else None


def topology_levels():
    return set(TopologyLevel.objects.values_list("name", flat=True)) | {"node"}


def pod_set_errors(pod_set, resource_class, offered):
    errors = {}
    if pod_set.replicas < 1:
        errors["replicas"] = ["At least 1 replica."]
    if pod_set.devices_per_pod < 1:
        errors["devices_per_pod"] = ["At least 1 device per pod."]
    elif resource_class.max_devices_per_pod and pod_set.devices_per_pod > resource_class.max_devices_per_pod:
        errors["devices_per_pod"] = [
            f"{resource_class} allows at most {resource_class.max_devices_per_pod} devices per pod."
        ]
    if pod_set.min_count is not None and not 1 <= pod_set.min_count <= pod_set.replicas:
        errors["min_count"] = [f"The gang size must be between 1 and the {pod_set.replicas} replicas."]
    if pod_set.claim:
        problem = claim_errors(pod_set, resource_class, offered)
        if problem:
            errors["claim"] = [problem]
    if pod_set.capacity:
        problem = capacity_errors(pod_set, resource_class)
        if problem:
            errors["capacity"] = [problem]
    known = set(DeviceClass.objects.filter(name__in=pod_set.device_classes).values_list("name", flat=True))
    unknown = [name for name in pod_set.device_classes if name not in known]
    not_offered = [name for name in pod_set.device_classes if name in known and offered and name not in offered]
    if unknown:
        errors["device_classes"] = [f"Unknown device class: {', '.join(unknown)}."]
    elif not_offered:
        errors["device_classes"] = [
            f"{resource_class} does not offer {', '.join(not_offered)}; it offers {', '.join(offered)}."
        ]
    return errors


MAX_CAPACITIES = 8  # a device publishes a handful (memory, compute, bandwidth): more is a malformed body


def capacity_errors(pod_set, resource_class):
    """What is wrong with the capacity amounts a time-sliced pod set asks of each device, or None."""
    if not isinstance(pod_set.capacity, dict):
        return 'Capacity must be an object of capacity: quantity, e.g. {"memory": "20Gi"}.'
    if len(pod_set.capacity) > MAX_CAPACITIES:
        return f"At most {MAX_CAPACITIES} capacities."
    if resource_class.sharing != SharingRule.TIME_SLICED:
        return f"{resource_class} shares no devices (sharing: TimeSliced): ask for whole devices without capacity."
    if pod_set.claim:
        return "Capacity amounts go with devices_per_pod, not with a claim's requests."
    for name, value in pod_set.capacity.items():
        amount = quantity(value)
        if amount is None or amount <= 0:
            return f"Capacity {name!r} must be a positive quantity, not {value!r}."
    return None


def claim_errors(pod_set, resource_class, offered):
    """What makes a pod set's several-request claim (DRA DeviceClaim) malformed, in one line, or None."""
    if pod_set.devices_per_pod != 1 or pod_set.device_classes or pod_set.match_attribute:
        return (
            "A claim with requests says its devices itself: leave devices_per_pod, device_classes and "
            "match_attribute out."
        )
    try:
        claim = Claim(*claim_from_dra(pod_set.claim))
    except ValueError as error:
        return f"Invalid claim: {error}."
    names = claim.classes()
    known = set(DeviceClass.objects.filter(name__in=names).values_list("name", flat=True))
    problem = claim_problem(claim, known)
    if problem:
        return f"Invalid claim: {problem}."
    not_offered = [name for name in names if offered and name not in offered]
    if not_offered:
        return f"{resource_class} does not offer {', '.join(not_offered)}; it offers {', '.join(offered)}."
    return None


def group_claim_errors(group_claims, resource_class):
    """What makes a workload's group claims malformed: [{field: [messages]}] by index (all empty when
    they are fine). A claim whose request no device of the cluster as built could ever meet is refused
    too: it would wait forever."""
    per_claim, seen = [], set()
    as_built = guidance.ClusterAsBuilt()
    for claim in group_claims:
        errors = {}
        name = claim.get("name")
        if name in seen:
            errors["name"] = [f"Group claim names must be unique; {name} is used twice."]
        seen.add(name)
        if resource_class.sharing == "TimeSliced":
            errors["requests"] = [f"{resource_class} shares devices by time-slicing; group claims take whole devices."]
        problem = None
        try:
            parsed = Claim(*claim_from_dra(_claim_body(claim)))
        except ValueError as error:
            problem = f"Invalid claim: {error}."
        else:
            names = parsed.classes()
            known = set(DeviceClass.objects.filter(name__in=names).values_list("name", flat=True))
            found = claim_problem(parsed, known)
            if found:
                problem = f"Invalid claim: {found}."
            else:
                problem = never_met(parsed, as_built)
        if problem:
            field_name = "constraints" if "constraint" in problem else "requests"
            errors.setdefault(field_name, []).append(problem)
        per_claim.append(errors)
    return per_claim


def never_met(claim, as_built):
    """The first request of `claim` that no device of the cluster as built could meet, said so, or None."""
    for request in claim.requests:
        ways = request.alternatives
        if not any(as_built.devices_of(way.device_class, way.selectors) >= way.count for way in ways):
            wanted = " or ".join(f"{way.count} {way.device_class}" for way in ways)
            return f"Request {request.name}: no device class can ever meet it; the cluster has not {wanted}."
    return None


def submission_errors(submission, actor):
    """Everything that makes a request malformed for its class, as {field: [messages]}. Entitlement is
    not here: a team not entitled to the class gets a NotEntitled explanation from the cycle."""
    errors = {}
    resource_class = submission.resource_class
    queue = submission.queue
    if not roles.is_admin(actor) and queue.team_id not in roles.team_ids(actor):
        errors["queue"] = [f"Queue {queue.name} belongs to team {queue.team.name}, which you are not a member of."]
    elif Workload.objects.filter(team_id=queue.team_id, name=submission.name).exists():
        errors["name"] = [f"Team {queue.team.name} already has a workload named {submission.name}."]

    if not submission.pod_sets:
        errors["pod_sets"] = ["A workload needs at least one pod set."]
    else:
        offered = [device_class.name for device_class in resource_class.ordered_device_classes()]
        per_pod_set, seen = [], set()
        for pod_set in submission.pod_sets:
            found = pod_set_errors(pod_set, resource_class, offered)
            if pod_set.name in seen:
                found["name"] = [f"Pod set names must be unique; {pod_set.name} is used twice."]
            seen.add(pod_set.name)
            per_pod_set.append(found)
        if any(per_pod_set):
            errors["pod_sets"] = per_pod_set
        elif resource_class.max_devices and submission.total_devices > resource_class.max_devices:
            errors["resource_class"] = [
                f"The request asks for {submission.total_devices} devices; {resource_class} allows at most "
                f"{resource_class.max_devices}. Choose a larger class."
            ]

    if submission.group_claims:
        per_claim = group_claim_errors(submission.group_claims, resource_class)
        if any(per_claim):
            errors["group_claims"] = per_claim

    levels = topology_levels()
    for name in ("topology_required", "topology_preferred"):
        value = getattr(submission, name)
        if value and value not in levels:
            errors[name] = [f"Unknown topology level {value}; levels are {', '.join(sorted(levels))}."]
    limit = resource_class.max_duration_seconds
    if limit and submission.expected_duration_seconds and submission.expected_duration_seconds > limit:
        errors["expected_duration_seconds"] = [f"{resource_class} allows at most {limit} seconds."]
    ceiling = resource_class.priority_class.value
    if submission.priority is not None and submission.priority > ceiling and not roles.is_operator(actor):
        errors["priority"] = [f"{resource_class} allows priority up to {ceiling}; an operator can raise it."]
    return errors


def submit_workload(submission, actor):
    """Store the workload and its pod sets, waiting for approval or pending; returns the workload with
    `guidance` set to the wrong-class advice for it (a list, usually empty)."""
    errors = submission_errors(submission, actor)
    if errors:
        raise InvalidSubmission(errors)
    resource_class = submission.resource_class
    approval_reasons = approvals.approval_reasons(resource_class, submission.approval_devices())
    needs_approval = bool(approval_reasons)
    # Before the workload exists, so its own row does not count in the team's history.
    advice = guidance.for_submission(submission)
    with transaction.atomic():
        workload = Workload.objects.create(
            name=submission.name,
            team=submission.queue.team,
            queue=submission.queue,
            resource_class=resource_class,
            submitted_by=actor,
            priority=resource_class.priority_class.value if submission.priority is None else submission.priority,
            disruption_mode=submission.disruption_mode or Workload._meta.get_field("disruption_mode").default,
            preemption_policy=submission.preemption_policy or PreemptionPolicy.PREEMPT_LOWER_PRIORITY,
            preemptible=resource_class.preemptible and resource_class.priority_class.preemptible,
            topology_required=(
                resource_class.topology_required
                if submission.topology_required is None
                else submission.topology_required
            ),
            topology_preferred=(
                resource_class.topology_preferred
                if submission.topology_preferred is None
                else submission.topology_preferred
            ),
            expected_duration_seconds=submission.expected_duration_seconds,
            approval=ApprovalState.REQUESTED if needs_approval else ApprovalState.NOT_REQUIRED,
            group_claims=[dict(claim) for claim in submission.group_claims],
        )
        for pod_set in submission.pod_sets:
            PodSet.objects.create(
                workload=workload,
                name=pod_set.name,
                replicas=pod_set.replicas,
                min_count=pod_set.min_count,
                devices_per_pod=pod_set.devices_per_pod,
                device_classes=list(pod_set.device_classes),
                match_attribute=pod_set.match_attribute,
                claim=pod_set.claim,
                capacity=pod_set.capacity,
            )
        target = State.AWAITING_APPROVAL if needs_approval else State.PENDING
        workload.transition(target, actor=actor, reason="submitted")
        record(
            "workload.submit",
            workload,
            actor=actor,
            after={
                "state": workload.state,
                "approval": workload.approval,
                "queue": workload.queue.name,
                "resource_class": resource_class.name,
                "priority": workload.priority,
                "devices": submission.total_devices,
            },
        )
        if needs_approval:
            approvals.open_request(workload, approval_reasons)
        guidance.count(workload, actor, advice)
        request_cycle_after_commit(f"workload {workload.pk} submitted")
    workload.guidance = advice
    return workload


def locked(workload):
    return Workload.objects.select_for_update().get(pk=workload.pk)


def cancel_workload(workload, actor, reason=""):
    """Cancel and release every device it holds; returns the workload."""
    with transaction.atomic():
        workload = locked(workload)
        if workload.state in FINAL_STATES:
            raise ActionRefused(f"The workload is already {workload.state}.")
        before = workload.state
        now = timezone.now()
        released = Allocation.objects.filter(workload=workload, released_at__isnull=True).update(released_at=now)
        workload.transition(State.CANCELLED, actor=actor, reason=reason or "cancelled", at=now)
        record(
            "workload.cancel",
            workload,
            actor=actor,
            before={"state": before},
            after={"state": workload.state, "released_devices": released},
            reason=reason,
            manual_intervention=workload.team_id not in roles.team_ids(actor),
        )
        # Even with nothing released, the queue behind it moves up and needs fresh explanations.
        request_cycle_after_commit(f"workload {workload.pk} cancelled")
    return workload


def decision_checks(workload, actor, comment):
    if not comment or not comment.strip():
        raise ValidationError({"comment": "A comment is required: say why."})
    if workload.submitted_by_id is not None and workload.submitted_by_id == actor.pk:
        raise PermissionDenied("Approvers cannot decide on their own requests; another approver must.")
    if workload.state != State.AWAITING_APPROVAL or workload.approval != ApprovalState.REQUESTED:
        raise ActionRefused(f"The workload is not awaiting a decision (it is {workload.state}, {workload.approval}).")


def entitlement_refusal(workload):
    """Why an approval would be refused because the team may not use the class (the menu may have
    changed since the request), or "" when it may."""
    resource_class = workload.resource_class
    if resource_class is None or not resource_class.allowed_teams.exists():
        return ""
    if resource_class.allowed_teams.filter(pk=workload.team_id).exists():
        return ""
    return (
        f"{workload.team.name} may not use {resource_class.name}, so an approval would never let it run; "
        "reject it, or entitle the team to the class in the menu first."
    )


def entitlement_checks(workload):
    """An approval cannot grant what the menu refuses: a request its team may not use would be approved
    and then never run (the cycle holds it NotEntitled)."""
    refusal = entitlement_refusal(workload)
    if refusal:
        raise ActionRefused(refusal)


def decide(workload, actor, comment, approval):
    workload.approval = approval
    workload.approval_decided_by = actor
    workload.approval_decided_at = timezone.now()
    workload.approval_comment = comment.strip()
    workload.save(update_fields=["approval", "approval_decided_by", "approval_decided_at", "approval_comment"])


def approve_workload(workload, actor, comment, not_before=None, not_after=None, reserve=False):
    """Approve a request: it joins its queue as Pending; returns the workload. An approval may carry a
    window (the workload is schedulable only inside it) and reserve the devices for the team over it."""
    with transaction.atomic():
        workload = locked(workload)
        decision_checks(workload, actor, comment)
        entitlement_checks(workload)
        decide(workload, actor, comment, ApprovalState.APPROVED)
        workload.transition(State.PENDING, actor=actor, reason=f"approved: {workload.approval_comment}")
        granted = approvals.grant(workload, actor, comment, not_before, not_after, reserve)
        record(
            "workload.approve",
            workload,
            actor=actor,
            before={"approval": ApprovalState.REQUESTED, "state": State.AWAITING_APPROVAL},
            after={"approval": workload.approval, "state": workload.state, **approvals.grant_summary(granted)},
            reason=workload.approval_comment,
        )
        events.approval_changed_after_commit("approval.decided", workload.pk)
        request_cycle_after_commit(f"workload {workload.pk} approved")
    return workload


def reject_workload(workload, actor, comment):
    """Reject a request: it becomes Rejected, a final state, and leaves its queue."""
    with transaction.atomic():
        workload = locked(workload)
        decision_checks(workload, actor, comment)
        decide(workload, actor, comment, ApprovalState.REJECTED)
        workload.transition(State.REJECTED, actor=actor, reason=f"rejected: {workload.approval_comment}")
        record(
            "workload.reject",
            workload,
            actor=actor,
            before={"approval": ApprovalState.REQUESTED, "state": State.AWAITING_APPROVAL},
            after={"approval": workload.approval, "state": workload.state},
            reason=workload.approval_comment,
        )
        events.approval_changed_after_commit("approval.decided", workload.pk)
        # The queue behind it moves up and needs fresh positions.
        request_cycle_after_commit(f"workload {workload.pk} rejected")
    return workload


def change_priority(workload, actor, priority, reason=""):
    """An operator's priority override, counted as a manual intervention; returns the workload. Like
    every manual intervention it needs a reason, and the priority must lie inside broker.limits' range."""
    errors = {}
    if not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        errors["priority"] = [f"The priority must lie between {PRIORITY_MIN:,} and {PRIORITY_MAX:,}."]
    if not (reason or "").strip():
        errors["reason"] = ["A reason is required: a manual intervention says why."]
    if errors:
        raise ValidationError(errors)
    reason = reason.strip()
    with transaction.atomic():
        workload = locked(workload)
        if workload.state in FINAL_STATES:
            raise ActionRefused(f"The workload is already {workload.state}.")
        before = workload.priority
        workload.priority = priority
        workload.save(update_fields=["priority"])
        record(
            "workload.priority",
            workload,
            actor=actor,
            before={"priority": before},
            after={"priority": priority},
            reason=reason,
            manual_intervention=True,
        )
        request_cycle_after_commit(f"workload {workload.pk} priority changed")
    return workload
