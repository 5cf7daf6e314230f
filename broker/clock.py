"""The simulation's one clock: how much simulated time passes per second of the wall clock.

The simulated executor runs each workload's expected duration SIMULATION_SPEED times faster than the
wall clock; whatever measures the simulated world's time in money (the cost ledger) must run on the same
clock, or a 6 h job of 56 devices costs what 90 s of them cost (issue 29). A real executor (EXECUTOR
other than "simulated") runs on the wall clock: the speed is 1.
"""

from fractions import Fraction

from django.conf import settings

# Exact scales for the integer ledger: SIMULATION_SPEED=0.5 or 240 is exact, 1/3 is near enough.
MAX_DENOMINATOR = 1000


def simulation_speed():
    """Simulated seconds per wall-clock second under the simulated executor."""
    return float(settings.SIMULATION_SPEED)


def speed():
    """Simulated seconds per wall-clock second of the executor in use."""
    return simulation_speed() if settings.EXECUTOR == "simulated" else 1.0


def billing_scale():
    """speed() as a fraction, for the cost ledger's integer microseconds."""
    return Fraction(speed()).limit_denominator(MAX_DENOMINATOR)
