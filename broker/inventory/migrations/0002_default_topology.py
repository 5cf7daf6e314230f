from django.db import migrations

DEFAULT_LEVELS = ("zone", "block", "rack")


def create_levels(apps, schema_editor):
    TopologyLevel = apps.get_model("inventory", "TopologyLevel")
    if TopologyLevel.objects.exists():
        return
    for order, name in enumerate(DEFAULT_LEVELS):
        TopologyLevel.objects.create(name=name, order=order)


class Migration(migrations.Migration):
    dependencies = [("inventory", "0001_initial")]
    operations = [migrations.RunPython(create_levels, migrations.RunPython.noop)]
