"""Kubernetes objects for the tests, built from the official client's models (never hand-written dicts),
so a test cannot describe a shape the client, and the real API server, would not know."""

from kubernetes import client

DRIVER = "gpu.example.com"
BLOCK = "cloud.provider.com/topology-block"
RACK = "cloud.provider.com/topology-rack"
SCHEDULER = "capacity-broker"
STORAGE = "storage.example.com"
SCRATCH = f'device.attributes["{STORAGE}"].model == "scratch"'
H100 = f'device.attributes["{DRIVER}"].model == "H100"'
HALF = "H100-3g.40gb"
H100_HALF = f'device.attributes["{DRIVER}"].model == "{HALF}"'


def meta(name, namespace=None, labels=None, **more):
    return client.V1ObjectMeta(name=name, namespace=namespace, labels=labels, **more)


def node(name, rack="r1", block="b1", ready="True", unschedulable=None):
    return client.V1Node(
        api_version="v1",
        kind="Node",
        metadata=meta(name, labels={BLOCK: block, RACK: rack, "kubernetes.io/hostname": name}),
        spec=client.V1NodeSpec(unschedulable=unschedulable),
        status=client.V1NodeStatus(conditions=[client.V1NodeCondition(type="Ready", status=ready)]),
    )


def device(name, model="H100", memory="80Gi", taints=None):
    return client.V1Device(
        name=name,
        attributes={
            "model": client.V1DeviceAttribute(string=model),
            f"{DRIVER}/index": client.V1DeviceAttribute(int=int(name.rsplit("-", 1)[-1])),
            "pcie.example.com/root": client.V1DeviceAttribute(string="pci0"),
        },
        capacity={"memory": client.V1DeviceCapacity(value=memory)},
        taints=taints,
    )


def resource_slice(node_name, devices=8, model="H100", taints=None):
    return client.V1ResourceSlice(
        api_version="resource.k8s.io/v1",
        kind="ResourceSlice",
        metadata=meta(f"{node_name}-{DRIVER}"),
        spec=client.V1ResourceSliceSpec(
            driver=DRIVER,
            node_name=node_name,
            pool=client.V1ResourcePool(name=node_name, generation=1, resource_slice_count=1),
            devices=[device(f"gpu-{i}", model, taints=taints if i == 0 else None) for i in range(devices)],
        ),
    )


def counter_slice(node_name, gpus=1, memory="80Gi"):
    """The slice of a node's pool that publishes its shared counters: one set per physical GPU."""
    return client.V1ResourceSlice(
        api_version="resource.k8s.io/v1",
        kind="ResourceSlice",
        metadata=meta(f"{node_name}-{DRIVER}-counters"),
        spec=client.V1ResourceSliceSpec(
            driver=DRIVER,
            node_name=node_name,
            pool=client.V1ResourcePool(name=node_name, generation=1, resource_slice_count=2),
            shared_counters=[
                client.V1CounterSet(name=f"gpu-{i}", counters={"memory": client.V1Counter(value=memory)})
                for i in range(gpus)
            ],
        ),
    )


def partitioned_slice(node_name, gpus=1):
    """The devices of that pool: each GPU whole (all its memory) and cut in two halves (half each), all
    consuming the GPU's counter set, as a MIG-capable driver publishes them."""
    devices = []
    for i in range(gpus):
        for suffix, model, memory in (("", "H100", "80Gi"), ("-half-0", HALF, "40Gi"), ("-half-1", HALF, "40Gi")):
            partition = device(f"gpu-{i}{suffix}", model, memory)
            partition.consumes_counters = [
                client.V1DeviceCounterConsumption(
                    counter_set=f"gpu-{i}", counters={"memory": client.V1Counter(value=memory)}
                )
            ]
            devices.append(partition)
    return client.V1ResourceSlice(
        api_version="resource.k8s.io/v1",
        kind="ResourceSlice",
        metadata=meta(f"{node_name}-{DRIVER}"),
        spec=client.V1ResourceSliceSpec(
            driver=DRIVER,
            node_name=node_name,
            pool=client.V1ResourcePool(name=node_name, generation=1, resource_slice_count=2),
            devices=devices,
        ),
    )


