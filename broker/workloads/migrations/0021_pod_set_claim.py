"""A pod set's claim with several requests (issue 26): DRA's DeviceClaim `requests` and `constraints`.

As in 0019, SQLite gets the column by its own ALTER TABLE ADD COLUMN (with a constant default), so no
table is rebuilt; elsewhere the schema editor adds it."""

from django.db import migrations, models

FIELD = models.JSONField(
    default=dict,
    blank=True,
    help_text="Each pod's claim as resource.k8s.io/v1 writes it (requests, constraints); empty: "
    "devices_per_pod devices of the device classes.",
)


def add_column(apps, schema_editor):
    model = apps.get_model("workloads", "PodSet")
    if schema_editor.connection.vendor == "sqlite":
        schema_editor.execute(
            "ALTER TABLE workloads_podset ADD COLUMN claim text NOT NULL DEFAULT '{}' "
            'CHECK ((JSON_VALID("claim") OR "claim" IS NULL))'
        )
    else:
        field = FIELD.clone()
        field.set_attributes_from_name("claim")
        schema_editor.add_field(model, field)


def drop_column(apps, schema_editor):
    schema_editor.execute("ALTER TABLE workloads_podset DROP COLUMN claim")


class Migration(migrations.Migration):
    dependencies = [
        ("workloads", "0020_rejected_state"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddField(model_name="podset", name="claim", field=FIELD)],
            database_operations=[migrations.RunPython(add_column, drop_column)],
        ),
    ]
