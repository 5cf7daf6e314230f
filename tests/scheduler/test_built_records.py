import dataclasses

import pytest

from broker.scheduler import snapshot as s


def test_it_builds_the_record_the_constructor_builds():
    fields = {"pod_set": "main", "index": 2, "node": "n1", "device_ids": ("n1/0", "n1/1")}

    record = s.built(s.RunningPod, fields)

    assert record == s.RunningPod(**fields)
    assert hash(record) == hash(s.RunningPod(**fields))
    assert type(record) is s.RunningPod
    assert repr(record) == repr(s.RunningPod(**fields))


def test_a_built_record_stays_frozen():
    record = s.built(s.RunningPod, {"pod_set": "main", "index": 0, "node": "n1", "device_ids": ()})

    with pytest.raises(dataclasses.FrozenInstanceError):
        record.node = "n2"


def test_a_built_record_keeps_its_cached_properties_apart():
    values = {field.name: field.default for field in dataclasses.fields(s.RunningWorkload)}
    pods = (s.RunningPod("main", 0, "n1", ("n1/0", "n1/1")), s.RunningPod("main", 1, "n2", ("n2/0",)))
    values.update(id="w1", queue="q", pods=pods, device_class="h100")

    record = s.built(s.RunningWorkload, values)

    assert record.device_count == 3
    assert record == s.RunningWorkload(**values)
