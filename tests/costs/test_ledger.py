"""The pure ledger: the capacity bill splits with nothing lost, to the cent, for every window."""

from collections import defaultdict
from decimal import Decimal
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.costs import ledger

SECOND = 1_000_000
HOUR = 3600 * SECOND
MILLIONTH = Fraction(1, 1_000_000)
# A share of a shared device: what an allocation of it is billed, in millionths of a device.
shares = st.integers(1, 1_000_000).map(lambda units: units * MILLIONTH)


def brute_force(steps, now, prices, samples, intervals):
    """An independent oracle: walk every second (all inputs are whole seconds) and classify devices one
    second at a time, with the rule written out again from the brief."""
    out = [defaultdict(int) for _ in steps]
    allocated_lines = [defaultdict(int) for _ in steps]
    billed = [0 for _ in steps]  # device-microseconds: every device billed, held or free
    for index, (start, end) in enumerate(steps):
        for t in range(start, min(end, now), SECOND):
            for device_class in set(prices):
                price = [p for at, p in prices[device_class] if at <= t]
                price = price[-1] if price else prices[device_class][0][1]
                held = [
                    i
                    for i in intervals
                    if i.device_class == device_class and i.start <= t and (i.end is None or t < i.end)
                ]
                busy = sum(i.devices for i in held)
                for i in held:
                    allocated_lines[index][i.line] += i.devices * SECOND * price
                out[index]["allocated"] += busy * SECOND * price
                current = [s for s in samples.get(device_class, []) if s.at <= t]
                if not current:
                    billed[index] += busy * SECOND
                    continue
                sample = current[-1]
                billed[index] += max(sample.total, busy) * SECOND
                free = max(sample.total - busy, 0)
                unhealthy = min(free, sample.unhealthy)
                reserved = min(free - unhealthy, sum(n for _, n in sample.reserved))
                stranded = min(free - unhealthy - reserved, sample.stranded)
                idle = free - unhealthy - reserved - stranded
                for name, devices in (
                    ("unhealthy", unhealthy),
                    ("reserved_unused", reserved),
                    ("stranded", stranded),
                    ("idle", idle),
                ):
                    out[index][name] += devices * SECOND * price
    return out, allocated_lines, billed


def partly(draw, whole, shared):
    """`whole` devices, plus with `shared` a part of a device that shares leave (Fraction)."""
    return whole + (draw(st.one_of(st.just(0), shares)) if shared else 0)


