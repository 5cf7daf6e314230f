"""A workload counts its preemptions (issue 31).

SQLite cannot add a NOT NULL column through Django's AddField without rebuilding the table, and the
rebuild breaks the triggers that check allocations against workloads (0016, 0017). SQLite's own
ALTER TABLE ADD COLUMN takes NOT NULL with a constant default, so on SQLite the column is added so;
elsewhere by the schema editor as usual."""

from django.db import migrations, models

FIELD = models.PositiveIntegerField(
    default=0, help_text="How often it was preempted; a bound (PREEMPTION_MAX_PER_WORKLOAD) then protects it."
)


def add_column(apps, schema_editor):
    model = apps.get_model("workloads", "Workload")
    if schema_editor.connection.vendor == "sqlite":
        schema_editor.execute(
            "ALTER TABLE workloads_workload ADD COLUMN preemption_count integer unsigned NOT NULL DEFAULT 0 "
            'CHECK ("preemption_count" >= 0)'
        )
    else:
        field = FIELD.clone()
        field.set_attributes_from_name("preemption_count")
        schema_editor.add_field(model, field)


def drop_column(apps, schema_editor):
    schema_editor.execute("ALTER TABLE workloads_workload DROP COLUMN preemption_count")


class Migration(migrations.Migration):
    dependencies = [
        ("workloads", "0018_workload_change_log"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddField(model_name="workload", name="preemption_count", field=FIELD)],
            database_operations=[migrations.RunPython(add_column, drop_column)],
        ),
    ]
