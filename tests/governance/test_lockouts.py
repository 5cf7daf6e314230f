"""Brute force: failed logins on the login page and the token endpoint lock the username out from that
address; the lockout is visible to operators, liftable with a reason, and both are audited."""

import pytest
from django.urls import reverse

from broker.audit.models import AuditEvent

LIMIT = 5


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.AXES_FAILURE_LIMIT = LIMIT


def log_in(client, username, password):
    return client.post(reverse("login"), {"username": username, "password": password})


def token(client, username, password):
    return client.post("/api/auth/token/", {"username": username, "password": password})


def test_it_locks_the_login_page_after_the_limit_even_for_the_right_password(client, alice):
    for _ in range(30):
        log_in(client, "alice", "wrong")

    response = log_in(client, "alice", "password")

    assert response.status_code == 429
    assert "Too many failed logins" in response.content.decode()
    assert "_auth_user_id" not in client.session


def test_it_lets_the_right_password_in_below_the_limit_and_forgets_the_failures(client, alice):
    for _ in range(LIMIT - 1):
        assert log_in(client, "alice", "wrong").status_code == 200
    assert log_in(client, "alice", "password").status_code == 302
    client.logout()
    for _ in range(LIMIT - 1):
        log_in(client, "alice", "wrong")
    assert log_in(client, "alice", "password").status_code == 302


def test_it_locks_the_token_endpoint_too(client, alice):
    assert token(client, "alice", "password").status_code == 200
    for _ in range(LIMIT):
        assert token(client, "alice", "wrong").status_code in (400, 429)

    response = token(client, "alice", "password")

    assert response.status_code == 429
    assert "Too many failed logins" in response.json()["detail"]
    assert int(response["Retry-After"]) > 0


def test_failures_on_one_door_count_at_the_other(client, alice):
    for _ in range(LIMIT):
        log_in(client, "alice", "wrong")
    assert token(client, "alice", "password").status_code == 429


def test_a_lockout_is_audited_once(client, alice):
    for _ in range(LIMIT + 3):
        log_in(client, "alice", "wrong")
    events = AuditEvent.objects.filter(action="login.lockout")
    assert events.count() == 1
    assert events.get().after == {"username": "alice", "ip_address": "127.0.0.1", "failures": LIMIT}


def test_an_operator_sees_and_lifts_a_lockout_with_a_reason(client, alice, olivia):
    for _ in range(LIMIT):
        log_in(client, "alice", "wrong")
    operator = client.__class__()
    operator.force_login(olivia)

    page = operator.get(reverse("governance:lockouts"))
    locked = page.context["locked"]
    assert [(a.username, a.ip_address) for a in locked] == [("alice", "127.0.0.1")]
    lift = reverse("governance:lockout-lift", args=[locked[0].pk])

    operator.post(lift, {"reason": ""})
    assert log_in(client, "alice", "password").status_code == 429
    operator.post(lift, {"reason": "alice called the help desk"})

    assert log_in(client, "alice", "password").status_code == 302
    event = AuditEvent.objects.get(action="login.unlock")
    assert (event.actor, event.reason, event.before["username"]) == (olivia, "alice called the help desk", "alice")


@pytest.mark.parametrize("persona", ["alice", "fiona", "april"])
def test_only_operators_open_the_lockouts(client, cluster, request, persona):
    client.force_login(request.getfixturevalue(persona))
    assert client.get(reverse("governance:lockouts")).status_code == 403
