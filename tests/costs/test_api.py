import csv
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from openpyxl import load_workbook

from broker.workloads.states import State
from tests.costs.helpers import hold, sample, submit

# A month wholly in the past, so the wall clock the views read cannot cut it short.
OCT = datetime(2026, 10, 1, tzinfo=UTC)

WINDOW = "2026-10-01T00:00:00Z,2026-11-01T00:00:00Z"


@pytest.fixture
def october(cluster):
    """A month with work from both teams, a reservation-unused stretch and an unhealthy device."""
    a = submit(
        cluster.queue_a,
        "train",
        OCT,
        replicas=2,
        devices_per_pod=4,
        resource_class=cluster.training,
        state=State.SUCCEEDED,
    )
    hold(
        a,
        list(cluster.nodes[0].devices.all()) + list(cluster.nodes[1].devices.all()),
        cluster.h100,
        OCT + timedelta(days=2),
        OCT + timedelta(days=5, hours=7, minutes=13, seconds=7),
    )
    b = submit(
        cluster.queue_b,
        "serve",
        OCT,
        replicas=1,
        devices_per_pod=1,
        resource_class=cluster.inference,
        state=State.RUNNING,
    )
    hold(b, list(cluster.nodes[2].devices.all()[:1]), cluster.h100, OCT + timedelta(hours=3, seconds=11))
    sample(cluster.h100, OCT, total=16, unhealthy=1, stranded=2, reserved={"team-a": 2})
    sample(cluster.h100, OCT + timedelta(days=10, minutes=7), total=16, unhealthy=0, stranded=3)
    return cluster


def get(client, user, url, **params):
    client.force_authenticate(user)
    return client.get(url, params)


def money(value):
    return Decimal(str(value))


def test_it_reports_allocation_per_step_with_the_unallocated_rows(api_client, october, fiona):
    response = get(api_client, fiona, "/api/costs/allocation", window=WINDOW, aggregate="team", step="day")
    assert response.status_code == 200, response.content
    body = response.json()
    assert len(body["steps"]) == 31
    day3 = body["steps"][2]
    assert set(day3) >= {"allocations", "idle", "stranded", "unhealthy", "reserved_unused", "totals"}
    assert money(day3["allocations"]["team-a"]["cost"]) == Decimal("768.00")  # 8 devices x 24 h x 4.00
    for step in body["steps"]:
        parts = sum(
            money(step["totals"][name]["cost"])
            for name in ("allocated", "idle", "stranded", "unhealthy", "reserved_unused")
        )
        assert parts == money(step["totals"]["total"]["cost"]) == Decimal("1536.00")
    assert money(body["totals"]["total"]["cost"]) == Decimal("1536.00") * 31


def test_it_shares_idle_in_proportion_and_can_leave_it_out(api_client, october, fiona):
    shared = get(api_client, fiona, "/api/costs/allocation", window=WINDOW, step="month", share_idle="true").json()
    [step] = shared["steps"]
    idle = money(step["idle"]["cost"])
    assert idle > 0
    assert sum(money(row["shared_idle_cost"]) for row in step["allocations"].values()) == idle
    hidden = get(api_client, fiona, "/api/costs/allocation", window=WINDOW, step="month", idle="false").json()
    assert "idle" not in hidden["steps"][0]


def test_it_shows_finance_workload_names_and_teams_only(api_client, october, fiona, olivia):
    body = get(api_client, fiona, "/api/costs/allocation", window=WINDOW, aggregate="workload", step="month").json()
    assert body["workloads"]["team-a/train"] == {"name": "train", "team": "team-a"}
    text = str(body)
    for secret in ("pod_set", "pod_index", "device", "node", "explanation", "n1"):
        assert secret not in text.replace("device_hours", "").replace("device_class", "")
    operator_view = get(api_client, olivia, "/api/costs/allocation", window=WINDOW, aggregate="workload").json()
    assert operator_view["workloads"]["team-a/train"]["queue"] == "team-a"


