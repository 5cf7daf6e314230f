from django.urls import reverse

from broker.workloads.models import Workload
from dashboard.forms import SubmitForm
from dashboard.queries import REASON_CODES


def ask(client, cluster, resource_class, replicas, per_pod, **extra):
    data = {
        "name": "probe",
        "queue": cluster.queue_a.pk,
        "resource_class": resource_class.pk,
        "replicas": replicas,
        "devices_per_pod": per_pod,
        **extra,
    }
    return client.post(reverse("dashboard:submit-whatif"), data)


def test_it_says_a_small_request_would_start_now(client, scene, alice, cluster):
    client.force_login(alice)
    answer = ask(client, cluster, cluster.inference, 1, 1).json()
    assert answer["ok"] is True
    assert answer["admitted"] is True
    assert answer["device_class"] == "h100"
    assert len(answer["nodes"]) == 1
    assert not Workload.objects.filter(name="probe").exists()


def test_it_explains_why_a_large_gang_would_not_start(client, scene, alice, cluster):
    client.force_login(alice)
    answer = ask(client, cluster, cluster.training, 2, 4).json()  # 8 devices in one rack: none has them
    assert answer["admitted"] is False
    assert answer["reason"] in REASON_CODES
    assert answer["message"]
    assert not Workload.objects.filter(name="probe").exists()


def test_it_rejects_a_malformed_what_if(client, scene, alice, cluster):
    client.force_login(alice)
    response = ask(client, cluster, cluster.inference, 2, 2)  # small inference allows 2 devices at most
    assert response.status_code == 400
    assert "resource_class" in response.json()["errors"]


def test_it_freezes_a_large_inventory_it_read_as_a_cycle_does(client, scene, alice, cluster, settings, monkeypatch):
    from broker.cycle import runner
    from broker.cycle.loader import forget_everything_loaded

    settings.GC_FREEZE_MIN_DEVICES = 1  # the small cluster counts as large here
    forget_everything_loaded()
    calls = []
    monkeypatch.setattr(runner.gc, "collect", lambda *args: calls.append("collect"))
    monkeypatch.setattr(runner.gc, "freeze", lambda: calls.append("freeze"))
    client.force_login(alice)

    assert ask(client, cluster, cluster.inference, 1, 1).json()["ok"] is True
    assert ask(client, cluster, cluster.inference, 1, 1).json()["ok"] is True  # the same inventory: nothing new

    assert calls == ["collect", "freeze"]


def test_it_offers_only_changes_the_form_makes_and_each_starts_the_gang(client, scene, alice, cluster):
    client.force_login(alice)
    answer = ask(client, cluster, cluster.training, 4, 2).json()  # 8 devices in one rack: 5 free in r2 at most
    assert answer["admitted"] is False
    assert answer["suggestions"], answer

    for suggestion in answer["suggestions"]:
        assert set(suggestion["form"]) <= set(SubmitForm(alice).fields), suggestion
        applied = {"replicas": 4, "devices_per_pod": 2, **suggestion["form"]}
        again = ask(
            client, cluster, cluster.training, applied.pop("replicas"), applied.pop("devices_per_pod"), **applied
        )
        assert again.json()["admitted"] is True, (suggestion, again.json())


def test_it_keeps_advice_the_submitter_cannot_apply_out_of_the_form(cluster):
    from broker.scheduler.snapshot import Suggestion
    from dashboard import whatif

    made = (
        Suggestion("IncreaseQuota", "raise queue team-a's h100 quota from 8 to 16: starts now", {"queue": "team-a"}),
        Suggestion(
            "RelaxTopology",
            "drop the one-rack requirement (prefer one rack): starts now",
            {"topology_required": "", "topology_preferred": "rack"},
        ),
        Suggestion("FallbackClass", "use device class a100 ($2/device-hour): starts now", {"device_classes": ["a100"]}),
        Suggestion(
            "ShrinkGang", "run 2 pods instead of 4: starts now", {"pod_sets": {"main": {"count": 2, "min_count": 2}}}
        ),
        Suggestion(
            "ShrinkGang",
            "run fewer workers and helpers: starts now",
            {"pod_sets": {"workers": {"count": 1, "min_count": 1}, "helpers": {"count": 1, "min_count": 1}}},
        ),
    )

    # distributed-training keeps a gang in one rack: only another class drops that, not this form.
    assert [s["kind"] for s in whatif.form_suggestions(made, cluster.training)] == ["FallbackClass", "ShrinkGang"]
    assert whatif.form_suggestions(made, cluster.inference) == [
        {
            "kind": "RelaxTopology",
            "description": "drop the one-rack requirement (prefer one rack): starts now",
            "form": {"topology_required": "anywhere", "topology_preferred": "rack"},
        },
        {
            "kind": "FallbackClass",
            "description": "use device class a100 ($2/device-hour): starts now",
            "form": {"device_class": "a100"},
        },
        {
            "kind": "ShrinkGang",
            "description": "run 2 pods instead of 4: starts now",
            "form": {"replicas": 2, "min_count": 2},
        },
    ]


def test_it_offers_another_class_that_starts_the_request_and_applying_it_does(client, scene, alice, cluster):
    from broker.policy.models import PriorityClass
    from tests.builders import make_resource_class

    anywhere = make_resource_class("batch-anywhere", PriorityClass.objects.get(name="batch"), [cluster.h100])
    client.force_login(alice)
    answer = ask(client, cluster, cluster.training, 6, 1).json()  # 6 in one rack: r2 has 5 free, the cluster 7
    assert answer["admitted"] is False

    (other,) = [s for s in answer["suggestions"] if s["kind"] == "OtherClass"]
    assert other["form"] == {"resource_class": anywhere.pk}
    assert "batch-anywhere" in other["description"].lower().replace(" ", "-")
    assert ask(client, cluster, anywhere, 6, 1).json()["admitted"] is True
