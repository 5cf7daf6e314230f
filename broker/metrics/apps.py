from django.apps import AppConfig


class MetricsConfig(AppConfig):
    name = "broker.metrics"
    label = "metrics"
