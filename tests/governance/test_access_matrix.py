"""Every persona over every page and every websocket route: the exact allowed / denied set, as tables.

Personas (tests/conftest.py): alice member of team-a, bob member of team-b, olivia operator, fiona
finance, april approver, adam admin; nora is signed in with no role. 302 for the anonymous visitor is
the way to the login page (for the Django admin, also for anyone who is not staff); 404 is a row that
exists but is invisible to that persona (another team's workload).
"""

import re

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client
from django.urls import get_resolver, reverse

from broker.asgi import application
from broker.workloads.states import State
from dashboard.navigation import submits
from tests.builders import make_workload

WHO = ("anonymous", "alice", "bob", "olivia", "fiona", "april", "adam", "nora")
ANY = (302, 200, 200, 200, 200, 200, 200, 403)
TEAM_A_ROW = (302, 200, 404, 200, 404, 200, 200, 403)
OPERATORS = (302, 403, 403, 200, 403, 403, 200, 403)
APPROVERS = (302, 403, 403, 403, 403, 200, 200, 403)
AUDIT_READERS = (302, 403, 403, 200, 403, 200, 200, 403)
COST_READERS = (302, 403, 403, 200, 200, 403, 200, 403)

PAGES = [
    # url name                         method  expected for                  anon alice bob olivia fiona april adam nora
    ("dashboard:overview", "get", ANY),
    ("dashboard:queue", "get", ANY),
    ("dashboard:history", "get", ANY),
    ("dashboard:workload", "get", TEAM_A_ROW),
    ("dashboard:workload-cancel", "post", (302, 302, 404, 302, 404, 403, 302, 403)),
    ("dashboard:workload-priority", "post", (302, 403, 403, 302, 403, 403, 302, 403)),
    ("dashboard:topology", "get", ANY),
    ("dashboard:node-cordon", "post", (302, 403, 403, 302, 403, 403, 302, 403)),
    ("dashboard:device-health", "post", (302, 403, 403, 302, 403, 403, 302, 403)),
    ("dashboard:teams", "get", ANY),
    ("dashboard:submit", "get", ANY),
    ("dashboard:submit-whatif", "post", (302, 400, 400, 400, 400, 400, 400, 403)),
    ("dashboard:api-overview", "get", ANY),
    ("dashboard:api-queue", "get", ANY),
    ("dashboard:api-heatmap", "get", ANY),
    ("dashboard:api-heatmap-rack", "get", ANY),
    ("dashboard:api-heatmap-node", "get", ANY),
    ("dashboard:api-workload", "get", TEAM_A_ROW),
    ("dashboard:api-live", "get", ANY),
    ("governance:menu", "get", ANY),
    ("governance:class-new", "get", OPERATORS),
    ("governance:class-edit", "get", OPERATORS),
    ("governance:approvals", "get", APPROVERS),
    ("governance:approval-row", "get", APPROVERS),
    ("governance:approve", "post", (302, 403, 403, 403, 403, 302, 302, 403)),
    ("governance:reject", "post", (302, 403, 403, 403, 403, 302, 302, 403)),
    ("governance:audit", "get", AUDIT_READERS),
    ("governance:audit-export", "get", AUDIT_READERS),
    ("governance:lockouts", "get", OPERATORS),
    ("governance:lockout-lift", "post", (302, 403, 403, 302, 403, 403, 302, 403)),
    ("costs:finance", "get", COST_READERS),
    ("admin:index", "get", (302, 302, 302, 302, 302, 302, 302, 302)),
]

SOCKETS = [
    # route              anon   alice  bob    olivia fiona  april  adam   nora
    ("/ws/live/", (False, True, True, True, True, True, True, False)),
    ("/ws/costs/", (False, False, False, True, True, False, True, False)),
    ("/ws/approvals/", (False, False, False, False, False, True, True, False)),
]

GATED = ("dashboard", "governance", "costs")

# The pages of the top bar: every other page is reached from one of them.
DESTINATIONS = (
    "dashboard:overview",
    "dashboard:queue",
    "dashboard:history",
    "dashboard:topology",
    "dashboard:teams",
    "dashboard:submit",
    "governance:menu",
    "governance:approvals",
    "governance:audit",
    "governance:lockouts",
    "costs:finance",
)


def url_args(name, objects):
    """Arguments for each URL: the team-a workload, the first node, device and rack."""
    by_param = {
        "dashboard:workload": [objects["workload"]],
        "dashboard:workload-cancel": [objects["workload"]],
        "dashboard:workload-priority": [objects["workload"]],
        "dashboard:node-cordon": [objects["node"]],
        "dashboard:device-health": [objects["device"]],
        "dashboard:api-heatmap-rack": [objects["rack"]],
        "dashboard:api-heatmap-node": [objects["node"]],
        "dashboard:api-workload": [objects["workload"]],
        "governance:class-edit": [objects["resource_class"]],
        "governance:approval-row": [objects["awaiting"]],
        "governance:approve": [objects["awaiting"]],
        "governance:reject": [objects["awaiting"]],
        "governance:lockout-lift": [objects["lockout"]],
    }
    return by_param.get(name, [])


