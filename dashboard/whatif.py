""" "Would it start now?": the candidate joins the current snapshot as one more pending workload and the
decision core runs over it. Nothing is written; the real cycle is not blocked (no cycle lock is taken)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

from django.db import connection, transaction
from django.utils import timezone

from broker.cycle.executor import get_executor
from broker.cycle.loader import group_claims_from_rows, load_snapshot
from broker.cycle.runner import keep_out_of_collections
from broker.governance import guidance
from broker.governance.approvals import price_per_hour
from broker.scheduler import snapshot as s
from broker.scheduler.claims import claim_from_dra
from broker.scheduler.cycle import decide
from broker.workloads import services as workload_services
from dashboard.advice import ANYWHERE, class_refusal, form_suggestions, levels
from dashboard.forms import entitled_resource_classes

CANDIDATE_ID = "what-if"
# Other resource classes a what-if that does not start tries: each is one more run of the decision core.
OTHER_CLASSES_TRIED = 3


def read_snapshot(now):
    """One consistent read, as the cycle takes it (REPEATABLE READ on PostgreSQL)."""
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if outermost and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        snapshot, _loaded = load_snapshot(now)
    return snapshot


def candidate(submission, now):
    resource_class = submission.resource_class
    needs_approval = resource_class.needs_approval(submission.approval_devices())
    return s.PendingWorkload(
        id=CANDIDATE_ID,
        queue=submission.queue.name,
        team=submission.queue.team.name,
        resource_class=resource_class.name,
        pod_sets=tuple(
            s.PodSet(
                name=pod_set.name,
                count=pod_set.replicas,
                min_count=pod_set.min_count,
                devices_per_pod=pod_set.devices_per_pod,
                device_classes=tuple(pod_set.device_classes),
                # A claim with several requests, as the loader reads a stored one (it passed the checks).
                **dict(zip(("requests", "constraints"), claim_from_dra(pod_set.claim), strict=True))
                if pod_set.claim
                else {},
            )
            for pod_set in submission.pod_sets
        ),
        group_claims=group_claims_from_rows(submission.group_claims),
        # "" is the submitter's "no level", as the loader reads a stored workload's.
        topology_required=(
            submission.topology_required
            if submission.topology_required is not None
            else resource_class.topology_required
        )
        or None,
        topology_preferred=(
            submission.topology_preferred
            if submission.topology_preferred is not None
            else resource_class.topology_preferred
        )
        or None,
        priority=resource_class.priority_class.value if submission.priority is None else submission.priority,
        submitted=now.timestamp(),
        approved=None if needs_approval else True,
        expected_duration=get_executor().wall_seconds(submission.expected_duration_seconds),
        preemptible=resource_class.preemptible and resource_class.priority_class.preemptible,
    )


def would_start(submission, user, now=None):
    """{"admitted": bool, ...}: where it would go, or the reason, message, position and suggestions."""
    now = now or timezone.now()
    read = read_snapshot(now)
    snapshot = dataclasses.replace(read, pending=(*read.pending, candidate(submission, now)))
    result = decide(snapshot)
    # What a cycle keeps, a what-if keeps too (the read inventory, the core's index, the work's records):
    # in a web process that runs no cycle, this is where a large one is frozen out of the collector.
    keep_out_of_collections()
    admission = admission_of(result)
    if admission is not None:
        nodes = sorted({pod.node for pod in admission.pods})
        where = ", ".join(f"{level} {name}" for level, name in admission.domain.items())
        return {
            "admitted": True,
            "device_class": admission.device_class,
            "where": where or ", ".join(nodes),
            "nodes": nodes,
        }
    for decision in result.pending:
        if decision.workload_id == CANDIDATE_ID:
            estimated = decision.estimated_start
            suggestions = form_suggestions(decision.suggestions, submission.resource_class)
            other = other_class(submission, user, read, now)
            return {
                "admitted": False,
                "reason": decision.reason,
                "secondary": list(decision.secondary),
                "message": decision.message,
                "position_in_queue": decision.position_in_queue,
                "position_in_cluster": decision.position_in_cluster,
                "estimated_start": datetime.fromtimestamp(estimated, tz=UTC).isoformat() if estimated else None,
                "suggestions": suggestions + ([other] if other else []),
                "preempts": sum(1 for p in result.preemptions if p.preemptor_id == CANDIDATE_ID),
            }
    raise RuntimeError("The decision core returned no decision for the what-if candidate.")


def admission_of(result):
    return next((admission for admission in result.admissions if admission.workload_id == CANDIDATE_ID), None)


def other_class(submission, user, snapshot, now):
    """The cheapest other resource class the user may pick in which the request, as the form has it,
    is valid, needs no approval and would start now, as a suggestion the form applies (the core advises
    within the request's class only). Tried only where it could hold the request at all, so a request
    invalid everywhere gets no such advice."""
    chosen = submission.resource_class
    classes = [rc for rc in entitled_resource_classes(user) if rc.pk != chosen.pk]
    classes.sort(key=lambda rc: (price_per_hour(rc) is None, price_per_hour(rc) or 0, rc.name))
    cluster, tried = guidance.ClusterAsBuilt(), 0
    for resource_class in classes:
        changed = dataclasses.replace(submission, resource_class=resource_class)
        if not usable(changed, user) or not cluster.holds(changed, resource_class):
            continue
        if tried == OTHER_CLASSES_TRIED:
            break
        tried += 1
        pending = (*snapshot.pending, candidate(changed, now))
        if admission_of(decide(dataclasses.replace(snapshot, pending=pending))) is None:
            continue
        price = price_per_hour(resource_class)
        cost = f" (${price:.2f}/device-hour)" if price is not None else ""
        return {
            "kind": "OtherClass",
            "description": f"use resource class {resource_class.display_name or resource_class}{cost}: starts now",
            "form": {"resource_class": resource_class.pk},
        }
    return None


def usable(submission, user):
    """Whether the form would take `submission` in its class without an approver's wait."""
    resource_class = submission.resource_class
    if resource_class.needs_approval(submission.approval_devices()):
        return False
    errors = workload_services.submission_errors(submission, user)
    errors.pop("name", None)
    if errors:
        return False
    known = levels()
    for field, value in (
        ("topology_required", submission.topology_required),
        ("topology_preferred", submission.topology_preferred),
    ):
        shown = "" if value is None else (value or ANYWHERE)
        if class_refusal(resource_class, field, shown, known):
            return False
    return True
