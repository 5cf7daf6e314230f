"""Section "browser": what an operator sees in Debian's Chromium, against a real ASGI server.

A daphne subprocess serves the bench database (at the largest size, with explanations), sharing the
Redis channel layer with this process; Playwright drives /usr/bin/chromium (never a downloaded browser)
with a session cookie of the bench operator.

- heatmap first paint: from navigation start (performance.timeOrigin) to the first animation frame in
  which the rack heatmap is drawn, every rack's cell in its colour: the canvas preview topology.js draws
  when the heatmap JSON arrives before Plotly (static/js/topology.js, RackMap.drawPreview) or Plotly's
  heatmap, whichever comes first, and the page has written its rack summary (topology-page.js does that
  right after drawing). Also per load: `interactive`, when Plotly's chart (hover, click to drill) has
  replaced the preview. The first load has a cold browser cache (Plotly's 4.6 MB bundle included); the
  others reuse the context's cache.
- commit-to-browser latency: the overview page open with its live socket connected; this process runs
  a real cycle (runner.run_once, in a thread of its own so async_to_sync may send); the clock starts
  when the commit's on_commit hook broadcasts `cycle.committed` and stops when the page's
  [data-counter="last_cycle_ms"] shows this cycle's duration (a MutationObserver timestamps it).
  Both clocks are this machine's wall clock.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench import cycle, db
from tests.chromium import CHROMIUM, CHROMIUM_ARGS
from tests.servers import free_port, wait_for_port

ROOT = Path(__file__).resolve().parent.parent
PAINT_TARGET_MS = 2000.0
LATENCY_TARGET_MS = 1000.0

PLOTLY_DRAWN = "#heatmap .main-svg image, #heatmap .main-svg .hm"
HEATMAP_READY = """() => {
  const chart = document.querySelector('PLOTLY_DRAWN');
  const preview = document.querySelector('#heatmap canvas.hm-preview[data-cells]');
  const summary = document.getElementById('rack-summary');
  if ((chart || preview) && summary && summary.textContent) {
    if (window.__benchReady === undefined) window.__benchReady = performance.now();
    if (chart && window.__benchInteractive === undefined) window.__benchInteractive = performance.now();
    return true;
  }
  return false;
}""".replace("PLOTLY_DRAWN", PLOTLY_DRAWN)
HEATMAP_INTERACTIVE = """() => {
  if (document.querySelector('PLOTLY_DRAWN')) {
    if (window.__benchInteractive === undefined) window.__benchInteractive = performance.now();
    return true;
  }
  return false;
}""".replace("PLOTLY_DRAWN", PLOTLY_DRAWN)

# The page rereads its live regions whole, so the counter's element is replaced: watch the page.
WATCH_COUNTER = """() => {
  window.__benchSeen = [];
  new MutationObserver(() => {
    const el = document.querySelector('[data-counter="last_cycle_ms"]');
    if (el) window.__benchSeen.push([el.textContent, performance.timeOrigin + performance.now()]);
  }).observe(document.body, {childList: true, characterData: true, subtree: true});
}"""

SEEN = """(value) => {
  const hit = (window.__benchSeen || []).find((s) => Math.abs(parseFloat(s[0]) - value) < 0.06);
  return hit ? hit[1] : null;
}"""


def start_daphne(log_path: Path):
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log = open(log_path, "w")  # noqa: SIM115 (closed by stop_daphne)
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "daphne"), "-b", "127.0.0.1", "-p", str(port), "broker.asgi:application"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for_port(port, process, timeout=60)
    except Exception:
        stop_daphne(process, log)
        raise
    return process, log, f"http://127.0.0.1:{port}"


def stop_daphne(process, log) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    log.close()


def session_cookie(base: str) -> dict:
    from django.conf import settings
    from django.test import Client

    client = Client()
    client.force_login(db.ensure_operator())
    name = settings.SESSION_COOKIE_NAME
    return {"name": name, "value": client.cookies[name].value, "url": base}


def heatmap_loads(context, base: str, loads: int) -> list[dict]:
    out = []
    for _ in range(loads):
        page = context.new_page()
        page.set_default_timeout(60000)
        page.goto(f"{base}/topology/", wait_until="commit")
        page.wait_for_function(HEATMAP_READY, polling="raf", timeout=60000)
        page.wait_for_function(HEATMAP_INTERACTIVE, polling="raf", timeout=60000)
        timing = page.evaluate(
            """() => {
              const nav = performance.getEntriesByType('navigation')[0];
              const api = performance.getEntriesByName(location.origin + '/dashboard/api/heatmap/')[0];
              const plotly = performance.getEntries().find((e) => e.name.includes('plotly'));
              return {ready: window.__benchReady, interactive: window.__benchInteractive,
                      html: nav ? nav.responseEnd : null,
                      dom_content_loaded: nav ? nav.domContentLoadedEventEnd : null,
                      api_start: api ? api.startTime : null, api_end: api ? api.responseEnd : null,
                      plotly_ms: plotly ? plotly.duration : null,
                      racks: (document.getElementById('rack-summary').textContent.match(/^\\d+/) || [null])[0]};
            }"""
        )
        out.append({k: (round(v, 1) if isinstance(v, float) else v) for k, v in timing.items()})
        page.close()
    return out


def run_in_thread(function):
    """Call `function` in a fresh thread (no event loop there, its own DB connection)."""
    from django.db import connection

    box = {}

    def target():
        try:
            box["value"] = function()
        except Exception as error:  # reported, not raised across threads
            box["error"] = error
        finally:
            connection.close()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def commit_latencies(context, base: str, repeats: int) -> list[dict]:
    from broker.cycle import commit
    from broker.cycle.runner import run_once
    from broker.workloads.models import SchedulingCycle

    page = context.new_page()
    page.set_default_timeout(60000)
    page.goto(f"{base}/")
    page.wait_for_selector('#live-status[data-state="live"]')
    page.evaluate(WATCH_COUNTER)
    original = commit.broadcast
    sent = {}

    def timed_broadcast(message):
        sent["at"] = time.time()
        original(message)

    commit.broadcast = timed_broadcast
    out = []
    try:
        for _ in range(repeats):
            sent.clear()
            run = run_in_thread(run_once)
            row = run_in_thread(lambda run=run: SchedulingCycle.objects.get(pk=run.cycle_id))
            expected = round(row.duration_ms, 1)
            if "at" not in sent:
                out.append({"cycle": row.pk, "outcome": row.outcome, "error": "no broadcast"})
                continue
            handle = page.wait_for_function(SEEN, arg=expected, timeout=60000)
            shown = handle.json_value()
            out.append(
                {
                    "cycle": row.pk,
                    "cycle_ms": expected,
                    "admitted": row.admitted_count,
                    "latency_ms": round(shown - sent["at"] * 1000, 1),
                }
            )
            time.sleep(0.5)
    finally:
        commit.broadcast = original
        page.close()
    return out


def section(quick: bool, size: tuple[int, int], log_dir: Path) -> dict:
    from django.conf import settings

    if not settings.REDIS_URL:
        return {"skipped": "REDIS_URL is not set: the daphne process and this one must share a channel layer"}
    if not Path(CHROMIUM).exists():
        return {"skipped": f"Debian's chromium is not installed at {CHROMIUM}"}
    from playwright.sync_api import sync_playwright

    cycle.ensure(*size)
    from broker.inventory.models import Device, Domain
    from broker.workloads.models import Workload
    from broker.workloads.states import WAITING_STATES

    db_size = {
        "devices": Device.objects.count(),
        "racks": Domain.objects.filter(level__name="rack").count(),
        "pending": Workload.objects.filter(state__in=WAITING_STATES).count(),
    }
    log_dir.mkdir(parents=True, exist_ok=True)
    process, log, base = start_daphne(log_dir / "bench-daphne.log")
    # Playwright's sync API keeps an event loop on this thread; the ORM calls here stay synchronous.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                cookie = session_cookie(base)
                context = chromium.new_context(viewport={"width": 1400, "height": 1000})
                context.add_cookies([cookie])
                loads = heatmap_loads(context, base, 2 if quick else 6)
                latencies = commit_latencies(context, base, 1 if quick else 3)
                context.close()
            finally:
                chromium.close()
    finally:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        stop_daphne(process, log)
    ready = [load["ready"] for load in loads]
    measured = [item["latency_ms"] for item in latencies if "latency_ms" in item]
    paint_median = statistics.median(ready)
    return {
        "size": db_size,
        "server": "daphne (1 process), DEBUG off, channels-redis",
        "heatmap_first_paint": {
            "loads": loads,
            "cold_ms": ready[0],
            "median_ms": round(paint_median, 1),
            "max_ms": max(ready),
            "interactive_median_ms": round(statistics.median(load["interactive"] for load in loads), 1),
            "target": {
                "what": "median first paint of the rack heatmap (preview or chart), navigation start -> drawn",
                "ms": PAINT_TARGET_MS,
                "pass": paint_median <= PAINT_TARGET_MS,
            },
        },
        "commit_to_browser": {
            "samples": latencies,
            "median_ms": round(statistics.median(measured), 1) if measured else None,
            "max_ms": max(measured) if measured else None,
            "target": {
                "what": "every sample: commit broadcast -> the overview shows the cycle",
                "ms": LATENCY_TARGET_MS,
                "pass": bool(measured) and len(measured) == len(latencies) and max(measured) <= LATENCY_TARGET_MS,
            },
        },
    }
