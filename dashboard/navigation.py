"""The top bar's links: every page a user may open, and no other, by the table the pages are guarded by
(broker.governance.access), so a role's pages and its links cannot drift apart."""

from collections.abc import Callable
from dataclasses import dataclass

from django.urls import reverse

from broker.governance.access import may_open
from broker.policy.roles import is_admin, team_ids


def submits(user):
    """Someone in no team has no queue to submit to (an admin may submit to any): no link leads there."""
    return is_admin(user) or bool(team_ids(user))


@dataclass(frozen=True)
class Section:
    label: str
    view_name: str
    # Pages reached from this section's page that keep it highlighted (a workload from the queue).
    within: tuple = ()
    # Whether the link is worth showing to a user who may open the page.
    useful: Callable | None = None

    def is_current(self, view_name):
        return view_name == self.view_name or view_name in self.within


SECTIONS = (
    Section("Overview", "dashboard:overview"),
    Section("Queue", "dashboard:queue", ("dashboard:workload",)),
    Section("My workloads", "dashboard:history", useful=submits),
    Section("Topology", "dashboard:topology"),
    Section("Teams & quotas", "dashboard:teams"),
    Section("Submit", "dashboard:submit", useful=submits),
    Section("Menu", "governance:menu", ("governance:class-new", "governance:class-edit")),
    Section("Approvals", "governance:approvals"),
    Section("Audit", "governance:audit"),
    Section("Lockouts", "governance:lockouts"),
    Section("Finance", "costs:finance"),
)


@dataclass(frozen=True)
class Link:
    label: str
    url: str
    current: bool


def links_for(user, current_view_name=None):
    """The Links of the sections `user` may open, in the bar's order."""
    return [
        Link(section.label, reverse(section.view_name), section.is_current(current_view_name))
        for section in SECTIONS
        if may_open(user, section.view_name) and (section.useful is None or section.useful(user))
    ]