def storage_slice(rack, devices=1):
    """Network-attached scratch volumes published for every node of a rack (a nodeSelector on its rack
    label), as a DRA driver publishes devices no single node holds."""
    return client.V1ResourceSlice(
        api_version="resource.k8s.io/v1",
        kind="ResourceSlice",
        metadata=meta(f"{rack}-{STORAGE}"),
        spec=client.V1ResourceSliceSpec(
            driver=STORAGE,
            node_selector=client.V1NodeSelector(
                node_selector_terms=[
                    client.V1NodeSelectorTerm(
                        match_expressions=[client.V1NodeSelectorRequirement(key=RACK, operator="In", values=[rack])]
                    )
                ]
            ),
            pool=client.V1ResourcePool(name=f"{rack}-scratch", generation=1, resource_slice_count=1),
            devices=[
                client.V1Device(
                    name=f"scratch-{i}",
                    attributes={"model": client.V1DeviceAttribute(string="scratch")},
                    capacity={"size": client.V1DeviceCapacity(value="10Ti")},
                )
                for i in range(devices)
            ],
        ),
    )


def device_class(name="h100", expression=H100, driver=DRIVER):
    return client.V1DeviceClass(
        api_version="resource.k8s.io/v1",
        kind="DeviceClass",
        metadata=meta(name),
        spec=client.V1DeviceClassSpec(
            selectors=[
                client.V1DeviceSelector(cel=client.V1CELDeviceSelector(expression=f'device.driver == "{driver}"')),
                client.V1DeviceSelector(cel=client.V1CELDeviceSelector(expression=expression)),
            ]
        ),
    )


def taint_rule(name, pool=None, device_name=None, effect="NoExecute"):
    return client.V1beta2DeviceTaintRule(
        api_version="resource.k8s.io/v1beta2",
        kind="DeviceTaintRule",
        metadata=meta(name),
        spec=client.V1beta2DeviceTaintRuleSpec(
            device_selector=client.V1beta2DeviceTaintSelector(driver=DRIVER, pool=pool, device=device_name),
            taint=client.V1beta2DeviceTaint(key="example.com/broken", value="ecc", effect=effect),
        ),
    )


def pod_group(
    name,
    namespace="ml",
    min_count=8,
    resource_class="training",
    topology=RACK,
    priority=None,
    queue=None,
    disruption_mode="PodGroup",
    template=None,
    priority_class=None,
    resource_claims=None,
):
    """A PodGroup; `template` (workload name, template name) makes it one made from a Workload's template;
    `resource_claims` [(entry, claim name, claim template name)] are the claims the gang owns."""
    labels = {"broker.capacity.io/resource-class": resource_class} if resource_class else {}
    if queue:
        labels["broker.capacity.io/queue"] = queue
    return client.V1alpha2PodGroup(
        api_version="scheduling.k8s.io/v1alpha2",
        kind="PodGroup",
        metadata=meta(name, namespace, labels=labels),
        spec=client.V1alpha2PodGroupSpec(
            pod_group_template_ref=client.V1alpha2PodGroupTemplateReference(
                workload=client.V1alpha2WorkloadPodGroupTemplateReference(
                    workload_name=template[0], pod_group_template_name=template[1]
                )
            )
            if template
            else None,
            resource_claims=group_claim_entries(resource_claims),
            **policy(min_count, topology, priority, disruption_mode, priority_class),
        ),
    )


def group_claim_entries(resource_claims):
    return [
        client.V1alpha2PodGroupResourceClaim(
            name=entry, resource_claim_name=claim_name, resource_claim_template_name=template_name
        )
        for entry, claim_name, template_name in resource_claims or []
    ] or None


