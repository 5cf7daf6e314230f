"""`make bench`: every benchmark in one run, one JSON report, a short summary on stdout.

    python -m bench.run [--out bench/results/report.json] [--quick]
        [--only decide,cycle,pages,browser,replay,waits,kube,soak]

Sections (docs/benchmarks.md says how each is measured):
  decide   the pure core's decision time and memory at 1k / 10k / 100k devices (target 0.5 s at 100k/20k)
  cycle    load + decide + commit on PostgreSQL at the same sizes (target 2 s at 100k/20k)
  pages    server time of the operator pages and JSON calls at 100k/20k (target p95 <= 300 ms)
  browser  heatmap first paint in Chromium (<= 2 s) and commit-to-browser latency (<= 1 s)
  replay   Philly trace replay through the core, backfill protection on and off (issue 5; issue 4's
           estimated-start error), and against the rules before issue 27 (backfill depth 1, reservation
           windows held only once open) with one reservation; the estimate error as a share of the wait
  waits    the same slice under today's rules and the short-waits policy (issue 31): JCT, waits per
           size, preemptions and lost work, gangs spread over extra racks; at a 300 s and a 60 s tick
  kube     the Kubernetes bridge against the mock API server at 10,000 nodes x 8 devices: initial sync
           (<= 60 s), watch event to database (<= 1 s), 64-pod PodGroup to bound (<= 3 s p99) (issue 28)
  soak     20 users reading and submitting for SOAK_SECONDS (180) on daphne, a Celery worker and beat while
           the worker is killed twice and the database's backends are terminated once; the invariants
           checked afterwards (issue 30)

cycle, pages, browser and soak need DATABASE_URL (a PostgreSQL server: the bench creates and drops its own
database, BENCH_DATABASE_NAME, default bench_capacity_broker); browser and soak also need REDIS_URL. Targets
are reported with pass flags; the exit status is 0 even when a target is missed (a report, not a gate).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

from bench.cycle import CYCLE_NAMES

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("decide", "cycle", "pages", "browser", "replay", "waits", "kube", "soak")
DB_SECTIONS = {"cycle", "pages", "browser", "kube", "soak"}
LARGEST = (12_500, 20_000)
QUICK_SIZE = (125, 1_000)


def configure_environment() -> None:
    """Settings for every bench process (daphne inherits them): no in-process cycle loop, no Celery
    task queued by a commit, expected durations in real seconds, DEBUG off (no query log)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "broker.settings")
    os.environ["CYCLE_MODE"] = "bench"
    os.environ["SIMULATION_SPEED"] = "1"
    os.environ["DEBUG"] = "False"
    os.environ.setdefault("CLUSTER_NAME", "default")


def git(*args) -> str | None:
    try:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def machine() -> dict:
    info = {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "git_commit": git("rev-parse", "--short", "HEAD"),
        "git_dirty_files": len((git("status", "--porcelain", "--untracked-files=no") or "").splitlines()),
    }
    try:
        with open("/proc/meminfo") as handle:
            info["memory_gb"] = round(int(handle.readline().split()[1]) / 2**20, 1)
    except OSError:
        pass
    return info


def database_info() -> dict:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        version = cursor.fetchone()[0]
    return {"postgresql": version, "database": connection.settings_dict["NAME"]}


def run_section(name: str, args, report: dict) -> None:
    started = time.perf_counter()
    size = QUICK_SIZE if args.quick else LARGEST
    try:
        if name == "decide":
            from bench import decide

            result = decide.section(args.quick)
        elif name == "cycle":
            from bench import cycle

            result = cycle.section(args.quick)
        elif name == "pages":
            from bench import pages

            result = pages.section(args.quick, size)
        elif name == "browser":
            from bench import browser

            result = browser.section(args.quick, size, Path(args.out).parent)
        elif name == "kube":
            from bench import kube

            result = kube.section(args.quick)
        elif name == "waits":
            from bench import waits

            result = waits.section(args.quick)
        elif name == "soak":
            from bench import soak

            result = soak.section(args.quick, Path(args.out).parent)
        else:
            from bench import replay

            result = replay.replay_section(args.quick)
            on = result["protection_on"]
            result["target"] = {
                "what": "with protection: no large gang (>= 32 GPUs) left unstarted, "
                "utilisation >= 95% of the run without",
                "pass": on["large_gangs"]["never_started"] == 0
                and (result["ratios"]["utilisation_on_over_off"] or 0) >= 0.95,
            }
    except Exception as error:
        result = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc().splitlines()[-8:]}
    result["section_seconds"] = round(time.perf_counter() - started, 1)
    report["sections"][name] = result
    print(summary_line(name, result), flush=True)


