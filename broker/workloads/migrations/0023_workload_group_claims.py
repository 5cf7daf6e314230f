"""Claims the whole gang owns (issue 26): Kubernetes 1.36 PodGroup spec.resourceClaims.

As in 0019 and 0021, SQLite gets the column by its own ALTER TABLE ADD COLUMN (with a constant default),
so the workload table, which carries the change-log triggers, is not rebuilt; elsewhere the schema
editor adds it."""

from django.db import migrations, models

FIELD = models.JSONField(
    default=list,
    blank=True,
    help_text="Claims the whole gang owns (PodGroup resourceClaims): [{name, requests, constraints}], requests "
    "and constraints as resource.k8s.io/v1 writes a claim's devices; each allocated once for all its pods.",
)


def add_column(apps, schema_editor):
    model = apps.get_model("workloads", "Workload")
    if schema_editor.connection.vendor == "sqlite":
        schema_editor.execute(
            "ALTER TABLE workloads_workload ADD COLUMN group_claims text NOT NULL DEFAULT '[]' "
            'CHECK ((JSON_VALID("group_claims") OR "group_claims" IS NULL))'
        )
    else:
        field = FIELD.clone()
        field.set_attributes_from_name("group_claims")
        schema_editor.add_field(model, field)


def drop_column(apps, schema_editor):
    schema_editor.execute("ALTER TABLE workloads_workload DROP COLUMN group_claims")


class Migration(migrations.Migration):
    dependencies = [
        ("workloads", "0022_allocation_shares_of_devices"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddField(model_name="workload", name="group_claims", field=FIELD)],
            database_operations=[migrations.RunPython(add_column, drop_column)],
        ),
    ]
