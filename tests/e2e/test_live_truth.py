"""Pages that stay true while the cluster moves (issue 29).

The production stack (daphne and a Celery worker) runs cycles while this test drives bursts of
submissions, completions, cancellations, health changes and cordons, with the overview, queue, topology
and finance pages open in Chromium. After each burst, once the cluster is still, every number each open
page shows must equal what a fresh load of the same page shows. The same after every socket was dropped
and the pages missed a burst, and after a silent network loss, which the badge must show as offline
within 10 s.

Thousands of admissions: each burst inserts 450 one-device runs of a minute or so in bulk and submits a
few gangs through the domain service; the real worker's cycles admit 400 of them while this test's
executor completes them (SIMULATION_SPEED 60: a minute runs a second), and halfway through busy devices
fail and a busy node is cordoned. Six bursts on a 128-device cluster: about 2,500 admissions and as many
completions, under three minutes on a loaded 2-core machine.
"""

import random
import threading
import time
from collections import Counter

import pytest
from django.utils import timezone

from broker.audit.models import AuditEvent
from broker.cycle.executor import get_executor, move
from broker.cycle.triggers import request_cycle
from broker.inventory import services as inventory_services
from broker.inventory.models import Device, Health, Node
from broker.workloads import services as workload_services
from broker.workloads.models import Allocation, Explanation, SchedulingCycle, Workload, WorkloadTransition
from broker.workloads.states import State
from dashboard import broadcast
from tests.builders import build_small_cluster, make_user, make_workloads
from tests.e2e.conftest import log_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

# Four bursts seen live, one while every socket is down and one during a silent loss: 2,400 admissions.
BURSTS = 4
ADMISSIONS_PER_BURST = 400
# Submitted per burst: a few more than it admits, so the queue grows from burst to burst.
SHORT_PER_BURST = 450
GANGS_PER_BURST = 8
MIN_ADMISSIONS = 2000
STEP_MS = 200
DRIVE_SECONDS = 90
SETTLE_SECONDS = 2.5

