import pytest

from broker.costs import held


@pytest.fixture(autouse=True)
def wall_clock_billing(settings):
    """The ledger's tests write allocations by hand at wall-clock times, not through the simulated
    executor: they bill on the wall clock (test_simulated_clock.py sets the demo's clock itself)."""
    settings.SIMULATION_SPEED = 1


@pytest.fixture(autouse=True)
def nothing_kept():
    """Each test starts with no allocation groups kept by the process (the database is new to it)."""
    held.forget()
    yield
    held.forget()
