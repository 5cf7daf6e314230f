"""The queue page in the browser: a live message makes the page reread its tables from the database, so
waiting rows come in the order their new positions give and a workload that was admitted moves from
Pending to Running, whatever the message itself said.

No worker runs here (Django's live server, no cycles): the test changes the database and hands the
page a message."""

import pytest
from django.conf import settings
from django.test import Client

from broker.workloads.models import Explanation, SchedulingCycle
from broker.workloads.states import State
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
    Explanation.objects.filter(workload=workloads["third"]).update(position_in_cluster=1)
    Explanation.objects.filter(workload=workloads["first"]).delete()
    workloads["first"].transition(State.ADMITTED)
    # The message is stale and partial (it names only "second"): the page trusts the database, not it.
    delta = [{"id": workloads["second"].pk, "position_in_cluster": 9, "state": "Pending"}]
    page.evaluate("delta => window.BrokerLive.apply({type: 'delta', cycle: 2, workloads: delta})", delta)
    page.wait_for_function("() => !window.BrokerLive.reading()")
    assert waiting_order(page) == ["third", "second"]
    assert page.inner_text("#pending-card h2") == "Pending (2)"
    assert page.inner_text("#running-card h2") == "Running (1)"
    assert (
        page.inner_text(f'#running-table tr[data-workload="{workloads["first"].pk}"] [data-field="state"]')
        == "Admitted"
    )
