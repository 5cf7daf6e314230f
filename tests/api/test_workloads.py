import pytest
from django.db import IntegrityError
from django.test import TestCase
from django.utils import timezone

from broker.audit.models import AuditEvent
from broker.workloads import services
from broker.workloads.models import Allocation, ApprovalState, Explanation, PodSet, Workload
from broker.workloads.states import State
from tests.api.base import signed_in
from tests.builders import make_workload

URL = "/api/workloads/"


def submission(**fields):
    body = {
        "name": "llama-finetune",
        "resource_class": "distributed-training",
        "pod_sets": [{"name": "workers", "replicas": 2, "min_count": 2, "devices_per_pod": 4}],
    }
    return {**body, **fields}


def awaiting_approval(cluster, submitted_by, name="big-run"):
    workload = make_workload(
        cluster.queue_a,
        name=name,
        resource_class=cluster.reserved,
        submitted_by=submitted_by,
        approval=ApprovalState.REQUESTED,
    )
    workload.transition(State.AWAITING_APPROVAL)
    return workload


def pending(cluster, queue=None, name="job", **fields):
    workload = make_workload(queue or cluster.queue_a, name=name, resource_class=cluster.training, **fields)
    workload.transition(State.PENDING)
    return workload


class TestSubmission:
    def test_it_submits_to_the_members_team_queue_with_the_class_defaults(self, cluster, api_client, alice):
        response = signed_in(api_client, alice).post(URL, submission(), format="json")
        assert response.status_code == 201, response.data
        workload = Workload.objects.get(pk=response.data["id"])
        assert (workload.queue, workload.team, workload.submitted_by) == (cluster.queue_a, cluster.team_a, alice)
        assert (workload.state, workload.approval) == (State.PENDING, ApprovalState.NOT_REQUIRED)
        assert workload.priority == cluster.training.priority_class.value
        assert workload.preemption_policy == "PreemptLowerPriority"
        assert workload.topology_required == "rack"
        assert workload.total_devices == 8
        assert response.data["pod_sets"][0]["gang_size"] == 2
        assert list(workload.transitions.values_list("to_state", flat=True)) == [State.PENDING]
        event = AuditEvent.objects.get(action="workload.submit", target_id=str(workload.pk))
        assert event.after["devices"] == 8

    def test_it_takes_explicit_settings_over_the_class_defaults(self, cluster, api_client, alice):
        body = submission(
            queue="team-a",
            priority=50,
            disruption_mode="Pod",
            preemption_policy="Never",
            topology_required="block",
            expected_duration_seconds=3600,
        )
        body["pod_sets"][0].update(device_classes=["h100"], match_attribute="gpu.example.com/nvlink-domain")
        response = signed_in(api_client, alice).post(URL, body, format="json")
        assert response.status_code == 201, response.data
        workload = Workload.objects.get(pk=response.data["id"])
        assert (workload.priority, workload.disruption_mode, workload.topology_required) == (50, "Pod", "block")
        assert (workload.preemption_policy, response.data["preemption_policy"]) == ("Never", "Never")
        assert workload.pod_sets.get().device_classes == ["h100"]

    def test_it_sends_a_class_needing_approval_to_await_approval(self, cluster, api_client, alice):
        response = signed_in(api_client, alice).post(
            URL, submission(resource_class="large-reserved-training"), format="json"
        )
        assert response.status_code == 201
        assert (response.data["state"], response.data["approval"]) == (State.AWAITING_APPROVAL, ApprovalState.REQUESTED)

    def test_it_asks_for_approval_above_the_size_threshold(self, cluster, api_client, alice):
        cluster.training.approval_threshold_devices = 4
        cluster.training.save()
        response = signed_in(api_client, alice).post(URL, submission(), format="json")
        assert response.data["state"] == State.AWAITING_APPROVAL

    def test_it_accepts_a_class_the_team_is_not_entitled_to(self, cluster, api_client, bob):
        # Entitlement is a pending reason (NotEntitled), explained by the cycle, not a 400.
        response = signed_in(api_client, bob).post(
            URL, submission(resource_class="large-reserved-training"), format="json"
        )
        assert response.status_code == 201
        assert response.data["queue"] == "team-b"

    def test_it_refuses_another_teams_queue(self, cluster, api_client, bob):
        response = signed_in(api_client, bob).post(URL, submission(queue="team-a"), format="json")
        assert response.status_code == 400
        assert "team-a" in response.data["queue"][0]
        assert not Workload.objects.exists()

    def test_it_needs_a_queue_when_the_member_is_in_several_teams(self, cluster, api_client, alice):
        cluster.team_b.members.add(alice)
        response = signed_in(api_client, alice).post(URL, submission(), format="json")
        assert list(response.data) == ["queue"]

    @pytest.mark.parametrize(
        ("changes", "errors"),
        [
            ({"replicas": 0}, {"pod_sets": [{"replicas"}]}),
            ({"min_count": 3}, {"pod_sets": [{"min_count"}]}),
            ({"devices_per_pod": 0}, {"pod_sets": [{"devices_per_pod"}]}),
            ({"device_classes": ["tpu-v5"]}, {"pod_sets": [{"device_classes"}]}),
        ],
    )
    def test_it_refuses_a_malformed_gang(self, cluster, api_client, alice, changes, errors):
        body = submission()
        body["pod_sets"][0].update(changes)
        response = signed_in(api_client, alice).post(URL, body, format="json")
        assert response.status_code == 400
        assert [set(error) for error in response.data["pod_sets"]] == errors["pod_sets"]
        assert not Workload.objects.exists()

    @pytest.mark.parametrize(
        ("fields", "error_field"),
        [
            ({"topology_required": "galaxy"}, "topology_required"),
            ({"topology_preferred": "shelf"}, "topology_preferred"),
            ({"resource_class": "no-such-class"}, "resource_class"),
            ({"pod_sets": []}, "pod_sets"),
            ({"disruption_mode": "Whenever"}, "disruption_mode"),
            ({"preemption_policy": "Sometimes"}, "preemption_policy"),
            ({"name": "Not A Slug"}, "name"),
            ({"priority": 5000}, "priority"),
        ],
    )
    def test_it_refuses_bad_fields(self, cluster, api_client, alice, fields, error_field):
        response = signed_in(api_client, alice).post(URL, submission(**fields), format="json")
        assert response.status_code == 400
        assert error_field in response.data

    def test_it_refuses_a_request_larger_than_its_class(self, cluster, api_client, alice):
        body = submission(resource_class="small-inference")
        response = signed_in(api_client, alice).post(URL, body, format="json")
        assert response.status_code == 400
        assert "at most 2" in response.data["resource_class"][0]

    def test_it_refuses_more_devices_per_pod_than_the_class_allows(self, cluster, api_client, alice):
        cluster.training.max_devices_per_pod = 2
        cluster.training.save()
        response = signed_in(api_client, alice).post(URL, submission(), format="json")
        assert set(response.data["pod_sets"][0]) == {"devices_per_pod"}

    def test_it_refuses_a_duplicate_name_in_the_team(self, cluster, api_client, alice):
        make_workload(cluster.queue_a, name="llama-finetune")
        response = signed_in(api_client, alice).post(URL, submission(), format="json")
        assert "name" in response.data

    def test_it_writes_nothing_when_the_second_pod_set_is_invalid(self, cluster, api_client, alice):
        body = submission()
        body["pod_sets"].append({"name": "evaluator", "replicas": 1, "min_count": 2, "devices_per_pod": 1})
        response = signed_in(api_client, alice).post(URL, body, format="json")
        assert response.status_code == 400
        assert response.data["pod_sets"][0] == {}
        assert set(response.data["pod_sets"][1]) == {"min_count"}
        assert (Workload.objects.count(), PodSet.objects.count(), AuditEvent.objects.count()) == (0, 0, 0)

    def test_it_rolls_back_the_workload_when_a_pod_set_fails_to_save(self, cluster, alice, monkeypatch):
        request = services.Submission(
            name="two-sets",
            queue=cluster.queue_a,
            resource_class=cluster.training,
            pod_sets=(services.PodSetRequest("a", 1, 1), services.PodSetRequest("b", 1, 1)),
        )
        real_create = PodSet.objects.create

        def fail_on_second(**fields):
            if fields["name"] == "b":
                raise IntegrityError("simulated failure")
            return real_create(**fields)

        monkeypatch.setattr(PodSet.objects, "create", fail_on_second)
        with pytest.raises(IntegrityError):
            services.submit_workload(request, alice)
        assert (Workload.objects.count(), PodSet.objects.count(), AuditEvent.objects.count()) == (0, 0, 0)

    def test_it_asks_for_a_cycle_after_commit(self, cluster, api_client, alice, monkeypatch):
        from broker.cycle import triggers

        reasons = []
        monkeypatch.setattr(triggers, "request_cycle", reasons.append)
        with TestCase.captureOnCommitCallbacks(execute=False) as callbacks:
            signed_in(api_client, alice).post(URL, submission(), format="json")
        assert reasons == []
        for callback in callbacks:
            callback()
        assert len(reasons) == 1
        assert "submitted" in reasons[0]

    def test_it_asks_for_no_cycle_when_the_submission_is_refused(self, cluster, api_client, alice, monkeypatch):
        from broker.cycle import triggers

        reasons = []
        monkeypatch.setattr(triggers, "request_cycle", reasons.append)
        with TestCase.captureOnCommitCallbacks(execute=True):
            signed_in(api_client, alice).post(URL, submission(topology_required="galaxy"), format="json")
        assert reasons == []

    def test_it_refuses_submission_from_roles_outside_teams(self, cluster, api_client, olivia, fiona):
        for user in (olivia, fiona):
            assert signed_in(api_client, user).post(URL, submission(queue="team-a"), format="json").status_code == 403


