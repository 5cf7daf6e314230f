""" "Would it start now?": the candidate joins the current snapshot as one more pending workload and the
decision core runs over it. Nothing is written; the real cycle is not blocked (no cycle lock is taken)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

from django.db import connection, transaction
from django.utils import timezone

from broker.cycle.executor import get_executor
from broker.cycle.loader import load_snapshot
from broker.cycle.runner import keep_out_of_collections
from broker.scheduler import snapshot as s
from broker.scheduler.cycle import decide
from dashboard.advice import form_suggestions

CANDIDATE_ID = "what-if"


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
    needs_approval = resource_class.needs_approval(submission.total_devices)
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
            )
            for pod_set in submission.pod_sets
        ),
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
    snapshot = read_snapshot(now)
    snapshot = dataclasses.replace(snapshot, pending=(*snapshot.pending, candidate(submission, now)))
    result = decide(snapshot)
    # What a cycle keeps, a what-if keeps too (the read inventory, the core's index, the work's records):
    # in a web process that runs no cycle, this is where a large one is frozen out of the collector.
    keep_out_of_collections()
    for admission in result.admissions:
        if admission.workload_id == CANDIDATE_ID:
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
            return {
                "admitted": False,
                "reason": decision.reason,
                "secondary": list(decision.secondary),
                "message": decision.message,
                "position_in_queue": decision.position_in_queue,
                "position_in_cluster": decision.position_in_cluster,
                "estimated_start": datetime.fromtimestamp(estimated, tz=UTC).isoformat() if estimated else None,
                "suggestions": form_suggestions(decision.suggestions, submission.resource_class),
                "preempts": sum(1 for p in result.preemptions if p.preemptor_id == CANDIDATE_ID),
            }
    raise RuntimeError("The decision core returned no decision for the what-if candidate.")