def cycle_cells(case: dict) -> str:
    """One size's committed_ms per cycle: each cycle's median where the size ran several times."""
    size = f"{case['devices'] // 1000}k/{case['pending'] // 1000}k"
    if "median_committed_ms" in case:
        size += f" (median of {len(case['runs'])} runs)"
        figures = case["median_committed_ms"]
    else:
        figures = {name: case[name].get("committed_ms") for name in CYCLE_NAMES}
    return f"{size} " + " ".join(f"{name} {figures[name] or 0:.0f}" for name in CYCLE_NAMES) + " ms"


def summary_line(name: str, result: dict) -> str:
    seconds = result.get("section_seconds")
    if "error" in result:
        return f"{name:<8} ERROR {result['error']} ({seconds} s)"
    if "skipped" in result:
        return f"{name:<8} skipped: {result['skipped']}"
    flag = {True: "PASS", False: "FAIL", None: "n/a "}[result.get("target", {}).get("pass")]
    if name == "decide":
        cells = ", ".join(
            f"{c['kind']} {c['devices'] // 1000}k/{c['pending'] // 1000}k {c['decide_seconds_median']:.3f}s "
            f"(cold {c['decide_seconds_cold_median']:.3f}s) {c['tracemalloc_peak_mb']}MB"
            for c in result["cases"]
            if "error" not in c
        )
        text = f"decide median warm (cold) (target 0.5 s at 100k/20k): {cells}"
    elif name == "cycle":
        cells = ", ".join(cycle_cells(c) for c in result["cases"])
        speeds = [
            run[name]["reference_seconds_before"]
            for c in result["cases"][-1:]
            for run in c.get("runs") or [c]
            for name in CYCLE_NAMES
            if run[name].get("reference_seconds_before")
        ]
        text = f"cycle until committed (target 2 s): {cells}"
        claims = result.get("claims")
        if claims and "error" not in claims:
            verdict = {True: "PASS", False: "FAIL"}[claims["within_target"]]
            text += f"; claims {cycle_cells(claims)} [{verdict}]"
        if speeds:
            text += f"; machine reference_seconds before those cycles {min(speeds)}-{max(speeds)}"
    elif name == "pages":
        worst = result["target"]["worst"]
        text = f"pages p95 (target 300 ms): worst {worst['name']} {worst['p95_ms']} ms at {result['size']}"
        reports = result["reports"]["urls"]
        passed = {True: "PASS", False: "FAIL"}[result["reports"]["target"]["pass"]]
        text += f"; reports p95 (target 300 ms) [{passed}]: " + ", ".join(
            f"{name} {row['p95_ms']} ms" for name, row in reports.items()
        )
    elif name == "browser":
        paint = result["heatmap_first_paint"]
        latency = result["commit_to_browser"]
        text = (
            f"heatmap first paint median {paint['median_ms']} ms (cold {paint['cold_ms']}, target 2000) "
            f"[{'PASS' if paint['target']['pass'] else 'FAIL'}], interactive {paint['interactive_median_ms']} ms; "
            f"commit->browser median {latency['median_ms']} ms, "
            f"max {latency['max_ms']} (target 1000) [{'PASS' if latency['target']['pass'] else 'FAIL'}]"
        )
        return f"{name:<8} {text} ({seconds} s)"
    elif name == "kube":
        bound = result["pod_group_to_bound"]
        text = (
            f"{result['nodes']} nodes x 8: initial sync {result['initial_sync']['seconds']} s (target 60); "
            f"watch event -> database max {result['watch_event_to_database']['max_ms']} ms (target 1000); "
            f"{bound['runs']}/{bound['of']} PodGroups of 64 bound, p99 {bound.get('p99_ms')} ms (target 3000), "
            f"cycle median {bound['cycle_ms_median']} ms"
        )
    elif name == "waits":
        cells = []
        for comparison in result["comparisons"]:
            today, short = comparison["today"], comparison["short_waits"]
            cells.append(
                f"tick {comparison['tick_s']:.0f} s: p99 wait {today['wait']['p99_s']} -> {short['wait']['p99_s']} s, "
                f"mean JCT {today['jct_mean_s']} -> {short['jct_mean_s']} s, {short['preemptions']} preemptions "
                f"({short['lost_device_hours']} device-h lost), spread {short['gangs_spread_over_extra_racks']}"
            )
        known = result["known_preemption"]["short_waits"]
        cells.append(
            f"known case: {known['preemptions']} preemption, {known['lost_device_seconds']:g} GPU-s lost "
            f"(expected {result['known_preemption']['expected_short_waits']['lost_device_seconds']:g})"
        )
        text = "today -> short waits: " + "; ".join(cells)
    elif name == "soak":
        latency, checks = result["latency_ms"], result["invariants"]
        broken = result["target"]["broken"]
        text = (
            f"soak {result['users']} users {result['seconds']} s, {len(result['faults'])} faults: "
            f"{result['requests_per_second']} req/s, "
            f"p50/p95/p99 {latency['p50']}/{latency['p95']}/{latency['p99']} ms, "
            f"errors {result['errors']} ({result['errors_outside_fault_windows']} outside fault windows), "
            f"cycles committed {result['cycles_committed']}, submissions {result['submissions_accepted']} "
            f"(lost {checks['submissions_lost']}), invariants {broken or 'all hold'}"
        )
    else:
        on, off = result["protection_on"], result["protection_off"]
        text = (
            f"replay {result['slice']['days']} d x{result['slice']['density']}: utilisation on {on['utilisation']} / "
            f"off {off['utilisation']}; large gangs never started on {on['large_gangs']['never_started']} / off "
            f"{off['large_gangs']['never_started']}; wait median on {on['wait_median_s']} s / off "
            f"{off['wait_median_s']} s; estimate error median {on['estimated_start']['abs_error_median_s']} s"
        )
        before = result.get("before_issue_27")
        if before:
            estimate = on["estimated_start"]
            longest = "max_wait_including_unstarted_s"
            text += (
                f"; vs the rules before issue 27 (depth 1, windows only once open): utilisation "
                f"{before['utilisation']}, large-gang max wait {before['large_gangs'][longest]}"
                f" / now {on['large_gangs'][longest]} s, reserved team's median wait "
                f"{before['reserved_team']['wait_median_s']} / now {on['reserved_team']['wait_median_s']} s; "
                f"estimate error share of waits >= 5 min: median {estimate['abs_error_share_of_wait_median']} "
                f"(target <= 0.25), p90 {estimate['abs_error_share_of_wait_p90']}"
            )
    return f"{name:<8} [{flag}] {text} ({seconds} s)"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "report.json"))
    parser.add_argument("--quick", action="store_true", help="small sizes only: a smoke run of every section")
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections to run")
    parser.add_argument("--keep-database", action="store_true", help="leave the bench database behind")
    args = parser.parse_args(argv)
    args.sections = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in args.sections if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(ROOT))
    configure_environment()
    report = {
        "benchmark": "Capacity Broker",
        "quick": args.quick,
        "machine": machine(),
        "sections": {},
    }
    server = os.environ.get("DATABASE_URL", "")
    wants_db = [s for s in args.sections if s in DB_SECTIONS]
    if wants_db:
        from bench import db

        try:
            db.prepare_environment()
        except Exception as error:
            for name in wants_db:
                report["sections"][name] = {"error": f"no bench database: {error}"}
                print(f"{name:<8} ERROR no bench database: {error}", flush=True)
            args.sections = [s for s in args.sections if s not in DB_SECTIONS]
            wants_db = []
    import django

    django.setup()
    if wants_db:
        from bench import db

        report["machine"]["database"] = database_info()
        report["machine"]["migrate_seconds"] = round(db.migrate(), 1)
    report["machine"]["redis"] = bool(os.environ.get("REDIS_URL"))
    from bench import machine_speed

    report["machine"]["reference_seconds_at_start"] = machine_speed.fresh_reference_seconds()
    cpu_at_start = machine_speed.cpu_times()
    started = time.perf_counter()
    try:
        for name in SECTIONS:
            if name in args.sections:
                run_section(name, args, report)
    finally:
        report["machine"]["reference_seconds_at_end"] = machine_speed.fresh_reference_seconds()
        report["machine"]["cpu_steal_percent"] = machine_speed.steal_percent(cpu_at_start)
        report["total_seconds"] = round(time.perf_counter() - started, 1)
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"wrote {out} ({report['total_seconds']} s)")
        if wants_db and not args.keep_database:
            from django.db import connections

            from bench import db

            connections.close_all()
            try:
                db.drop(url=server)
            except Exception as error:
                print(f"could not drop the bench database: {error}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
