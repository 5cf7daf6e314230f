"""Explanations of one shape share their encoded JSON within a commit, and only what is truly shared."""

from bench.saturated import saturated_snapshot
from broker.cycle.commit import CANONICAL_JSON, SharedTexts, encode_explanation, explanation_content, suggestion_dicts
from broker.scheduler.cycle import decide
from broker.scheduler.snapshot import Suggestion


def test_it_encodes_a_saturated_queue_as_each_explanation_alone():
    result = decide(saturated_snapshot(120, 900, sizes=None, seed=3))
    shared = SharedTexts()
    contents = [explanation_content(decision, shared) for decision in result.pending]

    assert contents == [explanation_content(decision) for decision in result.pending]
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


def test_it_writes_scalars_as_json_does_and_keeps_equal_values_of_other_types_apart():
    shared = SharedTexts()
    values = ["Priority", "needs 1 pod × 4 h100", 7, 1.0, True, 1, None, -3, 2.5, "1"]

    assert [shared.text(value) for value in values + values] == [CANONICAL_JSON.encode(v) for v in values + values]


def test_it_hands_decisions_of_one_shape_one_suggestions_list():
    shared = SharedTexts()
    suggestions = (Suggestion("IncreaseQuota", "raise research's h100 quota by 8", {"queue": "research"}),)

    first = shared.suggestions(suggestions)

    assert shared.suggestions(suggestions) is first
    assert first == suggestion_dicts(suggestions)
    assert shared.encode(first) == CANONICAL_JSON.encode(first)


def test_it_makes_the_stored_row_each_explanation_alone_would_make_sharing_its_json_texts():
    from datetime import UTC, datetime

    from broker.cycle.bulk import JsonText
    from broker.cycle.commit import stored_row

    result = decide(saturated_snapshot(120, 900, sizes=None, seed=3))
    shared = SharedTexts()
    now = datetime(2026, 11, 30, tzinfo=UTC)
    rows = []
    for pk, decision in enumerate(result.pending):
        content = explanation_content(decision, shared)
        encoded = encode_explanation(content, shared)
        rows.append(shared.stored_row(pk, 7, now, content, encoded))
        assert rows[-1] == stored_row(pk, 7, now, explanation_content(decision))

    json_columns = [4, 6, 10]  # secondary, details, suggestions
    assert all(type(row[i]) is JsonText for row in rows for i in json_columns)
    distinct = {id(row[i]) for row in rows for i in json_columns}
    assert len(distinct) == len({row[i] for row in rows for i in json_columns}) < len(rows)
