"""With Redis unreachable the pages and the overview JSON are read from the database and say that live
updates are paused (they answered 500 on a cache error)."""

import pytest
from django.urls import reverse

from dashboard import inventory_state, live_health

DOWN = "redis://127.0.0.1:1/0"  # nothing listens on port 1


@pytest.fixture
def redis_down(settings):
    settings.REDIS_URL = DOWN
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": DOWN,
            "OPTIONS": {"socket_connect_timeout": 0.2, "socket_timeout": 0.2},
        }
    }
    inventory_state._local.clear()
    live_health.forget()
    yield
    inventory_state._local.clear()
    live_health.forget()


@pytest.fixture
def redis_up(settings):
    live_health.forget()
    yield
    live_health.forget()


@pytest.mark.parametrize("page", ["dashboard:overview", "dashboard:queue", "dashboard:topology", "dashboard:teams"])
def test_pages_render_from_the_database_and_say_live_updates_are_paused(client, scene, olivia, redis_down, page):
    client.force_login(olivia)
    response = client.get(reverse(page))
    assert response.status_code == 200
    assert 'id="live-paused"' in response.content.decode()


def test_the_overview_json_answers_with_the_database_figures(client, scene, olivia, redis_down, settings):
    client.force_login(olivia)
    down = client.get(reverse("dashboard:api-overview")).json()
    assert down["live_paused"] is True
    assert sum(row["count"] for row in down["pending"]) == 2  # the scene's two waiting workloads
    assert {"capacity", "series", "counters"} <= set(down)


def test_the_heatmap_json_answers_too(client, scene, olivia, redis_down):
    client.force_login(olivia)
    assert client.get(reverse("dashboard:api-heatmap")).status_code == 200


def test_no_notice_while_redis_answers(client, scene, olivia, redis_up):
    client.force_login(olivia)
    assert 'id="live-paused"' not in client.get(reverse("dashboard:overview")).content.decode()
    assert client.get(reverse("dashboard:api-overview")).json()["live_paused"] is False