@st.composite
def scenarios(draw, shared=False):
    """Random steps, prices, samples and allocations; with `shared`, allocations of shared devices
    billed their shares and samples with the fractional parts shared devices leave free."""
    horizon = draw(st.integers(20, 120))
    seconds = st.integers(0, horizon)
    classes = draw(st.lists(st.sampled_from(["h100", "a100", "l4"]), min_size=1, max_size=2, unique=True))
    prices = {}
    for device_class in classes:
        changes = sorted(set(draw(st.lists(seconds, max_size=3))))
        prices[device_class] = [(0, draw(st.integers(0, 123_456)))] + [
            (at * SECOND, draw(st.integers(0, 123_456))) for at in changes if at > 0
        ]
    samples = {}
    for device_class in draw(st.lists(st.sampled_from(classes), unique=True)):
        times = sorted(set(draw(st.lists(seconds, min_size=1, max_size=4))))
        samples[device_class] = [
            ledger.Sample(
                at=at * SECOND,
                total=partly(draw, draw(st.integers(0, 12)), shared),
                unhealthy=partly(draw, draw(st.integers(0, 4)), shared),
                stranded=partly(draw, draw(st.integers(0, 4)), shared),
                reserved=tuple(
                    (team, draw(st.integers(0, 3)))
                    for team in draw(st.lists(st.sampled_from(["team-a", "team-b"]), unique=True))
                ),
            )
            for at in times
        ]
    intervals = []
    for n in range(draw(st.integers(0, 8))):
        start = draw(seconds)
        end = draw(st.one_of(st.none(), st.integers(start, horizon + 10)))
        intervals.append(
            ledger.Interval(
                start=start * SECOND,
                end=None if end is None else end * SECOND,
                device_class=draw(st.sampled_from(classes)),
                line=f"w{n % 4}",
                devices=draw(st.one_of(st.integers(1, 4), shares) if shared else st.integers(1, 4)),
            )
        )
    cuts = sorted(set(draw(st.lists(st.integers(1, horizon - 1), max_size=4))))
    window_start = draw(st.integers(0, 5)) * SECOND
    bounds = [window_start] + [c * SECOND for c in cuts if c * SECOND > window_start] + [horizon * SECOND]
    steps = list(zip(bounds, bounds[1:], strict=False))
    now = draw(st.integers(1, horizon + 5)) * SECOND
    return steps, now, prices, samples, intervals


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_it_splits_every_step_exactly_like_the_second_by_second_oracle(scenario):
    steps, now, prices, samples, intervals = scenario
    ledgers = ledger.build_ledger(steps, now, prices, samples, intervals)
    expected, expected_lines, _ = brute_force(steps, now, prices, samples, intervals)
    for step, want, want_lines in zip(ledgers, expected, expected_lines, strict=True):
        got = defaultdict(int)
        lines = defaultdict(int)
        for (line, _), amount in step.allocated.items():
            got["allocated"] += amount.raw
            lines[line] += amount.raw
        for (category, _, _), amount in step.capacity.items():
            got[category] += amount.raw
        assert {k: v for k, v in got.items() if v} == {k: v for k, v in want.items() if v}
        assert {k: v for k, v in lines.items() if v} == {k: v for k, v in want_lines.items() if v}


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_it_rounds_each_step_so_the_lines_sum_to_the_total_to_the_cent(scenario):
    steps, now, prices, samples, intervals = scenario
    for step in ledger.build_ledger(steps, now, prices, samples, intervals):
        leaves = {("allocated", line, dc): amount.raw for (line, dc), amount in step.allocated.items()}
        leaves |= {key: amount.raw for key, amount in step.capacity.items()}
        exact_total = Fraction(step.total().raw) / ledger.RAW_PER_CENT
        total, cents = ledger.round_lines(leaves, ledger.RAW_PER_CENT)
        assert sum(cents.values()) == total
        assert abs(total - exact_total) <= Fraction(1, 2)
        for leaf, raw in leaves.items():
            assert abs(cents[leaf] - Fraction(raw) / ledger.RAW_PER_CENT) < Fraction(3, 2)
        # The split: allocated + idle + stranded + unhealthy + reserved-unused is the capacity total.
        by_category = defaultdict(int)
        for leaf, value in cents.items():
            by_category[leaf[0]] += value
        assert sum(by_category[name] for name in ledger.CATEGORIES) == total


@settings(max_examples=150, deadline=None)
@given(scenarios(shared=True))
def test_it_bills_shares_of_shared_devices_exactly_like_the_second_by_second_oracle(scenario):
    test_it_splits_every_step_exactly_like_the_second_by_second_oracle.hypothesis.inner_test(scenario)
    test_it_rounds_each_step_so_the_lines_sum_to_the_total_to_the_cent.hypothesis.inner_test(scenario)


@settings(max_examples=150, deadline=None)
@given(scenarios(shared=True))
def test_it_puts_every_device_billed_in_exactly_one_category_with_shared_devices(scenario):
    steps, now, prices, samples, intervals = scenario
    _, _, billed = brute_force(steps, now, prices, samples, intervals)
    for step, devices_billed in zip(ledger.build_ledger(steps, now, prices, samples, intervals), billed, strict=True):
        by_category = defaultdict(int)
        for amount in step.allocated.values():
            by_category["allocated"] += amount.device_us
        for (category, _, _), amount in step.capacity.items():
            by_category[category] += amount.device_us
        assert set(by_category) <= set(ledger.CATEGORIES)
        assert all(value >= 0 for value in by_category.values())
        assert sum(by_category.values()) == devices_billed
        # Rounded to the reported 1/10000 device-hour, the categories still add up to the total.
        total, units = ledger.round_lines(by_category, ledger.MICROS_PER_TEN_THOUSANDTH_HOUR)
        assert sum(units.values()) == total


@given(st.integers(0, 10**9), st.lists(st.integers(0, 10**12), min_size=1, max_size=12))
def test_it_apportions_by_largest_remainder(total, weights):
    weights = {index: weight for index, weight in enumerate(weights)}
    if not sum(weights.values()):
        total = 0
    shares = ledger.apportion(total, weights)
    assert sum(shares.values()) == total
    weight_sum = sum(weights.values()) or 1
    for key, weight in weights.items():
        assert abs(shares[key] - Decimal(total * weight) / weight_sum) < 1


