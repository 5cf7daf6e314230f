"""Finance pages: the charts read the cost API with the session; the ticker listens on ws/costs/."""

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import render
from django.utils import timezone

from broker.costs.api.views import reads_all_costs
from broker.policy.models import Team


@login_required
def finance(request):
    if not reads_all_costs(request.user):
        raise PermissionDenied("Finance pages are for finance, operators and admins.")
    now = timezone.now()
    context = {
        "teams": Team.objects.values_list("name", flat=True),
        "month": f"{now:%Y-%m}",
        "window": request.GET.get("window", "30d"),
        "step": request.GET.get("step", "day"),
    }
    return render(request, "costs/finance.html", context)
