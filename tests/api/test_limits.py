"""Bounded input: every finding of issue 30's "Low" list that was a 500, and the body limits, answered
400 (or 413) with the field named, and nothing changed."""

import json

import pytest
from django.urls import reverse

from broker import limits
from broker.api.parsers import BoundedJSONParser, RequestTooLarge
from broker.audit.models import AuditEvent
from broker.workloads.models import Workload
from tests.api.base import signed_in
from tests.api.test_workloads import pending, submission

URL = "/api/workloads/"
TOO_BIG = 2**31


def post_json(client, url, body):
    return client.post(url, json.dumps(body), content_type="application/json")


class TestBodyLimits:
    def test_it_refuses_a_10_mb_body_before_parsing_it(self, cluster, api_client, alice, monkeypatch):
        parsed = []
        monkeypatch.setattr(BoundedJSONParser, "parse", lambda *args, **kwargs: parsed.append(1))
        body = json.dumps({**submission(), "padding": "x" * (10 * 1024 * 1024)})

        response = signed_in(api_client, alice).post(URL, body, content_type="application/json")

        assert response.status_code == 413
        assert "1,048,576 bytes" in response.json()["detail"]
        assert parsed == []
        assert not Workload.objects.exists()

    def test_it_refuses_a_page_form_larger_than_the_limit_too(self, cluster, client, alice):
        client.force_login(alice)
        response = client.post(reverse("dashboard:submit"), {"name": "x" * (2 * 1024 * 1024)})
        assert response.status_code == 413

    def test_it_stops_reading_a_body_without_a_length_at_the_limit(self, settings):
        settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000

        class Stream:
            read_sizes = []

            def read(self, size):
                self.read_sizes.append(size)
                return b"[" * size

        with pytest.raises(RequestTooLarge):
            BoundedJSONParser().parse(Stream())
        assert Stream.read_sizes == [1001]

    def test_it_names_unknown_keys(self, cluster, api_client, alice):
        client = signed_in(api_client, alice)
        response = client.post(URL, {**submission(), "prority": 5}, format="json")
        assert (response.status_code, list(response.data)) == (400, ["prority"])
        assert "Unknown field" in response.data["prority"][0]
        body = submission(pod_sets=[{"replicas": 1, "devices_per_pod": 1, "gpus": 2}])
        response = client.post(URL, body, format="json")
        assert (response.status_code, list(response.data["pod_sets"][0])) == (400, ["gpus"])
        assert not Workload.objects.exists()

    def test_it_refuses_unknown_keys_of_model_bodies_and_actions(self, cluster, api_client, olivia):
        client = signed_in(api_client, olivia)
        response = client.post("/api/teams/", {"name": "team-z", "colour": "red"}, format="json")
        assert (response.status_code, list(response.data)) == (400, ["colour"])
        workload = pending(cluster)
        response = client.post(f"{URL}{workload.pk}/cancel/", {"reason": "x", "force": True}, format="json")
        assert (response.status_code, list(response.data)) == (400, ["force"])

    def test_it_refuses_more_pod_sets_than_a_workload_may_have(self, cluster, api_client, alice):
        client = signed_in(api_client, alice)
        many = [{"name": f"p{i}", "replicas": 1, "devices_per_pod": 1} for i in range(10_000)]
        response = post_json(client, URL, submission(pod_sets=many))
        assert response.status_code == 400
        assert "no more than 8" in str(response.json()["pod_sets"])
        # 200,000 of them are past the body limit: refused unread.
        assert post_json(client, URL, submission(pod_sets=many * 20)).status_code == 413

    @pytest.mark.parametrize("depth", [limits.JSON_DEPTH_MAX + 1, 100_000])
    def test_it_refuses_deeply_nested_json(self, cluster, api_client, alice, depth):
        body = "[" * depth + "]" * depth
        response = signed_in(api_client, alice).post(URL, body, content_type="application/json")
        assert response.status_code == 400
        assert "nested deeper" in response.json()["detail"]

    def test_it_refuses_nan_and_infinity(self, cluster, api_client, alice):
        body = json.dumps(submission(expected_duration_seconds=float("inf")))
        response = signed_in(api_client, alice).post(URL, body, content_type="application/json")
        assert response.status_code == 400


