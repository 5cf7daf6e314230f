"""The cost ledger: pure functions over integer time intervals, no ORM and no clock.

Units (all exact integers, so nothing is lost before the final rounding):
  time      microseconds since the Unix epoch;
  price     1/10000 currency units per device-hour (prices have 4 decimal places);
  raw cost  device-microseconds x price units. One cent is RAW_PER_CENT raw units.
  devices   whole devices, or for an allocation of a shared device its share of the device
            (broker.scheduler.accounting.device_share: the largest fraction among the capacities it
            consumes), an exact Fraction in millionths of a device (SHARE_SCALE). Amounts are then
            exact Fractions of that denominator (integers whenever only whole devices are billed), and
            the hourly rollups store them as whole units plus millionths (rollup.py).

The capacity bill of a device class over a stretch of time where nothing changes (same allocations,
same capacity sample, same price) splits as:

  allocated  the active allocations of the class (from Allocation intervals, exactly);
  free       sample.total - allocated, never below 0 (devices added between samples may be allocated before
             the next sample counts them: then the total is the allocated count, nothing is free);
  unhealthy  min(sample.unhealthy, free), then
  reserved   per reserving team in team-name order, min(team's reserved unused, what is left), then
  stranded   min(sample.stranded, what is left), and
  idle       whatever free capacity is left.

Every category is clamped by what is left, so each is >= 0 and they add up to allocated + free, the
devices billed in that stretch, by construction. Before a class's first sample its capacity is unknown:
only allocated devices are billed.

A device several allocations share is one device of the sample's total; its allocations are billed
their shares, so what they leave of it is free, and the sample's fractional parts say where it goes
(Sample: shared remainders count in unhealthy and stranded, what shares bill beyond one device in
total). Half a shared GPU held for an hour by each of two workloads bills two half device-hours, one
in all, and nothing free.

Rounding, the one documented rule: money is rounded to the cent once, per step, over the step's leaf lines
(each allocation key, idle, stranded, unhealthy, each team's reserved unused). The step total is the exact
raw total rounded half up to the cent; the cents are then shared among the lines by largest remainder
(Hamilton), ties broken by line order. So the lines of a step always sum to the step total exactly, each
line is within one cent of its exact value, and a window's totals are the sums of its steps.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction

from broker.scheduler.accounting import SHARE_SCALE

MICROS_PER_HOUR = 3_600_000_000
PRICE_SCALE = 10_000
RAW_PER_CENT = MICROS_PER_HOUR * PRICE_SCALE // 100  # device-microseconds x price units in one cent
MICROS_PER_TEN_THOUSANDTH_HOUR = MICROS_PER_HOUR // 10_000  # device-hours are reported to 4 places

CATEGORIES = ("allocated", "unhealthy", "reserved_unused", "stranded", "idle")


@dataclass(frozen=True)
class Sample:
    """Free capacity of one class from `at` until the next sample. reserved: ((team, devices), ...).
    Counts are whole devices plus, with shared devices, Fractions of one (report.capacity_samples)."""

    at: int
    total: int
    unhealthy: int = 0
    stranded: int = 0
    reserved: tuple = ()


@dataclass(frozen=True)
class Interval:
    """`devices` devices held from start to end (None = still held) under `device_class`, charged to `line`."""

    start: int
    end: int | None
    device_class: object
    line: object
    devices: int = 1


@dataclass
class Amount:
    device_us: int = 0
    raw: int = 0

    def add(self, devices, length, price):
        self.device_us += devices * length
        self.raw += devices * length * price


@dataclass
class StepLedger:
    """Exact (unrounded) amounts of one step. Keys of `allocated` are (line, device class); keys of
    `capacity` are (category, device class, team or None) for the unallocated categories."""

    start: int
    end: int
    allocated: dict = field(default_factory=lambda: defaultdict(Amount))
    capacity: dict = field(default_factory=lambda: defaultdict(Amount))

    def drop_empty_lines(self):
        """Forget allocated lines whose amounts cancelled out: intervals taken out and put back (the
        checkpoint's corrections) leave a line of zeros where the history has none."""
        for key in [key for key, amount in self.allocated.items() if not amount.device_us and not amount.raw]:
            del self.allocated[key]

    def total(self):
        out = Amount()
        for amount in (*self.allocated.values(), *self.capacity.values()):
            out.device_us += amount.device_us
            out.raw += amount.raw
        return out


# --- time --------------------------------------------------------------------------------------------------


def price_at(timeline, t):
    """The price in force at t. Before the first recorded price the first price applies (a class's first
    price is its only price until the first change)."""
    index = bisect_right(timeline, t, key=lambda row: row[0]) - 1
    return timeline[max(index, 0)][1]


def split_points(start, end, *sorted_lists):
    """start, end and every point strictly between them from the sorted lists, ascending, unique."""
    points = {start, end}
    for values in sorted_lists:
        lo = bisect_right(values, start)
        for value in values[lo:]:
            if value >= end:
                break
            points.add(value)
    return sorted(points)


# --- the ledger ----------------------------------------------------------------------------------------------


def build_ledger(steps, now, prices, samples, intervals, scale=1):
    """The exact ledger of every step.

    steps: [(start, end), ...] ascending and contiguous; time at or after `now` is not billed yet.
    prices: {device class: [(from, price units), ...] ascending}.
    samples: {device class: [Sample, ...] ascending by at}.
    intervals: [Interval, ...] (any order).
    scale: simulated time per unit of the times above (broker.clock.billing_scale): every length billed
      is scaled by it, so the bill runs on the simulated executor's clock. An integer scale is exact;
      a fraction is floored per stretch.
    """
    ledgers = [StepLedger(start, end) for start, end in steps]
    if not steps:
        return ledgers
    window_start, window_end = steps[0][0], min(steps[-1][1], now)
    if window_end <= window_start:
        return ledgers
    step_starts = [start for start, _ in steps]
    by_class = defaultdict(list)
    for interval in intervals:
        end = window_end if interval.end is None else min(interval.end, window_end)
        if end > window_start and interval.start < window_end and end > interval.start:
            start = max(interval.start, window_start)
            by_class[interval.device_class].append((start, end, interval.line, interval.devices))
    for device_class in set(by_class) | set(samples):
        timeline = prices.get(device_class)
        if not timeline:
            raise ValueError(f"no price for device class {device_class!r}")
        price_times = [at for at, _ in timeline]
        held = by_class.get(device_class, [])
        _charge_allocations(ledgers, step_starts, device_class, held, timeline, price_times, scale)
        _charge_capacity(
            ledgers,
            step_starts,
            window_start,
            window_end,
            device_class,
            held,
            samples.get(device_class, []),
            timeline,
            scale,
        )
    return ledgers


def _charge_allocations(ledgers, step_starts, device_class, held, timeline, price_times, scale=1):
    for start, end, line, devices in held:
        for a, b in _pairs(split_points(start, end, step_starts, price_times)):
            step = ledgers[bisect_right(step_starts, a) - 1]
            step.allocated[(line, device_class)].add(devices, scaled(b - a, scale), price_at(timeline, a))


def scaled(length, scale):
    if scale == 1:
        return length
    return length * scale.numerator // scale.denominator


def _charge_capacity(ledgers, step_starts, window_start, window_end, device_class, held, samples, timeline, scale=1):
    if not samples:
        return  # capacity unknown: only what is held is billed
    changes = defaultdict(int)
    for start, end, _, devices in held:
        changes[start] += devices
        changes[end] -= devices
    sample_times = [sample.at for sample in samples]
    points = split_points(
        window_start, window_end, step_starts, [at for at, _ in timeline], sample_times, sorted(changes)
    )
    active = 0
    for a, b in _pairs(points):
        active += changes.get(a, 0)
        index = bisect_right(sample_times, a) - 1
        sample = samples[index] if index >= 0 else None
        parts = split_capacity(active, sample)
        step = ledgers[bisect_right(step_starts, a) - 1]
        price = price_at(timeline, a)
        for key, devices in parts:
            if devices:
                step.capacity[(key[0], device_class, key[1])].add(devices, scaled(b - a, scale), price)


def split_capacity(allocated, sample):
    """[((category, team or None), devices), ...] for the unallocated devices of one stretch (see the
    module docstring for the order and the clamping)."""
    if sample is None:
        return []
    left = max(0, sample.total - allocated)
    out = []
    unhealthy = min(sample.unhealthy, left)
    left -= unhealthy
    out.append((("unhealthy", None), unhealthy))
    for team, devices in sorted(sample.reserved):
        taken = min(devices, left)
        left -= taken
        out.append((("reserved_unused", team), taken))
    stranded = min(sample.stranded, left)
    left -= stranded
    out.append((("stranded", None), stranded))
    out.append((("idle", None), left))
    return out


def _pairs(points):
    return zip(points, points[1:], strict=False)


# --- rounding ------------------------------------------------------------------------------------------------


def apportion(total, weights):
    """Share the integer `total` among the keys of `weights` (non-negative integers) in proportion, by
    largest remainder; ties go to the key that comes first in `weights`. The result sums to `total`."""
    keys = list(weights)
    weight_sum = sum(weights.values())
    if not keys:
        return {}
    if weight_sum == 0:
        if total:
            raise ValueError("cannot share a non-zero total among zero weights")
        return dict.fromkeys(keys, 0)
    shares, remainders = {}, []
    for order, key in enumerate(keys):
        share, remainder = divmod(total * weights[key], weight_sum)
        shares[key] = share
        remainders.append((-remainder, order, key))
    remainders.sort()
    for _, _, key in remainders[: total - sum(shares.values())]:
        shares[key] += 1
    return shares


def whole_and_millionths(value):
    """(whole units, millionths) of an amount (an int, or a Fraction in millionths of a device): the
    exact value is whole + millionths / SHARE_SCALE, with 0 <= millionths < SHARE_SCALE."""
    if isinstance(value, int):
        return value, 0
    whole = value.numerator // value.denominator
    millionths = (value - whole) * SHARE_SCALE
    if millionths.denominator != 1:
        raise ValueError(f"{value} is not a whole number of millionths")
    return whole, int(millionths)


def in_millionths(value):
    """An amount (see whole_and_millionths) as a whole number of millionths of its unit."""
    whole, millionths = whole_and_millionths(value)
    return whole * SHARE_SCALE + millionths


def from_millionths(whole, millionths):
    """The amount stored as (whole units, millionths): an int when there are no millionths."""
    return whole + Fraction(millionths, SHARE_SCALE) if millionths else whole


def round_half_up(numerator, denominator):
    return (2 * numerator + denominator) // (2 * denominator)


def round_lines(raw_by_line, unit):
    """(total units, {line: units}): the exact total rounded half up, shared by largest remainder."""
    total = round_half_up(sum(raw_by_line.values()), unit)
    return total, apportion(total, raw_by_line)


def cents_to_money(cents):
    return (Decimal(cents) / 100).quantize(Decimal("0.01"))


def ten_thousandths_to_hours(units):
    return (Decimal(units) / 10_000).quantize(Decimal("0.0001"))
