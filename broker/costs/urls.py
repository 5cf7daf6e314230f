from django.urls import path

from broker.costs import views

app_name = "costs"

urlpatterns = [
    path("", views.finance, name="finance"),
]
