from broker.workloads import services


def submission(cluster, name="big", resource_class=None, replicas=2, devices_per_pod=4, **fields):
    return services.Submission(
        name=name,
        queue=fields.pop("queue", cluster.queue_a),
        resource_class=resource_class or cluster.reserved,
        pod_sets=(services.PodSetRequest(name="main", replicas=replicas, devices_per_pod=devices_per_pod),),
        **fields,
    )


def submit(cluster, actor, **fields):
    return services.submit_workload(submission(cluster, **fields), actor)
