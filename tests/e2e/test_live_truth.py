"""Pages that stay true while the cluster moves (issue 29).

The production stack (daphne and a Celery worker) runs cycles while this test drives bursts of
submissions, completions, cancellations, health changes and cordons, with the overview, queue, topology
and finance pages open in Chromium. After each burst, once the cluster is still, every number each open
page shows must equal what a fresh load of the same page shows. The same after every socket was dropped
and the pages missed a burst, and after a silent network loss, which the badge must show as offline
within 10 s.

Bounded: a few bursts of tens of workloads each on a 128-device cluster, about two minutes in all.
"""

import random
import threading
import time

import pytest
from django.utils import timezone

from broker.cycle.executor import get_executor
from broker.cycle.triggers import request_cycle
from broker.inventory import services as inventory_services
from broker.inventory.models import Device, Health, Node
from broker.workloads import services as workload_services
from broker.workloads.models import SchedulingCycle, Workload, WorkloadTransition
from broker.workloads.states import State
from dashboard import broadcast
from tests.builders import build_small_cluster, make_user, make_workload
from tests.e2e.conftest import log_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

BURSTS = 4
BURST_SIZE = 40
SETTLE_SECONDS = 2.5

# Every number a page shows, as text: its live regions whole, the topology's rack map and open node,
# the finance ticker's rates (its month-to-date figures run with the clock; checked to add up instead).
NUMBERS = """() => {
  const out = {};
  document.querySelectorAll("[data-live-region]").forEach((el) => {
    out[el.dataset.liveRegion] = el.innerText.replace(/\\s+/g, " ").trim();
  });
  const summary = document.getElementById("rack-summary");
  if (summary) out.rack_summary = summary.textContent;
  const topology = window.BrokerTopologyPage;
  if (topology && topology.rackMap.data) {
    out.racks = JSON.stringify(topology.rackMap.data.cells.map((c) => [c.id, c.counts, c.teams]));
    out.node = document.getElementById("node-title").textContent;
    out.devices = document.querySelector("#devices tbody").innerText.replace(/\\s+/g, " ").trim();
  }
  const ticker = document.getElementById("ticker");
  if (ticker) {
    const rates = ticker.querySelectorAll('[data-field^="per_hour"]');
    out.per_hour = Array.from(rates).map((e) => e.textContent).join(" | ");
  }
  return out;
}"""

# The page has handled every message up to `cycle` and has no read under way.
CAUGHT_UP = """(cycle) => window.BrokerLive && window.BrokerLive.lastCycle() >= cycle && !window.BrokerLive.reading()
  && document.getElementById("live-status").dataset.state === "live" """

TICKED_AFTER = "(after) => Date.parse(document.getElementById('ticker').dataset.updated || 0) > after"

MONTH_TO_DATE = """() => {
  const value = (name) => Number(
    document.querySelector('[data-field="month_to_date.' + name + '"]').textContent.replace(/[^0-9.-]/g, ""));
  return [value("total"), ["allocated", "idle", "stranded", "unhealthy", "reserved_unused"].map(value)];
}"""


# The network between page and server, as the test sets it: `blocked`, no socket connects; `silent`,
# sockets stay open but nothing passes either way (a socket opened during a silence never carries
# anything). Every WebSocket a page opens goes through it.
NETWORK = """(() => {
  const Real = window.WebSocket;
  window.__network = { blocked: false, silent: false };
  class TestSocket {
    constructor(url) {
      this.readyState = 0;
      this.onopen = this.onmessage = this.onclose = this.onerror = null;
      this.dead = window.__network.silent;
      if (window.__network.blocked) {
        setTimeout(() => { this.readyState = 3; if (this.onclose) this.onclose({ code: 1006 }); }, 50);
        return;
      }
      const real = this.real = new Real(url);
      const quiet = () => this.dead || window.__network.silent;
      real.onopen = (e) => { this.readyState = 1; if (!quiet() && this.onopen) this.onopen(e); };
      real.onmessage = (e) => { if (!quiet() && this.onmessage) this.onmessage(e); };
      real.onclose = (e) => { this.readyState = 3; if (!quiet() && this.onclose) this.onclose(e); };
      this.quiet = quiet;
    }
    send(data) { if (this.real && !this.quiet()) this.real.send(data); }
    close() { this.readyState = 3; if (this.real) this.real.close(); }
  }
  Object.assign(TestSocket, { CONNECTING: 0, OPEN: 1, CLOSING: 2, CLOSED: 3 });
  window.WebSocket = TestSocket;
})();"""


