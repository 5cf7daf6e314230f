from datetime import timedelta
from decimal import Decimal

from django.utils import timezone

from broker.audit.models import AuditEvent
from broker.policy.models import Cohort, DeviceClass, PriorityClass, Queue, Reservation, ResourceClass, Team
from tests.api.base import ModelAPITests, signed_in
from tests.builders import H100_SELECTOR, make_resource_class

A100_SELECTOR = 'device.attributes["gpu.example.com"].model == "A100"'


class TestTeams(ModelAPITests):
    model = Team
    url = "/api/teams/"

    def make_object(self, cluster):
        return Team.objects.create(name="team-c")

    def create_data(self, cluster, n):
        return {"name": f"team-new-{n}", "display_name": "New"}

    def update_data(self, cluster):
        return {"display_name": "Team C, renamed"}

    def bad_create_data(self, cluster):
        return [
            ({"name": "team-a"}, ["name"]),
            ({"name": "t", "members": ["nobody-by-this-name"]}, ["members"]),
        ]

    def test_it_sets_members_by_username(self, cluster, api_client, olivia, alice):
        response = signed_in(api_client, olivia).patch(
            f"{self.url}{cluster.team_b.pk}/", {"members": ["alice"]}, format="json"
        )
        assert response.data["members"] == ["alice"]
        assert cluster.team_b.members.filter(username="alice").exists()


class TestPriorityClasses(ModelAPITests):
    model = PriorityClass
    url = "/api/priority-classes/"

    def make_object(self, cluster):
        return PriorityClass.objects.create(name="scavenger", value=1)

    def create_data(self, cluster, n):
        return {"name": f"tier-{n}", "value": 500 + n}

    def update_data(self, cluster):
        return {"value": 2, "preemptible": False}

    def bad_create_data(self, cluster):
        return [({"name": "batch", "value": 5}, ["name"]), ({"name": "no-value"}, ["value"])]


class TestDeviceClasses(ModelAPITests):
    model = DeviceClass
    url = "/api/device-classes/"

    def make_object(self, cluster):
        return DeviceClass.objects.create(name="a100", selector=A100_SELECTOR, price_per_hour="2.0000")

    def create_data(self, cluster, n):
        return {"name": f"mi300-{n}", "selector": H100_SELECTOR.replace("H100", "MI300X"), "price_per_hour": "3.5000"}

    def update_data(self, cluster):
        return {"price_per_hour": "2.5000"}

    def bad_create_data(self, cluster):
        return [
            ({"name": "broken", "selector": "device.attributes[", "price_per_hour": "1"}, ["selector"]),
            ({"name": "free", "selector": A100_SELECTOR, "price_per_hour": "-1"}, ["price_per_hour"]),
            ({"name": "h100", "selector": A100_SELECTOR, "price_per_hour": "1"}, ["name"]),
        ]


class TestCohorts(ModelAPITests):
    model = Cohort
    url = "/api/cohorts/"

    def make_object(self, cluster):
        return Cohort.objects.create(name="research")

    def create_data(self, cluster, n):
        return {"name": f"org-{n}", "parent": "main", "nominal_quota": {"h100": 4}}

    def update_data(self, cluster):
        return {"nominal_quota": {"h100": 2}}

    def bad_create_data(self, cluster):
        return [
            ({"name": "q1", "nominal_quota": {"tpu": 4}}, ["nominal_quota"]),
            ({"name": "q2", "nominal_quota": {"h100": -1}}, ["nominal_quota"]),
            ({"name": "q3", "parent": "nowhere"}, ["parent"]),
        ]

    def test_it_refuses_a_cycle_of_cohorts(self, cluster, api_client, olivia):
        child = Cohort.objects.create(name="child", parent=Cohort.objects.get(name="main"))
        main = Cohort.objects.get(name="main")
        response = signed_in(api_client, olivia).patch(f"{self.url}{main.pk}/", {"parent": child.name})
        assert response.status_code == 400
        assert "parent" in response.data


