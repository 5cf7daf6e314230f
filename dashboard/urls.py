from django.urls import path

from dashboard import views

app_name = "dashboard"

urlpatterns = [
    path("", views.overview, name="overview"),
    path("queue/", views.queue, name="queue"),
    path("history/", views.history, name="history"),
    path("workloads/<int:pk>/", views.workload_detail, name="workload"),
    path("workloads/<int:pk>/cancel/", views.workload_cancel, name="workload-cancel"),
    path("workloads/<int:pk>/priority/", views.workload_priority, name="workload-priority"),
    path("topology/", views.topology, name="topology"),
    path("nodes/<int:pk>/cordon/", views.node_cordon, name="node-cordon"),
    path("devices/<int:pk>/health/", views.device_health, name="device-health"),
    path("teams/", views.teams, name="teams"),
    path("submit/", views.submit, name="submit"),
    path("submit/whatif/", views.submit_whatif, name="submit-whatif"),
    path("dashboard/api/overview/", views.api_overview, name="api-overview"),
    path("dashboard/api/queue/", views.api_queue, name="api-queue"),
    path("dashboard/api/heatmap/", views.api_heatmap, name="api-heatmap"),
    path("dashboard/api/heatmap/rack/<int:pk>/", views.api_heatmap_rack, name="api-heatmap-rack"),
    path("dashboard/api/heatmap/node/<int:pk>/", views.api_heatmap_node, name="api-heatmap-node"),
    path("dashboard/api/workloads/<int:pk>/", views.api_workload, name="api-workload"),
    path("dashboard/api/live/", views.api_live, name="api-live"),
]
