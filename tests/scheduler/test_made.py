"""Records the core makes without their dataclass __init__ are the records that __init__ makes."""

import dataclasses

import pytest

from broker.scheduler.snapshot import Admission, PendingDecision, PodPlacement, Suggestion, made

EXAMPLES = {
    PodPlacement: {
        "pod_set": "main",
        "index": 1,
        "node": "n1",
        "device_ids": ("n1/0", "n1/1", "n1/nic-0"),
        "requests": (("gpu", ("n1/0", "n1/1")), ("nic", ("n1/nic-0",))),
        "consumed": (("memory", 20.0),),
    },
    Admission: {
        "workload_id": "job-1",
        "device_class": "h100",
        "pods": (PodPlacement("main", 0, "n1", ("n1/0",)),),
        "domain": {"rack": "r1"},
        "request_classes": (("gpu", "h100"), ("nic", "efa")),
        "group_requests": (("scratch/volume", ("n1/scratch-0",)),),
    },
    PendingDecision: {
        "workload_id": "job-2",
        "reason": "InsufficientCapacity",
        "secondary": ("Priority",),
        "message": "needs 8",
        "details": {"needed": 8},
        "position_in_queue": 2,
        "position_in_cluster": 5,
        "estimated_start": 12.5,
        "suggestions": (Suggestion("wait", "it may start later", {}),),
    },
}


@pytest.mark.parametrize("cls", list(EXAMPLES), ids=lambda cls: cls.__name__)
def test_it_makes_the_record_the_dataclass_makes(cls):
    values = EXAMPLES[cls]
    assert set(values) == {field.name for field in dataclasses.fields(cls)}, "every field is given"

    record = made(cls, **values)

    assert record == cls(**values)
    assert repr(record) == repr(cls(**values))
    assert dataclasses.asdict(record) == dataclasses.asdict(cls(**values))
    assert dataclasses.replace(record) == record


@pytest.mark.parametrize("cls", list(EXAMPLES), ids=lambda cls: cls.__name__)
def test_it_is_used_only_on_classes_without_post_init(cls):
    assert not hasattr(cls, "__post_init__"), "made() would skip it"


def test_it_keeps_the_record_frozen():
    record = made(PodPlacement, **EXAMPLES[PodPlacement])

    with pytest.raises(dataclasses.FrozenInstanceError):
        record.node = "n2"
