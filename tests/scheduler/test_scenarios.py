"""Table-driven what-if scenarios: every tests/scenarios/*.yaml runs one cycle and is checked against its
`expect:` block (partial, readable expectations), then every suggestion it produced is applied and the
cycle re-run to show that the workload does start."""

from pathlib import Path

import pytest

from broker.scheduler.cycle import decide
from broker.scheduler.explanation import apply_suggestion
from broker.scheduler.scenario import load_scenario, result_to_json, scenario_expectations
from tests.scheduler.invariants import assert_valid_result

SCENARIOS = sorted((Path(__file__).parent.parent / "scenarios").glob("*.yaml"))


def run(path):
    text = path.read_text()
    snapshot = load_scenario(text)
    result = decide(snapshot)
    return snapshot, result, result_to_json(snapshot, result), scenario_expectations(text)


@pytest.mark.parametrize("path", SCENARIOS, ids=[path.stem for path in SCENARIOS])
def test_it_decides_scenario_as_expected(path):
    snapshot, result, output, expect = run(path)
    assert expect, f"{path.name} has no expect: block"
    assert_valid_result(snapshot, result)
    by_name = {workload["name"]: workload for workload in output["workloads"]}
    for name, wanted in expect.items():
        if name == "preempted":
            assert output["preempted"] == wanted
            continue
        if name == "evicted":
            assert len(output["evicted"]) == len(wanted), output["evicted"]
            pairs = zip(output["evicted"], wanted, strict=True)
            assert [{key: entry[key] for key in want} for entry, want in pairs] == wanted
            continue
        assert name in by_name, f"{name} missing from the output"
        check_workload(by_name[name], wanted)


@pytest.mark.parametrize("path", SCENARIOS, ids=[path.stem for path in SCENARIOS])
def test_it_only_suggests_changes_that_start_the_workload(path):
    snapshot, result, _, _ = run(path)
    for decision in result.pending:
        for suggestion in decision.suggestions:
            changed = decide(apply_suggestion(snapshot, decision.workload_id, suggestion))
            admitted = {admission.workload_id for admission in changed.admissions}
            assert decision.workload_id in admitted, f"{decision.workload_id}: {suggestion.description}"


def test_it_has_scenarios_for_every_reason_code_twice():
    from collections import Counter

    from broker.scheduler.snapshot import REASON_CODES

    seen = Counter()
    for path in SCENARIOS:
        for wanted in scenario_expectations(path.read_text()).values():
            if isinstance(wanted, dict) and wanted.get("reason"):
                seen[wanted["reason"]] += 1
    missing = {code: seen[code] for code in REASON_CODES if seen[code] < 2}
    assert not missing, f"reason codes covered fewer than twice: {missing}"


def check_workload(actual, wanted):
    name = actual["name"]
    for key, value in wanted.items():
        if key == "message_contains":
            for fragment in [value] if isinstance(value, str) else value:
                assert fragment in actual["message"], f"{name}: {fragment!r} not in {actual['message']!r}"
        elif key == "nodes":
            assert sorted({pod["node"] for pod in actual["placement"]}) == sorted(value), name
        elif key == "devices":
            assert [d for pod in actual["placement"] for d in pod["devices"]] == value, name
        elif key == "pods":
            assert len(actual["placement"]) == value, name
        elif key == "details":
            assert_subset(actual["details"], value, f"{name}.details")
        elif key == "domain":
            assert_subset(actual["domain"], value, f"{name}.domain")
        elif key == "suggestions":
            assert [s["kind"] for s in actual["suggestions"]] == value, f"{name}: {actual['suggestions']}"
        elif key == "suggestion_changes":
            assert [s["change"] for s in actual["suggestions"]] == value, f"{name}: {actual['suggestions']}"
        else:
            assert actual[key] == value, f"{name}.{key}: {actual[key]!r} != {value!r} ({actual['message']})"


def assert_subset(actual, wanted, where):
    if isinstance(wanted, dict):
        assert isinstance(actual, dict), f"{where}: {actual!r}"
        for key, value in wanted.items():
            assert key in actual, f"{where}: no {key} in {actual!r}"
            assert_subset(actual[key], value, f"{where}.{key}")
    else:
        assert actual == wanted, f"{where}: {actual!r} != {wanted!r}"
