"""The queue page in the browser: live deltas move waiting rows into the order their new positions give.

No worker runs here (Django's live server, no cycles), so nothing but the delta this test hands the page
moves a row."""

import pytest
from django.conf import settings
from django.test import Client

from broker.workloads.models import SchedulingCycle
from tests.builders import make_workload
from tests.dashboard.conftest import wait

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True, serialized_rollback=True)]


def signed_in_page(browser, live_server, user):
    client = Client()
    client.force_login(user)
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.add_cookies(
        [
            {
                "name": settings.SESSION_COOKIE_NAME,
                "value": client.cookies[settings.SESSION_COOKIE_NAME].value,
                "url": live_server.url,
            }
        ]
    )
    page = context.new_page()
    page.set_default_timeout(20000)
    return page


def waiting_order(page):
    return page.eval_on_selector_all(
        "#pending-table tbody tr[data-workload]", "rows => rows.map(r => r.innerText.split('\\t')[1])"
    )


def test_it_reorders_waiting_rows_when_a_cycle_moves_them(live_server, browser, cluster, olivia):
    cycle = SchedulingCycle.objects.create(cluster=settings.CLUSTER_NAME)
    names = ("first", "second", "third")
    workloads = {name: make_workload(cluster.queue_a, name, minutes_ago=10 - index) for index, name in enumerate(names)}
    for position, name in enumerate(names, start=1):
        wait(workloads[name], cycle, "InsufficientCapacity", "needs 8 h100", position)
    page = signed_in_page(browser, live_server, olivia)
    page.goto(f"{live_server.url}/queue/")
    assert waiting_order(page) == ["first", "second", "third"]

    # Fair share moved "third" ahead; "first" was admitted and has no position any more.
    delta = [
        {"id": workloads["third"].pk, "position_in_cluster": 1},
        {"id": workloads["second"].pk, "position_in_cluster": 2},
        {"id": workloads["first"].pk, "state": "Admitted", "position_in_cluster": None},
    ]
    page.evaluate("delta => window.BrokerLive.apply({type: 'cycle', workloads: delta})", delta)
    assert waiting_order(page) == ["third", "second", "first"]
    assert page.inner_text(f'tr[data-workload="{workloads["first"].pk}"] [data-field="state"]') == "Admitted"