def policy(min_count, topology, priority, disruption_mode, priority_class=None):
    """The policy fields a PodGroup and a PodGroupTemplate share (min_count None: the basic policy)."""
    return {
        "scheduling_policy": client.V1alpha2PodGroupSchedulingPolicy(
            gang=client.V1alpha2GangSchedulingPolicy(min_count=min_count) if min_count else None,
            basic={} if not min_count else None,
        ),
        "scheduling_constraints": client.V1alpha2PodGroupSchedulingConstraints(
            topology=[client.V1alpha2TopologyConstraint(key=topology)]
        )
        if topology
        else None,
        "priority": priority,
        "priority_class_name": priority_class,
        "disruption_mode": disruption_mode,
    }


def workload(name, namespace="ml", templates=None):
    """A Workload whose templates are {name: {min_count, topology, priority, disruption_mode, priority_class,
    resource_claims}}."""
    templates = templates or {"workers": {}}
    return client.V1alpha2Workload(
        api_version="scheduling.k8s.io/v1alpha2",
        kind="Workload",
        metadata=meta(name, namespace),
        spec=client.V1alpha2WorkloadSpec(
            pod_group_templates=[
                client.V1alpha2PodGroupTemplate(
                    name=template_name,
                    resource_claims=group_claim_entries(fields.get("resource_claims")),
                    **policy(
                        fields.get("min_count", 8),
                        fields.get("topology", RACK),
                        fields.get("priority"),
                        fields.get("disruption_mode", "PodGroup"),
                        fields.get("priority_class"),
                    ),
                )
                for template_name, fields in templates.items()
            ]
        ),
    )


def priority_class(name, value, global_default=None, preemption_policy=None):
    return client.V1PriorityClass(
        api_version="scheduling.k8s.io/v1",
        kind="PriorityClass",
        metadata=meta(name),
        value=value,
        global_default=global_default,
        preemption_policy=preemption_policy,
    )


def claim(name, namespace="ml", device_class_name="h100", count=1, request="gpus"):
    return client.ResourceV1ResourceClaim(
        api_version="resource.k8s.io/v1",
        kind="ResourceClaim",
        metadata=meta(name, namespace),
        spec=client.V1ResourceClaimSpec(
            devices=client.V1DeviceClaim(
                requests=[
                    client.V1DeviceRequest(
                        name=request,
                        exactly=client.V1ExactDeviceRequest(device_class_name=device_class_name, count=count),
                    )
                ]
            )
        ),
    )


def pod(name, group, namespace="ml", claim_name=None, scheduler=SCHEDULER, shared=None):
    """A pod of `group`; `shared` are its group's claim entries, which the pod names as they are (KEP-5729)."""
    claims = [client.V1PodResourceClaim(name="gpus", resource_claim_name=claim_name)] if claim_name else []
    claims += [
        client.V1PodResourceClaim(name=entry, resource_claim_name=claim, resource_claim_template_name=template)
        for entry, claim, template in shared or []
    ]
    return client.V1Pod(
        api_version="v1",
        kind="Pod",
        metadata=meta(name, namespace),
        spec=client.V1PodSpec(
            scheduler_name=scheduler,
            scheduling_group=client.V1PodSchedulingGroup(pod_group_name=group),
            containers=[client.V1Container(name="main", image="trainer:1")],
            resource_claims=claims or None,
        ),
    )


def gang(cluster, name, pods=8, devices_per_pod=1, namespace="ml", device_class_name="h100", **group):
    """A PodGroup, its pods and one claim per pod, created in the mock cluster."""
    cluster.create(pod_group(name, namespace, **{"min_count": pods, **group}))
    for i in range(pods):
        cluster.create(claim(f"{name}-{i}-gpus", namespace, device_class_name, count=devices_per_pod))
        cluster.create(
            pod(f"{name}-{i}", name, namespace, claim_name=f"{name}-{i}-gpus", shared=group.get("resource_claims"))
        )


def allocated(claim_devices):
    """A ResourceClaim's status with `claim_devices` [(pool, device)] allocated, as a DRA scheduler writes it."""
    return client.V1ResourceClaimStatus(
        allocation=client.V1AllocationResult(
            devices=client.V1DeviceAllocationResult(
                results=[
                    client.V1DeviceRequestAllocationResult(request="gpus", driver=DRIVER, pool=pool, device=device)
                    for pool, device in claim_devices
                ]
            )
        )
    )