class TestQueues(ModelAPITests):
    model = Queue
    url = "/api/queues/"

    def make_object(self, cluster):
        return Queue.objects.create(name="team-b-spare", team=cluster.team_b)

    def create_data(self, cluster, n):
        return {"name": f"team-a-extra-{n}", "team": "team-a", "cohort": "main", "nominal_quota": {"h100": 2}}

    def update_data(self, cluster):
        return {"nominal_quota": {"h100": 12}, "borrowing_limit": {"h100": 4}, "fair_share_weight": 2.0}

    def bad_create_data(self, cluster):
        return [
            ({"name": "x", "team": "nobody"}, ["team"]),
            ({"name": "y", "team": "team-a", "nominal_quota": {"tpu": 1}}, ["nominal_quota"]),
            ({"name": "z", "team": "team-a", "lending_limit": {"h100": 1.5}}, ["lending_limit"]),
            ({"name": "w", "team": "team-a", "fair_share_weight": -1}, ["fair_share_weight"]),
            ({"name": "v", "team": "team-a", "within_queue_preemption": "Always"}, ["within_queue_preemption"]),
        ]

    def test_it_counts_a_quota_edit_as_a_manual_intervention(self, cluster, api_client, olivia):
        response = signed_in(api_client, olivia).patch(
            f"{self.url}{cluster.queue_a.pk}/", {"nominal_quota": {"h100": 4}}, format="json", HTTP_X_REASON="INC-7"
        )
        assert response.status_code == 200
        event = AuditEvent.objects.get(action="queue.update")
        assert event.before["nominal_quota"] == {"h100": 8}
        assert event.after["nominal_quota"] == {"h100": 4}
        assert (event.manual_intervention, event.reason) == (True, "INC-7")

    def test_it_refuses_to_delete_a_queue_with_workloads(self, cluster, api_client, olivia):
        from tests.builders import make_workload

        for index in range(12):
            make_workload(cluster.queue_a, f"job-{index:02}")
        response = signed_in(api_client, olivia).delete(f"{self.url}{cluster.queue_a.pk}/")
        assert response.status_code == 409
        named = ", ".join(f"team-a/job-{index:02}" for index in range(10))
        assert response.data["detail"] == f"It is still in use by 12 workloads ({named}, …)."
        assert Queue.objects.filter(pk=cluster.queue_a.pk).exists()
        assert not AuditEvent.objects.filter(action="queue.delete").exists()

    def test_it_names_a_few_blockers_in_a_few_queries_however_many_there_are(self, cluster, api_client, olivia):
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        from tests.builders import make_workload

        for index in range(40):
            make_workload(cluster.queue_a, f"job-{index:02}")
        client = signed_in(api_client, olivia)
        with CaptureQueriesContext(connection) as captured:
            response = client.delete(f"{self.url}{cluster.queue_a.pk}/")
        assert response.status_code == 409
        assert "40 workloads (team-a/job-00," in response.data["detail"]
        # Naming all forty read each one's team: the answer took 47 s for a device class in use.
        assert len(captured) < 40


