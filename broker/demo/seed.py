"""Write a demo inventory, its policy and demo users into the database, idempotently.

Every object is looked up by its natural key first and created only when missing, so a second run
changes nothing; existing rows (an operator's edited quota, a changed password) are left alone.
Nodes and devices go in with bulk_create: the Alibaba inventory is 10k devices.
"""

from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta

from django.contrib.auth.models import Group, User
from django.db import transaction
from django.utils import timezone

from broker.demo import inventory as demo
from broker.inventory.models import ClusterState, Device, Domain, Node, TopologyLevel
from broker.policy import roles
from broker.policy.models import (
    Cohort,
    DeviceClass,
    PriorityClass,
    Queue,
    ReclaimPolicy,
    Reservation,
    ResourceClass,
    ResourceClassDeviceClass,
    Team,
    WithinQueuePolicy,
)

LEVELS = ("zone", "block", "rack")
COHORT = "shared"
STAFF_LOGINS = (
    ("operator", roles.OPERATOR, False),
    ("finance", roles.FINANCE, False),
    ("approver", roles.APPROVER, False),
    ("admin", roles.ADMIN, True),
)


class SeedConflict(Exception):
    pass


@dataclass
class SeedReport:
    inventory: str
    created: Counter = field(default_factory=Counter)
    logins: list = field(default_factory=list)

    @property
    def changed(self):
        return sum(self.created.values()) > 0


def seed(inventory="philly"):
    machines = demo.machines_for(inventory)
    report = SeedReport(inventory)
    with transaction.atomic():
        check_same_inventory(inventory)
        levels = ensure_levels(report)
        placed = demo.place(machines)
        place_nodes(inventory, placed, levels, report)
        classes = ensure_device_classes(inventory, report)
        capacity = Counter()
        for machine in machines:
            capacity[demo.class_of(inventory, machine.attributes)] += machine.devices
        capacity.update(demo.partition_and_nic_capacity(placed))
        teams = ensure_teams_and_queues(demo.philly_virtual_clusters(), capacity, report)
        ensure_menu(inventory, classes, teams, report)
        report.logins = ensure_users(teams, report)
        if report.created["nodes"]:
            add_demo_conditions(inventory, classes, capacity, teams, report)
            add_demo_requests(inventory, teams, report)
        if report.created["nodes"] or report.created["devices"]:
            # Running cycles must see their snapshot went stale.
            ClusterState.bump()
    return report


def check_same_inventory(inventory):
    other = Node.objects.exclude(labels__inventory=inventory).values_list("labels", flat=True).first()
    if other is not None:
        found = other.get("inventory", "a hand-made inventory")
        raise SeedConflict(f"The database already holds {found}; seed '{inventory}' into an empty database.")


def ensure_levels(report):
    levels = {}
    for order, name in enumerate(LEVELS):
        level = TopologyLevel.objects.filter(name=name).first()
        if level is None:
            level = TopologyLevel.objects.create(name=name, order=order)
            report.created["topology levels"] += 1
        levels[name] = level
    return levels


def ensure_domains(level, wanted, report):
    """{name: Domain} for `wanted` = {name: parent Domain or None}, creating the missing ones."""
    existing = {domain.name: domain for domain in Domain.objects.filter(level=level, name__in=list(wanted))}
    missing = [Domain(level=level, name=name, parent=parent) for name, parent in wanted.items() if name not in existing]
    for domain in Domain.objects.bulk_create(missing):
        existing[domain.name] = domain
    report.created[f"{level.name}s"] += len(missing)
    return existing


