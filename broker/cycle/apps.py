from django.apps import AppConfig


class CycleConfig(AppConfig):
    name = "broker.cycle"
    label = "cycle"
