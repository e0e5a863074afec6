"""A tenant's own datasets for the agent's metric tool: a table of (metric, region, period) ->
value that an agent job names (`dataset`) instead of the sample dataset `dataset_seed` draws.
Uploaded as JSON rows or CSV (header metric,region,period,value), checked whole before anything
is written, and replaced whole by the next upload of the same name.

The model asks in its own words: a call is `metric("<metric>", "<region>", "<period>")` with the
names copied from the question (the shipped model is fine-tuned on names of any characters the
API's grammar allows: domain/agent.py wild_task).  Names are kept as the runtime compares
them (domain/narrative.py canonical: no spaces at the ends, none doubled), as an agent's
question is.  A value is a number as the tools write one (the model reads it as it read their
results in training).
No torch here: the API process imports this."""

from __future__ import annotations

import csv
import io
import re
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from domain.narrative import canonical
from runtime.db import writer
from runtime.errors import BadInput, NotFound, OverBudget
from runtime.tables import DatasetRecord

NAME = r"^[A-Za-z0-9_-]{1,64}$"  #: a dataset's name
MAX_ROWS = 10_000
COLUMNS = ("metric", "region", "period", "value")
_KEY = re.compile(r'^[^"<>\x00-\x1f]{1,64}$')  # what a call's quoted argument can hold
_VALUE = re.compile(r"^-?[0-9]{1,15}(?:\.[0-9]{1,6})?$")  # the number part of the tools' result grammar


def parse_json(body: Any) -> list[list[str]]:
    """{"rows": [{"metric", "region", "period", "value"}, ...]} -> rows; BadInput naming the
    first bad row."""
    if not isinstance(body, dict) or set(body) != {"rows"} or not isinstance(body["rows"], list):
        raise BadInput('a dataset is {"rows": [{"metric": .., "region": .., "period": .., "value": ..}, ...]}')
    rows = []
    for i, r in enumerate(body["rows"]):
        if not isinstance(r, dict) or set(r) != set(COLUMNS):
            raise BadInput(f"row {i}: needs exactly the fields {', '.join(COLUMNS)}")
        rows.append([r[c] if isinstance(r[c], str) else _number(r[c], i) for c in COLUMNS])
    return check(rows)


def parse_csv(text: str) -> list[list[str]]:
    """CSV with the header metric,region,period,value (in any order) -> rows."""
    reader = csv.reader(io.StringIO(text))
    header = [h.strip().lower() for h in next(reader, [])]
    if sorted(header) != sorted(COLUMNS):
        raise BadInput(f"the CSV header must name the columns {','.join(COLUMNS)}; it has {header}")
    at = [header.index(c) for c in COLUMNS]
    rows = []
    for i, r in enumerate(reader):
        if not r:
            continue
        if len(r) != len(COLUMNS):
            raise BadInput(f"CSV row {i + 1}: {len(r)} fields, not {len(COLUMNS)}")
        rows.append([r[j].strip() for j in at])
    return check(rows)


def _number(v: Any, i: int) -> str:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise BadInput(f"row {i}: every field is a string (or the value a number)")
    return str(v)


def check(rows: list[list[str]]) -> list[list[str]]:
    """1..MAX_ROWS rows; names a call can hold; numbers as the tools write them; each
    (metric, region, period) once."""
    if not 1 <= len(rows) <= MAX_ROWS:
        raise BadInput(f"a dataset has 1..{MAX_ROWS} rows, not {len(rows)}")
    seen: set[tuple[str, ...]] = set()
    out = []
    for i, (metric, region, period, value) in enumerate(rows):
        for what, v in (("metric", metric), ("region", region), ("period", period)):
            if not _KEY.fullmatch(v) or not canonical(v):
                raise BadInput(f"row {i}: {what} {v!r} must be 1..64 characters, not only spaces, without "
                               "quotes, <, > or control characters")
        if not _VALUE.fullmatch(value):
            raise BadInput(f"row {i}: value {value!r} is not a number as the tools write one (e.g. 512, -2.4)")
        key = (canonical(metric), canonical(region), canonical(period))  # as a question names them
        if key in seen:
            raise BadInput(f"row {i}: ({', '.join(key)}) is in the dataset twice (names compare without "
                           "the spaces at their ends, runs of spaces as one)")
        seen.add(key)
        out.append([*key, value])
    return out


class Datasets:
    def __init__(self, engine: Engine, max_per_tenant: int = 100) -> None:
        self._db = sessionmaker(engine, expire_on_commit=False)
        self._write = sessionmaker(writer(engine), expire_on_commit=False)
        self.max_per_tenant = max_per_tenant

    def check_room(self, tenant: str, name: str) -> None:
        """OverBudget where `name` would be a new dataset past max_per_tenant."""
        with self._db() as db:
            self._room(db, tenant, name)

    def _room(self, db: Session, tenant: str, name: str) -> DatasetRecord | None:
        rec = db.get(DatasetRecord, (tenant, name))
        if rec is None:
            have = int(db.scalar(select(func.count()).select_from(DatasetRecord)
                                 .where(DatasetRecord.tenant == tenant)) or 0)
            if have >= self.max_per_tenant:
                raise OverBudget(f"tenant {tenant!r} has {have} datasets, the most it may have "
                                 "(tenant_max_datasets): replace or delete one")
        return rec

    def put(self, tenant: str, name: str, rows: list[list[str]]) -> DatasetRecord:
        """Create or replace the tenant's dataset `name` (rows checked by the caller: parse_*);
        OverBudget for a new one past max_per_tenant.  Two uploads of a new name at once: the
        second replaces the first."""
        for _ in range(3):
            try:
                with self._write.begin() as db:
                    rec = self._room(db, tenant, name)
                    if rec is None:
                        rec = DatasetRecord(tenant=tenant, name=name)
                        db.add(rec)
                    rec.rows, rec.n_rows, rec.updated_at = rows, len(rows), datetime.now(UTC)
                return rec
            except IntegrityError:  # inserted by another upload between our read and our write
                continue
        raise BadInput(f"dataset {name!r}: too many concurrent uploads")

    def exists(self, tenant: str, name: str) -> None:
        """NotFound where the tenant has no dataset `name` (its rows not read)."""
        with self._db() as db:
            found = db.scalar(select(DatasetRecord.name).where(DatasetRecord.tenant == tenant,
                                                               DatasetRecord.name == name))
        if found is None:
            raise NotFound(f"no dataset {name!r} for tenant {tenant!r}")

    def get(self, tenant: str, name: str) -> DatasetRecord:
        with self._db() as db:
            rec = db.get(DatasetRecord, (tenant, name))
        if rec is None:
            raise NotFound(f"no dataset {name!r} for tenant {tenant!r}")
        return rec

    def listing(self, tenant: str) -> list[DatasetRecord]:
        """The tenant's datasets, by name (their rows not loaded)."""
        with self._db() as db:
            return [DatasetRecord(tenant=tenant, name=n, rows=[], n_rows=k, updated_at=u)
                    for n, k, u in db.execute(select(DatasetRecord.name, DatasetRecord.n_rows, DatasetRecord.updated_at)
                                              .where(DatasetRecord.tenant == tenant).order_by(DatasetRecord.name))]

    def delete(self, tenant: str, name: str) -> None:
        with self._write.begin() as db:
            n = db.execute(delete(DatasetRecord).where(DatasetRecord.tenant == tenant, DatasetRecord.name == name))
        if not n.rowcount:  # type: ignore[attr-defined]
            raise NotFound(f"no dataset {name!r} for tenant {tenant!r}")
