"""Explanations of one shape share their encoded JSON within a commit, and only what is truly shared."""

from bench.saturated import saturated_snapshot
from broker.cycle.commit import CANONICAL_JSON, SharedTexts, encode_explanation, explanation_content
from broker.scheduler.cycle import decide


def test_it_encodes_a_saturated_queue_as_each_explanation_alone():
    result = decide(saturated_snapshot(120, 900, sizes=None, seed=3))
    contents = [explanation_content(decision) for decision in result.pending]
    shared = SharedTexts()

    assert [encode_explanation(content, shared) for content in contents] == [
        encode_explanation(content) for content in contents
    ]
    assert len(shared._texts) < len(contents) / 3, "workloads of one shape share their texts"


def test_it_tells_apart_dicts_of_equal_keys_and_other_values():
    shared = SharedTexts()
    needed = {"devices": 8}
    first = {"needed": needed, "free": 3}
    same_objects = {"needed": needed, "free": 3}
    other = {"needed": {"devices": 8}, "free": 4}

    texts = [shared.encode(value) for value in (first, same_objects, other)]

    assert texts == [CANONICAL_JSON.encode(value) for value in (first, same_objects, other)]
    assert texts[0] == texts[1] != texts[2]
    assert len(shared._texts) == 2
