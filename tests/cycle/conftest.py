import pytest

from broker.cycle.loader import forget_everything_loaded


@pytest.fixture
def committed_cluster():
    """The small cluster, and no record kept from another test (for tests whose writes commit)."""
    from tests.builders import build_small_cluster

    forget_everything_loaded()
    cluster = build_small_cluster()
    yield cluster
    forget_everything_loaded()


@pytest.fixture
def quiet_server():
    """No transaction older than this test's own left open on the PostgreSQL server.

    A load reads the change log from its snapshot's xmin, and pg_snapshot_xmin is the oldest transaction
    open anywhere on the server. One that another process or an earlier test left open would put every
    horizon before the flush that ended the previous test, whose log row means "everything", and the
    change-log tests would see a full read where they expect a patch. Waits for such transactions to
    end; ends those left idle in a transaction on this test database, which nothing will ever commit.
    Fails naming them if they outlive the wait."""
    import time

    from django.db import connection

    if connection.vendor != "postgresql":
        yield
        return
    query = (
        "SELECT pid, datname, state, now() - xact_start, left(query, 100) FROM pg_stat_activity "
        "WHERE pid <> pg_backend_pid() AND backend_type = 'client backend' AND xact_start IS NOT NULL "
        "AND xact_start < now() - interval '1 second'"
    )
    deadline = time.monotonic() + 20
    while True:
        with connection.cursor() as cursor:
            cursor.execute(query)
            holders = cursor.fetchall()
            for pid, database, state, _, _ in holders:
                if database == connection.settings_dict["NAME"] and state == "idle in transaction":
                    cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        if not holders:
            break
        if time.monotonic() > deadline:
            pytest.fail(f"transactions left open on the server: {holders}")
        time.sleep(0.2)
    yield
