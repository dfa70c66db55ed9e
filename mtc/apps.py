from django.apps import AppConfig


class MtcConfig(AppConfig):
    name = "mtc"

    def ready(self) -> None:
        # Django's development server (what `make run` serves with) writes a response's
        # headers and body in two sends; on a kept-alive connection Nagle's algorithm
        # then holds the body until the client's delayed ACK, about 40 ms a request.
        from django.core.servers.basehttp import WSGIRequestHandler

        WSGIRequestHandler.disable_nagle_algorithm = True

        from django.db.backends.signals import connection_created

        connection_created.connect(_sqlite_private, dispatch_uid="mtc-sqlite-private")

        from .retention import logs_purge, purge_register

        purge_register("logs", logs_purge, setting="MTC_RETENTION_LOGS_DAYS")


def _sqlite_private(sender, connection, **kwargs) -> None:
    """SQLite makes the database (and its -wal/-shm files) itself, with the process
    umask: make them mtc's alone before anything is read from them. Jobs pass through
    the data dir to their own folders, so the file's mode is what keeps them out."""
    if connection.vendor != "sqlite":
        return
    import os

    name = str(connection.settings_dict.get("NAME") or "")
    if not name or name == ":memory:" or name.startswith("file:"):
        return
    for path in (name, f"{name}-wal", f"{name}-shm"):
        try:
            os.chmod(path, 0o600)
        except FileNotFoundError:
            continue
