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


def test_it_keeps_details_by_the_identities_of_their_values_and_writes_mixed_keys_as_json_does():
    import json

    from broker.cycle.commit import details_texts

    shared = SharedTexts()
    needed = {"devices": 8}
    note = "estimated from 12 running workloads"
    first = {"needed": needed, "free": 3, "estimate": note}
    same_objects = {"needed": needed, "free": 3, "estimate": note}
    other_note = {"needed": needed, "free": 3, "estimate": "estimated from 13 running workloads"}
    other_value = {"needed": {"devices": 9}, "free": 3, "estimate": note}
    mixed_keys = {1: "one", "two": 2}

    texts = [shared.details_texts(details) for details in (first, same_objects, other_note, other_value)]

    assert texts == [details_texts(d, CANONICAL_JSON.encode) for d in (first, same_objects, other_note, other_value)]
    assert texts[0] is texts[1]
    assert texts[2][0] == texts[0][0] and texts[2][1] != texts[0][1]  # same rest, another stored note
    assert texts[2][2] == texts[0][2] == CANONICAL_JSON.encode("estimated from # running workloads")
    assert texts[3][0] != texts[0][0]
    content = {"reason": "Priority", "message": "m", "position_in_queue": 1, "position_in_cluster": 2,
               "secondary": [], "details": mixed_keys, "suggestions": []}  # fmt: skip
    alone, with_shared = encode_explanation(content), encode_explanation(content, SharedTexts())
    assert alone == with_shared
    assert json.loads(alone[0]["details"]) == {"1": "one", "two": 2}


def test_it_hashes_the_texts_of_one_shape_once():
    shared = SharedTexts()
    shape = (shared.encode(["Quota"]), shared.encode({"needs": 8}), "null", shared.encode([]))
    other = ("[]", *shape[1:])

    assert shared.hasher(shape) is shared.hasher(tuple(shape))
    assert shared.hasher(other) is not shared.hasher(shape)
    assert shared.hasher(shape).hexdigest() != shared.hasher(other).hexdigest()