def network(pages, **state):
    for page in pages:
        page.evaluate("(state) => Object.assign(window.__network, state)", state)


@pytest.fixture
def cluster(db):
    """Four racks of four nodes with eight H100 each (128 devices); each team may use all of them."""
    cluster = build_small_cluster(racks=4, nodes_per_rack=4, devices_per_node=8)
    for queue in (cluster.queue_a, cluster.queue_b):
        queue.nominal_quota = {"h100": 128}
        queue.save()
    return cluster


def last_cycle():
    committed = SchedulingCycle.objects.filter(outcome=SchedulingCycle.Outcome.COMMITTED)
    return committed.values_list("pk", flat=True).first() or 0


def submit(cluster, rng, prefix, count):
    for index in range(count):
        queue = rng.choice([cluster.queue_a, cluster.queue_b])
        workload = make_workload(
            queue,
            f"{prefix}-{index}",
            replicas=rng.choice([1, 1, 2]),
            devices_per_pod=rng.choice([1, 2, 4, 8]),
            priority=rng.choice([100, 100, 500]),
            resource_class=cluster.training,
            expected_duration_seconds=rng.choice([30, 60, 120, 36000]),
        )
        workload.transition(State.PENDING)


def shake_inventory(cluster, rng, operator):
    """Flip a few devices' health and one node's cordon, busy ones included, as an operator would."""
    devices = list(Device.objects.select_related("node").order_by("id"))
    touched = set()
    for device in rng.sample(devices, 3):
        health = Health.HEALTHY if device.health != Health.HEALTHY else Health.UNHEALTHY
        inventory_services.set_health(device, operator, health, reason="burst")
        touched.add(device.node.domain_id)
    node = rng.choice(list(Node.objects.order_by("id")))
    inventory_services.set_cordoned(node, operator, not node.cordoned, reason="burst")
    touched.add(node.domain_id)
    # Playwright's sync API keeps an event loop on this thread; the channel layer's send needs its own.
    sender = threading.Thread(target=broadcast.inventory_changed, args=(touched,))
    sender.start()
    sender.join()


def cancel_some(rng, operator, count):
    waiting = list(Workload.objects.filter(state=State.PENDING).order_by("id"))
    for workload in rng.sample(waiting, min(count, len(waiting))):
        workload_services.cancel_workload(workload, operator, reason="burst")


