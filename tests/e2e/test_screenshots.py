"""Full-page screenshots of every page each role opens, at 1440 px, for a reviewer (issue 29), and a
contrast check of every piece of text on them (WCAG AA: 4.5:1, 3:1 for large text).

The pictures are artifacts, never committed: they go to var/screenshots/<time>/ (git ignores var/) and
the test prints where. Bounded: five roles, about twenty pages in all.
"""

import time
from pathlib import Path

import pytest

from broker.cycle.triggers import request_cycle
from broker.workloads.models import Workload
from broker.workloads.states import State
from tests.builders import make_user, make_workload
from tests.e2e.conftest import log_in
from tests.governance.helpers import submit

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

ROOT = Path(__file__).resolve().parents[2]

# Text whose colour is too close to its background's: [text, ratio, colour, background] for each.
LOW_CONTRAST = """() => {
  function rgb(value) {
    const m = value.match(/rgba?\\(([^)]+)\\)/);
    if (!m) return null;
    const p = m[1].split(",").map((x) => parseFloat(x));
    return { r: p[0], g: p[1], b: p[2], a: p.length > 3 ? p[3] : 1 };
  }
  function lum(c) {
    const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
    return 0.2126 * f(c.r) + 0.7152 * f(c.g) + 0.0722 * f(c.b);
  }
  function background(el) {
    for (let e = el; e; e = e.parentElement) {
      const c = rgb(getComputedStyle(e).backgroundColor);
      if (c && c.a > 0.5) return c;
    }
    return { r: 255, g: 255, b: 255, a: 1 };
  }
  const bad = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const seen = new Set();
  while (walker.nextNode()) {
    const el = walker.currentNode.parentElement;
    if (!el || seen.has(el) || !walker.currentNode.textContent.trim()) continue;
    seen.add(el);
    if (el.closest("svg, script, style, [hidden], option")) continue;
    const style = getComputedStyle(el);
    if (style.visibility === "hidden" || style.display === "none" || el.getClientRects().length === 0) continue;
    const fg = rgb(style.color), bg = background(el);
    const a = lum(fg), b = lum(bg);
    const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    const size = parseFloat(style.fontSize), bold = parseInt(style.fontWeight, 10) >= 700;
    const large = size >= 24 || (bold && size >= 18.66);
    if (ratio < (large ? 3 : 4.5)) {
      const text = el.textContent.trim().slice(0, 40);
      bad.push([text, Math.round(ratio * 100) / 100, style.color, `rgb(${bg.r}, ${bg.g}, ${bg.b})`]);
    }
  }
  return bad;
}"""


@pytest.fixture
def people(cluster, alice, bob):
    """A busy little cluster: running and waiting work of both teams, and a request awaiting approval."""
    for index in range(3):
        make_workload(
            cluster.queue_a,
            f"train-{index}",
            replicas=1,
            devices_per_pod=4,
            resource_class=cluster.training,
            expected_duration_seconds=36000,
        ).transition(State.PENDING)
        make_workload(
            cluster.queue_b,
            f"serve-{index}",
            replicas=1,
            devices_per_pod=2,
            resource_class=cluster.training,
            expected_duration_seconds=7200,
        ).transition(State.PENDING)
    awaiting = submit(cluster, alice, name="big-reserved-run")
    return {
        "alice": alice,
        "olivia": make_user("olivia", roles=["operator"]),
        "fiona": make_user("fiona", roles=["finance"]),
        "april": make_user("april", roles=["approver"]),
        "adam": make_user("adam", roles=["admin"]),
        "awaiting": awaiting,
    }


def test_it_takes_full_page_screenshots_of_each_roles_pages_with_readable_text(stack, browser, cluster, people):
    base, _logs = stack
    request_cycle("screenshots")
    out = ROOT / "var" / "screenshots" / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    low = {}
    taken = 0
    for who in ("alice", "olivia", "fiona", "april", "adam"):
        page = log_in(browser, base, who)
        page.set_viewport_size({"width": 1440, "height": 900})
        links = page.eval_on_selector_all(".topbar nav a", "links => links.map((a) => a.getAttribute('href'))")
        pages = [href for href in links if href.startswith("/") and not href.startswith(("/api/", "/admin/"))]
        workload = Workload.objects.filter(team__members=people[who]).order_by("id").first()
        if workload is not None:
            pages.append(f"/workloads/{workload.pk}/")
        for href in pages:
            page.goto(base + href)
            page.wait_for_selector('#live-status[data-state="live"]')
            page.wait_for_load_state("networkidle")
            name = f"{who}-{href.strip('/').replace('/', '-') or 'overview'}.png"
            page.screenshot(path=str(out / name), full_page=True)
            taken += 1
            found = page.evaluate(LOW_CONTRAST)
            if found:
                low[f"{who} {href}"] = found
            assert page.console_errors == [], (who, href, page.console_errors)
        page.context.close()
    print(f"\n{taken} screenshots at 1440 px in {out}")
    assert taken >= 20
    assert low == {}, "\n".join(f"{where}: {found}" for where, found in low.items())
