from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from broker.inventory.models import Device, Node
from broker.workloads.models import SchedulingCycle, Workload


@login_required
def overview(request):
    context = {
        "node_count": Node.objects.count(),
        "device_count": Device.objects.count(),
        "workload_count": Workload.objects.count(),
        "last_cycle": SchedulingCycle.objects.first(),
    }
    return render(request, "dashboard/overview.html", context)
