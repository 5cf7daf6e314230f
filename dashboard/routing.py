from django.urls import path

from broker.costs.consumers import CostTickerConsumer
from broker.governance.consumers import ApprovalsConsumer
from dashboard.consumers import LiveConsumer

websocket_urlpatterns = [
    path("ws/live/", LiveConsumer.as_asgi()),
    path("ws/costs/", CostTickerConsumer.as_asgi()),
    path("ws/approvals/", ApprovalsConsumer.as_asgi()),
]
