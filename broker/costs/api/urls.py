from django.urls import path

from broker.costs.api import views

urlpatterns = [
    path("allocation", views.AllocationView.as_view(), name="costs-allocation"),
    path("pending", views.PendingView.as_view(), name="costs-pending"),
    path("statement", views.StatementView.as_view(), name="costs-statement"),
    path("export.csv", views.ExportCsvView.as_view(), name="costs-export-csv"),
    path("export.xlsx", views.ExportXlsxView.as_view(), name="costs-export-xlsx"),
    path("ticker", views.TickerView.as_view(), name="costs-ticker"),
]
