from broker.audit.models import AuditEvent
from broker.inventory.models import MAX_TOPOLOGY_LEVELS, Device, Domain, Health, Node, TopologyLevel
from tests.api.base import ModelAPITests, generation, signed_in


def rack(name="r1"):
    return Domain.objects.get(level__name="rack", name=name)


class TestTopologyLevels(ModelAPITests):
    model = TopologyLevel
    url = "/api/topology-levels/"

    def make_object(self, cluster):
        return TopologyLevel.objects.create(name="row", order=9)

    def create_data(self, cluster, n):
        return {"name": f"pod-{n}", "order": 20 + n}

    def update_data(self, cluster):
        return {"name": "aisle"}

    def bad_create_data(self, cluster):
        return [
            ({"name": "zone", "order": 30}, ["name"]),
            ({"name": "hall", "order": 0}, ["order"]),
            ({"name": "not a slug!", "order": 31}, ["name"]),
        ]

    def test_it_refuses_a_level_past_the_deepest_topology(self, cluster, api_client, olivia):
        for index in range(TopologyLevel.objects.count(), MAX_TOPOLOGY_LEVELS):
            TopologyLevel.objects.create(name=f"extra-{index}", order=40 + index)

        response = signed_in(api_client, olivia).post(self.url, {"name": "one-too-many", "order": 60}, format="json")

        assert response.status_code == 400
        assert "at most 8 levels" in response.json()["non_field_errors"][0]
        assert TopologyLevel.objects.count() == MAX_TOPOLOGY_LEVELS
        assert not AuditEvent.objects.filter(action__startswith="topologylevel").exists()


class TestDomains(ModelAPITests):
    model = Domain
    url = "/api/domains/"

    def make_object(self, cluster):
        return Domain.objects.create(level=TopologyLevel.objects.get(name="rack"), name="r9", parent=rack().parent)

    def create_data(self, cluster, n):
        return {"level": "rack", "name": f"r-new-{n}", "parent": rack().parent_id}

    def update_data(self, cluster):
        return {"name": "r99"}

    def bad_create_data(self, cluster):
        return [
            ({"level": "nowhere", "name": "x"}, ["level"]),
            ({"level": "rack", "name": "r1"}, ["non_field_errors"]),
            # A zone cannot sit inside a rack.
            ({"level": "zone", "name": "z9", "parent": rack().pk}, ["parent"]),
        ]

    def test_it_shows_the_path_to_the_root(self, cluster, api_client, alice):
        response = signed_in(api_client, alice).get(f"{self.url}{rack().pk}/")
        assert response.data["path"] == {"zone": "z1", "block": "b1", "rack": "r1"}


class TestNodes(ModelAPITests):
    model = Node
    url = "/api/nodes/"

    def make_object(self, cluster):
        return Node.objects.create(name="spare", domain=rack())

    def create_data(self, cluster, n):
        return {"name": f"new-node-{n}", "domain": rack("r2").pk, "labels": {"pool": "a"}}

    def update_data(self, cluster):
        return {"labels": {"pool": "b"}, "shared_counters": {"gpu-0": {"memory": "80Gi"}}}

    def test_it_refuses_shared_counters_that_are_not_quantities(self, cluster, api_client, olivia):
        node = Node.objects.create(name="spare", domain=rack())
        response = signed_in(api_client, olivia).patch(
            f"{self.url}{node.pk}/", {"shared_counters": {"gpu-0": {"memory": "lots"}}}, format="json"
        )
        assert response.status_code == 400
        assert "must be a non-negative quantity" in response.json()["shared_counters"][0]
        node.refresh_from_db()
        assert node.shared_counters is None

    def bad_create_data(self, cluster):
        return [
            ({"name": "n1"}, ["name"]),
            ({"name": "x", "domain": 987654}, ["domain"]),
            ({"name": "y", "labels": ["not", "a", "map"]}, ["labels"]),
        ]

    def test_it_filters_by_rack_name(self, cluster, api_client, alice):
        response = signed_in(api_client, alice).get(self.url, {"domain_name": "r2"})
        assert [node["name"] for node in response.data["results"]] == ["n3", "n4"]

    def test_it_cordons_and_uncordons_as_audited_interventions(self, cluster, api_client, olivia):
        node = cluster.nodes[0]
        before = generation()
        client = signed_in(api_client, olivia)
        response = client.post(f"{self.url}{node.pk}/cordon/", {"reason": "fan failure"})
        assert response.status_code == 200
        assert response.data["cordoned"] is True
        event = AuditEvent.objects.get(action="node.cordon", target_id=str(node.pk))
        assert (event.manual_intervention, event.reason, event.actor_name) == (True, "fan failure", "olivia")
        assert generation() == before + 1

        assert client.post(f"{self.url}{node.pk}/uncordon/").data["cordoned"] is False
        assert AuditEvent.objects.filter(action="node.uncordon", manual_intervention=True).count() == 1
        assert generation() == before + 2

    def test_it_keeps_cordoning_out_of_plain_updates(self, cluster, api_client, olivia):
        node = cluster.nodes[0]
        signed_in(api_client, olivia).patch(f"{self.url}{node.pk}/", {"cordoned": True})
        node.refresh_from_db()
        assert node.cordoned is False

    def test_it_refuses_to_delete_a_node_whose_devices_are_allocated(self, cluster, api_client, olivia):
        from broker.workloads.models import Allocation
        from tests.builders import make_workload

        workload = make_workload(cluster.queue_a)
        device = cluster.nodes[0].devices.first()
        Allocation.objects.create(
            workload=workload, device=device, device_class=cluster.h100, pod_set="main", pod_index=0
        )
        response = signed_in(api_client, olivia).delete(f"{self.url}{cluster.nodes[0].pk}/")
        assert response.status_code == 409
        assert Node.objects.filter(pk=cluster.nodes[0].pk).exists()


