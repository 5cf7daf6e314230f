"""Human formats: durations, the numbers behind an explanation and audit before/after as tables."""

import pytest
from django.urls import reverse

from broker.audit.models import AuditEvent
from dashboard.templatetags.broker_tags import changes, duration, fields


@pytest.mark.parametrize(
    ("seconds", "said"),
    [(0, "0 s"), (45, "45 s"), (60, "1 min"), (5400, "1 h 30 min"), (360000, "4 d 4 h"), (86400, "1 d"), (None, "")],
)
def test_it_says_durations_as_people_do(seconds, said):
    assert duration(seconds) == said


def test_it_flattens_nested_numbers_into_named_rows():
    rows = fields({"needed": 8, "best_domain": {"name": "r1", "free": 3}, "blockers": [], "teams": ["a", "b"]})
    assert rows == [
        ("needed", 8),
        ("best domain.name", "r1"),
        ("best domain.free", 3),
        ("blockers", "none"),
        ("teams", "a, b"),
    ]


def test_it_sets_an_audit_events_before_beside_its_after():
    event = AuditEvent(before={"priority": 100}, after={"priority": 500, "reason": None})
    assert changes(event) == [("priority", 100, 500), ("reason", "", "—")]


def test_it_shows_the_numbers_behind_an_explanation_as_a_table(client, scene, alice):
    client.force_login(alice)
    page = client.get(reverse("dashboard:workload", args=[scene.a_wait.pk])).content.decode()
    assert 'id="explanation-numbers"' in page
    assert "{&#x27;" not in page and "{'" not in page  # no Python dict dump
    assert '<th scope="row">needed</th><td class="num">8</td>' in page


def test_it_shows_expected_durations_in_hours_and_days(client, scene, alice):
    scene.a_wait.expected_duration_seconds = 360000
    scene.a_wait.save()
    client.force_login(alice)
    page = client.get(reverse("dashboard:workload", args=[scene.a_wait.pk])).content.decode()
    assert "<dd>4 d 4 h</dd>" in page and "360000 s" not in page
