"""The seconds-by-reason rollup's progress in a table of its own: it was kept in the cost rollups'
progress table (costs.RollupProgress) under the name "pending_seconds". The row is carried over, so an
upgraded broker goes on from where its rollup stood instead of rolling the whole history up again."""

from django.db import migrations, models

OLD_NAME = "pending_seconds"
ROW = 1


def carry_over(apps, schema_editor):
    old = apps.get_model("costs", "RollupProgress")
    new = apps.get_model("metrics", "PendingSecondsProgress")
    row = old.objects.filter(name=OLD_NAME).first()
    if row is not None:
        new.objects.update_or_create(pk=ROW, defaults={"until": row.until})
        row.delete()


def carry_back(apps, schema_editor):
    old = apps.get_model("costs", "RollupProgress")
    new = apps.get_model("metrics", "PendingSecondsProgress")
    row = new.objects.filter(pk=ROW).first()
    if row is not None:
        old.objects.update_or_create(name=OLD_NAME, defaults={"until": row.until})


class Migration(migrations.Migration):
    dependencies = [
        ("metrics", "0001_pending_seconds_rollup"),
        ("costs", "0002_hourly_rollups"),
    ]

    operations = [
        migrations.CreateModel(
            name="PendingSecondsProgress",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("until", models.DateTimeField()),
            ],
        ),
        migrations.RunPython(carry_over, carry_back),
    ]
