"""End to end, in Chromium against daphne + a Celery worker + PostgreSQL + Redis: a member submits large
reserved training; an approver, in a second browser context, sees it arrive without reloading, approves
with a comment, and the workload goes Pending and then Admitted on the member's page without a reload. A
rejected request is never scheduled, and an approver cannot approve their own request.
Screenshots go to test-artifacts/approval-*.png.
"""

import time

import pytest

from broker.audit.models import AuditEvent
from broker.workloads.models import Allocation, ApprovalState, SchedulingCycle, Workload
from broker.workloads.states import State
from tests.builders import make_user
from tests.e2e.conftest import log_in, shot

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

FORGED_APPROVAL = """async (pk) => {
  const token = document.cookie.split('; ').find((c) => c.startsWith('csrftoken=')).split('=')[1];
  const body = new URLSearchParams({[`w${pk}-comment`]: 'my own, trust me'});
  const response = await fetch(`/governance/approvals/${pk}/approve/`,
    {method: 'POST', body, headers: {'X-CSRFToken': token}, credentials: 'same-origin'});
  return await response.text();
}"""


def submit_large_training(page, base, name):
    page.goto(f"{base}/submit/")
    page.fill("input[name=name]", name)
    page.check('input[name=resource_class][data-name="large-reserved-training"]')
    page.fill("input[name=replicas]", "2")
    page.fill("input[name=devices_per_pod]", "4")
    page.click("#submit-button")
    page.wait_for_url(f"{base}/workloads/*/")
    workload = Workload.objects.get(name=name)
    assert page.inner_text("#workload-state") == State.AWAITING_APPROVAL
    return workload


def wait_until(condition, timeout, message):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(message)


def run_a_cycle():
    """Ask the worker for a cycle and wait until one more has committed."""
    from broker.cycle.tasks import run_cycle

    last = SchedulingCycle.objects.order_by("-id").values_list("id", flat=True).first() or 0
    run_cycle.delay(reason="e2e")
    wait_until(
        lambda: SchedulingCycle.objects.filter(id__gt=last, outcome=SchedulingCycle.Outcome.COMMITTED).exists(),
        30,
        "the worker committed no cycle",
    )


def test_it_approves_live_and_the_workload_is_admitted_rejected_never_runs(stack, browser, cluster, alice, april):
    base, _logs = stack
    member = log_in(browser, base, "alice")
    approver = log_in(browser, base, "april")
    approver.goto(f"{base}/governance/approvals/")
    approver.wait_for_selector('body[data-approvals-live="true"]')
    approver.evaluate("window.__sameDocument = true")
    shot(approver, "approval-01-inbox-empty")

    # The member submits; the approver's inbox shows it without a reload.
    workload = submit_large_training(member, base, "big-train")
    shot(member, "approval-02-member-awaiting")
    row = f'tr[data-approval-row="{workload.pk}"]'
    approver.wait_for_selector(row)
    assert approver.evaluate("window.__sameDocument") is True
    assert "always needs approval" in approver.inner_text(row)
    shot(approver, "approval-03-request-arrived-live")

    # Approve with a comment: Pending, then the worker's cycle admits it, and the member's page says so.
    approver.fill(f'{row} textarea[name="w{workload.pk}-comment"]', "capacity planned for this week")
    approver.click(f"{row} button.approve")
    approver.wait_for_selector(".message")
    member.wait_for_function(
        "() => ['Admitted', 'Running'].includes(document.querySelector('#workload-state').textContent.trim())",
        timeout=30000,
    )
    workload.refresh_from_db()
    states = list(workload.transitions.values_list("to_state", flat=True))
    assert states[:3] == [State.AWAITING_APPROVAL, State.PENDING, State.ADMITTED], states
    assert Allocation.objects.filter(workload=workload, released_at__isnull=True).count() == 8
    shot(member, "approval-04-member-admitted-live")
    member.reload()
    assert member.inner_text("#approval-decided-by") == "april"
    assert "capacity planned for this week" in member.inner_text("#approval-comment")
    shot(member, "approval-05-member-sees-decision")

    # A second request is rejected and stays off the cluster, though the free half would hold it.
    rejected = submit_large_training(member, base, "big-train-2")
    row = f'tr[data-approval-row="{rejected.pk}"]'
    approver.goto(f"{base}/governance/approvals/")
    approver.wait_for_selector(row)
    approver.click(f"{row} button.reject")  # no comment: the browser's required check holds it
    assert Workload.objects.get(pk=rejected.pk).approval == ApprovalState.REQUESTED
    approver.fill(f'{row} textarea[name="w{rejected.pk}-comment"]', "no budget left this month")
    approver.click(f"{row} button.reject")
    approver.wait_for_selector(".message")
    shot(approver, "approval-06-after-reject")
    run_a_cycle()
    run_a_cycle()
    rejected.refresh_from_db()
    assert (rejected.state, rejected.approval) == (State.REJECTED, ApprovalState.REJECTED)
    assert not Allocation.objects.filter(workload=rejected).exists()
    assert Allocation.objects.filter(released_at__isnull=True).count() == 8, "8 devices stayed free"
    member.goto(f"{base}/workloads/{rejected.pk}/")
    assert 'data-approval="Rejected"' in member.inner_html("#approval-card")
    shot(member, "approval-07-member-sees-rejection")


def test_it_refuses_an_approver_their_own_request_in_the_browser(stack, browser, cluster):
    make_user("paula", roles=["member", "approver"], teams=[cluster.team_a])
    page = log_in(browser, base := stack[0], "paula")
    workload = submit_large_training(page, base, "paula-train")

    page.goto(f"{base}/governance/approvals/")
    row = f'tr[data-approval-row="{workload.pk}"]'
    assert "another approver must decide" in page.inner_text(row)
    assert page.locator(f"{row} form").count() == 0
    answer = page.evaluate(FORGED_APPROVAL, workload.pk)
    assert "Approvers cannot decide on their own requests" in answer
    shot(page, "approval-08-self-approval-refused")

    workload.refresh_from_db()
    assert (workload.state, workload.approval) == (State.AWAITING_APPROVAL, ApprovalState.REQUESTED)
    assert not AuditEvent.objects.filter(action="workload.approve").exists()
