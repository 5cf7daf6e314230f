from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.shortcuts import redirect
from django.templatetags.static import static
from django.urls import include, path
from drf_spectacular.views import SpectacularRedocView, SpectacularSwaggerSplitView

from broker.api.schema import SchemaView
from broker.metrics.views import metrics


def favicon(request):
    """Where browsers look for an icon on pages that name none (Swagger UI, the admin, the browsable API)."""
    return redirect(static("img/favicon.svg"), permanent=True)


urlpatterns = [
    path("favicon.ico", favicon),
    path("admin/", admin.site.urls),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("api/", include("broker.api.urls")),
    path("metrics", metrics, name="metrics"),
    path("api/schema/", SchemaView.as_view(), name="schema"),
    # The split view serves Swagger UI's start-up script as a file, which the CSP lets run (no inline script).
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="swagger-ui"),
    path("api/redoc/", SpectacularRedocView.as_view(url_name="schema"), name="redoc"),
    path("finance/", include("broker.costs.urls")),
    path("governance/", include("broker.governance.urls")),
    path("", include("dashboard.urls")),
]
