"""Workloads (scheduling.k8s.io/v1alpha2): listed and watched like every resource, their PodGroupTemplates
complete the PodGroups made from them, and a template the broker cannot take shows on those PodGroups."""

import pytest
from kubernetes.client.rest import ApiException

from broker.kube.applier import Applier
from broker.kube.models import Cluster, MirroredPodGroup, MirroredWorkload
from broker.kube.sync import WORK, Sync
from broker.workloads.models import Workload
from broker.workloads.states import State
from tests.kube import objects

WORKLOADS, PODGROUPS, CLAIMS, PODS = (
    next(r for r in WORK if r.name == n) for n in ("workloads", "podgroups", "resourceclaims", "pods")
)
TEMPLATE = {"min_count": 4, "topology": objects.RACK, "priority": 500, "disruption_mode": "Pod"}


def watch(sync, resource):
    return sync.watch_once(resource, sync.cursor(resource))


def made_from(cluster, name, workload="job", template="workers", pods=4, **group):
    """A PodGroup made from a template, as a controller makes it: the gang policy copied, the rest left
    unset unless given; its pods and claims."""
    fields = {"min_count": pods, "topology": None, "disruption_mode": None, "template": (workload, template)}
    objects.gang(cluster, name, pods=pods, **{**fields, **group})


def test_it_completes_a_pod_group_with_its_templates_policy(sync, lab):
    lab.create(objects.workload("job", templates={"workers": TEMPLATE}))
    made_from(lab, "job-0")
    made_from(lab, "job-1", priority=900, disruption_mode="PodGroup")
    sync.list_all(WORK)
    plain = MirroredPodGroup.objects.get(name="job-0").workload
    assert (plain.topology_required, plain.priority, plain.disruption_mode) == ("rack", 500, "Pod")
    assert plain.pod_sets.get().min_count == 4
    own = MirroredPodGroup.objects.get(name="job-1").workload
    assert (own.priority, own.disruption_mode) == (900, "PodGroup"), "what the PodGroup copied wins"


def test_it_keeps_a_pod_groups_own_gang_over_its_templates(sync, lab):
    lab.create(objects.workload("job", templates={"workers": {**TEMPLATE, "min_count": 8}}))
    made_from(lab, "job-0", pods=4)
    made_from(lab, "job-1", pods=2, min_count=None)  # the basic policy: no gang
    sync.list_all(WORK)
    assert MirroredPodGroup.objects.get(name="job-0").workload.pod_sets.get().min_count == 4
    basic = MirroredPodGroup.objects.get(name="job-1").workload
    assert basic.pod_sets.get().min_count is None and basic.pod_sets.get().replicas == 2


def test_it_waits_for_the_workload_and_takes_the_group_when_the_watch_brings_it(sync, lab):
    made_from(lab, "job-0")
    sync.list_all(WORK)
    group = MirroredPodGroup.objects.get(name="job-0")
    assert group.workload is None
    assert (group.refused, group.refused_message) == ("WaitingForWorkload", "Workload job does not exist yet")
    Applier().write_conditions()
    condition = lab.get("PodGroup", "job-0", "ml")["status"]["conditions"][0]
    assert (condition["status"], condition["reason"]) == ("False", "WaitingForWorkload")

    lab.create(objects.workload("job", templates={"workers": TEMPLATE}))
    watch(sync, WORKLOADS)
    group.refresh_from_db()
    assert group.workload is not None and group.workload.priority == 500 and group.refused == ""


def test_it_watches_workloads_added_modified_and_deleted(sync, lab):
    sync.list_all(WORK)
    lab.create(objects.workload("job", templates={"workers": TEMPLATE}))
    watch(sync, WORKLOADS)
    assert MirroredWorkload.objects.get(name="job").templates["workers"]["priority"] == 500
    lab.apply(objects.workload("job", templates={"workers": TEMPLATE, "leaders": {"min_count": 1}}))
    watch(sync, WORKLOADS)
    assert set(MirroredWorkload.objects.get(name="job").templates) == {"workers", "leaders"}
    made_from(lab, "job-0")
    for resource in (PODGROUPS, CLAIMS, PODS):
        watch(sync, resource)
    taken = MirroredPodGroup.objects.get(name="job-0").workload
    assert taken is not None

    lab.delete("Workload", "job", "ml")
    watch(sync, WORKLOADS)
    assert not MirroredWorkload.objects.exists()
    taken.refresh_from_db()
    assert taken.state == State.PENDING, "a group the broker took runs on: its policy was copied"
    made_from(lab, "job-1")
    for resource in (PODGROUPS, CLAIMS, PODS):
        watch(sync, resource)
    assert MirroredPodGroup.objects.get(name="job-1").refused == "WaitingForWorkload"


def test_it_gives_the_groups_of_a_template_it_cannot_take_a_clear_condition(sync, lab):
    unknown = {**TEMPLATE, "topology": "example.com/aisle"}
    lab.create(objects.workload("job", templates={"workers": unknown, "leaders": TEMPLATE}))
    made_from(lab, "job-0")
    made_from(lab, "job-1", template="evaluators")
    made_from(lab, "job-2", template="leaders")
    sync.list_all(WORK)
    Applier().write_conditions()
    conditions = {
        name: lab.get("PodGroup", name, "ml")["status"]["conditions"][0] for name in ("job-0", "job-1", "job-2")
    }
    assert conditions["job-0"]["reason"] == "InvalidWorkload"
    assert conditions["job-0"]["message"] == (
        "Workload job, PodGroupTemplate workers: topology key 'example.com/aisle' is no topology level the broker knows"
    )
    assert conditions["job-1"]["reason"] == "InvalidWorkload"
    assert conditions["job-1"]["message"] == "Workload job has no PodGroupTemplate 'evaluators'"
    assert MirroredPodGroup.objects.get(name="job-2").workload is not None, "another template of it is fine"


def test_it_lists_workloads_again_after_410_gone_and_forgets_those_deleted_meanwhile(sync, lab):
    lab.create(objects.workload("job"))
    lab.create(objects.workload("other"))
    sync.list_all(WORK)
    lab.delete("Workload", "job", "ml")
    lab.compact()
    with pytest.raises(ApiException) as gone:
        watch(sync, WORKLOADS)
    assert gone.value.status == 410
    sync.relist(WORKLOADS)
    assert list(MirroredWorkload.objects.values_list("name", flat=True)) == ["other"]


def test_it_resumes_watching_workloads_without_applying_an_event_twice(sync, lab):
    lab.create(objects.workload("job", templates={"workers": TEMPLATE}))
    made_from(lab, "job-0")
    sync.list_all(WORK)
    lab.create(objects.workload("other"))
    watch(sync, WORKLOADS)
    applied = Cluster.objects.get(name="lab").events_applied
    restarted = Sync(timeout_seconds=1)
    for resource in WORK:
        watch(restarted, resource)  # nothing new: every cursor is past every event
    assert Cluster.objects.get(name="lab").events_applied == applied
    assert MirroredWorkload.objects.count() == 2 and Workload.objects.count() == 1
    lab.delete("Workload", "other", "ml")
    watch(restarted, WORKLOADS)
    assert Cluster.objects.get(name="lab").events_applied == applied + 1
    assert list(MirroredWorkload.objects.values_list("name", flat=True)) == ["job"]
