from django.urls import reverse

from broker.inventory.models import Node
from dashboard.inventory_state import STATES


def counts(**given):
    return {state: given.get(state, 0) for state in STATES}


def test_it_aggregates_the_heatmap_to_racks(client, scene, alice):
    client.force_login(alice)
    data = client.get(reverse("dashboard:api-heatmap")).json()
    assert data["level"] == "rack"
    assert data["levels"] == ["zone", "block", "rack", "node"]
    assert data["rows"] == ["z1/b1"]
    cells = {cell["name"]: cell for cell in data["cells"]}
    assert set(cells) == {"r1", "r2"}
    assert cells["r1"]["counts"] == counts(busy=4, reserved=2, stranded=2)
    assert cells["r1"]["teams"] == {"team-a": 4}
    assert cells["r1"]["nodes"] == 2 and cells["r1"]["total"] == 8
    # secret-b is held by quota, so it wants nothing: big-a's 4 per pod is the smallest request, and
    # n4's 3 healthy free devices are stranded.
    assert cells["r2"]["counts"] == counts(busy=2, stranded=5, unhealthy=1)
    assert cells["r2"]["teams"] == {"team-b": 2}
    assert data["teams"] == ["team-a", "team-b"]


def test_it_treats_a_cordoned_node_as_unavailable(client, scene, olivia, cluster):
    Node.objects.filter(pk=cluster.nodes[3].pk).update(cordoned=True)
    client.force_login(olivia)
    cells = {cell["name"]: cell for cell in client.get(reverse("dashboard:api-heatmap")).json()["cells"]}
    assert cells["r2"]["counts"] == counts(busy=2, stranded=2, unhealthy=4)


def test_it_drills_a_rack_into_nodes_and_devices(client, scene, alice):
    client.force_login(alice)
    data = client.get(reverse("dashboard:api-heatmap-rack", args=[scene.r1.pk])).json()
    assert data["level"] == "node"
    assert data["rack"] == {"id": scene.r1.pk, "name": "r1", "path": "z1/b1/r1"}
    assert [n["name"] for n in data["nodes"]] == ["n1", "n2"]
    states = [(d["node"], d["name"], d["state"]) for d in data["devices"]]
    assert states == [
        ("n1", "0", "busy"),
        ("n1", "1", "busy"),
        ("n1", "2", "busy"),
        ("n1", "3", "busy"),
        ("n2", "0", "reserved"),
        ("n2", "1", "reserved"),
        ("n2", "2", "stranded"),
        ("n2", "3", "stranded"),
    ]
    busy = data["devices"][0]
    assert busy["team"] == "team-a"
    assert busy["workload"]["name"] == "train-a"
    assert busy["classes"] == ["h100"]


def test_it_never_names_another_teams_workload_in_the_drill_down(client, scene, alice, bob):
    client.force_login(bob)
    busy = client.get(reverse("dashboard:api-heatmap-rack", args=[scene.r1.pk])).json()["devices"][0]
    assert busy["team"] == "team-a"
    assert busy["workload"] is None
    client.force_login(alice)
    node = Node.objects.get(name="n3")
    devices = client.get(reverse("dashboard:api-heatmap-node", args=[node.pk])).json()["devices"]
    assert [d["state"] for d in devices] == ["busy", "busy", "stranded", "stranded"]
    assert all(d["workload"] is None for d in devices)
    assert "serve-b" not in str(devices)


def test_it_describes_one_node_for_the_device_level(client, scene, olivia):
    client.force_login(olivia)
    node = Node.objects.get(name="n4")
    data = client.get(reverse("dashboard:api-heatmap-node", args=[node.pk])).json()
    assert data["level"] == "device"
    assert data["node"]["name"] == "n4" and data["node"]["path"] == "z1/b1/r2" and data["node"]["cordoned"] is False
    assert [(d["name"], d["state"], d["health"]) for d in data["devices"]] == [
        ("0", "unhealthy", "Unhealthy"),
        ("1", "stranded", "Healthy"),
        ("2", "stranded", "Healthy"),
        ("3", "stranded", "Healthy"),
    ]


def test_it_highlights_a_workloads_placement_only_for_those_who_may_see_it(client, scene, alice):
    client.force_login(alice)
    url = reverse("dashboard:api-heatmap-rack", args=[scene.r1.pk])
    devices = client.get(url, {"highlight": scene.a_run.pk}).json()["devices"]
    assert [d["highlight"] for d in devices] == [True] * 4 + [False] * 4
    assert client.get(url, {"highlight": scene.b_run.pk}).status_code == 404


def test_it_answers_the_queue_json_per_role(client, scene, alice, olivia):
    client.force_login(alice)
    data = client.get(reverse("dashboard:api-queue")).json()
    assert [row["name"] for row in data["pending"]["rows"]] == ["big-a"]
    row = data["pending"]["rows"][0]
    assert row["reason"] == "TopologyFragmented"
    assert row["position_in_cluster"] == 1 and row["position_in_queue"] == 1
    assert row["devices"] == 8
    assert data["hidden"]["total"] == 1
    assert "secret-b" not in str(data)
    client.force_login(olivia)
    data = client.get(reverse("dashboard:api-queue")).json()
    assert [row["name"] for row in data["pending"]["rows"]] == ["big-a", "secret-b"]