def place_nodes(inventory, placed, levels, report):
    zones = ensure_domains(levels["zone"], {p.zone: None for p in placed}, report)
    blocks = ensure_domains(levels["block"], {p.block: zones[p.zone] for p in placed}, report)
    racks = ensure_domains(levels["rack"], {p.rack: blocks[p.block] for p in placed}, report)
    partitioned, networked = demo.partitioned_and_networked(placed)
    existing = set(Node.objects.filter(name__in=[p.machine.name for p in placed]).values_list("name", flat=True))
    new_nodes = [
        Node(
            name=p.machine.name,
            domain=racks[p.rack],
            labels={"inventory": inventory, "machine-type": type_label(p)},
            shared_counters=demo.gpu_counter_sets(p.machine) if p.machine.name in partitioned else None,
        )
        for p in placed
        if p.machine.name not in existing
    ]
    Node.objects.bulk_create(new_nodes, batch_size=1000)
    report.created["nodes"] += len(new_nodes)
    node_ids = dict(Node.objects.filter(name__in=[p.machine.name for p in placed]).values_list("name", "id"))
    have = set(Device.objects.filter(node_id__in=node_ids.values()).values_list("node_id", "name"))
    first_networked = min(networked, key=demo.natural_key) if networked else None
    devices = []
    for p in placed:
        node_id = node_ids[p.machine.name]
        for index in range(p.machine.devices):
            if (node_id, str(index)) in have:
                continue
            devices.append(new_device(node_id, p, index, partitioned, networked))
        if p.machine.name in networked:
            nics = [
                Device(
                    node_id=node_id,
                    driver=demo.NIC_DRIVER,
                    pool=p.machine.name,
                    name=name,
                    attributes={**attributes, "networkIsland": p.rack},
                )
                for name, attributes in demo.nics_of(p.machine)
                if (node_id, name) not in have
            ]
            devices.extend(nics)
            report.created["NICs"] += len(nics)
            if p.machine.name == first_networked:
                # The rack's scratch volume sits on its first networked node and is reachable rack-wide.
                volumes = [
                    Device(node_id=node_id, driver=demo.STORAGE_DRIVER, pool=f"{p.rack}-storage", name=name,
                           attributes=attributes)
                    for name, attributes in demo.scratch_of(p.rack)
                    if (node_id, name) not in have
                ]  # fmt: skip
                devices.extend(volumes)
                report.created["scratch volumes"] += len(volumes)
    Device.objects.bulk_create(devices, batch_size=2000)
    report.created["devices"] += len(devices)
    add_partitions(placed, partitioned, node_ids, have, report)


def add_partitions(placed, partitioned, node_ids, have, report):
    """The MIG-style partitions of every GPU of the partitioned nodes, each pointing at its whole GPU."""
    wanted = [p for p in placed if p.machine.name in partitioned]
    parents = {
        (node_id, name): pk
        for pk, node_id, name in Device.objects.filter(
            node_id__in=[node_ids[p.machine.name] for p in wanted], parent__isnull=True, driver=demo.DRIVER
        ).values_list("pk", "node_id", "name")
    }
    partitions = []
    for p in wanted:
        node_id = node_ids[p.machine.name]
        for index in range(p.machine.devices):
            for name, attributes, consumes in demo.partitions_of(p.machine, index):
                if (node_id, name) in have:
                    continue
                partitions.append(
                    Device(
                        node_id=node_id,
                        driver=demo.DRIVER,
                        pool=p.machine.name,
                        name=name,
                        attributes=attributes,
                        parent_id=parents[(node_id, str(index))],
                        consumes_counters=consumes,
                    )
                )
    Device.objects.bulk_create(partitions, batch_size=2000)
    report.created["devices"] += len(partitions)
    report.created["partitions"] += len(partitions)


def type_label(placed):
    return f"{placed.machine.devices}x{placed.machine.attributes['model']}"


def new_device(node_id, placed, index, partitioned=(), networked=()):
    machine = placed.machine
    capacity = {"memory": f"{machine.attributes['memory']}Gi"} if "memory" in machine.attributes else {}
    attributes = {**machine.attributes, "index": index}
    if machine.name in networked:
        # The same names as the NICs' attributes, so one matchAttribute spans GPUs and NICs.
        attributes |= {"pcie_root": demo.pcie_root(index), "networkIsland": placed.rack}
    return Device(
        node_id=node_id,
        driver=demo.DRIVER,
        pool=machine.name,
        name=str(index),
        attributes=attributes,
        capacity=capacity,
        consumes_counters=demo.whole_gpu_consumes(machine, index) if machine.name in partitioned else None,
    )


