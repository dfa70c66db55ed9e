"""A fast bulk INSERT for the poller: the ORM's bulk_create spends most of its time
preparing each value of each field; here only the fields that need it (dates, JSON)
are prepared, and the rows go to the database in one executemany."""

from __future__ import annotations

from django.db import connection, models
from django.db.models.constants import OnConflict

# Field types whose Python values the database driver cannot take as they are.
_PREPARED = (
    models.DateTimeField,
    models.DateField,
    models.JSONField,
    models.UUIDField,
    models.DecimalField,
)


def bulk_insert(
    model: type[models.Model], rows: list[dict], *, skip_existing: bool = False
) -> None:
    """Insert ``rows`` (field name -> value); fields not given take their defaults.
    skip_existing: a row that a unique constraint says is there already is left out
    (ON CONFLICT DO NOTHING) instead of failing the whole statement."""
    if not rows:
        return
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    defaults = {f.attname: f.get_default() for f in fields}
    prepare = {f.attname: f for f in fields if isinstance(f, _PREPARED)}
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    marks = ", ".join(["%s"] * len(fields))
    table = connection.ops.quote_name(model._meta.db_table)
    on_conflict = OnConflict.IGNORE if skip_existing else None
    sql = (
        f"{connection.ops.insert_statement(on_conflict=on_conflict)} {table} ({columns})"
        f" VALUES ({marks})"
    )
    if skip_existing:
        sql += " " + connection.ops.on_conflict_suffix_sql(fields, on_conflict, None, None)
    params = []
    for row in rows:
        values = []
        for f in fields:
            value = row.get(f.attname, defaults[f.attname])
            if f.attname in prepare and value is not None:
                value = prepare[f.attname].get_db_prep_save(value, connection)
            values.append(value)
        params.append(values)
    with connection.cursor() as cursor:
        cursor.executemany(sql, params)


def bulk_update(objs: list[models.Model], field_names: list[str]) -> None:
    """UPDATE each object's ``field_names`` by primary key, one executemany per set of
    fields (the ORM's bulk_update builds one CASE per field, slow for thousands of rows).

    A field an object never loaded (``only()``/``defer()``) and never had set is left as
    it is in the database: reading it would fetch it, one query per object and field
    (the poller's round did thousands, holding the write lock)."""
    if not objs:
        return
    model = type(objs[0])
    attnames = {name: model._meta.get_field(name).attname for name in field_names}
    groups: dict[tuple[str, ...], list[models.Model]] = {}
    for obj in objs:
        deferred = obj.get_deferred_fields()
        names = tuple(n for n in field_names if attnames[n] not in deferred)
        if names:
            groups.setdefault(names, []).append(obj)
    for names, members in groups.items():
        _update_rows(model, members, names)


def _update_rows(model: type[models.Model], objs: list[models.Model], names: tuple[str, ...]):
    fields = [model._meta.get_field(name) for name in names]
    assignments = ", ".join(f"{connection.ops.quote_name(f.column)} = %s" for f in fields)
    pk = model._meta.pk
    sql = (
        f"UPDATE {connection.ops.quote_name(model._meta.db_table)} SET {assignments} "
        f"WHERE {connection.ops.quote_name(pk.column)} = %s"
    )
    params = []
    for obj in objs:
        values = []
        for f in fields:
            value = getattr(obj, f.attname)
            if isinstance(f, _PREPARED) and value is not None:
                value = f.get_db_prep_save(value, connection)
            values.append(value)
        values.append(obj.pk)
        params.append(values)
    with connection.cursor() as cursor:
        cursor.executemany(sql, params)