class TestVisibility:
    def test_it_shows_members_only_their_teams_workloads(self, cluster, api_client, alice, bob):
        mine, theirs = pending(cluster, name="mine"), pending(cluster, cluster.queue_b, name="theirs")
        client = signed_in(api_client, alice)
        assert [row["name"] for row in client.get(URL).data["results"]] == ["mine"]
        assert client.get(f"{URL}{theirs.pk}/").status_code == 404
        assert client.get(f"{URL}{mine.pk}/").status_code == 200

    def test_it_filters_explanations_and_allocations_by_team(self, cluster, api_client, alice):
        mine, theirs = pending(cluster, name="mine"), pending(cluster, cluster.queue_b, name="theirs")
        for position, workload in enumerate((theirs, mine)):
            Explanation.objects.create(
                workload=workload,
                reason="QuotaExceeded",
                message="m",
                position_in_queue=1,
                position_in_cluster=position + 1,
            )
        running = make_workload(cluster.queue_b, name="running")
        Allocation.objects.create(
            workload=running,
            device=cluster.nodes[0].devices.first(),
            device_class=cluster.h100,
            pod_set="main",
            pod_index=0,
        )
        client = signed_in(api_client, alice)
        assert [row["workload_name"] for row in client.get("/api/explanations/").data["results"]] == ["mine"]
        assert client.get("/api/allocations/").data["count"] == 0

    def test_it_lists_the_pods_of_shrunk_workloads_that_are_still_leaving(self, cluster, api_client, olivia):
        running = make_workload(cluster.queue_b, name="elastic", state=State.RUNNING)
        claimant = make_workload(cluster.queue_b, name="claimant")
        devices = list(cluster.nodes[0].devices.order_by("name")[:2])
        for index, device in enumerate(devices):
            Allocation.objects.create(
                workload=running, device=device, device_class=cluster.h100, pod_set="main", pod_index=index
            )
        now = timezone.now()
        Allocation.objects.filter(pod_index=1).update(eviction_requested_at=now, evicted_for=claimant)
        client = signed_in(api_client, olivia)
        leaving = client.get("/api/allocations/", {"evicting": "true"}).data["results"]
        assert [(row["pod_index"], row["evicted_for"]) for row in leaving] == [(1, claimant.pk)]
        assert leaving[0]["eviction_requested_at"] is not None
        staying = client.get("/api/allocations/", {"evicting": "false"}).data["results"]
        assert [(row["pod_index"], row["evicted_for"]) for row in staying] == [(0, None)]

    def test_it_orders_the_pending_view_by_position_and_filters_it(self, cluster, api_client, olivia):
        for position, name in ((3, "third"), (1, "first"), (2, "second")):
            workload = pending(cluster, name=name)
            Explanation.objects.create(
                workload=workload,
                reason="InsufficientCapacity",
                message="full",
                position_in_queue=position,
                position_in_cluster=position,
            )
        other = pending(cluster, cluster.queue_b, name="other")
        Explanation.objects.create(workload=other, reason="QuotaExceeded", message="q", position_in_cluster=4)
        admitted = pending(cluster, name="admitted")
        Explanation.objects.create(workload=admitted, reason="Priority", message="stale", position_in_cluster=0)
        admitted.transition(State.ADMITTED)

        client = signed_in(api_client, olivia)
        names = [row["workload_name"] for row in client.get("/api/explanations/").data["results"]]
        assert names == ["first", "second", "third", "other"]
        by_queue = client.get("/api/explanations/", {"queue": "team-b"}).data["results"]
        assert [row["workload_name"] for row in by_queue] == ["other"]
        by_reason = client.get(
            "/api/explanations/",
            {"reason": "InsufficientCapacity", "team": "team-a", "resource_class": "distributed-training"},
        )
        assert by_reason.data["count"] == 3

    def test_it_pages_the_pending_view_in_its_order(self, cluster, api_client, olivia):
        for position, name in ((3, "third"), (1, "first"), (4, "fourth"), (2, "second")):
            Explanation.objects.create(
                workload=pending(cluster, name=name),
                reason="InsufficientCapacity",
                message="full",
                position_in_queue=position,
                position_in_cluster=position,
            )
        client = signed_in(api_client, olivia)

        page = client.get("/api/explanations/", {"limit": 2, "offset": 1}).data
        reversed_page = client.get("/api/explanations/", {"limit": 3, "ordering": "-position_in_queue"}).data

        assert [row["workload_name"] for row in page["results"]] == ["second", "third"]
        assert page["count"] == 4 and page["next"] and page["previous"]
        assert [row["workload_name"] for row in reversed_page["results"]] == ["fourth", "third", "second"]
        assert reversed_page["results"][0]["reason"] == "InsufficientCapacity"

    def test_it_embeds_the_explanation_in_the_workload(self, cluster, api_client, alice):
        workload = pending(cluster)
        Explanation.objects.create(workload=workload, reason="TopologyFragmented", message="largest free rack: 3")
        data = signed_in(api_client, alice).get(f"{URL}{workload.pk}/").data
        assert data["explanation"]["reason"] == "TopologyFragmented"

    def test_it_embeds_the_rows_explanations_through_one_serializer(self, cluster, api_client, alice, monkeypatch):
        from broker.workloads.api import serializers

        made = []
        original = serializers.WorkloadExplanationSerializer.__init__

        def counted(self, *args, **kwargs):
            made.append(self)
            original(self, *args, **kwargs)

        monkeypatch.setattr(serializers.WorkloadExplanationSerializer, "__init__", counted)
        client = signed_in(api_client, alice)
        client.get(URL)  # what a process makes once, at its first request

        def made_for_a_list_of(reasons):
            for reason in reasons:
                Explanation.objects.create(workload=pending(cluster, name=reason.lower()), reason=reason, message="m")
            made.clear()
            rows = client.get(URL, {"state": "Pending"}).data["results"]
            return len(made), sorted(row["explanation"]["reason"] for row in rows)

        one = made_for_a_list_of(["Priority"])
        four = made_for_a_list_of(["QuotaExceeded", "TopologyFragmented", "InsufficientCapacity"])

        # As many for four rows as for one: made per row, each introspected the model again.
        assert four[0] == one[0]
        assert four[1] == ["InsufficientCapacity", "Priority", "QuotaExceeded", "TopologyFragmented"]

    def test_it_offers_no_update_or_delete_of_workloads(self, cluster, api_client, adam):
        workload = pending(cluster)
        client = signed_in(api_client, adam)
        assert client.patch(f"{URL}{workload.pk}/", {"priority": 1}).status_code == 405
        assert client.delete(f"{URL}{workload.pk}/").status_code == 405


