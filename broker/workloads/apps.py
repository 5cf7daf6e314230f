from django.apps import AppConfig


class WorkloadsConfig(AppConfig):
    name = "broker.workloads"
    label = "workloads"