def ensure_device_classes(inventory, report):
    classes = {}
    for spec in demo.device_classes_for(inventory):
        device_class = DeviceClass.objects.filter(name=spec.name).first()
        if device_class is None:
            device_class = DeviceClass.objects.create(
                name=spec.name, selector=spec.selector, price_per_hour=spec.price_per_hour, description=spec.description
            )
            report.created["device classes"] += 1
        classes[spec.name] = device_class
    return classes


def ensure_teams_and_queues(vcs, capacity, report):
    cohort, created = Cohort.objects.get_or_create(name=COHORT)
    report.created["cohorts"] += int(created)
    quotas = demo.proportional_quotas(vcs, capacity)
    teams = {}
    for vc in vcs:
        team, created = Team.objects.get_or_create(
            name=vc.name, defaults={"display_name": f"Philly VC {vc.name}" + ("" if vc.nodes else " (no quota)")}
        )
        report.created["teams"] += int(created)
        _, created = Queue.objects.get_or_create(
            name=vc.name,
            defaults={
                "team": team,
                "cohort": cohort,
                "nominal_quota": quotas[vc.name],
                # Lend and borrow freely inside the cohort; a queue under its quota reclaims what it lent.
                "borrowing_limit": None,
                "lending_limit": None,
                "within_queue_preemption": WithinQueuePolicy.LOWER_PRIORITY,
                "reclaim_within_cohort": ReclaimPolicy.ANY,
            },
        )
        report.created["queues"] += int(created)
        teams[vc.name] = (team, vc.nodes)
    return teams


def ensure_menu(inventory, classes, teams, report):
    priorities = {}
    for name, value, preemptible, description in demo.PRIORITY_CLASSES:
        priority, created = PriorityClass.objects.get_or_create(
            name=name, defaults={"value": value, "preemptible": preemptible, "description": description}
        )
        report.created["priority classes"] += int(created)
        priorities[name] = priority
    for spec in demo.RESOURCE_CLASSES:
        fields = {key: value for key, value in spec.items() if key not in ("name", "priority_class")}
        resource_class, created = ResourceClass.objects.get_or_create(
            name=spec["name"], defaults={**fields, "priority_class": priorities[spec["priority_class"]]}
        )
        if not created:
            continue
        report.created["resource classes"] += 1
        for rank, class_name in enumerate(demo.MENU[inventory][spec["name"]]):
            ResourceClassDeviceClass.objects.create(
                resource_class=resource_class, device_class=classes[class_name], rank=rank
            )
        if spec["name"] == "large-reserved-training":
            allowed = [team for team, nodes in teams.values() if nodes >= demo.RESERVED_TRAINING_MIN_VC_NODES]
            resource_class.allowed_teams.add(*allowed)


def ensure_users(teams, report):
    """Demo logins; the password is the user name. Returns [(username, password, what it is)]."""
    logins = []
    for username, role, superuser in STAFF_LOGINS:
        user = ensure_user(username, role, report, superuser=superuser)
        logins.append((user.username, username, role))
    for name, (team, _) in sorted(teams.items()):
        username = f"member-{name}"
        user = ensure_user(username, roles.MEMBER, report)
        if not team.members.filter(pk=user.pk).exists():
            team.members.add(user)
        logins.append((username, username, f"member of team {name}"))
    return logins


def ensure_user(username, role, report, superuser=False):
    user = User.objects.filter(username=username).first()
    if user is not None:
        return user
    if superuser:
        user = User.objects.create_superuser(username, f"{username}@example.com", username)
    else:
        user = User.objects.create_user(username, f"{username}@example.com", username)
    user.groups.add(Group.objects.get_or_create(name=role)[0])
    report.created["users"] += 1
    return user