class TestCancel:
    def test_it_cancels_and_releases_the_devices(self, cluster, api_client, alice):
        workload = pending(cluster)
        workload.transition(State.ADMITTED)
        device = cluster.nodes[0].devices.first()
        Allocation.objects.create(
            workload=workload, device=device, device_class=cluster.h100, pod_set="main", pod_index=0
        )
        response = signed_in(api_client, alice).post(f"{URL}{workload.pk}/cancel/", {"reason": "wrong data"})
        assert response.status_code == 200
        assert response.data["state"] == State.CANCELLED
        assert not Allocation.objects.filter(released_at__isnull=True).exists()
        event = AuditEvent.objects.get(action="workload.cancel")
        assert (event.after["released_devices"], event.manual_intervention) == (1, False)

    def test_it_counts_an_operator_cancelling_someone_elses_as_intervention(self, cluster, api_client, olivia):
        workload = pending(cluster)
        assert signed_in(api_client, olivia).post(f"{URL}{workload.pk}/cancel/").status_code == 200
        assert AuditEvent.objects.get(action="workload.cancel").manual_intervention is True

    def test_it_refuses_to_cancel_twice(self, cluster, api_client, alice):
        workload = pending(cluster)
        client = signed_in(api_client, alice)
        client.post(f"{URL}{workload.pk}/cancel/")
        response = client.post(f"{URL}{workload.pk}/cancel/")
        assert response.status_code == 409
        assert "Cancelled" in response.data["detail"]

    def test_it_hides_other_teams_workloads_from_cancel(self, cluster, api_client, bob):
        workload = pending(cluster)
        assert signed_in(api_client, bob).post(f"{URL}{workload.pk}/cancel/").status_code == 404
        workload.refresh_from_db()
        assert workload.state == State.PENDING


