"""Estimated start times (filled in below)."""


def estimated_starts(cycle, waiting):
    return {}
