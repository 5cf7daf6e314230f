from django.conf import settings

from dashboard import live_health
from dashboard.navigation import links_for


def site(request):
    return {"site_name": settings.SITE_NAME, "cycle_mode": settings.CYCLE_MODE}


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
