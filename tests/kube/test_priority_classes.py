"""PriorityClasses (scheduling.k8s.io/v1): listed and watched like every resource; a PodGroup's priority
resolves through them when the broker takes it, in the order the Priority admission plugin uses."""

import pytest
from kubernetes.client.rest import ApiException

from broker.kube.applier import Applier
from broker.kube.models import Cluster, MirroredPodGroup, MirroredPriorityClass
from broker.kube.sync import WORK, Sync
from broker.workloads.models import Workload
from broker.workloads.states import State
from tests.kube import objects
from tests.kube_apiserver import ShapeError

PRIORITY_CLASSES, PODGROUPS, CLAIMS, PODS = (
    next(r for r in WORK if r.name == n) for n in ("priorityclasses", "podgroups", "resourceclaims", "pods")
)


def watch(sync, resource):
    return sync.watch_once(resource, sync.cursor(resource))


def watch_work(sync):
    for resource in (PODGROUPS, CLAIMS, PODS):
        watch(sync, resource)


def group(cluster, name, **fields):
    """A one-pod PodGroup with its claim and pod (`template` (workload, template) makes it from one)."""
    objects.gang(cluster, name, pods=1, topology=None, **fields)


def taken(name):
    return MirroredPodGroup.objects.select_related("workload").get(name=name).workload


def test_it_resolves_a_groups_priority_in_the_order_kubernetes_admission_does(sync, lab):
    lab.create(objects.priority_class("urgent", 1000))
    lab.create(objects.priority_class("low", 10))
    lab.create(objects.priority_class("fallback", 50, global_default=True))
    templates = {
        "numbered": {"min_count": 1, "topology": None, "priority": 500, "priority_class": "low"},
        "named": {"min_count": 1, "topology": None, "priority_class": "urgent"},
        "plain": {"min_count": 1, "topology": None},
    }
    lab.create(objects.workload("job", templates=templates))
    group(lab, "own-number", priority=900, priority_class="low")
    group(lab, "own-class", priority_class="urgent", template=("job", "numbered"))
    group(lab, "template-number", template=("job", "numbered"))
    group(lab, "template-class", template=("job", "named"))
    group(lab, "template-nothing", template=("job", "plain"))
    group(lab, "nothing")
    sync.list_all(WORK)
    priorities = {name: taken(name).priority for name in MirroredPodGroup.objects.values_list("name", flat=True)}
    assert priorities == {
        "own-number": 900,  # a number set wins over the class named beside it
        "own-class": 1000,  # the group's own class wins over its template's number
        "template-number": 500,
        "template-class": 1000,
        "template-nothing": 50,  # the global default
        "nothing": 50,
    }


def test_it_takes_the_smallest_global_default_and_the_resource_classs_priority_without_one(sync, lab):
    group(lab, "before")
    sync.list_all(WORK)
    assert taken("before").priority == 100, "no PriorityClass at all: the resource class's priority, as before"

    lab.create(objects.priority_class("default-a", 70, global_default=True))
    lab.create(objects.priority_class("default-b", 60, global_default=True))
    lab.create(objects.priority_class("not-default", 5, global_default=False))
    watch(sync, PRIORITY_CLASSES)
    group(lab, "after")
    watch_work(sync)
    assert taken("after").priority == 60, "several claim globalDefault: the smallest value counts"
    assert taken("before").priority == 100, "a group already taken keeps what it was given"


def test_it_refuses_a_group_naming_an_unknown_class_until_the_class_is_created(sync, lab):
    lab.create(objects.workload("job", templates={"workers": {"min_count": 1, "priority_class": "gold"}}))
    group(lab, "train", priority_class="urgent")
    group(lab, "job-0", template=("job", "workers"))
    sync.list_all(WORK)
    waiting = {group.name: group for group in MirroredPodGroup.objects.all()}
    assert waiting["train"].workload is None
    assert (waiting["train"].refused, waiting["train"].refused_message) == (
        "UnknownPriorityClass",
        "no PriorityClass named 'urgent' (the PodGroup's priorityClassName)",
    )
    assert waiting["job-0"].refused_message == (
        "no PriorityClass named 'gold' (priorityClassName of Workload job, PodGroupTemplate workers)"
    )
    Applier().write_conditions()
    condition = lab.get("PodGroup", "train", "ml")["status"]["conditions"][0]
    assert (condition["status"], condition["reason"]) == ("False", "UnknownPriorityClass")

    lab.create(objects.priority_class("urgent", 1000))
    watch(sync, PRIORITY_CLASSES)
    train = MirroredPodGroup.objects.select_related("workload").get(name="train")
    assert train.workload is not None and train.workload.priority == 1000 and train.refused == ""
    assert MirroredPodGroup.objects.get(name="job-0").refused == "UnknownPriorityClass", "gold still missing"
    lab.create(objects.priority_class("gold", 700))
    watch(sync, PRIORITY_CLASSES)
    assert taken("job-0").priority == 700
    Applier().write_conditions()
    condition = lab.get("PodGroup", "train", "ml")["status"]["conditions"][0]
    assert condition["reason"] != "UnknownPriorityClass"


