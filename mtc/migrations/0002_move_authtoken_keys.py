"""DRF authtoken keys become hashed ApiToken rows (scripts' tokens keep working); the
plain keys are then deleted. Raw SQL: the authtoken app is no longer installed."""

import hashlib

from django.db import migrations


def move_keys(apps, schema_editor):
    connection = schema_editor.connection
    if "authtoken_token" not in connection.introspection.table_names():
        return
    ApiToken = apps.get_model("mtc", "ApiToken")
    with connection.cursor() as cursor:
        cursor.execute("SELECT key, user_id, created FROM authtoken_token")
        rows = cursor.fetchall()
        for key, user_id, created in rows:
            digest = hashlib.sha256(key.encode()).hexdigest()
            if not ApiToken.objects.filter(key_hash=digest).exists():
                token = ApiToken.objects.create(
                    user_id=user_id, name="migrated", prefix=key[:8], key_hash=digest
                )
                ApiToken.objects.filter(pk=token.pk).update(created=created)
        cursor.execute("DELETE FROM authtoken_token")


class Migration(migrations.Migration):
    dependencies = [("mtc", "0001_api_token")]
    operations = [migrations.RunPython(move_keys, migrations.RunPython.noop)]
