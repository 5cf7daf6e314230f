"""GET /metrics: the Prometheus text exposition of broker.metrics.collector.

Scrapers carry no session, so this is not behind the login: set METRICS_TOKEN and the scraper sends it as
`Authorization: Bearer <token>`; leave it unset and the page is open (a private network, the embedded demo).
"""

import hmac

from django.conf import settings
from django.http import HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from broker.metrics.collector import build_registry

REGISTRY = build_registry()


def bearer_token(request):
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def scrape_allowed(request):
    expected = getattr(settings, "METRICS_TOKEN", "")
    if not expected:
        return True
    # Constant-time comparison: the token is the only thing guarding the page.
    return hmac.compare_digest(bearer_token(request).encode(), expected.encode())


@never_cache
@require_GET
def metrics(request):
    if not scrape_allowed(request):
        response = HttpResponse("A bearer token is required.\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
