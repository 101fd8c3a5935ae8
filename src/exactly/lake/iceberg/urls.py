"""Iceberg lake URLs (:mod:`exactly.lake.iceberg`) read into where the catalog and the table are."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, urlencode

from exactly.errors import LakeError
from exactly.urls import redact

KNOWN = ("namespace", "table", "warehouse", "catalog")


@dataclass(frozen=True)
class Where:
    """A table's catalog (its SQLAlchemy URI and name), warehouse, namespace and name, and the
    pyiceberg ``s3.*`` properties."""

    catalog_uri: str
    warehouse: str
    namespace: str = "exactly"
    table: str = "events"
    catalog: str = "exactly"
    properties: dict[str, str] = field(default_factory=dict)


def where(url: str) -> Where:
    """``iceberg://DIR[?...]`` or ``iceberg+postgresql://USER@HOST/DB?warehouse=URI[&...]``
    read; a bad one raises :class:`~exactly.errors.LakeError` saying how to write it. The
    embedded form's directory is created."""
    scheme, _, rest = url.partition("://")
    place, _, query = rest.partition("?")
    options = dict(parse_qsl(query))
    unknown = [k for k in options if k not in KNOWN and not k.startswith("s3.")]
    libpq = {k: options[k] for k in unknown} if scheme == "iceberg+postgresql" else {}
    if unknown and not libpq:
        raise LakeError(
            f"lake URL {redact(url)!r}: unknown options {', '.join(unknown)} (known: "
            f"{', '.join(sorted(KNOWN))}, s3.*)"
        )
    properties = {k: v for k, v in options.items() if k.startswith("s3.")}
    if scheme == "iceberg":
        if not place:
            raise LakeError(f"lake URL {redact(url)!r} names no directory: iceberg://DIR")
        directory = Path(place)
        directory.mkdir(parents=True, exist_ok=True)
        warehouse = options.get("warehouse") or (directory / "warehouse").resolve().as_uri()
        catalog_uri = f"sqlite:///{(directory / 'catalog.db').resolve()}"
    elif scheme == "iceberg+postgresql":
        if "warehouse" not in options:
            raise LakeError(
                f"lake URL {redact(url)!r}: a PostgreSQL catalog needs ?warehouse=URI "
                "(s3://BUCKET/KEY or a directory every writer and reader sees)"
            )
        warehouse = options["warehouse"]
        catalog_uri = f"postgresql+psycopg://{place}"
        if libpq:
            catalog_uri += f"?{urlencode(libpq)}"
    else:
        raise LakeError(f"lake URL {redact(url)!r}: use iceberg://DIR or iceberg+postgresql://")
    if "://" not in warehouse:
        warehouse = Path(warehouse).resolve().as_uri()
    names = {k: options[k] for k in ("namespace", "table", "catalog") if k in options}
    return Where(catalog_uri, warehouse, properties=properties, **names)


def with_table(url: str, name: str) -> str:
    """``url`` naming the table ``name`` (its ``table`` option set): a sibling's URL."""
    base, _, query = url.partition("?")
    options = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k != "table"]
    return f"{base}?{urlencode([*options, ('table', name)], safe=':/')}"
