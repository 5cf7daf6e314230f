from django.urls import path

from broker.costs.consumers import CostTickerConsumer
from dashboard.consumers import LiveConsumer

websocket_urlpatterns = [
    path("ws/live/", LiveConsumer.as_asgi()),
    path("ws/costs/", CostTickerConsumer.as_asgi()),
]
