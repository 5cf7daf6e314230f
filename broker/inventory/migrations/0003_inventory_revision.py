"""InventoryRevision and the triggers that move its token on every write to the inventory tables."""

from django.db import migrations, models

TABLES = ("inventory_topologylevel", "inventory_domain", "inventory_node", "inventory_device")
REVISION = "inventory_inventoryrevision"

POSTGRESQL_FUNCTION = f"""
CREATE OR REPLACE FUNCTION inventory_revision_bump() RETURNS trigger AS $$
BEGIN
    INSERT INTO {REVISION} (id, token) VALUES (1, gen_random_uuid()::text)
    ON CONFLICT (id) DO UPDATE SET token = EXCLUDED.token;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
"""
# SQLite has no statement-level triggers: one per row and event.
SQLITE_BUMP = (
    f"INSERT INTO {REVISION} (id, token) VALUES (1, lower(hex(randomblob(16)))) "
    "ON CONFLICT (id) DO UPDATE SET token = excluded.token;"
)


def install(apps, schema_editor):
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(POSTGRESQL_FUNCTION)
            for table in TABLES:
                cursor.execute(
                    f"CREATE TRIGGER {table}_revision AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON {table} "
                    "FOR EACH STATEMENT EXECUTE FUNCTION inventory_revision_bump()"
                )
            cursor.execute(f"INSERT INTO {REVISION} (id, token) VALUES (1, gen_random_uuid()::text)")
        elif connection.vendor == "sqlite":
            for table in TABLES:
                for event in ("INSERT", "UPDATE", "DELETE"):
                    cursor.execute(
                        f"CREATE TRIGGER {table}_revision_{event.lower()} AFTER {event} ON {table} "
                        f"BEGIN {SQLITE_BUMP} END"
                    )
            cursor.execute(f"INSERT INTO {REVISION} (id, token) VALUES (1, lower(hex(randomblob(16))))")
        else:
            raise NotImplementedError(f"inventory revision triggers for {connection.vendor}")


def uninstall(apps, schema_editor):
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            for table in TABLES:
                cursor.execute(f"DROP TRIGGER IF EXISTS {table}_revision ON {table}")
            cursor.execute("DROP FUNCTION IF EXISTS inventory_revision_bump()")
        elif connection.vendor == "sqlite":
            for table in TABLES:
                for event in ("insert", "update", "delete"):
                    cursor.execute(f"DROP TRIGGER IF EXISTS {table}_revision_{event}")


class Migration(migrations.Migration):
    dependencies = [("inventory", "0002_default_topology")]
    operations = [
        migrations.CreateModel(
            name="InventoryRevision",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("token", models.CharField(max_length=64)),
            ],
        ),
        migrations.RunPython(install, uninstall),
    ]
