"""Finance pages and the running-cost ticker socket."""

from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client
from django.utils import timezone

from broker.asgi import application
from broker.workloads.states import State
from tests.costs.helpers import hold, sample, submit


def page(user):
    client = Client()
    if user is not None:
        client.force_login(user)
    return client.get("/finance/")


@pytest.mark.parametrize(
    ("persona", "status"), [("fiona", 200), ("olivia", 200), ("adam", 200), ("alice", 403), ("april", 403)]
)
def test_it_shows_the_finance_page_to_cost_readers_only(cluster, request, persona, status):
    response = page(request.getfixturevalue(persona))
    assert response.status_code == status
    if status == 200:
        html = response.content.decode()
        for chart in ("stacked", "treemap", "idle-vs-pending", "top-workloads", "ticker"):
            assert f'id="{chart}"' in html
        assert "vendor/plotly.min.js" in html


def test_it_sends_anonymous_visitors_to_log_in(cluster):
    response = page(None)
    assert response.status_code == 302
    assert "/login/" in response["Location"]


def socket_for(user):
    client = Client()
    client.force_login(user)
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    return WebsocketCommunicator(
        application,
        "/ws/costs/",
        headers=[(b"cookie", cookie.encode()), (b"origin", b"http://testserver"), (b"host", b"testserver")],
    )


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_it_ticks_the_running_cost_to_finance_over_the_socket(cluster, fiona):
    now = timezone.now()
    start = max(now.replace(day=1, hour=0, minute=0, second=0, microsecond=0), now - timedelta(hours=1))
    job = submit(cluster.queue_a, "ticking", start, state=State.RUNNING)
    hold(job, list(cluster.nodes[0].devices.all()[:2]), cluster.h100, start)
    sample(cluster.h100, start, total=16)

    communicator = socket_for(fiona)

    async def go():
        connected, _ = await communicator.connect()
        assert connected
        tick = await communicator.receive_json_from(timeout=10)
        await communicator.disconnect()
        return tick

    tick = async_to_sync(go)()
    assert tick["type"] == "cost.tick"
    assert tick["per_hour"] == {"allocated": "8.00", "capacity": "64.00"}
    assert tick["devices"] == {"allocated": 2, "capacity": 16}
    assert float(tick["month_to_date"]["allocated"]) > 0


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_it_closes_the_ticker_to_team_members(cluster, alice):
    communicator = socket_for(alice)

    async def go():
        connected, _ = await communicator.connect()
        return connected

    assert async_to_sync(go)() is False