def test_it_watches_priority_classes_added_and_deleted_without_reranking_groups_taken(sync, lab):
    sync.list_all(WORK)
    lab.create(objects.priority_class("urgent", 1000))
    watch(sync, PRIORITY_CLASSES)
    assert MirroredPriorityClass.objects.get(name="urgent").value == 1000
    group(lab, "train", priority_class="urgent")
    lab.create(objects.pod_group("late", min_count=2, topology=None, priority_class="urgent"))
    watch_work(sync)
    assert taken("train").priority == 1000
    assert MirroredPodGroup.objects.get(name="late").refused == "WaitingForPods"
    with pytest.raises(ShapeError, match="value: Forbidden"):
        lab.apply(objects.priority_class("urgent", 10))  # as the API server: a new value is a new class

    lab.delete("PriorityClass", "urgent")
    watch(sync, PRIORITY_CLASSES)
    assert not MirroredPriorityClass.objects.exists()
    workload = taken("train")
    assert (workload.priority, workload.state) == (1000, State.PENDING), "taken: its priority was resolved"
    late = MirroredPodGroup.objects.get(name="late")
    assert late.refused == "UnknownPriorityClass", "a group still waiting says at once that its class is gone"

    lab.create(objects.priority_class("urgent", 10))
    watch(sync, PRIORITY_CLASSES)
    assert MirroredPriorityClass.objects.get(name="urgent").value == 10
    assert taken("train").priority == 1000, "a class created again with another value re-ranks nothing taken"
    assert MirroredPodGroup.objects.get(name="late").refused == "WaitingForPods"
    group(lab, "fresh", priority_class="urgent")
    watch_work(sync)
    assert taken("fresh").priority == 10


def test_it_takes_a_group_whose_class_never_preempts_as_work_that_never_preempts(sync, lab):
    lab.create(objects.priority_class("polite", 1000, preemption_policy="Never"))
    lab.create(objects.priority_class("polite-default", 20, global_default=True, preemption_policy="Never"))
    lab.create(objects.priority_class("pushy", 900))
    group(lab, "named", priority_class="polite")
    group(lab, "defaulted")
    group(lab, "preempting", priority_class="pushy")
    sync.list_all(WORK)
    assert not MirroredPodGroup.objects.exclude(refused="").exists()
    named, defaulted, preempting = taken("named"), taken("defaulted"), taken("preempting")
    assert (named.priority, named.preemption_policy) == (1000, "Never")
    assert (defaulted.priority, defaulted.preemption_policy) == (20, "Never")
    assert (preempting.priority, preempting.preemption_policy) == (900, "PreemptLowerPriority")
    assert named.preemptible, "its victim side stays the resource class's: Never never meant 'not preemptible'"


def test_it_lists_priority_classes_again_after_410_gone_and_forgets_those_deleted_meanwhile(sync, lab):
    lab.create(objects.priority_class("urgent", 1000))
    lab.create(objects.priority_class("low", 10))
    sync.list_all(WORK)
    lab.delete("PriorityClass", "urgent")
    lab.compact()
    with pytest.raises(ApiException) as gone:
        watch(sync, PRIORITY_CLASSES)
    assert gone.value.status == 410
    sync.relist(PRIORITY_CLASSES)
    assert list(MirroredPriorityClass.objects.values_list("name", flat=True)) == ["low"]


def test_it_resumes_watching_priority_classes_without_applying_an_event_twice(sync, lab):
    lab.create(objects.priority_class("urgent", 1000))
    group(lab, "train", priority_class="urgent")
    sync.list_all(WORK)
    lab.create(objects.priority_class("low", 10))
    watch(sync, PRIORITY_CLASSES)
    applied = Cluster.objects.get(name="lab").events_applied
    restarted = Sync(timeout_seconds=1)
    for resource in WORK:
        watch(restarted, resource)  # nothing new: every cursor is past every event
    assert Cluster.objects.get(name="lab").events_applied == applied
    assert MirroredPriorityClass.objects.count() == 2 and Workload.objects.count() == 1
    lab.delete("PriorityClass", "low")
    watch(restarted, PRIORITY_CLASSES)
    assert Cluster.objects.get(name="lab").events_applied == applied + 1
    assert list(MirroredPriorityClass.objects.values_list("name", flat=True)) == ["urgent"]
