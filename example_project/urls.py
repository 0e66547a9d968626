"""URL routes of the example project."""

from __future__ import annotations

from django.urls import path

from example_project.invoices import views

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    path("invoices/", views.create_invoice, name="create-invoice"),
]
