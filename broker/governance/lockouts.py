"""Login lockouts: django-axes counts failed logins (the login page, the API's token endpoint, the admin)
per username and address, and after LOGIN_FAILURE_LIMIT of them refuses that pair for LOGIN_LOCKOUT_MINUTES
(settings.AXES_*). This module is what the broker adds: the lockout answer, an audit event when a pair
is locked out, and the list operators see and lift (governance:lockouts), each lift audited.
"""

from django.conf import settings
from django.db import transaction
from django.http import JsonResponse
from django.shortcuts import render
from django.utils import timezone

from broker.audit.models import record

LOCKED_MESSAGE = (
    "Too many failed logins from here for this username; try again in {minutes} minutes or ask an operator."
)


def cool_off_minutes():
    return max(1, round(settings.AXES_COOLOFF_TIME.total_seconds() / 60))


def locked_message():
    return LOCKED_MESSAGE.format(minutes=cool_off_minutes())


def lockout_response(request, original_response=None, credentials=None):
    """settings.AXES_LOCKOUT_CALLABLE: 429 in the API's JSON, or the login page saying so."""
    if request.path.startswith("/api/"):
        response = JsonResponse({"detail": locked_message()}, status=429)
    else:
        response = render(request, "registration/login.html", {"locked_out": locked_message()}, status=429)
    response["Retry-After"] = str(int(settings.AXES_COOLOFF_TIME.total_seconds()))
    return response


def attempts():
    from axes.models import AccessAttempt

    return AccessAttempt.objects.order_by("-attempt_time")


def current_lockouts(now=None):
    """The username/address pairs refused now: as many failures as the limit within the cool-off."""
    now = now or timezone.now()
    return list(
        attempts().filter(
            failures_since_start__gte=settings.AXES_FAILURE_LIMIT,
            attempt_time__gt=now - settings.AXES_COOLOFF_TIME,
        )
    )


def recent_failures(now=None):
    """Pairs with failures inside the cool-off that are not (yet) locked out."""
    now = now or timezone.now()
    return list(
        attempts().filter(
            failures_since_start__lt=settings.AXES_FAILURE_LIMIT,
            attempt_time__gt=now - settings.AXES_COOLOFF_TIME,
        )
    )


def summary(attempt):
    return {"username": attempt.username, "ip_address": attempt.ip_address, "failures": attempt.failures_since_start}


def on_locked_out(sender, request, username, ip_address, **kwargs):
    """axes' user_locked_out handler: audits the lockout once, when the pair reaches the limit (axes
    signals again on every refused attempt after it)."""
    if getattr(request, "axes_failures_since_start", None) != settings.AXES_FAILURE_LIMIT:
        return
    attempt = attempts().filter(username=username, ip_address=ip_address).first()
    if attempt is not None:
        record("login.lockout", attempt, after=summary(attempt), reason=f"{settings.AXES_FAILURE_LIMIT} failed logins")


def lift(attempt, actor, reason):
    """An operator lets the pair log in again at once; audited, with why."""
    from axes.utils import reset

    with transaction.atomic():
        record("login.unlock", attempt, actor=actor, before=summary(attempt), reason=reason)
        reset(ip=attempt.ip_address, username=attempt.username)
