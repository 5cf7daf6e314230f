import pytest


@pytest.fixture(autouse=True)
def wall_clock_billing(settings):
    """The ledger's tests write allocations by hand at wall-clock times, not through the simulated
    executor: they bill on the wall clock (test_simulated_clock.py sets the demo's clock itself)."""
    settings.SIMULATION_SPEED = 1
