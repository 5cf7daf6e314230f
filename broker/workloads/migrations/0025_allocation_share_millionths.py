"""What a share of a device counts for, fixed when the allocation is made (Allocation.share_millionths).

Finance read an allocation's share against the capacity its device publishes now, so a device
republished with another capacity repriced every share of it not rolled up yet. The shares already
written are fixed here as the reports read them until now, against the capacity published today.

As in 0019 and 0024, SQLite gets the column by its own ALTER TABLE ADD COLUMN, so the allocation table,
which carries the change-log triggers, is not rebuilt; elsewhere the schema editor adds it."""

from django.db import migrations, models

FIELD = models.PositiveIntegerField(
    null=True, blank=True, help_text="The share of its device this allocation takes, in millionths."
)


def add_column(apps, schema_editor):
    model = apps.get_model("workloads", "Allocation")
    if schema_editor.connection.vendor == "sqlite":
        schema_editor.execute(
            'ALTER TABLE workloads_allocation ADD COLUMN share_millionths integer unsigned NULL '
            'CHECK ("share_millionths" >= 0)'
        )
    else:
        field = FIELD.clone()
        field.set_attributes_from_name("share_millionths")
        schema_editor.add_field(model, field)


def drop_column(apps, schema_editor):
    schema_editor.execute("ALTER TABLE workloads_allocation DROP COLUMN share_millionths")


def fix_shares(apps, schema_editor):
    from broker.inventory.quantities import numbers
    from broker.scheduler.accounting import share_millionths

    allocation = apps.get_model("workloads", "Allocation")
    device = apps.get_model("inventory", "Device")
    shares = allocation.objects.filter(consumed_capacity__isnull=False, share_millionths__isnull=True)
    rows = list(shares.values_list("pk", "device_id", "consumed_capacity"))
    capacity = dict(device.objects.filter(pk__in={row[1] for row in rows}).values_list("pk", "capacity"))
    by_share: dict[int, list[int]] = {}
    for pk, device_pk, consumed in rows:
        share = share_millionths(numbers(capacity.get(device_pk)), numbers(consumed))
        by_share.setdefault(share, []).append(pk)
    for share, pks in by_share.items():
        allocation.objects.filter(pk__in=pks).update(share_millionths=share)


class Migration(migrations.Migration):
    dependencies = [
        ("workloads", "0024_workload_preemption_policy"),
        ("inventory", "0006_device_allows_multiple_allocations"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddField(model_name="allocation", name="share_millionths", field=FIELD)],
            database_operations=[migrations.RunPython(add_column, drop_column)],
        ),
        migrations.RunPython(fix_shares, migrations.RunPython.noop),
    ]