class TestDevices(ModelAPITests):
    model = Device
    url = "/api/devices/"

    def make_object(self, cluster):
        return Device.objects.create(node=cluster.nodes[0], name="spare", attributes={"model": "H100"})

    def create_data(self, cluster, n):
        return {"node": "n1", "name": f"extra-{n}", "attributes": {"model": "H100"}, "capacity": {"memory": "80Gi"}}

    def update_data(self, cluster):
        return {"taints": [{"key": "maintenance", "effect": "NoSchedule"}]}

    def bad_create_data(self, cluster):
        return [
            ({"node": "nowhere", "name": "0"}, ["node"]),
            ({"node": "n1", "name": "0"}, ["non_field_errors"]),
            ({"node": "n1", "name": "t", "taints": [{"effect": "NoSchedule"}]}, ["taints"]),
            ({"node": "n1", "name": "u", "taints": [{"key": "k", "effect": "Sometimes"}]}, ["taints"]),
            # n1 publishes no counter set: a partition cannot consume one.
            ({"node": "n1", "name": "p", "consumes_counters": {"gpu-0": {"memory": 1}}}, ["consumes_counters"]),
            # Shared by several allocations, but with no capacity for them to take amounts of.
            ({"node": "n1", "name": "s", "allow_multiple_allocations": True}, ["allow_multiple_allocations"]),
        ]

    def test_it_refuses_a_partition_consuming_a_counter_its_device_lacks(self, cluster, api_client, olivia):
        Node.objects.filter(name="n1").update(shared_counters={"gpu-0": {"memory": "80Gi", "compute": 7}})
        client = signed_in(api_client, olivia)
        before = Device.objects.count()

        response = client.post(
            self.url, {"node": "n1", "name": "0:1g", "consumes_counters": {"gpu-0": {"slices": 1}}}, format="json"
        )

        assert response.status_code == 400
        assert response.json()["consumes_counters"] == [
            "Counter 'slices' is not in counter set 'gpu-0' (its counters: compute, memory)."
        ]
        assert Device.objects.count() == before
        good = {"node": "n1", "name": "0:1g", "consumes_counters": {"gpu-0": {"memory": "10Gi", "compute": 1}}}
        assert client.post(self.url, good, format="json").status_code == 201

    def test_it_marks_unhealthy_and_healthy_as_audited_interventions(self, cluster, api_client, olivia):
        device = cluster.nodes[1].devices.first()
        before = generation()
        client = signed_in(api_client, olivia)
        response = client.post(f"{self.url}{device.pk}/mark-unhealthy/", {"reason": "XID 79"})
        assert response.status_code == 200
        assert response.data["health"] == Health.UNHEALTHY
        event = AuditEvent.objects.get(action="device.mark_unhealthy")
        assert (event.before, event.after, event.manual_intervention) == (
            {"health": "Healthy"},
            {"health": "Unhealthy"},
            True,
        )
        assert generation() == before + 1

        assert client.post(f"{self.url}{device.pk}/mark-healthy/").data["health"] == Health.HEALTHY
        assert generation() == before + 2

    def test_it_changes_nothing_when_the_device_already_has_that_health(self, cluster, api_client, olivia):
        device = cluster.nodes[1].devices.first()
        before = generation()
        signed_in(api_client, olivia).post(f"{self.url}{device.pk}/mark-healthy/")
        assert generation() == before
        assert not AuditEvent.objects.filter(action__startswith="device.").exists()

    def test_it_filters_by_health(self, cluster, api_client, alice):
        Device.objects.filter(pk=cluster.nodes[0].devices.first().pk).update(health=Health.UNHEALTHY)
        response = signed_in(api_client, alice).get(self.url, {"health": "Unhealthy"})
        assert response.data["count"] == 1
