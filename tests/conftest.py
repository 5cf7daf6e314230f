"""Shared fixtures: named personas (healthchecks style) and the service checks.

The suite runs against the real PostgreSQL and Redis named by DATABASE_URL and REDIS_URL (`make test`
sets both). If either cannot be reached the run fails: it never silently skips.
"""

import os

import pytest
from django.conf import settings


def pytest_configure(config):
    if os.environ.get("CI", "").lower() == "true":
        problems = []
        if settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
            problems.append("CI=true but DATABASE_URL does not point at PostgreSQL")
        if not settings.REDIS_URL:
            problems.append("CI=true but REDIS_URL is not set")
        if problems:
            raise pytest.UsageError("; ".join(problems))


@pytest.fixture(scope="session", autouse=True)
def services_reachable():
    """Fail the whole run, loudly, when a configured service is down."""
    if settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
        import psycopg

        db = settings.DATABASES["default"]
        try:
            psycopg.connect(
                host=db.get("HOST") or None,
                port=db.get("PORT") or None,
                user=db.get("USER") or None,
                password=db.get("PASSWORD") or None,
                dbname=db.get("NAME"),
                connect_timeout=5,
            ).close()
        except psycopg.OperationalError as error:
            pytest.fail(f"PostgreSQL cannot be reached: {error}", pytrace=False)
    if settings.REDIS_URL:
        import redis

        try:
            client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=5)
            client.ping()
            client.flushdb()
        except redis.RedisError as error:
            pytest.fail(f"Redis cannot be reached: {error}", pytrace=False)


# ---- a small cluster and the named personas ---------------------------------------------------------


@pytest.fixture
def cluster(db):
    """Two racks of two nodes, 4 H100 each, two teams with queues in one cohort, the resource menu."""
    from tests.builders import build_small_cluster

    return build_small_cluster()


@pytest.fixture
def alice(cluster):
    """A member of team-a."""
    from tests.builders import make_user

    return make_user("alice", roles=["member"], teams=[cluster.team_a])


@pytest.fixture
def bob(cluster):
    """A member of team-b."""
    from tests.builders import make_user

    return make_user("bob", roles=["member"], teams=[cluster.team_b])


@pytest.fixture
def olivia(cluster):
    """An operator of the platform team."""
    from tests.builders import make_user

    return make_user("olivia", roles=["operator"])


@pytest.fixture
def fiona(cluster):
    """Finance."""
    from tests.builders import make_user

    return make_user("fiona", roles=["finance"])


@pytest.fixture
def april(cluster):
    """An approver."""
    from tests.builders import make_user

    return make_user("april", roles=["approver"])


@pytest.fixture
def adam(cluster):
    """An admin."""
    from tests.builders import make_user

    return make_user("adam", roles=["admin"])


@pytest.fixture
def api_client():
    from rest_framework.test import APIClient

    return APIClient()