def test_it_keeps_the_costliest_lines_and_sums_the_rest_into_one(api_client, october, fiona):
    params = {"window": WINDOW, "aggregate": "workload", "step": "day"}
    whole = get(api_client, fiona, "/api/costs/allocation", **params).json()
    top = get(api_client, fiona, "/api/costs/allocation", top=1, **params).json()
    # One device for the whole month costs more than eight for three days.
    assert list(top["totals"]["allocations"]) == ["(other)", "team-b/serve"]
    assert top["totals"]["allocations"]["team-b/serve"] == whole["totals"]["allocations"]["team-b/serve"]
    assert top["totals"]["allocations"]["(other)"] == whole["totals"]["allocations"]["team-a/train"]
    assert top["other"] == "(other)" and "other" not in whole
    assert set(top["workloads"]) == {"team-b/serve"}
    for step, whole_step in zip(top["steps"], whole["steps"], strict=True):
        allocated = sum(money(row["cost"]) for row in step["allocations"].values())
        assert (
            allocated == money(step["totals"]["allocated"]["cost"]) == money(whole_step["totals"]["allocated"]["cost"])
        )
    everything = get(api_client, fiona, "/api/costs/allocation", top=2, **params).json()
    assert everything["totals"] == whole["totals"]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"top": "0"}, "top"),
        ({"top": "many"}, "top"),
        ({"window": "yesterday-ish"}, "window"),
        ({"window": "2026-12-01T00:00:00Z,2026-11-01T00:00:00Z"}, "window"),
        ({"window": "2026-11-01,2026-12-01"}, "window"),
        ({"aggregate": "planet"}, "aggregate"),
        ({"aggregate": "team,team"}, "aggregate"),
        ({"step": "fortnight"}, "step"),
        ({"idle": "maybe"}, "idle"),
        ({"window": "2000-01-01T00:00:00Z,2026-01-01T00:00:00Z", "step": "hour"}, "step"),
    ],
)
def test_it_answers_bad_parameters_with_field_errors(api_client, cluster, fiona, params, field):
    response = get(api_client, fiona, "/api/costs/allocation", **params)
    assert response.status_code == 400
    assert field in response.json()


@pytest.mark.parametrize("url", ["/api/costs/export.csv", "/api/costs/statement"])
def test_it_wants_a_real_month(api_client, cluster, fiona, url):
    response = get(api_client, fiona, url, month="2026-13", team="team-a")
    assert response.status_code == 400
    assert "month" in response.json()


@pytest.mark.parametrize(
    ("persona", "allowed"),
    [("alice", False), ("bob", False), ("olivia", True), ("fiona", True), ("april", False), ("adam", True)],
)
@pytest.mark.parametrize(
    "url", ["/api/costs/allocation", "/api/costs/pending", "/api/costs/export.csv", "/api/costs/ticker"]
)
def test_it_lets_only_finance_operators_and_admins_read_cluster_costs(
    api_client, cluster, request, persona, allowed, url
):
    user = request.getfixturevalue(persona)
    response = get(api_client, user, url, month="2026-10")
    assert response.status_code == (200 if allowed else 403)


def test_it_refuses_anonymous_readers(api_client, cluster):
    assert api_client.get("/api/costs/allocation").status_code in (401, 403)


@pytest.mark.parametrize(
    ("persona", "team", "status"),
    [
        ("alice", "team-a", 200),
        ("alice", "team-b", 403),
        ("bob", "team-a", 403),
        ("bob", "team-b", 200),
        ("fiona", "team-b", 200),
        ("olivia", "team-a", 200),
        ("adam", "team-a", 200),
        ("alice", "nobody", 403),
        ("fiona", "nobody", 400),
    ],
)
def test_it_shows_a_member_only_their_own_team_statement(api_client, request, october, persona, team, status):
    user = request.getfixturevalue(persona)
    response = get(api_client, user, "/api/costs/statement", team=team, month="2026-10")
    assert response.status_code == status


def test_it_builds_a_statement_whose_lines_add_up_to_the_charge(api_client, october, alice):
    body = get(api_client, alice, "/api/costs/statement", team="team-a", month="2026-10").json()
    allocated = money(body["allocated"]["cost"])
    assert money(body["charge"]) == allocated + money(body["reserved_unused"]["cost"])
    for name in ("by_resource_class", "by_queue", "by_device_class", "by_workload", "by_cost_label"):
        assert sum(money(row["cost"]) for row in body[name].values()) == allocated
    assert money(body["reserved_unused"]["cost"]) > 0