class TestApproval:
    def test_it_approves_with_a_comment_into_pending(self, cluster, api_client, alice, april):
        workload = awaiting_approval(cluster, alice)
        response = signed_in(api_client, april).post(f"{URL}{workload.pk}/approve/", {"comment": "budget ok"})
        assert response.status_code == 200
        assert (response.data["state"], response.data["approval"]) == (State.PENDING, ApprovalState.APPROVED)
        assert (response.data["approval_decided_by"], response.data["approval_comment"]) == ("april", "budget ok")
        assert response.data["approval_decided_at"] is not None
        event = AuditEvent.objects.get(action="workload.approve")
        assert (event.actor_name, event.reason) == ("april", "budget ok")

    def test_it_rejects_and_keeps_it_out_of_the_queue(self, cluster, api_client, alice, april):
        workload = awaiting_approval(cluster, alice)
        response = signed_in(api_client, april).post(f"{URL}{workload.pk}/reject/", {"comment": "use a smaller class"})
        assert response.status_code == 200
        assert (response.data["state"], response.data["approval"]) == (State.REJECTED, ApprovalState.REJECTED)
        assert AuditEvent.objects.get(action="workload.reject").reason == "use a smaller class"
        # A rejection is final: it cannot be approved afterwards.
        again = signed_in(api_client, april).post(f"{URL}{workload.pk}/approve/", {"comment": "changed my mind"})
        assert again.status_code == 409

    @pytest.mark.parametrize("body", [{}, {"comment": ""}, {"comment": "   "}])
    def test_it_requires_a_comment(self, cluster, api_client, alice, april, body):
        workload = awaiting_approval(cluster, alice)
        for verb in ("approve", "reject"):
            response = signed_in(api_client, april).post(f"{URL}{workload.pk}/{verb}/", body, format="json")
            assert response.status_code == 400
            assert "comment" in response.data
        workload.refresh_from_db()
        assert workload.approval == ApprovalState.REQUESTED

    def test_it_refuses_self_approval(self, cluster, api_client, april):
        cluster.team_a.members.add(april)
        workload = awaiting_approval(cluster, april)
        response = signed_in(api_client, april).post(f"{URL}{workload.pk}/approve/", {"comment": "looks fine to me"})
        assert response.status_code == 403
        assert "own requests" in str(response.data["detail"])
        workload.refresh_from_db()
        assert (workload.state, workload.approval) == (State.AWAITING_APPROVAL, ApprovalState.REQUESTED)
        assert not AuditEvent.objects.filter(action="workload.approve").exists()

    def test_it_refuses_to_approve_what_is_not_awaiting(self, cluster, api_client, april):
        workload = pending(cluster)
        response = signed_in(api_client, april).post(f"{URL}{workload.pk}/approve/", {"comment": "ok"})
        assert response.status_code == 409


