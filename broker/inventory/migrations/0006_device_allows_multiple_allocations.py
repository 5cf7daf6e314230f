"""A device may be shared by several allocations (issue 26): DRA's allowMultipleAllocations.

The device table has triggers (0003, 0004) that a rebuild would drop on SQLite, so there the column is
added by SQLite's own ALTER TABLE ADD COLUMN (NOT NULL with a constant default); elsewhere by the
schema editor as usual."""

from django.db import migrations, models

FIELD = models.BooleanField(
    default=False,
    help_text="DRA allowMultipleAllocations: several allocations may share it (a time-sliced GPU, a NIC's "
    "bandwidth), each taking an amount of its capacity; the amounts never sum past the capacity.",
)


def add_column(apps, schema_editor):
    model = apps.get_model("inventory", "Device")
    if schema_editor.connection.vendor == "sqlite":
        schema_editor.execute(
            "ALTER TABLE inventory_device ADD COLUMN allow_multiple_allocations bool NOT NULL DEFAULT 0"
        )
    else:
        field = FIELD.clone()
        field.set_attributes_from_name("allow_multiple_allocations")
        schema_editor.add_field(model, field)


def drop_column(apps, schema_editor):
    schema_editor.execute("ALTER TABLE inventory_device DROP COLUMN allow_multiple_allocations")


class Migration(migrations.Migration):
    dependencies = [
        ("inventory", "0005_counter_sets"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddField(model_name="device", name="allow_multiple_allocations", field=FIELD)
            ],
            database_operations=[migrations.RunPython(add_column, drop_column)],
        ),
    ]
