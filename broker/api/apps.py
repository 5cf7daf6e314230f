from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "broker.api"
    label = "api"
