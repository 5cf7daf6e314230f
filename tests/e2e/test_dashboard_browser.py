"""End to end: a real ASGI server (daphne) and a real Celery worker against the test PostgreSQL and
Redis, driven by Debian's Chromium through Playwright.

A member submits a gang that cannot start and reads why; an operator, in a second browser context,
cancels the blocker; the member's page shows the workload admitted without a reload. The heatmap drills
from rack to device. Screenshots go to test-artifacts/.
"""

import pytest

from broker.workloads.models import Allocation, Workload
from broker.workloads.states import State
from tests.builders import make_workload
from tests.e2e.conftest import log_in, shot

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

REASONS = ("InsufficientCapacity", "TopologyFragmented", "QuotaExceeded", "Priority", "DeviceUnhealthy", "Reserved")


def hold(workload, nodes, device_class):
    """A running workload holding every device of `nodes`."""
    workload.transition(State.PENDING)
    workload.transition(State.ADMITTED)
    workload.transition(State.RUNNING)
    index = 0
    for node in nodes:
        for device in node.devices.order_by("name"):
            Allocation.objects.create(
                workload=workload, device=device, device_class=device_class, pod_set="main", pod_index=index
            )
            index += 1


@pytest.fixture
def blockers(cluster, bob):
    """team-b runs a non-preemptible 4-device workload on the first node of each rack (n1 and n3): a
    rack-local gang of 2 × 4 devices fits in no rack, one of 1 × 4 would start."""
    n1, _, n3, _ = cluster.nodes
    held = []
    for name, node in (("blocker-1", n1), ("blocker-2", n3)):
        blocker = make_workload(
            cluster.queue_b,
            name,
            devices_per_pod=4,
            priority=1000,
            preemptible=False,
            submitted_by=bob,
            chosen_device_class=cluster.h100,
        )
        hold(blocker, [node], cluster.h100)
        held.append(blocker)
    return held


def test_it_admits_a_blocked_gang_live_when_an_operator_frees_capacity(stack, browser, blockers, alice, olivia):
    base, _logs = stack
    _, blocker_2 = blockers

    member = log_in(browser, base, "alice")
    shot(member, "01-overview-member")

    # Submit: the what-if says it would not start now, and why.
    member.goto(f"{base}/submit/")
    member.fill("input[name=name]", "gang-8")
    member.check('input[name=resource_class][data-name="distributed-training"]')
    member.fill("input[name=replicas]", "2")
    member.fill("input[name=devices_per_pod]", "4")
    member.click("#whatif-button")
    member.wait_for_selector('#whatif[data-verdict="no"]')
    whatif = member.inner_text("#whatif")
    assert "Not now" in whatif and any(code in whatif for code in REASONS), whatif
    shot(member, "02-submit-whatif")
    member.click("#submit-button")
    member.wait_for_url(f"{base}/workloads/*/")
    workload = Workload.objects.get(name="gang-8")

    # The first cycle explains it; the page learns it over the socket.
    member.wait_for_function("() => document.querySelector('#workload-reason').dataset.reason !== ''", timeout=30000)
    reason = member.inner_text("#workload-reason")
    message = member.inner_text("#workload-message")
    assert reason in REASONS, reason
    assert message and message != "—"
    assert member.inner_text("#workload-state") == "Pending"
    member.evaluate("window.__sameDocument = true")
    shot(member, "03-workload-pending")

    # The operator, in a second context, cancels one blocker (with the confirm dialog).
    operator = log_in(browser, base, "olivia")
    operator.goto(f"{base}/queue/")
    shot(operator, "04-queue-operator")
    operator.goto(f"{base}/workloads/{blocker_2.pk}/")
    operator.on("dialog", lambda dialog: dialog.accept())
    operator.fill("form[action$='/cancel/'] input[name=reason]", "free r2 for gang-8")
    operator.click("text=Cancel workload")
    operator.wait_for_selector(".message")
    assert Workload.objects.get(pk=blocker_2.pk).state == State.CANCELLED

    # The member's page turns Admitted without a reload.
    member.wait_for_function(
        "() => ['Admitted', 'Running'].includes(document.querySelector('#workload-state').textContent.trim())",
        timeout=30000,
    )
    assert member.evaluate("window.__sameDocument") is True
    workload.refresh_from_db()
    assert workload.state in (State.ADMITTED, State.RUNNING)
    assert set(workload.allocations.values_list("device__node__name", flat=True)) == {"n3", "n4"}
    member.wait_for_selector(".placement-rack .main-svg")
    shot(member, "05-workload-admitted")

    # The heatmap drills from rack to nodes to one device.
    operator.goto(f"{base}/topology/")
    operator.wait_for_selector("#heatmap .main-svg")
    shot(operator, "06-topology-racks")
    box = operator.evaluate(
        """() => {
          const el = document.getElementById('heatmap'), fl = el._fullLayout;
          const r = el.getBoundingClientRect();
          return {x: r.left + fl._size.l + fl.xaxis.l2p(2), y: r.top + fl._size.t + fl.yaxis.l2p(0)};
        }"""
    )
    operator.mouse.click(box["x"], box["y"])
    operator.wait_for_selector("#drill-card:not([hidden]) #drill .main-svg")
    assert "rack r2" in operator.inner_text("#crumbs")
    operator.click("#node-buttons button[data-node]:first-child")
    operator.wait_for_selector("#node-card:not([hidden]) #devices tbody tr")
    rows = operator.locator("#devices tbody tr")
    assert rows.count() == 4
    assert "gang-8" in operator.inner_text("#devices")
    shot(operator, "07-topology-node-devices")
    assert (member.console_errors, operator.console_errors) == ([], [])