class TestIntegerBounds:
    @pytest.mark.parametrize(
        ("where", "field"),
        [
            ("body", "priority"),
            ("body", "expected_duration_seconds"),
            ("pod_set", "replicas"),
            ("pod_set", "devices_per_pod"),
            ("pod_set", "min_count"),
        ],
    )
    def test_it_refuses_integers_past_the_bounds(self, cluster, api_client, alice, where, field):
        body = submission()
        if where == "body":
            body[field] = TOO_BIG
        else:
            body["pod_sets"][0][field] = TOO_BIG
        response = signed_in(api_client, alice).post(URL, body, format="json")

        assert response.status_code == 400
        errors = response.data if where == "body" else response.data["pod_sets"][0]
        assert field in errors
        assert not Workload.objects.exists()

    @pytest.mark.parametrize("priority", [99999999999999999999, limits.PRIORITY_MAX + 1, limits.PRIORITY_MIN - 1])
    def test_it_refuses_an_operator_priority_out_of_range(self, cluster, api_client, olivia, priority):
        workload = pending(cluster)
        body = {"priority": priority, "reason": "deadline"}
        response = post_json(signed_in(api_client, olivia), f"{URL}{workload.pk}/priority/", body)

        assert response.status_code == 400
        assert "priority" in response.json()
        workload.refresh_from_db()
        assert workload.priority == 0

    @pytest.mark.parametrize("reason", ["", "   ", None])
    def test_it_refuses_a_priority_change_without_a_reason(self, cluster, api_client, olivia, reason):
        workload = pending(cluster)
        body = {"priority": -99999} if reason is None else {"priority": -99999, "reason": reason}
        response = signed_in(api_client, olivia).post(f"{URL}{workload.pk}/priority/", body, format="json")

        assert response.status_code == 400
        assert "reason" in response.data
        workload.refresh_from_db()
        assert workload.priority == 0
        assert not AuditEvent.objects.filter(action="workload.priority").exists()

    def test_the_page_action_refuses_out_of_range_and_unexplained_priorities(self, cluster, client, olivia):
        workload = pending(cluster)
        client.force_login(olivia)
        url = reverse("dashboard:workload-priority", args=[workload.pk])
        for body in ({"priority": "99999999999999999999", "reason": "x"}, {"priority": "-99999", "reason": ""}):
            assert client.post(url, body).status_code == 302
        workload.refresh_from_db()
        assert workload.priority == 0
        assert not AuditEvent.objects.filter(action="workload.priority").exists()

    def test_the_admin_refuses_a_priority_class_value_past_the_bound(self, cluster, client, adam):
        adam.is_staff = adam.is_superuser = True
        adam.save()
        client.force_login(adam)
        url = reverse("admin:policy_priorityclass_add")
        response = client.post(url, {"name": "huge", "value": str(TOO_BIG), "description": ""})
        assert response.status_code == 200
        assert "value" in response.context["adminform"].form.errors