class TestPriorityChange:
    def test_it_changes_priority_as_an_audited_intervention(self, cluster, api_client, olivia):
        workload = pending(cluster)
        response = signed_in(api_client, olivia).post(
            f"{URL}{workload.pk}/priority/", {"priority": 900, "reason": "deadline"}
        )
        assert response.status_code == 200
        assert response.data["priority"] == 900
        event = AuditEvent.objects.get(action="workload.priority")
        assert (event.before, event.after, event.manual_intervention, event.reason) == (
            {"priority": 0},
            {"priority": 900},
            True,
            "deadline",
        )

    def test_it_refuses_a_non_integer_priority(self, cluster, api_client, olivia):
        workload = pending(cluster)
        response = signed_in(api_client, olivia).post(f"{URL}{workload.pk}/priority/", {"priority": "high"})
        assert response.status_code == 400
        assert "priority" in response.data

    def test_it_refuses_to_reprioritise_a_finished_workload(self, cluster, api_client, olivia):
        workload = pending(cluster)
        workload.transition(State.CANCELLED)
        body = {"priority": 1, "reason": "too late"}
        assert signed_in(api_client, olivia).post(f"{URL}{workload.pk}/priority/", body).status_code == 409


class TestAuditEvents:
    def test_it_lists_and_searches_events(self, cluster, api_client, olivia):
        node = cluster.nodes[0]
        client = signed_in(api_client, olivia)
        client.post(f"/api/nodes/{node.pk}/cordon/", {"reason": "PSU swap"})
        client.post(f"/api/queues/{cluster.queue_a.pk}/", {})
        response = client.get("/api/audit-events/", {"search": "PSU"})
        assert [event["action"] for event in response.data["results"]] == ["node.cordon"]
        assert client.get("/api/audit-events/", {"manual_intervention": "true"}).data["count"] == 1

    def test_it_cannot_be_written_through_the_api(self, cluster, api_client, adam):
        client = signed_in(api_client, adam)
        client.post(f"/api/nodes/{cluster.nodes[0].pk}/cordon/")
        event = AuditEvent.objects.get()
        assert client.post("/api/audit-events/", {"action": "forged"}).status_code == 405
        assert client.patch(f"/api/audit-events/{event.pk}/", {"reason": "x"}).status_code == 405
        assert client.put(f"/api/audit-events/{event.pk}/", {"reason": "x"}).status_code == 405
        assert client.delete(f"/api/audit-events/{event.pk}/").status_code == 405
        assert AuditEvent.objects.get().reason == ""

    def test_it_exports_the_filtered_events_as_csv(self, cluster, api_client, april, olivia):
        signed_in(api_client, olivia).post(
            f"/api/nodes/{cluster.nodes[0].pk}/cordon/", {"reason": "=cmd|' /C calc'!A0"}
        )
        signed_in(api_client, olivia).post(f"/api/devices/{cluster.nodes[1].devices.first().pk}/mark-unhealthy/")
        response = signed_in(api_client, april).get(
            "/api/audit-events/export/", {"action": "node.cordon"}, HTTP_ACCEPT="text/csv"
        )
        assert response.status_code == 200
        assert response["Content-Type"].startswith("text/csv")
        lines = b"".join(response.streaming_content).decode().splitlines()
        assert lines[0].startswith("at,actor_name,action")
        assert len(lines) == 2
        assert ",olivia,node.cordon," in lines[1]
        assert "'=cmd" in lines[1]


