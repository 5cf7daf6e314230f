"""The top workloads' rounding (report.RoundedStep) is the ledger's largest-remainder rounding of every
line (ledger.round_lines), computed once per distinct amount: the same total, the same units per line."""

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.costs import ledger
from broker.costs.report import RoundedStep, _costliest, _near_top, _ranked

# Few distinct amounts and small units, so equal amounts, equal remainders and partial ties are common.
amounts = st.sampled_from([0, 1, 2, 3, 5, 7, 12, 100, 10**18 + 7])
steps = st.fixed_dictionaries(
    {
        "workloads": st.lists(amounts, max_size=25),
        "keys": st.randoms(use_true_random=False),
        "rest": st.lists(amounts, max_size=4),
        "unit": st.sampled_from([1, 2, 3, 4, 7, 10, 360_000]),
    }
)


def by_key_of(keys):
    def first(ids, limit):
        return sorted(ids, key=keys.__getitem__)[:limit]

    return first


@settings(max_examples=400, deadline=None)
@given(steps)
def test_it_rounds_every_line_as_the_ledger_does(step):
    workload_ids = list(range(100, 100 + len(step["workloads"])))
    shuffled = [f"team/w{n:03d}" for n in range(len(workload_ids))]
    step["keys"].shuffle(shuffled)
    keys = dict(zip(workload_ids, shuffled, strict=True))
    amounts_by_id = dict(zip(workload_ids, step["workloads"], strict=True))
    # The ledger's lines in line order: workloads by key, then the rest lines in their order.
    lines = {("w", keys[w]): amounts_by_id[w] for w in sorted(workload_ids, key=keys.__getitem__)}
    lines.update({("rest", order): amount for order, amount in enumerate(step["rest"])})
    total, expected = ledger.round_lines(lines, step["unit"])
    rounded = RoundedStep(amounts_by_id, step["rest"], step["unit"], by_key_of(keys))
    assert rounded.total == total
    assert {("w", keys[w]): rounded.of(w) for w in workload_ids} == {k: v for k, v in expected.items() if k[0] == "w"}
    assert rounded.rest == [expected[("rest", order)] for order in range(len(step["rest"]))]


def test_it_gives_the_last_units_of_a_tied_remainder_to_the_first_keys():
    """Three equal workloads and one unit left among them: the first key takes it, whatever its id."""
    keys = {1: "team/c", 2: "team/a", 3: "team/b"}
    rounded = RoundedStep({1: 1, 2: 1, 3: 1}, [], 3, by_key_of(keys))
    assert rounded.total == 1
    assert [rounded.of(w) for w in (1, 2, 3)] == [0, 1, 0]


class Keys:
    """WorkloadKeys over given keys, counting the workloads it is asked to order."""

    def __init__(self, keys):
        self.keys = keys
        self.asked = 0

    def first(self, ids, limit):
        self.asked += len(ids)
        return sorted(ids, key=self.keys.__getitem__)[:limit]


ranking = st.fixed_dictionaries(
    {
        "steps": st.lists(st.lists(amounts, min_size=1, max_size=12), min_size=1, max_size=3),
        "keys": st.randoms(use_true_random=False),
        "rest": st.lists(amounts, max_size=3),
        "unit": st.sampled_from([1, 2, 3, 7, 360_000]),
        "top": st.integers(1, 6),
        # Each workload's price: cents do not follow units across workloads, as with classes of two prices.
        "prices": st.lists(st.sampled_from([1, 2, 3]), min_size=12, max_size=12),
    }
)


@settings(max_examples=400, deadline=None)
@given(ranking)
def test_it_ranks_the_costliest_as_if_every_tie_were_decided(case):
    """The ranking asks the keys of a tied remainder only when it can matter; the top it keeps is the one
    that every workload's exact units and cents give."""
    workload_ids = list(range(100, 112))
    shuffled = [f"team/w{n:03d}" for n in range(len(workload_ids))]
    case["keys"].shuffle(shuffled)
    keys = dict(zip(workload_ids, shuffled, strict=True))

    def rounded_steps(first):
        out = []
        for step in case["steps"]:
            amounts_by_id = dict(zip(workload_ids, step, strict=False))
            units = RoundedStep(amounts_by_id, case["rest"], case["unit"], first)
            # Cents from the same amounts at each workload's price, rounded to a coarser unit.
            prices = dict(zip(workload_ids, case["prices"], strict=True))
            priced = {w: amount * prices[w] for w, amount in amounts_by_id.items()}
            cents = RoundedStep(priced, [a * 3 for a in case["rest"]], case["unit"] * 2, first)
            out.append((units, cents))
        return out

    exact = {}
    for units, cents in rounded_steps(Keys(keys).first):
        for w in units.amounts:
            exact[w] = exact.get(w, 0) + _ranked(cents.of(w), units.of(w))
    expected = set(_costliest(exact, case["top"], Keys(keys)))
    lazy_keys = Keys(keys)
    kept = _costliest(_near_top(rounded_steps(lazy_keys.first), case["top"]), case["top"], lazy_keys)
    assert len(kept) == len(expected) and set(kept) == expected


def test_it_does_not_ask_the_keys_of_a_tie_far_below_the_top():
    """A cycle started thousands of equal small workloads: which of them take the last units of a step
    decides nothing about the top, and ordering them is the costliest query of the report."""
    amounts_by_id = {1: 900, 2: 800} | {w: 1 for w in range(10, 10_010)}
    keys = Keys({w: f"team/w{w:05d}" for w in amounts_by_id})
    units = RoundedStep(amounts_by_id, [], 7, keys.first)
    cents = RoundedStep(amounts_by_id, [], 7, keys.first)
    assert units.tied_amounts == {1}
    assert set(_costliest(_near_top([(units, cents)], 2), 2, keys)) == {1, 2}
    assert keys.asked == 0
    assert units.of(1) + units.of(2) + sum(units.of(w) for w in range(10, 10_010)) == units.total
    assert keys.asked == 10_000  # asking one of the tied workloads decides the tie


def test_it_counts_the_cent_the_keys_may_give_a_workload_left_out():
    """Workload 1 takes the last cent of a tied remainder (its key is before workload 0's) and so ties
    workloads 2 and 3, of a larger amount, in cents and units, before them by key: left out at the first
    depth, its possible cent must keep the search going."""
    units_amounts = {0: 4, 1: 2, 2: 6, 3: 6, 4: 1, 5: 4}
    prices = {0: 1, 1: 2, 2: 1, 3: 1, 4: 3, 5: 3}
    keys = Keys({0: "t/k3", 1: "t/k0", 2: "t/k5", 3: "t/k1", 4: "t/k2", 5: "t/k4"})
    units = RoundedStep(units_amounts, [], 5, keys.first)
    cents = RoundedStep({w: amount * prices[w] for w, amount in units_amounts.items()}, [], 3, keys.first)
    exact = {w: _ranked(cents.of(w), units.of(w)) for w in units_amounts}
    assert set(_costliest(exact, 2, keys)) == {1, 5}
    assert set(_costliest(_near_top([(units, cents)], 2), 2, keys)) == {1, 5}