def test_it_answers_the_overview_json(client, scene, fiona):
    client.force_login(fiona)
    data = client.get(reverse("dashboard:api-overview")).json()
    h100 = data["capacity"][0]
    assert h100["device_class"] == "h100" and h100["total"] == 16
    assert h100["idle_cost_per_hour"] == 36.0  # (7 stranded + 2 reserved) x $4
    assert h100["min_pending_request"] == 4  # secret-b (3 per pod) is held by quota and wants nothing
    assert data["counters"]["pending"] == 2 and data["counters"]["running"] == 2
    assert data["counters"]["pending_mine"] == 0
    assert data["series"]["admitted"] == [2]
    assert data["series"]["duration_ms"] == [35.0]


def test_it_catches_up_from_the_database_with_only_visible_workloads(client, scene, alice):
    client.force_login(alice)
    ids = ",".join(str(w.pk) for w in (scene.a_wait, scene.b_wait, scene.a_run))
    data = client.get(reverse("dashboard:api-live"), {"workloads": ids}).json()
    assert data["type"] == "catchup"
    assert {row["name"] for row in data["workloads"]} == {"big-a", "train-a"}
    running = next(row for row in data["workloads"] if row["name"] == "train-a")
    assert running["where"] == "r1: n1 ×4"
    assert data["counters"]["devices_busy"] == 6


def test_it_answers_a_workload_json_only_to_its_readers(client, scene, alice):
    client.force_login(alice)
    assert client.get(reverse("dashboard:api-workload", args=[scene.b_wait.pk])).status_code == 404
    data = client.get(reverse("dashboard:api-workload", args=[scene.a_run.pk])).json()
    assert data["workload"]["state"] == "Running"
    assert data["cost"]["total"] > 31


def test_it_requires_a_login_for_json(client, scene):
    assert client.get(reverse("dashboard:api-heatmap")).status_code == 302


def test_it_shows_a_device_that_a_plain_update_took_down(client, scene, olivia, cluster):
    from broker.inventory.models import Device
    from broker.workloads.models import Allocation

    client.force_login(olivia)
    before = {cell["name"]: cell for cell in client.get(reverse("dashboard:api-heatmap")).json()["cells"]}
    held = Allocation.objects.filter(released_at__isnull=True).values("device_id")
    free = Device.objects.filter(node__domain__name="r1").exclude(pk__in=held).order_by("pk").first()
    # No signal, no generation bump, no cycle: only the inventory triggers see it.
    Device.objects.filter(pk=free.pk).update(health="Unhealthy")

    after = {cell["name"]: cell for cell in client.get(reverse("dashboard:api-heatmap")).json()["cells"]}

    assert after["r1"]["counts"]["unhealthy"] == before["r1"]["counts"]["unhealthy"] + 1


def test_it_orders_nodes_as_people_number_them_and_keeps_each_teams_colour(client, scene, olivia, cluster):
    from broker.inventory.models import Device
    from broker.policy.models import Team
    from dashboard.queries import TEAM_PALETTE, natural_key

    for name in ("n10", "n2x", "n9"):
        node = Node.objects.create(name=name, domain=scene.r1)
        Device.objects.create(node=node, name="0", attributes={"model": "H100", "memory": 80})
    client.force_login(olivia)
    url = reverse("dashboard:api-heatmap-rack", args=[scene.r1.pk])
    data = client.get(url).json()
    assert [n["name"] for n in data["nodes"]] == ["n1", "n2", "n2x", "n9", "n10"]
    assert [d["node"] for d in data["devices"]] == sorted((d["node"] for d in data["devices"]), key=natural_key)

    colours = client.get(reverse("dashboard:api-heatmap")).json()["team_colors"]
    assert colours["team-a"] == TEAM_PALETTE[cluster.team_a.pk % len(TEAM_PALETTE)]
    Team.objects.create(name="aaa-new", display_name="New")  # a new team takes no colour from another
    again = client.get(url).json()["team_colors"]
    assert again["team-a"] == colours["team-a"] and again["team-b"] == colours["team-b"]


def test_it_marks_a_busy_device_that_failed_or_was_cordoned_at_once(client, scene, olivia, cluster):
    from broker.inventory.models import Health

    client.force_login(olivia)
    url = reverse("dashboard:api-heatmap-rack", args=[scene.r1.pk])
    busy = [d for d in client.get(url).json()["devices"] if d["state"] == "busy"]
    assert busy and not any(d["unavailable"] for d in busy)

    failed = cluster.nodes[0].devices.order_by("id").first()
    failed.health = Health.UNHEALTHY
    failed.save()
    devices = {d["id"]: d for d in client.get(url).json()["devices"]}
    assert devices[failed.pk]["state"] == "busy" and devices[failed.pk]["unavailable"] is True
    assert not any(d["unavailable"] for pk, d in devices.items() if pk != failed.pk and d["node"] == "n1")

    Node.objects.filter(pk=cluster.nodes[0].pk).update(cordoned=True)
    devices = client.get(url).json()["devices"]
    assert all(d["unavailable"] for d in devices if d["node"] == "n1")