class TestCyclesAndStatus:
    def test_it_reports_status(self, cluster, api_client, alice, bob):
        from broker.workloads.models import SchedulingCycle

        pending(cluster, name="mine")
        pending(cluster, cluster.queue_b, name="theirs")
        SchedulingCycle.objects.create(outcome="Committed", finished_at=timezone.now(), admitted_count=2)
        data = signed_in(api_client, alice).get("/api/status/").data
        assert (data["nodes"], data["cordoned_nodes"], data["devices"]) == (4, 0, {"Healthy": 16})
        assert data["workloads"] == {"Pending": 1}
        assert data["last_cycle"]["admitted_count"] == 2

    def test_it_lists_cycles_newest_first(self, cluster, api_client, fiona):
        from datetime import timedelta

        from broker.workloads.models import SchedulingCycle

        now = timezone.now()
        old = SchedulingCycle.objects.create(started_at=now - timedelta(minutes=1), outcome="Committed")
        new = SchedulingCycle.objects.create(started_at=now, outcome="Refused")
        response = signed_in(api_client, fiona).get("/api/cycles/")
        assert [row["id"] for row in response.data["results"]] == [new.pk, old.pk]
        assert signed_in(api_client, fiona).get("/api/cycles/", {"outcome": "Refused"}).data["count"] == 1
