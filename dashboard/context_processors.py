from django.conf import settings

from dashboard import live_health
from dashboard.broadcast import last_cycle
from dashboard.navigation import links_for

LIVE_REFRESH_HEADER = "HTTP_X_LIVE_REFRESH"


def site(request):
    # A page rereading its live regions (static/js/live.js) must not take the flash messages meant for
    # the next page the user opens.
    return {
        "site_name": settings.SITE_NAME,
        "cycle_mode": settings.CYCLE_MODE,
        "live_refresh": request.META.get(LIVE_REFRESH_HEADER) == "1",
    }


def live_cycle(request):
    """The last committed cycle when the page was drawn: the live socket's first hello compares it, so
    a page that nothing changed under since it was drawn is not read a second time."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {"live_cycle": last_cycle()}


def live_updates(request):
    """`live_paused` when Redis cannot be reached: the page is read from the database and says so."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"live_paused": False}
    return {"live_paused": not live_health.redis_up()}


def navigation(request):
    """The top bar's links for the signed-in user (dashboard.navigation)."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"nav_links": []}
    match = request.resolver_match
    return {"nav_links": links_for(user, match.view_name if match else None)}
