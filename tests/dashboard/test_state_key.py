"""The dashboard's state is computed once per state key (dashboard.inventory_state.state_key): the key
moves with everything the state reads, and stays when a cycle changed none of it."""

from django.contrib.auth.models import User
from django.urls import reverse

from broker.audit.models import AuditEvent
from broker.inventory.models import Device, Health
from broker.workloads.models import Allocation, Explanation, PodSet, SchedulingCycle
from broker.workloads.states import State
from dashboard import queries
from dashboard.inventory_state import state_key
from tests.builders import make_workload


def stranded(client, user):
    client.force_login(user)
    capacity = client.get(reverse("dashboard:overview")).context["capacity"]
    return {row["device_class"]: row["stranded"] for row in capacity}


def test_it_keeps_the_key_over_a_cycle_that_changed_nothing_the_state_reads(scene):
    before = state_key()
    # A later cycle that only rewrote explanations, with the same reasons (an estimate moved, say).
    later = SchedulingCycle.objects.create(outcome=SchedulingCycle.Outcome.COMMITTED)
    Explanation.objects.filter(workload=scene.a_wait).update(cycle=later, message="the same wait, new numbers")

    assert state_key() == before


def test_it_moves_the_key_as_policy_starts_or_stops_holding_pending_work(scene, client, alice):
    assert stranded(client, alice) == {"h100": 7}  # big-a's pods of 4 fit on no node (n2 2, n3 2, n4 3 free)
    before = state_key()
    Explanation.objects.filter(workload=scene.a_wait).update(reason="QuotaExceeded")

    assert state_key() != before
    assert stranded(client, alice) == {"h100": 0}, "work held by quota wants no devices"
    Explanation.objects.filter(workload=scene.a_wait).update(reason="TopologyFragmented")
    assert state_key() == before
    assert stranded(client, alice) == {"h100": 7}


def test_it_moves_the_key_with_allocations_devices_and_new_pending_work(scene, cluster):
    keys = [state_key()]
    device = Device.objects.filter(node=cluster.nodes[3], health=Health.HEALTHY).first()
    Allocation.objects.create(
        workload=scene.b_run, device=device, device_class=cluster.h100, pod_set="main", pod_index=2
    )
    keys.append(state_key())
    Device.objects.filter(pk=device.pk).update(health=Health.UNHEALTHY)
    keys.append(state_key())
    make_workload(cluster.queue_b, "newcomer", devices_per_pod=1, resource_class=cluster.training, state=State.PENDING)
    keys.append(state_key())

    assert len(set(keys)) == len(keys)


def admin_form_data(response):
    """The POST an unchanged admin change form sends, from the page the admin served."""
    form = response.context["adminform"].form
    data = {}
    for name, field in form.fields.items():
        value = form[name].value()
        if hasattr(field.widget, "widgets"):  # split date and time
            for index, part in enumerate(field.widget.decompress(value) if value else ["", ""]):
                data[f"{name}_{index}"] = "" if part is None else str(part)
        elif value is None:
            data[name] = ""
        else:
            formatted = field.widget.format_value(value)
            formatted = formatted[0] if isinstance(formatted, list) else formatted
            data[name] = "" if formatted is None else formatted
    for inline in response.context["inline_admin_formsets"]:
        formset = inline.formset
        for name in formset.management_form.fields:
            data[f"{formset.prefix}-{name}"] = formset.management_form[name].value()
        for row in formset.forms:
            for name, field in row.fields.items():
                value = row[name].value()
                formatted = None if value is None else field.widget.format_value(value)
                data[f"{row.prefix}-{name}"] = "" if formatted is None else formatted
    return data


def test_it_moves_the_key_when_a_pending_gang_is_resized_in_the_admin(scene, client, alice):
    assert stranded(client, alice) == {"h100": 7}
    root = User.objects.create_superuser("root", "root@example.com", "password")
    client.force_login(root)
    url = reverse("admin:workloads_workload_change", args=[scene.a_wait.pk])
    data = admin_form_data(client.get(url))
    data["pod_sets-0-devices_per_pod"] = "1"  # big-a's pods of 4 become pods of 1
    before = state_key()

    response = client.post(url, data)

    assert response.status_code == 302, response.content.decode()[:3000]
    assert PodSet.objects.get(workload=scene.a_wait).devices_per_pod == 1
    assert state_key() != before
    event = AuditEvent.objects.get(action="workload.update")
    assert (event.actor, event.target_id, event.manual_intervention) == (root, str(scene.a_wait.pk), True)
    assert queries.shared_summary()["capacity"][0]["min_pending_request"] == 1
    assert stranded(client, alice) == {"h100": 0}, "a pod of 1 fits on any free device"
