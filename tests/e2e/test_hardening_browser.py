"""In Chromium, on the production stack: every page works under the Content-Security-Policy with no
violation reported (Plotly's bundle, Swagger UI and the admin included), and operator-set names with
HTML are drawn as text in the topology charts."""

import pytest

from broker.inventory.models import Domain, Node
from broker.workloads.states import State
from tests.builders import make_workload
from tests.e2e.conftest import log_in, shot

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

WATCH_CSP = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", function (e) {
  window.__csp.push(e.violatedDirective + " " + e.blockedURI + " " + (e.sourceFile || "") + ":" + e.lineNumber);
});
"""

# Each page and what shows it has finished drawing (a chart, Swagger UI's header, a table).
PAGES = [
    ("/", "#cycles-chart .main-svg"),
    ("/queue/", "#pending-table"),
    ("/workloads/{workload}/", ".placement-rack .main-svg"),
    ("/topology/", "#heatmap .main-svg"),
    ("/teams/", "#usage-chart .main-svg"),
    ("/submit/", "form"),
    ("/finance/", "#stacked .main-svg"),
    ("/governance/menu/", "table"),
    ("/governance/approvals/", "h1"),
    ("/governance/audit/", "#audit"),
    ("/governance/lockouts/", "#lockouts"),
    ("/api/docs/", ".swagger-ui .info"),
    ("/api/workloads/", ".response-info"),
    ("/admin/", "#content"),
]


def test_every_page_works_under_the_content_security_policy(stack, browser, cluster, adam):
    base, _logs = stack
    adam.is_staff = adam.is_superuser = True
    adam.save()
    running = make_workload(cluster.queue_a, "placed", resource_class=cluster.training, state=State.PENDING)
    page = log_in(browser, base, "adam")
    page.context.add_init_script(WATCH_CSP)
    violations = {}
    for path, ready in PAGES:
        url = base + path.format(workload=running.pk)
        response = page.goto(url)
        policy = dict(part.strip().split(" ", 1) for part in response.headers["content-security-policy"].split(";"))
        assert policy["script-src"].split(" ")[0] == "'self'", (path, policy)
        assert "unsafe" not in policy["script-src"], (path, policy)
        assert (policy["frame-ancestors"], policy["object-src"]) == ("'none'", "'none'"), path
        if "{workload}" in path:
            ready = "#workload-cost"  # a pending workload has no placement chart
        page.wait_for_selector(ready, state="attached")
        page.wait_for_timeout(500)  # late work: charts drawn after their JSON, the socket's catch-up
        found = page.evaluate("window.__csp")
        if found:
            violations[path] = found
    shot(page, "csp-last-page")
    assert violations == {}
    assert [error for error in page.console_errors if "Content Security Policy" in error] == []


def test_html_in_operator_set_names_is_drawn_as_text_in_the_charts(stack, browser, cluster, olivia):
    base, _logs = stack
    Domain.objects.filter(name="b1").update(name='<a href="https://evil.example/">b1</a>')
    Domain.objects.filter(name="r1").update(name="<b>r1</b>")
    Domain.objects.filter(name="r2").update(name="<b>r2</b>")
    for name in ("n1", "n3"):
        Node.objects.filter(name=name).update(name=f'<span style="font-size:80px">{name}</span>')
    page = log_in(browser, base, "olivia")
    page.goto(f"{base}/topology/")
    page.wait_for_selector("#heatmap .main-svg")

    heatmap = page.evaluate(
        """() => ({
          links: document.querySelectorAll('#heatmap a').length,
          ticks: Array.from(document.querySelectorAll('#heatmap .ytick text')).map((t) => t.textContent),
        })"""
    )
    assert heatmap["links"] == 0
    assert 'z1/<a href="https://evil.example/">b1</a>' in heatmap["ticks"]

    box = page.evaluate(
        """() => {
          const el = document.getElementById('heatmap'), fl = el._fullLayout;
          const r = el.getBoundingClientRect();
          return {x: r.left + fl._size.l + fl.xaxis.l2p(2), y: r.top + fl._size.t + fl.yaxis.l2p(0)};
        }"""
    )
    page.mouse.click(box["x"], box["y"])
    page.wait_for_selector("#drill-card:not([hidden]) #drill .main-svg")
    drill = page.evaluate(
        """() => ({
          links: document.querySelectorAll('#drill a').length,
          bold: document.querySelectorAll('#drill .gtitle b, #drill .gtitle tspan[style*="bold"]').length,
          title: document.querySelector('#drill .gtitle').textContent,
          ticks: Array.from(document.querySelectorAll('#drill .ytick text')).map((t) => t.textContent),
          big: Array.from(document.querySelectorAll('#drill .ytick tspan')).filter(
            (t) => (t.getAttribute('style') || '').includes('80px')).length,
        })"""
    )
    shot(page, "html-names-as-text")
    assert drill["links"] == 0 and drill["big"] == 0 and drill["bold"] == 0
    assert "<b>r" in drill["title"]  # whichever rack the click opened, its name is text
    assert any(tick.startswith('<span style="font-size:80px">n') for tick in drill["ticks"]), drill["ticks"]
    assert page.console_errors == []
