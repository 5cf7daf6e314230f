from django.db import migrations, models


class Migration(migrations.Migration):
    """PodGroup-owned ResourceClaims (#28): a claim's requests and constraints as written, and the claims a
    PodGroup owns. The kube tables have no triggers, so SQLite may remake them."""

    dependencies = [("kube", "0004_priority_classes")]

    operations = [
        migrations.AddField(
            model_name="mirroredclaim",
            name="devices",
            field=models.JSONField(
                blank=True,
                default=dict,
                help_text="Its spec.devices requests and constraints, as a group claim is read.",
            ),
        ),
        migrations.AddField(
            model_name="mirroredpodgroup",
            name="group_claims",
            field=models.JSONField(
                blank=True,
                default=dict,
                help_text="{PodGroup claim entry: ResourceClaim name} of the claims it owns.",
            ),
        ),
    ]