# Every number a page shows, as text: its live regions whole, the topology's rack map and open node,
# the finance ticker's rates (its month-to-date figures run with the clock; checked to add up instead).
NUMBERS = """() => {
  const out = {};
  document.querySelectorAll("[data-live-region]").forEach((el) => {
    out[el.dataset.liveRegion] = el.innerText.replace(/\\s+/g, " ").trim();
  });
  const cycles = document.getElementById("cycles-chart");  // the overview's chart of recent cycles
  if (cycles && cycles.data) out.cycles = JSON.stringify(cycles.data.map((trace) => [trace.x, trace.y]));
  const summary = document.getElementById("rack-summary");
  if (summary) out.rack_summary = summary.textContent;
  const topology = window.BrokerTopologyPage;
  if (topology && topology.rackMap.data) {
    out.racks = JSON.stringify(topology.rackMap.data.cells.map((c) => [c.id, c.counts, c.teams]));
    out.node = document.getElementById("node-title").textContent;
    out.devices = document.querySelector("#devices tbody").innerText.replace(/\\s+/g, " ").trim();
    const drill = document.getElementById("drill").data;  // the open rack as Plotly drew it
    out.drill = JSON.stringify(drill && [drill[0].y, drill[0].z, drill[0].text]);
    out.nodes = document.getElementById("node-buttons").innerText;
    out.team_legend = document.getElementById("team-legend").innerText;
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


def admissions():
    return WorkloadTransition.objects.filter(to_state=State.ADMITTED).count()


def submit(cluster, rng, submitter, prefix, short, gangs):
    """`short` one-device workloads of a minute or so, inserted in bulk (the domain service's checks and
    advice cost ~50 ms a submission, too slow for thousands), and `gangs` larger or longer ones, some
    at a priority that preempts, through the domain service as the form and the API submit them."""
    ids = []
    for seconds in (30, 60, 90):  # a third each
        names = [f"{prefix}-{seconds}s-{index}" for index in range(short // 3)]
        queues = [rng.choice([cluster.queue_a, cluster.queue_b]) for _ in names]
        ids += make_workloads(queues, names, resource_class=cluster.training, expected_duration_seconds=seconds)
    move(ids, State.SUBMITTED, State.PENDING, timezone.now(), "submitted")
    # Long runs only on two devices: they stay running to the end, and must not fill the cluster.
    shapes = [(2, 4, 60), (1, 8, 120), (2, 2, 90), (1, 2, 36000)]
    for index in range(gangs):
        replicas, devices_per_pod, seconds = rng.choice(shapes)
        submission = workload_services.Submission(
            name=f"{prefix}-gang-{index}",
            queue=rng.choice([cluster.queue_a, cluster.queue_b]),
            resource_class=cluster.training,
            pod_sets=(workload_services.PodSetRequest("main", replicas, devices_per_pod),),
            priority=rng.choice([None, None, 500]),
            expected_duration_seconds=seconds,
        )
        workload_services.submit_workload(submission, submitter)


def busy_devices():
    held = Allocation.objects.filter(released_at__isnull=True).values("device_id")
    return Device.objects.filter(pk__in=held, health=Health.HEALTHY).select_related("node").order_by("id")


def shake_inventory(rng, operator):
    """As an operator would in the middle of a burst: mark busy devices unhealthy and cordon a node that
    runs work; the devices and the node marked last time are repaired and uncordoned."""
    touched = set()
    for device in Device.objects.filter(health=Health.UNHEALTHY).select_related("node"):
        inventory_services.set_health(device, operator, Health.HEALTHY, reason="repaired")
        touched.add(device.node.domain_id)
    for node in Node.objects.filter(cordoned=True):
        inventory_services.set_cordoned(node, operator, False, reason="back in service")
        touched.add(node.domain_id)
    busy = list(busy_devices())
    assert len(busy) >= 8, f"only {len(busy)} devices are busy: the burst does not load the cluster"
    for device in rng.sample(busy, 3):
        inventory_services.set_health(device, operator, Health.UNHEALTHY, reason="burst")
        touched.add(device.node.domain_id)
    node = rng.choice(sorted({device.node for device in busy_devices()}, key=lambda node: node.pk))
    inventory_services.set_cordoned(node, operator, True, reason="burst")
    touched.add(node.domain_id)
    # Playwright's sync API keeps an event loop on this thread; the channel layer's send needs its own.
    sender = threading.Thread(target=broadcast.inventory_changed, args=(touched,))
    sender.start()
    sender.join()


def cancel_some(rng, operator, count):
    waiting = list(Workload.objects.filter(state=State.PENDING).order_by("id"))
    for workload in rng.sample(waiting, min(count, len(waiting))):
        workload_services.cancel_workload(workload, operator, reason="burst")


def cluster_state():
    """Where the work stands and why it waits, for a failure's message."""
    states = Counter(Workload.objects.values_list("state", flat=True))
    reasons = Counter(Explanation.objects.filter(workload__state=State.PENDING).values_list("reason", "message")[:2000])
    busy = Allocation.objects.filter(released_at__isnull=True).count()
    return f"states {dict(states)}, {busy} devices allocated, waiting for {reasons.most_common(3)}"


def drive(pages, target):
    """Let the executor start and finish work until the worker's cycles have admitted `target` workloads
    in all."""
    deadline = time.monotonic() + DRIVE_SECONDS
    steps = 0
    while admissions() < target:
        assert time.monotonic() < deadline, (
            f"{target - admissions()} admissions short after {DRIVE_SECONDS} s; {cluster_state()}"
        )
        # Completions ask for a cycle themselves; every second the test asks too, as beat would.
        get_executor().advance(timezone.now())
        if steps % 5 == 0:
            request_cycle("test burst")
        steps += 1
        pages[0].wait_for_timeout(STEP_MS)  # lets Playwright deliver the pages' socket traffic


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