def test_it_bills_a_held_device_at_the_old_price_before_a_change_and_the_new_after():
    prices = {"h100": [(0, 40_000), (2 * HOUR, 60_000)]}  # 4.00/h, then 6.00/h from hour 2
    held = [ledger.Interval(start=HOUR, end=3 * HOUR, device_class="h100", line="job")]
    [step] = ledger.build_ledger([(0, 4 * HOUR)], 10 * HOUR, prices, {}, held)
    total, cents = ledger.round_lines({"job": step.allocated[("job", "h100")].raw}, ledger.RAW_PER_CENT)
    assert total == 400 + 600


def test_it_clamps_sampled_categories_to_the_free_devices():
    sample = ledger.Sample(at=0, total=4, unhealthy=2, stranded=2, reserved=(("team-b", 2), ("team-a", 2)))
    parts = dict(ledger.split_capacity(1, sample))
    assert parts == {
        ("unhealthy", None): 2,
        ("reserved_unused", "team-a"): 1,
        ("reserved_unused", "team-b"): 0,
        ("stranded", None): 0,
        ("idle", None): 0,
    }


def test_it_bills_nothing_after_now_and_only_held_devices_before_the_first_sample():
    prices = {"h100": [(0, 10_000)]}
    samples = {"h100": [ledger.Sample(at=2 * HOUR, total=8)]}
    held = [ledger.Interval(start=0, end=None, device_class="h100", line="job")]
    steps = [(0, 2 * HOUR), (2 * HOUR, 4 * HOUR), (4 * HOUR, 6 * HOUR)]
    first, second, third = ledger.build_ledger(steps, 3 * HOUR, prices, samples, held)
    assert first.total().device_us == 2 * HOUR
    assert second.total().device_us == 8 * HOUR  # 8 devices for the hour up to now
    assert second.capacity[("idle", "h100", None)].device_us == 7 * HOUR
    assert third.total().device_us == 0


def test_it_bills_two_halves_of_a_shared_device_one_device_hour_and_nothing_free():
    prices = {"h100": [(0, 40_000)]}  # 4.00/h
    samples = {"h100": [ledger.Sample(at=0, total=1)]}
    half = Fraction(1, 2)
    held = [ledger.Interval(0, HOUR, "h100", line, half) for line in ("a", "b")]
    [step] = ledger.build_ledger([(0, HOUR)], HOUR, prices, samples, held)
    assert step.allocated[("a", "h100")].device_us == step.allocated[("b", "h100")].device_us == HOUR / 2
    assert step.total().device_us == HOUR
    assert all(not amount.device_us for amount in step.capacity.values())
    total, cents = ledger.round_lines({line: step.allocated[(line, "h100")].raw for line in "ab"}, ledger.RAW_PER_CENT)
    assert (total, cents) == (400, {"a": 200, "b": 200})


def test_it_bills_what_a_share_leaves_of_a_device_in_the_sampled_category():
    prices = {"h100": [(0, 40_000)]}
    # One shared device, a quarter of it used; the rest of it takes no new work (unhealthy).
    samples = {"h100": [ledger.Sample(at=0, total=1, unhealthy=Fraction(3, 4))]}
    held = [ledger.Interval(0, HOUR, "h100", "a", Fraction(1, 4))]
    [step] = ledger.build_ledger([(0, HOUR)], HOUR, prices, samples, held)
    assert step.allocated[("a", "h100")].device_us == HOUR / 4
    assert step.capacity[("unhealthy", "h100", None)].device_us == 3 * HOUR / 4
    assert ("idle", "h100", None) not in step.capacity


@given(st.integers(0, 10**15), st.integers(0, 10**6 - 1))
def test_it_stores_an_amount_as_whole_units_and_millionths_without_loss(whole, millionths):
    value = whole + Fraction(millionths, 1_000_000)
    assert ledger.whole_and_millionths(value) == (whole, millionths)
    assert ledger.from_millionths(whole, millionths) == value
    assert ledger.whole_and_millionths(whole) == (whole, 0)
