import django.core.validators
import django.db.models.deletion
from datetime import UTC, datetime
from django.db import migrations, models

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def record_first_prices(apps, schema_editor):
    """Device classes created before this app existed get their current price as their first price."""
    DeviceClass = apps.get_model("policy", "DeviceClass")
    DeviceClassPrice = apps.get_model("costs", "DeviceClassPrice")
    for device_class in DeviceClass.objects.all():
        DeviceClassPrice.objects.get_or_create(
            device_class=device_class, effective_from=EPOCH, defaults={"price_per_hour": device_class.price_per_hour}
        )


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("policy", "0002_roles"),
    ]

    operations = [
        migrations.CreateModel(
            name="DeviceClassPrice",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                (
                    "price_per_hour",
                    models.DecimalField(
                        decimal_places=4, max_digits=10, validators=[django.core.validators.MinValueValidator(0)]
                    ),
                ),
                ("effective_from", models.DateTimeField(db_index=True)),
                ("recorded_at", models.DateTimeField(auto_now_add=True)),
                (
                    "device_class",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="price_history",
                        to="policy.deviceclass",
                    ),
                ),
            ],
            options={"ordering": ["device_class", "effective_from"]},
        ),
        migrations.CreateModel(
            name="CapacitySample",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("at", models.DateTimeField(db_index=True)),
                ("total", models.PositiveIntegerField(help_text="Devices billed under this class (allocated or free).")),
                ("unhealthy", models.PositiveIntegerField(default=0, help_text="Free devices that take no new work.")),
                (
                    "reserved_unused",
                    models.PositiveIntegerField(default=0, help_text="Free devices held by reservations."),
                ),
                (
                    "stranded",
                    models.PositiveIntegerField(default=0, help_text="Free healthy devices no pending work can use."),
                ),
                (
                    "reserved_by_team",
                    models.JSONField(blank=True, default=dict, help_text="{team name: reserved unused devices}"),
                ),
                (
                    "device_class",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="capacity_samples",
                        to="policy.deviceclass",
                    ),
                ),
            ],
            options={
                "ordering": ["device_class", "at"],
                "indexes": [models.Index(fields=["device_class", "at"], name="costs_capac_device__82d163_idx")],
            },
        ),
        migrations.AddConstraint(
            model_name="deviceclassprice",
            constraint=models.UniqueConstraint(
                fields=("device_class", "effective_from"), name="price_unique_per_class_and_time"
            ),
        ),
        migrations.AddConstraint(
            model_name="capacitysample",
            constraint=models.UniqueConstraint(fields=("device_class", "at"), name="sample_unique_per_class_and_time"),
        ),
        migrations.RunPython(record_first_prices, migrations.RunPython.noop),
    ]