def run(pages, seconds):
    """Let the executor start and finish work for `seconds`, each step asking for a cycle."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        get_executor().advance(timezone.now())
        request_cycle("test burst")
        pages[0].wait_for_timeout(300)  # lets Playwright deliver the pages' socket traffic


def settle(pages):
    """Wait until no cycle has committed for SETTLE_SECONDS (no executor runs now, so none is coming)."""
    seen, since = last_cycle(), time.monotonic()
    deadline = since + 60
    while time.monotonic() - since < SETTLE_SECONDS:
        assert time.monotonic() < deadline, "the cluster never settled"
        pages[0].wait_for_timeout(250)
        now = last_cycle()
        if now != seen:
            seen, since = now, time.monotonic()
    return seen


def burst(cluster, rng, operator, pages, label):
    submit(cluster, rng, label, BURST_SIZE)
    request_cycle("test burst")
    run(pages, 3)
    shake_inventory(cluster, rng, operator)
    cancel_some(rng, operator, 3)
    run(pages, 3)
    request_cycle("test burst end")


def assert_pages_true(pages, cycle, after, reconnect_ms=30000):
    """`reconnect_ms`: after a loss, a page retries with back-off (a dead attempt takes 8 s to give up),
    so it may take that long to be live again."""
    for page in pages:
        page.wait_for_function(CAUGHT_UP, arg=cycle, timeout=reconnect_ms)
        if page.query_selector("#ticker"):
            page.wait_for_function(TICKED_AFTER, arg=after)
        fresh_page = page.context.new_page()
        fresh_page.set_default_timeout(20000)
        fresh_page.goto(page.url)
        fresh_page.wait_for_function(CAUGHT_UP, arg=cycle, timeout=30000)
        if fresh_page.query_selector("#heatmap"):
            fresh_page.wait_for_function("() => document.getElementById('rack-summary').textContent !== ''")
            fresh_page.wait_for_function("() => document.querySelector('#devices tbody tr') !== null")
        if fresh_page.query_selector("#ticker"):
            fresh_page.wait_for_function("() => document.getElementById('ticker').dataset.updated")
        shown, fresh = page.evaluate(NUMBERS), fresh_page.evaluate(NUMBERS)
        fresh_page.close()
        assert shown == fresh, f"{page.url} after cycle {cycle}"
        assert page.console_errors == [], page.console_errors


def assert_counts_agree(overview, queue):
    """The overview's Pending equals its reason rows' sum; the queue lists only waiting work, in order."""
    pending = int(overview.inner_text('[data-counter="pending"]').replace(",", ""))
    rows = overview.eval_on_selector_all(
        '#pending-by-reason [data-field="count"]', "cells => cells.map((c) => Number(c.textContent.replace(/,/g, '')))"
    )
    assert pending == sum(rows)
    states = queue.eval_on_selector_all("#pending-table tr[data-workload]", "rows => rows.map((r) => r.dataset.state)")
    assert set(states) <= {"Submitted", "AwaitingApproval", "Pending", "Preempted"}, states
    positions = queue.eval_on_selector_all(
        '#pending-table [data-field="position_in_cluster"]', "cells => cells.map((c) => c.textContent)"
    )
    numbers = [int(p) for p in positions if p.strip().isdigit()]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers), positions


def test_it_keeps_every_open_page_equal_to_a_fresh_load_through_bursts_and_drops(stack, browser, cluster, alice):
    base, _logs = stack
    rng = random.Random(29)
    operator = make_user("olivia", roles=["operator", "finance"])
    overview = log_in(browser, base, "olivia")
    context = overview.context
    context.add_init_script(NETWORK)
    submit(cluster, rng, "warm", 10)
    request_cycle("warm up")
    cycle = settle([overview])
    node = Node.objects.order_by("id").first()
    urls = ["/", "/queue/", f"/topology/?rack={node.domain_id}&node={node.pk}", "/finance/"]
    pages = []
    for url in urls:
        page = context.new_page()
        page.set_default_timeout(20000)
        page.console_errors = []
        page.on("pageerror", lambda error, page=page: page.console_errors.append(str(error)))
        page.goto(base + url)
        page.wait_for_function(CAUGHT_UP, arg=cycle, timeout=30000)
        pages.append(page)
    overview.close()
    member = log_in(browser, base, "alice")
    member.context.add_init_script(NETWORK)
    member.reload()
    pages.append(member)
    member_queue = member.context.new_page()  # other teams' work as counts only
    member_queue.set_default_timeout(20000)
    member_queue.console_errors = []
    member_queue.on("pageerror", lambda error: member_queue.console_errors.append(str(error)))
    member_queue.goto(base + "/queue/")
    pages.append(member_queue)
    started = last_cycle()

    for index in range(BURSTS):
        print(f"burst {index} at {time.strftime('%X')}", flush=True)
        burst(cluster, rng, operator, pages, f"burst{index}")
        after = time.time() * 1000
        cycle = settle(pages)
        assert_pages_true(pages, cycle, after)
        assert_counts_agree(pages[0], pages[1])

    # Every socket dropped; the pages miss a whole burst, then reconnect and catch up.
    network(pages, blocked=True)
    for page in pages:
        page.evaluate("window.BrokerLive.drop()")
        page.wait_for_selector('#live-status[data-state="down"]')
    burst(cluster, rng, operator, pages, "unseen")
    network(pages, blocked=False)
    after = time.time() * 1000
    cycle = settle(pages)
    assert_pages_true(pages, cycle, after, reconnect_ms=90000)

    # A silent loss: the socket stays open but nothing gets through. The badge says offline within 10 s.
    network(pages, silent=True)
    silent_at = time.monotonic()
    pages[0].wait_for_selector('#live-status[data-state="down"]', timeout=10000)
    assert time.monotonic() - silent_at <= 10
    burst(cluster, rng, operator, pages, "silent")
    network(pages, silent=False)
    after = time.time() * 1000
    cycle = settle(pages)
    assert_pages_true(pages, cycle, after, reconnect_ms=90000)

    # The finance tiles add up: this month's capacity cost is the sum of its parts.
    total, parts = pages[3].evaluate(MONTH_TO_DATE)
    assert total == pytest.approx(sum(parts), abs=0.011)

    admissions = WorkloadTransition.objects.filter(to_state=State.ADMITTED).count()
    completions = WorkloadTransition.objects.filter(to_state=State.SUCCEEDED).count()
    print(f"cycles {last_cycle() - started}, admissions {admissions}, completions {completions}")
    assert admissions > 100 and completions > 50
