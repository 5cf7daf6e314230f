"""Builders for test data: small, explicit, and named for what they build."""

from dataclasses import dataclass
from datetime import timedelta

from django.contrib.auth.models import Group, User
from django.utils import timezone

from broker.inventory.models import Device, Domain, Node, TopologyLevel
from broker.policy.models import (
    Cohort,
    DeviceClass,
    PriorityClass,
    Queue,
    ResourceClass,
    ResourceClassDeviceClass,
    Team,
)
from broker.workloads.models import PodSet, Workload

H100_SELECTOR = 'device.attributes["gpu.example.com"].model == "H100"'


@dataclass
class SmallCluster:
    team_a: Team
    team_b: Team
    queue_a: Queue
    queue_b: Queue
    h100: DeviceClass
    training: ResourceClass
    inference: ResourceClass
    reserved: ResourceClass
    nodes: list


def make_user(username, roles=(), teams=(), password="password"):
    user = User.objects.create_user(username=username, password=password, email=f"{username}@example.com")
    for role in roles:
        user.groups.add(Group.objects.get(name=role))
    for team in teams:
        team.members.add(user)
    return user


def build_small_cluster(racks=2, nodes_per_rack=2, devices_per_node=4):
    levels = {level.name: level for level in TopologyLevel.objects.all()}
    zone = Domain.objects.create(level=levels["zone"], name="z1")
    block = Domain.objects.create(level=levels["block"], name="b1", parent=zone)
    nodes = []
    for r in range(racks):
        rack = Domain.objects.create(level=levels["rack"], name=f"r{r + 1}", parent=block)
        for n in range(nodes_per_rack):
            node = Node.objects.create(name=f"n{r * nodes_per_rack + n + 1}", domain=rack)
            for d in range(devices_per_node):
                Device.objects.create(node=node, name=str(d), attributes={"model": "H100", "memory": 80})
            nodes.append(node)
    h100 = DeviceClass.objects.create(name="h100", selector=H100_SELECTOR, price_per_hour="4.00")
    team_a = Team.objects.create(name="team-a", display_name="Team A")
    team_b = Team.objects.create(name="team-b", display_name="Team B")
    cohort = Cohort.objects.create(name="main")
    queue_a = Queue.objects.create(name="team-a", team=team_a, cohort=cohort, nominal_quota={"h100": 8})
    queue_b = Queue.objects.create(name="team-b", team=team_b, cohort=cohort, nominal_quota={"h100": 8})
    batch = PriorityClass.objects.create(name="batch", value=100)
    prod = PriorityClass.objects.create(name="production", value=1000, preemptible=False)
    training = make_resource_class("distributed-training", batch, [h100], topology_required="rack")
    inference = make_resource_class("small-inference", prod, [h100], preemptible=False, max_devices=2)
    reserved = make_resource_class("large-reserved-training", prod, [h100], approval_required=True)
    reserved.allowed_teams.add(team_a)
    return SmallCluster(team_a, team_b, queue_a, queue_b, h100, training, inference, reserved, nodes)


def make_resource_class(name, priority_class, device_classes, **fields):
    resource_class = ResourceClass.objects.create(
        name=name, display_name=name.replace("-", " ").capitalize(), priority_class=priority_class, **fields
    )
    for rank, device_class in enumerate(device_classes):
        ResourceClassDeviceClass.objects.create(resource_class=resource_class, device_class=device_class, rank=rank)
    return resource_class


def make_workload(
    queue, name="job", replicas=1, devices_per_pod=1, resource_class=None, submitted_by=None, minutes_ago=0, **fields
):
    workload = Workload.objects.create(
        name=name,
        team=queue.team,
        queue=queue,
        resource_class=resource_class,
        submitted_by=submitted_by,
        submitted_at=timezone.now() - timedelta(minutes=minutes_ago),
        **fields,
    )
    PodSet.objects.create(workload=workload, name="main", replicas=replicas, devices_per_pod=devices_per_pod)
    return workload


def make_workloads(queues, names, devices_per_pod=1, resource_class=None, **fields):
    """Many one-pod-set workloads at once (Submitted, as `make_workload` builds them), the i-th named
    names[i] in queues[i]: two bulk inserts, for tests that need thousands. Returns their ids."""
    now = timezone.now()
    workloads = Workload.objects.bulk_create(
        Workload(name=name, team=queue.team, queue=queue, resource_class=resource_class, submitted_at=now, **fields)
        for queue, name in zip(queues, names, strict=True)
    )
    PodSet.objects.bulk_create(
        PodSet(workload=workload, name="main", replicas=1, devices_per_pod=devices_per_pod) for workload in workloads
    )
    return [workload.pk for workload in workloads]