def test_it_applies_a_suggestion_of_the_what_if_in_one_click(stack, browser, blockers, alice):
    base, _logs = stack

    member = log_in(browser, base, "alice")
    member.goto(f"{base}/submit/")
    member.fill("input[name=name]", "gang-shrunk")
    member.check('input[name=resource_class][data-name="distributed-training"]')
    member.fill("input[name=replicas]", "2")
    member.fill("input[name=devices_per_pod]", "4")
    member.click("#whatif-button")
    member.wait_for_selector('#whatif[data-verdict="no"] .apply-suggestion[data-kind="ShrinkGang"]')
    shot(member, "submit-whatif-suggestion")

    member.click('.apply-suggestion[data-kind="ShrinkGang"]')
    member.wait_for_selector('#whatif[data-verdict="yes"]')

    assert member.input_value("input[name=replicas]") == "1"
    assert member.input_value("input[name=min_count]") == "1"
    assert "it would start now" in member.inner_text("#whatif")


def test_it_resubmits_a_waiting_gang_with_a_suggestion_in_one_click(stack, browser, blockers, alice):
    base, _logs = stack

    member = log_in(browser, base, "alice")
    member.goto(f"{base}/submit/")
    member.fill("input[name=name]", "gang-wide")
    member.check('input[name=resource_class][data-name="distributed-training"]')
    member.fill("input[name=replicas]", "2")
    member.fill("input[name=devices_per_pod]", "4")
    member.click("#submit-button")
    member.wait_for_url(f"{base}/workloads/*/")
    original = Workload.objects.get(name="gang-wide")

    # The cycle's explanation carries the suggestion; the list is drawn with the page.
    resubmit = '#suggestions li[data-kind="ShrinkGang"] a[data-action="resubmit"]'
    for _ in range(30):
        if member.locator(resubmit).count():
            break
        member.wait_for_timeout(1000)
        member.reload()
    assert "quota" not in member.inner_text("#explanation").lower()  # a member changes no quota
    shot(member, "workload-resubmit-suggestion")

    member.click(resubmit)
    member.wait_for_selector("#resubmitting")
    assert member.input_value("input[name=name]") == "gang-wide-2"
    assert (member.input_value("input[name=replicas]"), member.input_value("input[name=min_count]")) == ("1", "1")
    assert member.is_checked("input[name=replaces]")
    shot(member, "submit-resubmission")
    member.click("#submit-button")
    member.wait_for_url(f"{base}/workloads/*/")

    assert "gang-wide-2" in member.inner_text("h1")
    original.refresh_from_db()
    assert original.state == State.CANCELLED
    member.wait_for_function(
        "() => ['Admitted', 'Running'].includes(document.querySelector('#workload-state').textContent.trim())",
        timeout=30000,
    )
    assert member.console_errors == []


def test_it_previews_a_claim_written_in_the_advanced_section(stack, browser, blockers, alice):
    """A claim for every H100 of a node (allocationMode All): n2 and n4 are free, so it would start; the
    same claim with a count beside All is refused under its field, in the page."""
    base, _logs = stack
    member = log_in(browser, base, "alice")
    member.goto(f"{base}/submit/")
    member.fill("input[name=name]", "every-gpu")
    member.check('input[name=resource_class][data-name="distributed-training"]')
    member.click("#advanced-claims summary")
    every = "requests: [{name: gpus, exactly: {deviceClassName: h100, allocationMode: All}}]"
    member.fill("textarea[name=claim]", every)
    assert "each with the devices its claim says" in member.inner_text("#size-summary")
    member.click("#whatif-button")
    member.wait_for_selector('#whatif[data-verdict="yes"]')
    assert "it would start now" in member.inner_text("#whatif")

    member.fill(
        "textarea[name=claim]",
        "requests: [{name: gpus, exactly: {deviceClassName: h100, allocationMode: All, count: 4}}]",
    )
    member.click("#whatif-button")
    member.wait_for_selector('#whatif[data-verdict="no"]')
    assert "allocationMode All takes every matching device; give no count" in member.inner_text("#whatif")
    # The refused what-if's 400 is the only thing the browser logs.
    assert all("status of 400" in error for error in member.console_errors), member.console_errors
