"""A workload's preemption policy (Kubernetes PriorityClass preemptionPolicy): Never keeps it from
preempting others.

As in 0019, 0021 and 0023, SQLite gets the column by its own ALTER TABLE ADD COLUMN (with a constant
default), so the workload table, which carries the change-log triggers, is not rebuilt; elsewhere the
schema editor adds it."""

from django.db import migrations, models

FIELD = models.CharField(
    max_length=24,
    choices=[
        ("PreemptLowerPriority", "may preempt lower-priority work"),
        ("Never", "never preempts; may still be preempted"),
    ],
    default="PreemptLowerPriority",
    help_text="Never: it never preempts others to start (it may still be preempted, as `preemptible` says).",
)


def add_column(apps, schema_editor):
    model = apps.get_model("workloads", "Workload")
    if schema_editor.connection.vendor == "sqlite":
        schema_editor.execute(
            "ALTER TABLE workloads_workload ADD COLUMN preemption_policy varchar(24) NOT NULL "
            "DEFAULT 'PreemptLowerPriority'"
        )
    else:
        field = FIELD.clone()
        field.set_attributes_from_name("preemption_policy")
        schema_editor.add_field(model, field)


def drop_column(apps, schema_editor):
    schema_editor.execute("ALTER TABLE workloads_workload DROP COLUMN preemption_policy")


class Migration(migrations.Migration):
    dependencies = [
        ("workloads", "0023_workload_group_claims"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddField(model_name="workload", name="preemption_policy", field=FIELD)],
            database_operations=[migrations.RunPython(add_column, drop_column)],
        ),
    ]
