"""Kubernetes quantities ("80Gi", "500m", 7) as plain numbers: DRA publishes capacities and counters so,
and the decision core compares numbers."""

import re

QUANTITY = re.compile(r"^\s*([0-9.]+)\s*([KMGTPE]i?|[mk])?\s*$")
SUFFIXES = {
    None: 1,
    "m": 0.001,
    "k": 1e3,
    "K": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


def quantity(value):
    """The number a quantity stands for (an int when whole), or None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value
    match = QUANTITY.match(str(value))
    if not match:
        return None
    try:
        number = float(match.group(1)) * SUFFIXES[match.group(2)]
    except ValueError:  # "1.2.3"
        return None
    return int(number) if number.is_integer() else number


def numbers(amounts) -> dict:
    """{name: number} of a capacity or consumedCapacity as stored ({name: quantity}); names whose value is
    no quantity are left out."""
    out = {}
    for name, value in (amounts or {}).items():
        number = quantity(value)
        if number is not None:
            out[name] = number
    return out
