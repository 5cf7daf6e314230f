"""POST actions return to their `next` only when it is a path on this host."""

import pytest
from django.urls import reverse

from tests.api.test_workloads import pending


@pytest.mark.parametrize(
    ("next_url", "expected"),
    [
        ("https://evil.example/phish", "/topology/"),
        ("//evil.example/phish", "/topology/"),
        ("http://testserver.evil.example/", "/topology/"),
        ("javascript:alert(1)", "/topology/"),
        ("/queue/?team=team-a", "/queue/?team=team-a"),
        ("http://testserver/teams/", "http://testserver/teams/"),
        ("", "/topology/"),
    ],
)
def test_the_cordon_action_follows_next_only_on_this_host(client, cluster, olivia, next_url, expected):
    client.force_login(olivia)
    url = reverse("dashboard:node-cordon", args=[cluster.nodes[0].pk])
    response = client.post(url, {"cordoned": "true", "reason": "fan", "next": next_url})
    assert (response.status_code, response["Location"]) == (302, expected)


def test_the_health_and_cancel_actions_ignore_an_off_site_next(client, cluster, olivia):
    client.force_login(olivia)
    device = cluster.nodes[0].devices.first()
    health = client.post(
        reverse("dashboard:device-health", args=[device.pk]),
        {"health": "Unhealthy", "reason": "xid 79", "next": "https://evil.example/"},
    )
    assert health["Location"] == "/topology/"
    workload = pending(cluster)
    cancel = client.post(
        reverse("dashboard:workload-cancel", args=[workload.pk]), {"reason": "done", "next": "//evil.example"}
    )
    assert cancel["Location"] == reverse("dashboard:workload", args=[workload.pk])