def test_it_exports_the_same_totals_as_csv_xlsx_and_the_api(api_client, october, fiona):
    api = get(api_client, fiona, "/api/costs/allocation", window=WINDOW, aggregate="team", step="month").json()
    csv_text = get(api_client, fiona, "/api/costs/export.csv", month="2026-10").content.decode()
    rows = list(csv.DictReader(io.StringIO(csv_text)))
    xlsx = get(api_client, fiona, "/api/costs/export.xlsx", month="2026-10")
    assert xlsx["Content-Type"].startswith("application/vnd.openxmlformats")
    sheet = load_workbook(io.BytesIO(xlsx.content)).active
    header = [cell.value for cell in sheet[1]]
    xrows = [dict(zip(header, [c.value for c in row], strict=True)) for row in sheet.iter_rows(min_row=2)]
    assert [r["line"] for r in rows] == [r["line"] for r in xrows]
    for row, xrow in zip(rows, xrows, strict=True):
        for column in ("allocated_cost", "reserved_unused_cost", "charge", "pending_cost_not_billed"):
            assert Decimal(row[column]) == Decimal(str(xrow[column])).quantize(Decimal("0.01"))
    by_line = {row["line"]: row for row in rows}
    totals = api["totals"]
    assert Decimal(by_line["total"]["charge"]) == money(totals["total"]["cost"])
    assert Decimal(by_line["team-a"]["allocated_cost"]) == money(totals["allocations"]["team-a"]["cost"])
    assert Decimal(by_line["team-a"]["reserved_unused_cost"]) == money(
        totals["reserved_unused_by_team"]["team-a"]["cost"]
    )
    assert Decimal(by_line["idle"]["charge"]) == money(totals["idle"]["cost"])
    assert sum(Decimal(r["charge"]) for r in rows if r["kind"] != "total") == Decimal(by_line["total"]["charge"])
    # Both say when the figures were read: October is over, so as of its end.
    assert {r["as_of"] for r in rows} == {r["as_of"] for r in xrows} == {"2026-11-01T00:00:00+00:00"}


def test_it_reports_pending_cost_beside_the_bill(api_client, cluster, fiona):
    waiting = submit(cluster.queue_b, "waits", OCT, replicas=1, devices_per_pod=2, resource_class=cluster.training)
    waiting.transition(State.PENDING, at=OCT)
    response = get(
        api_client,
        fiona,
        "/api/costs/pending",
        window="2026-10-01T00:00:00Z,2026-10-02T00:00:00Z",
        aggregate="team,reason",
        step="day",
    )
    assert response.status_code == 200
    assert response.json()["totals"]["pending"]["team-b/NotYetExplained"]["cost"] == 192.0  # 2 x 24 h x 4.00


def pending_report_queries(cluster, waiting):
    """The SQL of one pending report over October with `waiting` workloads queued in it."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from broker.costs.pending import pending_report

    for index in range(waiting):
        workload = submit(cluster.queue_b, f"waits-{waiting}-{index}", OCT, resource_class=cluster.training)
        workload.transition(State.PENDING, at=OCT)
    with CaptureQueriesContext(connection) as captured:
        report = pending_report(OCT, OCT + timedelta(days=31), aggregate=("workload",), step="month")
    assert len(report["totals"]["pending"]) >= waiting
    return [query["sql"] for query in captured.captured_queries]


def test_it_reads_pending_cost_in_the_same_queries_however_many_workloads_waited(cluster):
    few = pending_report_queries(cluster, 2)
    many = pending_report_queries(cluster, 40)
    # The workloads are selected once and joined, never passed back as a list of ids.
    assert [len(sql) for sql in many] == [len(sql) for sql in few]


def allocation_report_queries(cluster, workloads):
    """The SQL of one allocation report by workload over October with `workloads` more of them having run."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from broker.costs.report import allocation_report

    device = cluster.nodes[0].devices.first()
    for index in range(workloads):
        workload = submit(cluster.queue_a, f"ran-{workloads}-{index}", OCT, state=State.SUCCEEDED)
        hold(workload, [device], cluster.h100, OCT + timedelta(hours=index), OCT + timedelta(hours=index + 1))
    with CaptureQueriesContext(connection) as captured:
        report = allocation_report(OCT, OCT + timedelta(days=31), aggregate=("workload",), step="month")
    assert len(report["workloads"]) >= workloads
    return [query["sql"] for query in captured.captured_queries]


def test_it_names_the_workloads_of_a_cost_report_in_the_same_queries_however_many_ran(cluster):
    few = allocation_report_queries(cluster, 2)
    many = allocation_report_queries(cluster, 40)
    assert [len(sql) for sql in many] == [len(sql) for sql in few]