class TestResourceClasses(ModelAPITests):
    model = ResourceClass
    url = "/api/resource-classes/"

    def make_object(self, cluster):
        return make_resource_class("interactive", PriorityClass.objects.get(name="batch"), [cluster.h100])

    def create_data(self, cluster, n):
        DeviceClass.objects.get_or_create(name="a100", defaults={"selector": A100_SELECTOR, "price_per_hour": "2.0000"})
        return {
            "name": f"batch-inference-{n}",
            "display_name": "Batch inference",
            "device_classes": ["a100", "h100"],
            "priority_class": "batch",
            "topology_preferred": "rack",
            "max_devices": 8,
            "allowed_teams": ["team-b"],
        }

    def update_data(self, cluster):
        return {"approval_required": True, "max_devices_per_pod": 4}

    def bad_create_data(self, cluster):
        base = {"name": "rc", "display_name": "RC", "priority_class": "batch"}
        return [
            ({**base, "topology_required": "galaxy"}, ["topology_required"]),
            ({**base, "device_classes": ["tpu"]}, ["device_classes"]),
            ({**base, "device_classes": ["h100", "h100"]}, ["device_classes"]),
            ({**base, "priority_class": "urgent"}, ["priority_class"]),
            ({**base, "allowed_teams": ["team-z"]}, ["allowed_teams"]),
        ]

    def test_it_keeps_device_classes_in_fallback_order(self, cluster, api_client, olivia):
        response = signed_in(api_client, olivia).post(self.url, self.create_data(cluster, 0), format="json")
        resource_class = ResourceClass.objects.get(pk=response.data["id"])
        assert [dc.name for dc in resource_class.ordered_device_classes()] == ["a100", "h100"]
        assert response.data["device_classes"] == ["a100", "h100"]
        assert response.data["allowed_teams"] == ["team-b"]

        response = signed_in(api_client, olivia).patch(
            f"{self.url}{resource_class.pk}/", {"device_classes": ["h100", "a100"]}, format="json"
        )
        assert [dc.name for dc in resource_class.ordered_device_classes()] == ["h100", "a100"]
        assert AuditEvent.objects.get(action="resourceclass.update").before["device_classes"] == ["a100", "h100"]

    def test_it_reads_and_writes_the_cost_approval_rule_with_the_class(self, cluster, api_client, olivia):
        from broker.governance.approvals import cost_threshold

        client = signed_in(api_client, olivia)
        response = client.post(
            self.url, {**self.create_data(cluster, 0), "cost_threshold_per_hour": "12.50"}, format="json"
        )
        resource_class = ResourceClass.objects.get(pk=response.data["id"])
        assert response.data["cost_threshold_per_hour"] == "12.50"
        assert cost_threshold(resource_class) == Decimal("12.50")

        client.patch(f"{self.url}{resource_class.pk}/", {"max_devices": 16}, format="json")
        assert cost_threshold(ResourceClass.objects.get(pk=resource_class.pk)) == Decimal("12.50"), "left as it was"

        response = client.patch(f"{self.url}{resource_class.pk}/", {"cost_threshold_per_hour": None}, format="json")
        assert response.data["cost_threshold_per_hour"] is None
        assert cost_threshold(ResourceClass.objects.get(pk=resource_class.pk)) is None
        assert AuditEvent.objects.filter(action="resourceclass.update").count() == 2

    def test_it_refuses_a_negative_cost_rule_and_changes_nothing(self, cluster, api_client, olivia):
        response = signed_in(api_client, olivia).patch(
            f"{self.url}{cluster.training.pk}/", {"cost_threshold_per_hour": "-1", "max_devices": 3}, format="json"
        )

        assert response.status_code == 400
        assert set(response.data) == {"cost_threshold_per_hour"}
        assert ResourceClass.objects.get(pk=cluster.training.pk).max_devices != 3

    def test_it_shows_a_member_the_menu_their_teams_may_use(self, cluster, api_client, bob):
        client = signed_in(api_client, bob)
        usable = client.get(self.url, {"entitled": "true"}).data["results"]
        assert [row["name"] for row in usable] == ["distributed-training", "small-inference"]
        refused = client.get(self.url, {"entitled": "false"}).data["results"]
        assert [row["name"] for row in refused] == ["large-reserved-training"]

    def test_it_filters_by_entitled_team(self, cluster, api_client, alice):
        response = signed_in(api_client, alice).get(self.url, {"allowed_team": "team-a"})
        assert [row["name"] for row in response.data["results"]] == ["large-reserved-training"]


class TestReservations(ModelAPITests):
    model = Reservation
    url = "/api/reservations/"

    def make_object(self, cluster):
        now = timezone.now()
        return Reservation.objects.create(
            name="demo-day",
            team=cluster.team_a,
            device_class=cluster.h100,
            count=4,
            start=now,
            end=now + timedelta(hours=4),
        )

    def create_data(self, cluster, n):
        start = timezone.now() + timedelta(days=1)
        return {
            "name": f"launch-{n}",
            "team": "team-b",
            "device_class": "h100",
            "count": 8,
            "start": start.isoformat(),
            "end": (start + timedelta(hours=8)).isoformat(),
            "reason": "model launch",
        }

    def update_data(self, cluster):
        return {"count": 2, "reason": "scaled down"}

    def bad_create_data(self, cluster):
        good = self.create_data(cluster, 0)
        return [
            ({**good, "end": good["start"]}, ["end"]),
            ({**good, "count": 0}, ["count"]),
            ({**good, "device_class": "tpu"}, ["device_class"]),
        ]

    def test_it_records_who_made_it(self, cluster, api_client, olivia):
        response = signed_in(api_client, olivia).post(self.url, self.create_data(cluster, 0), format="json")
        assert response.data["created_by"] == "olivia"
