"""Create the ``Invoice`` table."""

from __future__ import annotations

import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    """Initial schema of the ``invoices`` app."""

    initial = True

    operations = (
        migrations.CreateModel(
            name="Invoice",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("number", models.PositiveBigIntegerField(unique=True)),
                (
                    "source",
                    models.CharField(
                        choices=[("task", "Task"), ("view", "View"), ("command", "Command")],
                        max_length=8,
                    ),
                ),
                (
                    "fence",
                    models.BigIntegerField(db_index=True, help_text="fence of the lease held"),
                ),
                (
                    "ticket",
                    models.BigIntegerField(help_text="arrival order of the lock request"),
                ),
                ("pid", models.IntegerField(help_text="process that issued the invoice")),
                (
                    "entered_ns",
                    models.BigIntegerField(help_text="monotonic clock when issuing began"),
                ),
                (
                    "exited_ns",
                    models.BigIntegerField(
                        help_text="monotonic clock after the invoice was committed", null=True
                    ),
                ),
                (
                    "waited_ms",
                    models.FloatField(help_text="how long the caller waited for the lock"),
                ),
                ("created", models.DateTimeField(default=django.utils.timezone.now)),
            ],
            options={"ordering": ("number",)},
        ),
    )