def post_body(name):
    # Bodies that pass the role check but change nothing: an action the persona may take must not
    # alter what the next persona sees (a blank comment is refused, health "x" is invalid, and so on).
    return {
        "dashboard:workload-priority": {"priority": "not a number"},
        "dashboard:node-cordon": {"cordoned": "false"},
        "dashboard:device-health": {"health": "Healthy"},
    }.get(name, {})


@pytest.fixture
def objects(cluster, alice, bob):
    from axes.models import AccessAttempt

    from broker.inventory.models import Domain
    from tests.governance.helpers import submit

    workload = make_workload(cluster.queue_a, "shared", resource_class=cluster.training, state=State.PENDING)
    return {
        "workload": workload.pk,
        "awaiting": submit(cluster, alice, name="awaiting").pk,
        "node": cluster.nodes[0].pk,
        "device": cluster.nodes[0].devices.first().pk,
        "rack": Domain.objects.get(name="r1").pk,
        "resource_class": cluster.training.pk,
        # A blank reason lifts nothing: the lockout stays for the next persona.
        "lockout": AccessAttempt.objects.create(
            username="bob", ip_address="10.0.0.9", user_agent="", failures_since_start=9, get_data="", post_data=""
        ).pk,
    }


def test_it_lists_every_page_of_the_gated_namespaces(db):
    """A new page without a row here fails this test, so it cannot ship unchecked."""
    names = set()
    for pattern in get_resolver().url_patterns:
        namespace = getattr(pattern, "namespace", None)
        if namespace in GATED:
            names |= {f"{namespace}:{p.name}" for p in pattern.url_patterns if p.name}
    assert names <= {name for name, _, _ in PAGES}


@pytest.mark.parametrize(("name", "method", "expected"), PAGES, ids=[row[0] for row in PAGES])
def test_it_gives_each_persona_exactly_its_pages(request, objects, name, method, expected):
    from django.urls import reverse

    url = reverse(name, args=url_args(name, objects))
    got = {}
    for who in WHO:
        client = Client()
        if who != "anonymous":
            client.force_login(request.getfixturevalue(who))
        if name == "dashboard:workload-cancel":
            # Cancelling is terminal: every persona tries it on a fresh team-a workload.
            fresh = make_workload(
                request.getfixturevalue("cluster").queue_a, f"c-{who}", state=State.PENDING, resource_class=None
            )
            url = reverse(name, args=[fresh.pk])
        response = client.get(url) if method == "get" else client.post(url, post_body(name))
        got[who] = response.status_code
    assert got == dict(zip(WHO, expected, strict=True))


def top_bar_links(html):
    """The hrefs of the page's top bar, but the API's and the admin's (not pages of this table)."""
    bar = re.search(r"<nav>(.*?)</nav>", html, re.S)
    return set(re.findall(r'href="([^"]+)"', bar.group(1) if bar else "")) - {reverse("swagger-ui"), "/admin/"}


@pytest.mark.parametrize("who", WHO[1:])
def test_it_links_in_the_top_bar_exactly_the_pages_a_persona_opens(request, cluster, who):
    client = Client()
    client.force_login(request.getfixturevalue(who))
    user = request.getfixturevalue(who)
    opens = {reverse(name) for name in DESTINATIONS if client.get(reverse(name)).status_code == 200}
    if not submits(user):
        # Submit and their history only say "you are in no team" to them: no link leads there.
        opens -= {reverse("dashboard:submit"), reverse("dashboard:history")}
    # Someone with no role gets the 403 page, which has the bar too.
    for page in ("dashboard:overview", "dashboard:queue"):
        assert top_bar_links(client.get(reverse(page)).content.decode()) == opens, page


def socket_connects(user, route):
    headers = [(b"origin", b"http://testserver"), (b"host", b"testserver")]
    if user is not None:
        client = Client()
        client.force_login(user)
        cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
        headers.append((b"cookie", cookie.encode()))

    async def go():
        communicator = WebsocketCommunicator(application, route, headers=headers)
        connected, code = await communicator.connect(timeout=5)
        if connected:
            await communicator.disconnect()
        return connected, code

    return async_to_sync(go)()


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_it_opens_each_socket_to_exactly_its_roles(request, cluster):
    for route, expected in SOCKETS:
        got = {}
        for who in WHO:
            user = None if who == "anonymous" else request.getfixturevalue(who)
            connected, code = socket_connects(user, route)
            got[who] = connected
            if not connected:
                assert code == (4401 if who == "anonymous" else 4403), (route, who, code)
        assert got == dict(zip(WHO, expected, strict=True)), route


@pytest.mark.parametrize(("who", "linked"), [("alice", True), ("adam", True), ("olivia", False), ("fiona", False)])
def test_it_links_submit_only_for_those_with_a_queue_to_submit_to(request, cluster, who, linked):
    client = Client()
    client.force_login(request.getfixturevalue(who))
    links = top_bar_links(client.get(reverse("dashboard:overview")).content.decode())
    assert (reverse("dashboard:submit") in links) is linked