# A real fleet is never all green: about 1 device in 100 is broken, one in 250 carries a taint, one
# node is drained for maintenance, and the largest team holds a rack for a month. Chosen by position,
# so the demo looks the same on every machine.
UNHEALTHY_EVERY = 97
TAINTED_EVERY = 251
RESERVED_RACK_DEVICES = 16


def add_demo_conditions(inventory, classes, capacity, teams, report):
    # Chosen among whole GPUs, so adding partitions and NICs did not move them; a GPU's partitions fail with it.
    devices = list(
        Device.objects.filter(driver=demo.DRIVER, parent__isnull=True)
        .order_by("node__name", "name")
        .values_list("pk", flat=True)
    )
    unhealthy = devices[UNHEALTHY_EVERY // 2 :: UNHEALTHY_EVERY]
    tainted = [pk for pk in devices[TAINTED_EVERY // 2 :: TAINTED_EVERY] if pk not in set(unhealthy)]
    Device.objects.filter(pk__in=unhealthy).update(health="Unhealthy")
    Device.objects.filter(parent__in=unhealthy).update(health="Unhealthy")
    Device.objects.filter(pk__in=tainted).update(
        taints=[{"key": "gpu.example.com/ecc-errors", "value": "high", "effect": "NoSchedule"}]
    )
    report.created["unhealthy devices"] += len(unhealthy)
    report.created["tainted devices"] += len(tainted)
    drained = Node.objects.order_by("name").last()
    Node.objects.filter(pk=drained.pk).update(cordoned=True, labels={**drained.labels, "maintenance": "demo"})
    report.created["cordoned nodes"] += 1
    add_demo_reservation(inventory, classes, capacity, teams, report)


def add_demo_reservation(inventory, classes, capacity, teams, report):
    """The team with the most quota holds RESERVED_RACK_DEVICES of the biggest class in one rack."""
    class_name = max(classes, key=lambda name: (capacity.get(name, 0), name))
    team = max((team for team, _ in teams.values()), key=lambda team: (teams[team.name][1], team.name))
    rack = next(
        (
            domain
            for domain in Domain.objects.filter(level__name="rack").order_by("name")
            if rack_class(inventory, domain) == class_name
        ),
        None,
    )
    if rack is None:
        return
    now = timezone.now()
    Reservation.objects.create(
        name=f"{team.name}-demo-hold",
        team=team,
        device_class=classes[class_name],
        count=RESERVED_RACK_DEVICES,
        domain=rack,
        start=now,
        end=now + timedelta(days=30),
        reason="Demo: a month of guaranteed capacity for the largest virtual cluster.",
    )
    report.created["reservations"] += 1


def rack_class(inventory, rack):
    attributes = (
        Device.objects.filter(node__domain=rack, driver=demo.DRIVER, parent__isnull=True)
        .values_list("attributes", flat=True)
        .first()
    )
    return demo.class_of(inventory, attributes) if attributes else None


# Standing requests that show, from the first cycle on, what the replayed trace alone rarely does: a
# large run waiting for an approver, a team asking for a class it may not use, a pod no node can hold,
# and a rack-sized gang in a busy cluster. (name, team rank by quota, resource class, pods, devices per pod)
DEMO_REQUESTS = (
    ("llm-pretrain-256", 0, "large-reserved-training", 32, 8),
    ("borrowed-ambition", -1, "large-reserved-training", 8, 8),
    ("one-pod-16-gpus", 1, "distributed-training", 1, 16),
    ("rack-sized-gang", 2, "distributed-training", 8, 8),
)


# Elastic work (Pod disruption mode): it takes up to `pods` pods and runs on any `min_count` of them, so
# when its team's higher-priority work needs room the cycle shrinks it rather than stopping it.
# (name, team rank by quota, resource class, pods, devices per pod, min_count)
ELASTIC_REQUESTS = (("elastic-embeddings", 1, "batch-inference", 16, 1, 4),)


# Work on the partitioned nodes: gangs of one-partition pods of one profile, chosen by device class.
# (name, team rank by quota, device class, pods)
PARTITION_REQUESTS = (("notebook-slices", 3, "mig-1g", 3), ("eval-slices", 4, "mig-2g", 2))


def claim_requests(inventory):
    """Work on the networked nodes, as DRA claims with two requests: (name, team rank by quota, pods,
    claim). Each pod of the first takes 4 GPUs and the NIC under their PCIe root; the one pod of the
    second takes 8 GPUs and a NIC of the same network island."""
    gpus = demo.MENU[inventory]["networked-training"][0]

    def claim(count, attribute):
        return {
            "requests": [
                {"name": "gpus", "exactly": {"deviceClassName": gpus, "count": count}},
                {"name": "nic", "exactly": {"deviceClassName": "rdma-nic", "count": 1}},
            ],
            "constraints": [{"requests": ["gpus", "nic"], "matchAttribute": f"{demo.DRIVER}/{attribute}"}],
        }

    return (
        ("allreduce-rdma", 1, 2, claim(demo.GPUS_PER_PCIE_ROOT, "pcie_root")),
        ("island-finetune", 2, 1, claim(2 * demo.GPUS_PER_PCIE_ROOT, "networkIsland")),
    )


def group_claim_requests(inventory):
    """A gang that owns a claim (Kubernetes 1.36 PodGroup resourceClaims): (name, team rank by quota,
    pods, GPUs per pod, device class, group claims). Its two pods of 4 GPUs share the networked rack's
    scratch volume, allocated once for the gang, so both pods go to that rack."""
    gpus = demo.MENU[inventory]["networked-training"][0]
    dataset = {"name": "dataset", "requests": [{"name": "volume", "exactly": {"deviceClassName": "rack-scratch"}}]}
    return (("shared-dataset-prep", 3, 2, demo.GPUS_PER_PCIE_ROOT, gpus, (dataset,)),)


def add_demo_requests(inventory, teams, report):
    ranked = sorted((team for team, nodes in teams.values() if nodes), key=lambda t: (-teams[t.name][1], t.name))

    def submit(name, rank, class_name, hours, pod_set, **fields):
        """One demo request from the `rank`-th team's member, as the submit form would send it."""
        from broker.workloads import services

        team = ranked[rank]
        submission = services.Submission(
            name=name,
            queue=Queue.objects.get(name=team.name),
            resource_class=ResourceClass.objects.get(name=class_name),
            pod_sets=(services.PodSetRequest(name="main", **pod_set),),
            expected_duration_seconds=hours * 3600,
            **fields,
        )
        services.submit_workload(submission, User.objects.get(username=f"member-{team.name}"))
        report.created["demo requests"] += 1

    for name, rank, class_name, pods, per_pod in DEMO_REQUESTS:
        submit(name, rank, class_name, 6, {"replicas": pods, "devices_per_pod": per_pod, "min_count": pods})
    for name, rank, class_name, pods, per_pod, min_count in ELASTIC_REQUESTS:
        pod_set = {"replicas": pods, "devices_per_pod": per_pod, "min_count": min_count}
        submit(name, rank, class_name, 12, pod_set, disruption_mode="Pod")
    for name, rank, device_class, pods in PARTITION_REQUESTS:
        pod_set = {"replicas": pods, "devices_per_pod": 1, "min_count": pods, "device_classes": (device_class,)}
        submit(name, rank, "gpu-slice", 4, pod_set)
    for name, rank, pods, per_pod, gpus, group_claims in group_claim_requests(inventory):
        pod_set = {"replicas": pods, "devices_per_pod": per_pod, "min_count": pods, "device_classes": (gpus,)}
        submit(name, rank, "networked-training", 8, pod_set, group_claims=group_claims)
    for name, rank, pods, claim in claim_requests(inventory):
        pod_set = {"replicas": pods, "devices_per_pod": 1, "min_count": pods, "claim": claim}
        submit(name, rank, "networked-training", 8, pod_set)
