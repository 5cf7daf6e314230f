"""A team's monthly statement: its charge (the chargeback line) and what it is made of."""

from django.utils import timezone

from broker.costs.pending import pending_report
from broker.costs.report import chargeback, team_breakdowns

BREAKDOWNS = {
    "by_resource_class": ("resource_class",),
    "by_cost_label": ("cost_label",),
    "by_queue": ("queue",),
    "by_device_class": ("device_class",),
    "by_workload": ("workload",),
}


def monthly_statement(team, start, end, now=None):
    now = now or timezone.now()
    bill = chargeback(start, end, now=now)
    [line] = [row for row in bill["teams"] if row["team"] == team.name]
    splits = team_breakdowns(start, end, team.name, list(BREAKDOWNS.values()), now=now)
    pending = pending_report(start, end, aggregate=("reason",), step="month", now=now, team_ids=[team.pk])["totals"]
    return {
        "team": team.name,
        "display_name": str(team),
        "month": f"{start:%Y-%m}",
        "period": {"start": start, "end": end},
        "allocated": {"device_hours": line["allocated_device_hours"], "cost": line["allocated_cost"]},
        "reserved_unused": {"device_hours": line["reserved_unused_device_hours"], "cost": line["reserved_unused_cost"]},
        "charge": line["charge"],
        **{name: splits[dims] for name, dims in BREAKDOWNS.items()},
        # Beside the bill, never in it: what the team's waiting cost in devices it could not use.
        "pending_not_billed": {"total": pending["total"], "by_reason": pending["pending"]},
    }
