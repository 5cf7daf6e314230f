"""GET /metrics: the Prometheus text exposition of broker.metrics.collector.

The figures name every team's pending work, reasons and manual interventions, which members may not
see, so the page is closed by default. A scraper carries no session: set METRICS_TOKEN and it sends
`Authorization: Bearer <token>`. A signed-in session that may read /api/metrics/ (operators, finance,
admins) or a staff session reads it too. METRICS_PUBLIC=True opens it to anyone (a private network).
"""

import hmac

from django.conf import settings
from django.http import HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from broker.metrics.collector import build_registry
from broker.policy import roles

REGISTRY = build_registry()


def bearer_token(request):
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def token_matches(request):
    expected = settings.METRICS_TOKEN
    # Constant-time comparison: the token is what guards the page from scrapers.
    return bool(expected) and hmac.compare_digest(bearer_token(request).encode(), expected.encode())


def session_may_read(user):
    return user.is_authenticated and (user.is_staff or roles.is_operator(user) or roles.is_finance(user))


def scrape_allowed(request):
    return settings.METRICS_PUBLIC or token_matches(request) or session_may_read(request.user)


@never_cache
@require_GET
def metrics(request):
    if not scrape_allowed(request):
        response = HttpResponse("A bearer token is required.\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
