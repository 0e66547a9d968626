"""URLs of the test project."""

from __future__ import annotations

from django.urls import path

from . import views

urlpatterns = [
    path("sync/", views.sync_increment),
    path("async/", views.async_increment),
    path("holder/", views.holder),
    path("aholder/", views.aholder),
    path("nested/", views.nested),
    path("invoice/", views.issue_invoice),
]
