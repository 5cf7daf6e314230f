from django.urls import include, path
from rest_framework.routers import DefaultRouter

from broker.api.views import StatusView, TokenView
from broker.audit.api.views import AuditEventViewSet
from broker.inventory.api.views import DeviceViewSet, DomainViewSet, NodeViewSet, TopologyLevelViewSet
from broker.metrics.api.explanations import WorkloadExplanationView
from broker.metrics.api.views import MetricsView
from broker.policy.api.views import (
    CohortViewSet,
    DeviceClassViewSet,
    PriorityClassViewSet,
    QueueViewSet,
    ReservationViewSet,
    ResourceClassViewSet,
    TeamViewSet,
)
from broker.workloads.api.views import AllocationViewSet, ExplanationViewSet, SchedulingCycleViewSet, WorkloadViewSet

router = DefaultRouter()
# Inventory
router.register("topology-levels", TopologyLevelViewSet)
router.register("domains", DomainViewSet)
router.register("nodes", NodeViewSet)
router.register("devices", DeviceViewSet)
# Policy
router.register("teams", TeamViewSet)
router.register("priority-classes", PriorityClassViewSet)
router.register("device-classes", DeviceClassViewSet)
router.register("cohorts", CohortViewSet)
router.register("queues", QueueViewSet)
router.register("resource-classes", ResourceClassViewSet)
router.register("reservations", ReservationViewSet)
# Workloads and what the scheduler made of them
router.register("workloads", WorkloadViewSet)
router.register("allocations", AllocationViewSet)
router.register("explanations", ExplanationViewSet)
router.register("cycles", SchedulingCycleViewSet)
# Audit
router.register("audit-events", AuditEventViewSet)

urlpatterns = [
    path("status/", StatusView.as_view(), name="api-status"),
    path("auth/token/", TokenView.as_view(), name="api-token"),
    path("costs/", include("broker.costs.api.urls")),
    path("metrics/", MetricsView.as_view(), name="api-metrics"),
    path("workloads/<int:pk>/explanation/", WorkloadExplanationView.as_view(), name="workload-explanation"),
    *router.urls,
]