def burst(cluster, rng, submitter, operator, pages, label):
    """ADMISSIONS_PER_BURST admissions and about as many completions, with devices failing and a node
    cordoned under busy work halfway through and a few waiting workloads cancelled."""
    began, before = time.monotonic(), admissions()
    submit(cluster, rng, submitter, label, SHORT_PER_BURST, GANGS_PER_BURST)
    request_cycle("test burst")
    submitted = time.monotonic()
    drive(pages, before + ADMISSIONS_PER_BURST // 2)
    shake_inventory(rng, operator)
    cancel_some(rng, operator, 3)
    drive(pages, before + ADMISSIONS_PER_BURST)
    request_cycle("test burst end")
    print(
        f"{label}: submitted in {submitted - began:.1f} s, driven in {time.monotonic() - submitted:.1f} s", flush=True
    )


def assert_pages_true(pages, cycle, after, reconnect_ms=30000):
    """Every open page shows what a fresh load of it shows. `reconnect_ms`: after a loss, a page retries
    with back-off (a dead attempt takes 8 s to give up), so it may take that long to be live again."""
    for page in pages:
        page.wait_for_function(CAUGHT_UP, arg=cycle, timeout=reconnect_ms)
        if page.query_selector("#ticker"):
            page.wait_for_function(TICKED_AFTER, arg=after)
    # The fresh loads all at once: the server and the browser overlap their work.
    fresh_pages = []
    for page in pages:
        fresh_page = page.context.new_page()
        fresh_page.set_default_timeout(30000)
        fresh_page.goto(page.url, wait_until="commit")
        fresh_pages.append(fresh_page)
    for page, fresh_page in zip(pages, fresh_pages, strict=True):
        fresh_page.wait_for_load_state()
        fresh_page.wait_for_function(CAUGHT_UP, arg=cycle)
        if fresh_page.query_selector("#heatmap"):
            fresh_page.wait_for_function("() => document.getElementById('rack-summary').textContent !== ''")
            fresh_page.wait_for_function("() => document.querySelector('#devices tbody tr') !== null")
            fresh_page.wait_for_function("() => document.getElementById('drill').data !== undefined")
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
    # Submits for both teams; an operator may give a workload a priority above its class's.
    submitter = make_user("sam", roles=["member", "operator"], teams=[cluster.team_a, cluster.team_b])
    overview = log_in(browser, base, "olivia")
    context = overview.context
    context.add_init_script(NETWORK)
    submit(cluster, rng, submitter, "warm", 10, 0)
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
    began = time.monotonic()

    for index in range(BURSTS):
        print(f"burst {index} at {time.monotonic() - began:.1f} s, {admissions()} admissions", flush=True)
        burst(cluster, rng, submitter, operator, pages, f"burst{index}")
        after = time.time() * 1000
        settling = time.monotonic()
        cycle = settle(pages)
        comparing = time.monotonic()
        assert_pages_true(pages, cycle, after)
        print(f"settled in {comparing - settling:.1f} s, compared in {time.monotonic() - comparing:.1f} s", flush=True)
        assert_counts_agree(pages[0], pages[1])

    # Every socket dropped; the pages miss a whole burst, then reconnect and catch up.
    network(pages, blocked=True)
    for page in pages:
        page.evaluate("window.BrokerLive.drop()")
        page.wait_for_selector('#live-status[data-state="down"]')
    burst(cluster, rng, submitter, operator, pages, "unseen")
    network(pages, blocked=False)
    after = time.time() * 1000
    cycle = settle(pages)
    assert_pages_true(pages, cycle, after, reconnect_ms=90000)

    # A silent loss: the socket stays open but nothing gets through. The badge says offline within 10 s.
    network(pages, silent=True)
    silent_at = time.monotonic()
    pages[0].wait_for_selector('#live-status[data-state="down"]', timeout=10000)
    assert time.monotonic() - silent_at <= 10
    burst(cluster, rng, submitter, operator, pages, "silent")
    network(pages, silent=False)
    after = time.time() * 1000
    cycle = settle(pages)
    assert_pages_true(pages, cycle, after, reconnect_ms=90000)

    # The finance tiles add up: this month's capacity cost is the sum of its parts.
    total, parts = pages[3].evaluate(MONTH_TO_DATE)
    assert total == pytest.approx(sum(parts), abs=0.011)

    admitted = admissions()
    completions = WorkloadTransition.objects.filter(to_state=State.SUCCEEDED).count()
    running = Workload.objects.filter(state__in=(State.ADMITTED, State.RUNNING)).count()
    failed = AuditEvent.objects.filter(action="device.mark_unhealthy").count()
    cordoned = AuditEvent.objects.filter(action="node.cordon").count()
    print(
        f"{time.monotonic() - began:.1f} s: cycles {last_cycle() - started}, admissions {admitted}, "
        f"completions {completions}, running {running}, busy devices failed {failed}, nodes cordoned {cordoned}"
    )
    assert (failed, cordoned) == (3 * (BURSTS + 2), BURSTS + 2)
    assert admitted >= MIN_ADMISSIONS
    # Admitted work either finished or still runs, bar the few preempted or cancelled on the way.
    assert completions >= admitted - running - admitted // 20