class TestNames:
    def test_the_admin_refuses_a_nul_in_a_json_field(self, cluster, client, adam):
        adam.is_staff = adam.is_superuser = True
        adam.save()
        client.force_login(adam)
        node = cluster.nodes[0]
        url = reverse("admin:inventory_node_change", args=[node.pk])
        form = client.get(url).context["adminform"].form
        body = {name: form.initial.get(name) or "" for name in form.fields}
        body.update({"name": node.name, "domain": node.domain_id, "labels": '{"zone\\u0000": "a"}'})
        response = client.post(url, {k: v for k, v in body.items() if v is not None})
        assert response.status_code == 200
        assert "labels" in response.context["adminform"].form.errors
        node.refresh_from_db()
        assert node.labels == {}

    @pytest.mark.parametrize("field", ["queue", "resource_class", "name"])
    def test_it_refuses_a_nul_in_a_name_or_reference(self, cluster, api_client, alice, field):
        response = signed_in(api_client, alice).post(URL, submission(**{field: "team\x00a"}), format="json")
        assert response.status_code == 400
        assert not Workload.objects.exists()

    def test_it_refuses_a_nul_in_a_form_encoded_body(self, cluster, api_client, alice):
        body = "name=job&queue=team-a%00&resource_class=small-inference"
        client = signed_in(api_client, alice)
        response = client.post(URL, body, content_type="application/x-www-form-urlencoded")
        assert response.status_code == 400
        assert "NUL" in response.json()["detail"]

    def test_it_refuses_a_nul_deep_in_a_body(self, cluster, api_client, olivia):
        body = {"name": "n9", "attributes": {"model\x00": "H100"}}
        response = signed_in(api_client, olivia).post("/api/nodes/", body, format="json")
        assert response.status_code == 400

    @pytest.mark.parametrize(
        "url",
        [
            "/api/workloads/?team=a%00b",
            "/api/devices/?node=n1%00",
            "/api/domains/?name=r%001",
            "/api/reservations/?team=%00",
            "/api/resource-classes/?name=%00x",
            "/api/queues/?cohort=%00",
            "/api/teams/?name=%00",
        ],
    )
    def test_it_refuses_a_nul_in_any_filter_naming_the_parameter(self, cluster, api_client, adam, url):
        response = signed_in(api_client, adam).get(url)
        assert response.status_code == 400
        name = url.split("?")[1].split("=")[0]
        assert list(response.json()) == [name]

    def test_a_page_refuses_a_nul_in_its_query(self, cluster, client, olivia):
        client.force_login(olivia)
        assert client.get("/queue/?team=a%00").status_code == 400


class TestDatetimes:
    @pytest.mark.parametrize(
        "url",
        [
            "/api/workloads/?submitted_after=2020-01-01T00:00:00-23:01",
            "/api/cycles/?started_before=2020-01-01T00:00:00%2B23:59",
            "/api/audit-events/?after=2020-01-01T00:00:00-23:01",
            "/api/reservations/?active_at=2020-01-01T00:00:00-23:01",
        ],
    )
    def test_it_takes_any_utc_offset(self, cluster, api_client, adam, url):
        assert signed_in(api_client, adam).get(url).status_code == 200

    def test_it_refuses_an_instant_outside_the_calendar(self, cluster, api_client, adam):
        response = signed_in(api_client, adam).get("/api/workloads/?submitted_after=0001-01-01T00:00:00%2B05:00")
        assert response.status_code == 400
        assert "submitted_after" in response.json()

    def test_the_audit_page_takes_any_utc_offset(self, cluster, client, olivia):
        client.force_login(olivia)
        response = client.get("/governance/audit/", {"after": "2020-01-01T00:00:00-23:01"})
        assert response.status_code == 200


class TestPages:
    def test_a_huge_page_number_is_the_last_page(self, cluster, client, olivia):
        client.force_login(olivia)
        assert client.get("/queue/?page=99999999999999999999").status_code == 200
        assert client.get("/dashboard/api/queue/?page=99999999999999999999").status_code == 200

    def test_page_number_is_bounded(self):
        assert limits.page_number("99999999999999999999") == limits.PAGE_MAX
        assert (limits.page_number("-3"), limits.page_number("x"), limits.page_number(None)) == (1, 1, 1)

    @pytest.mark.parametrize("hours", ["1e20", "1e308", "inf", "nan"])
    def test_expected_hours_past_the_bound_are_a_field_error(self, cluster, client, alice, hours):
        client.force_login(alice)
        body = {
            "name": "probe",
            "queue": cluster.queue_a.pk,
            "resource_class": cluster.inference.pk,
            "replicas": 1,
            "devices_per_pod": 1,
            "expected_hours": hours,
        }
        whatif = client.post(reverse("dashboard:submit-whatif"), body)
        assert whatif.status_code == 400
        assert "expected_hours" in whatif.json()["errors"]
        page = client.post(reverse("dashboard:submit"), body)
        assert page.status_code == 200
        assert "expected_hours" in page.context["form"].errors
        assert not Workload.objects.exists()


def test_in_utc_keeps_the_instant():
    from datetime import UTC, datetime, timedelta, timezone

    value = datetime(2020, 1, 1, tzinfo=timezone(-timedelta(hours=23, minutes=1)))
    assert limits.in_utc(value) == value
    assert limits.in_utc(value).tzinfo == UTC
