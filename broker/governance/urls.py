from django.urls import path

from broker.governance import views

app_name = "governance"

urlpatterns = [
    path("menu/", views.menu_page, name="menu"),
    path("menu/new/", views.class_edit, name="class-new"),
    path("menu/<int:pk>/edit/", views.class_edit, name="class-edit"),
    path("approvals/", views.approvals_page, name="approvals"),
    path("approvals/<int:pk>/row/", views.approval_row_fragment, name="approval-row"),
    path("approvals/<int:pk>/approve/", views.decide, {"verdict": "approve"}, name="approve"),
    path("approvals/<int:pk>/reject/", views.decide, {"verdict": "reject"}, name="reject"),
    path("audit/", views.audit_page, name="audit"),
    path("audit/export.csv", views.audit_export, name="audit-export"),
    path("lockouts/", views.lockouts_page, name="lockouts"),
    path("lockouts/<int:pk>/lift/", views.lockout_lift, name="lockout-lift"),
]
