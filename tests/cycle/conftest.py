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
