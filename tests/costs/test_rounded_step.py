"""The top workloads' rounding (report.RoundedStep) is the ledger's largest-remainder rounding of every
line (ledger.round_lines), computed once per distinct amount: the same total, the same units per line."""

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.costs import ledger
from broker.costs.report import RoundedStep

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
