"""`python -m bench.run` still runs and writes a report of the documented shape (no timings checked:
speed targets live in the benchmark, not in tests)."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def quick_bench(tmp_path, sections, timeout, **environment):
    """(completed process, report) of `python -m bench.run --quick --only <sections>`."""
    out = tmp_path / "report.json"
    completed = subprocess.run(
        [sys.executable, "-m", "bench.run", "--quick", "--only", sections, "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **environment},
    )
    assert completed.returncode == 0, completed.stderr
    return completed, json.loads(out.read_text())


def test_it_writes_a_quick_report_of_the_decide_and_replay_sections(tmp_path):
    completed, report = quick_bench(tmp_path, "decide,replay", timeout=120)
    assert set(report) >= {"machine", "sections", "quick", "total_seconds"}
    assert report["quick"] is True
    assert {"cores", "python", "load_average_at_start"} <= set(report["machine"])
    assert report["machine"]["reference_seconds_at_start"] > 0 and report["machine"]["reference_seconds_at_end"] > 0
    assert 0 <= report["machine"]["cpu_steal_percent"] < 100
    assert set(report["sections"]) == {"decide", "replay"}

    decide = report["sections"]["decide"]
    assert "error" not in decide, decide
    assert len(decide["cases"]) == 4
    assert {case["kind"] for case in decide["cases"]} == {"fresh", "saturated"}
    for case in decide["cases"]:
        assert "error" not in case, case
        assert case["devices"] == case["nodes"] * 8
        assert case["decide_seconds_median"] > 0
        assert case["decide_seconds_cold_median"] > 0
        assert case["tracemalloc_peak_mb"] > 0
        assert case["admitted"] + sum(case["pending_reasons"].values()) == case["pending"]
    assert set(decide["target"]) >= {"seconds", "pass"}
    assert decide["gang_sizes"]["source"].endswith("philly.csv (num_gpus)") and decide["gang_sizes"]["jobs"] > 1000

    replay = report["sections"]["replay"]
    assert "error" not in replay, replay
    assert replay["slice"]["cluster"] == {"machines": 552, "devices": 2490}
    for key in ("protection_on", "protection_off"):
        run = replay[key]
        assert run["jobs_arrived"] == replay["slice"]["jobs"] > 0
        assert 0 < run["utilisation"] <= 1
        assert run["jobs_started"] + run["jobs_never_started"] == run["jobs_arrived"]
        assert set(run["large_gangs"]) >= {"arrived", "never_started", "max_wait_including_unstarted_s"}
        assert set(run["estimated_start"]) >= {"abs_error_median_s", "abs_error_p90_s", "measured"}
    assert replay["protection_on"]["backfill_protection"] is True
    assert replay["protection_off"]["backfill_protection"] is False
    assert set(replay["ratios"]) >= {"utilisation_on_over_off"}
    assert isinstance(replay["target"]["pass"], bool)
    assert "decide" in completed.stdout and "replay" in completed.stdout


def test_it_compares_todays_rules_with_short_waits_on_the_same_slice(tmp_path):
    completed, report = quick_bench(tmp_path, "waits", timeout=180)
    waits = report["sections"]["waits"]
    assert "error" not in waits, waits
    assert [comparison["tick_s"] for comparison in waits["comparisons"]] == [300.0, 60.0]
    for comparison in waits["comparisons"]:
        today, short = comparison["today"], comparison["short_waits"]
        for run in (today, short):
            # Arrivals stop at the end of the window, the run goes on until every job finished.
            assert run["jobs_finished"] == run["jobs"] == waits["slice"]["jobs"] > 0
            assert sum(size["jobs"] for size in run["wait_by_size"].values()) == run["jobs"]
            assert run["gangs_spread_over_extra_racks"] == 0
        assert today["preemptions"] == 0 and today["lost_device_hours"] == 0
        assert short["config"]["enable_preemption"] is True
        assert short["most_preemptions_of_one_job"] <= short["config"]["max_preemptions_per_workload"]
        # Each preemption costs its class's checkpoint-restart seconds of the victim's devices.
        assert (short["lost_device_hours"] > 0) == (short["preemptions"] > 0)
    # A quick slice preempts nothing, so the check above holds whether lost work is counted or not;
    # the known case preempts once, and must count exactly one checkpoint-restart of one GPU.
    known = waits["known_preemption"]
    assert known["today"]["preemptions"] == 0 and known["today"]["lost_device_seconds"] == 0
    expected = known["expected_short_waits"]
    assert expected["lost_device_seconds"] > 0
    assert known["short_waits"]["preemptions"] == expected["preemptions"] == 1
    assert known["short_waits"]["lost_device_seconds"] == expected["lost_device_seconds"]
    assert known["short_waits"]["inference_wait_s"] < known["today"]["inference_wait_s"]
    assert isinstance(waits["target"]["pass"], bool)
    assert "waits" in completed.stdout


def test_it_measures_the_machine_by_a_fixed_workload():
    from bench import machine_speed

    assert machine_speed.reference_workload() == machine_speed.reference_workload()
    before = machine_speed.cpu_times()
    assert before is not None and before[0] <= before[1]
    assert 0 < machine_speed.reference_seconds(repeat=2) < 10
    # The bench's readings come from a new interpreter, not from its own (large, fragmented) heap.
    assert 0 < machine_speed.fresh_reference_seconds(repeat=1) < 10


def test_it_times_each_cycle_on_postgresql_until_its_transaction_committed(tmp_path):
    """The cycle section's target holds `committed_ms`: the phases plus the lock, the cycle row and the
    COMMIT, which the phases alone leave out."""
    from django.conf import settings

    if settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        pytest.skip("the cycle section needs a PostgreSQL server")
    completed, report = quick_bench(tmp_path, "cycle", timeout=300, BENCH_DATABASE_NAME=f"bench_smoke_{os.getpid()}")
    cycle = report["sections"]["cycle"]
    assert "error" not in cycle, cycle
    assert cycle["gang_sizes"]["jobs"] > 1000
    (case,) = cycle["cases"]
    for name in ("first", "refill", "steady", "health_flap", "steady_cold", "restarted_worker"):
        run = case[name]
        assert run["outcome"] == "Committed", run
        assert run["load_ms"] + run["decide_ms"] + run["commit_ms"] <= run["committed_ms"] <= run["run_once_wall_ms"]
        assert abs(run["after_commit_ms"] - (run["run_once_wall_ms"] - run["committed_ms"])) <= 0.2
        assert run["gc_ms"] >= 0 and run["gc_collections"] >= 0
        assert 0 < run["reference_seconds_before"] < 10, "the machine's speed right before the cycle"
        assert run["after_commit_read_back_ms"] >= 0
    # Every committed cycle takes a finance sample after its commit; its timer wraps the hook the commit calls.
    assert case["restarted_worker"]["warm_up_ms"] > 0
    warm = ("first", "refill", "steady", "health_flap", "restarted_worker")
    assert all(case[name]["after_commit_capacity_sample_ms"] > 0 for name in warm)
    # The largest size runs its whole sequence several times; its figures are each cycle's median.
    runs = case["runs"]
    assert len(runs) == 3
    assert runs[0]["first"]["committed_ms"] == case["first"]["committed_ms"], "the case shows the first run"
    for name in ("first", "refill", "steady", "health_flap", "steady_cold", "restarted_worker"):
        figures = sorted(run[name]["committed_ms"] for run in runs)
        assert case["median_committed_ms"][name] == round(figures[1], 1)
        assert all(0 < run[name]["reference_seconds_before"] < 10 for run in runs)
    assert case["worst_cycle_ms"] == max(case["median_committed_ms"][name] for name in warm)
    assert "(median of 3 runs)" in completed.stdout
    assert "cycle until committed" in completed.stdout

    # Issue 26's cluster through the whole cycle: partitions, NICs and several-request claims written as
    # rows and read back by the loader admit what the core admits on the same snapshot.
    from bench.bench_decide import required_philly_sizes
    from bench.decide import build, philly_path
    from broker.cycle.loader import scheduler_config
    from broker.scheduler.cycle import decide

    claims = cycle["claims"]
    assert claims["kind"] == "claims" and claims["target_seconds"] == 2.0
    rows = claims["populate"]["rows"]
    assert rows["counter_sets"] > 0 and rows["devices"] > claims["nodes"] * 8
    snapshot = build("claims", claims["nodes"], claims["pending"], 1, required_philly_sizes(philly_path()))
    # With the settings the cycle's loader gives the core (the oldest large gangs protected, say).
    snapshot = dataclasses.replace(snapshot, config=scheduler_config())
    assert claims["first"]["outcome"] == "Committed"
    assert claims["first"]["admitted"] == len(decide(snapshot).admissions) > 0
    assert all(claims[name]["outcome"] == "Committed" for name in ("refill", "steady", "health_flap"))
    assert isinstance(claims["within_target"], bool)
    # Judged on its median, like the plain case; --quick runs its sequence once.
    assert len(claims["runs"]) == 1
    assert claims["median_committed_ms"]["first"] == pytest.approx(claims["first"]["committed_ms"], abs=0.1)
    assert "; claims " in completed.stdout


def test_it_times_the_pages_and_the_reports_over_the_history(tmp_path):
    from django.conf import settings

    if settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        pytest.skip("the pages section needs a PostgreSQL server")
    completed, report = quick_bench(tmp_path, "pages", timeout=300, BENCH_DATABASE_NAME=f"bench_smoke_{os.getpid()}")
    pages = report["sections"]["pages"]
    assert "error" not in pages, pages
    assert {row["status"] for row in pages["urls"].values()} == {200}
    reports = pages["reports"]["urls"]
    assert set(reports) >= {"Prometheus scrape", "metrics JSON", "top 15 workloads by cost, 30 days"}
    for row in reports.values():
        assert row["status"] == 200 and 0 < row["p50_ms"] <= row["max_ms"], row
    assert "reports p95 (target 300 ms)" in completed.stdout
    # The rollups were caught up before the reports were timed, as beat would have on a running broker.
    assert set(pages["reports"]["rollups_caught_up"]) == {"costs", "pending_seconds"}


def test_it_benches_the_kubernetes_bridge_and_prints_only_its_report(tmp_path):
    from django.conf import settings

    if settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        pytest.skip("the kube section needs a PostgreSQL server")
    completed, report = quick_bench(tmp_path, "kube", timeout=300, BENCH_DATABASE_NAME=f"bench_smoke_{os.getpid()}")
    kube = report["sections"]["kube"]
    assert "error" not in kube, kube
    assert kube["devices"] == kube["nodes"] * 8
    assert kube["watch_event_to_database"]["runs"] == 20
    assert kube["pod_group_to_bound"]["runs"] == kube["pod_group_to_bound"]["of"] == 10
    assert {"initial_sync", "watch_event_to_database", "pod_group_to_bound"} <= set(kube)
    # One line per section, not the mock API server's access log (it printed 1,200 request lines).
    output = completed.stdout + completed.stderr
    assert "OpenAPI-Generator" not in output and "HTTP/1.1" not in output, output[-2000:]
    assert "kube     [" in completed.stdout


def test_it_refuses_to_bench_without_the_philly_trace(tmp_path):
    from bench.bench_decide import required_philly_sizes

    with pytest.raises(FileNotFoundError, match="no Philly trace at .*philly.csv"):
        required_philly_sizes(tmp_path / "philly.csv")
    (tmp_path / "philly.csv").write_text("job_id,num_gpus\na,8\nb,0\nc,1\n")
    assert required_philly_sizes(tmp_path / "philly.csv") == (8, 1)


def test_it_takes_each_cycles_median_over_runs_and_none_where_a_run_has_no_figure():
    from bench.cycle import CYCLE_NAMES, median_committed_ms, verdict

    def run(first, refill):
        figures = dict.fromkeys(CYCLE_NAMES, 100.0) | {"first": first, "refill": refill}
        return {name: {"committed_ms": value, "reference_seconds_before": 0.1} for name, value in figures.items()}

    medians = median_committed_ms([run(900.0, 1500.0), run(2500.0, None), run(1100.0, 1400.0)])

    assert medians["first"] == 1100.0
    assert medians["refill"] is None, "a cycle that failed in one run has no median"
    assert medians["steady"] == 100.0
    assert verdict(medians) == {"worst_cycle_ms": 1100.0, "within_target": False, "within_target_cold": True}
    assert verdict(medians | {"refill": 1999.0})["within_target"]
    assert not verdict(medians | {"refill": 2001.0})["within_target"]
