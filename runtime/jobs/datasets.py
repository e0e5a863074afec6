"""A tenant's own datasets for the agent's metric tool: a table of (metric, region, period) ->
value that an agent job names (`dataset`) instead of the sample dataset `dataset_seed` draws.
Uploaded as JSON rows or CSV (header metric,region,period,value), checked whole before anything
is written, and replaced whole by the next upload of the same name.

The model asks in its own words: a call is `metric("<metric>", "<region>", "<period>")` with the
names copied from the question.  A name is any text in any script, as a payload's
(runtime/jobs/specs.py name_text), but of at most MAX_KEY characters and with no quote, < or >
(a call's argument cannot hold a quote, nor a question < or >).  Names are kept as the runtime
compares them (domain/grammar.py clean_name: NFC, no spaces at the ends, none doubled), as an
agent's question is.  A value is a JSON number or a string of one, as a payload's (number_text:
negative allowed, 15 significant digits, 6 decimals), kept as the tools write it (the model
reads it as it read their results in training).
No torch here: the API process imports this."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from domain.grammar import clean_name, number_text
from runtime.db import writer
from runtime.errors import BadInput, NotFound, OverBudget
from runtime.jobs.payload import name_text
from runtime.tables import DatasetRecord, owned

NAME = r"^[A-Za-z0-9_-]{1,64}$"  #: a dataset's name
MAX_ROWS = 10_000
COLUMNS = ("metric", "region", "period", "value")
MAX_KEY = 64  # characters of a metric, region or period: what a call's argument holds (workflows/tools.py MetricArgs)
_NOT_IN_CALL = '"<>'  # a call's argument is quoted; a question holds no markup


def parse_json(body: Any) -> list[list[str]]:
    """{"rows": [{"metric", "region", "period", "value"}, ...]} -> rows; BadInput naming the
    first bad row."""
    if not isinstance(body, dict) or set(body) != {"rows"} or not isinstance(body["rows"], list):
        raise BadInput('a dataset is {"rows": [{"metric": .., "region": .., "period": .., "value": ..}, ...]}')
    rows: list[list[Any]] = []
    for i, r in enumerate(body["rows"]):
        if not isinstance(r, dict) or set(r) != set(COLUMNS):
            raise BadInput(f"row {i}: needs exactly the fields {', '.join(COLUMNS)}")
        rows.append([r[c] if c == "value" or isinstance(r[c], str) else _name(r[c], i) for c in COLUMNS])
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


def _name(v: Any, i: int) -> str:
    """A name sent as a JSON number (a period 2026): its text."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise BadInput(f"row {i}: a metric, region or period is a string, a value a number or a string")
    return str(v)


def _key(what: str, v: str, i: int) -> str:
    """A name as a question and a call hold it (name_text: NFC, canonical spaces); BadInput why not."""
    if len(clean_name(v)) > MAX_KEY:
        raise BadInput(f"row {i}: {what} {v!r}: a name here is 1-{MAX_KEY} characters (a tool call's argument), "
                       f"got {len(clean_name(v))}")
    try:
        name = name_text(v)
    except ValueError as e:
        raise BadInput(f"row {i}: {what} {v!r}: {e}") from None
    bad = sorted({c for c in name if c in _NOT_IN_CALL})
    if bad:
        raise BadInput(f"row {i}: {what} {v!r}: a name here holds no {' or '.join(bad)} (a tool call quotes "
                       "its names, and a question holds no < or >)")
    return name


def check(rows: list[list[Any]]) -> list[list[str]]:
    """1..MAX_ROWS rows; names a call can hold; numbers as the tools write them; each
    (metric, region, period) once.  Each distinct name is checked once (a table of 10k rows
    names a few hundred: the checks were 40% of an upload's CPU)."""
    if not 1 <= len(rows) <= MAX_ROWS:
        raise BadInput(f"a dataset has 1..{MAX_ROWS} rows, not {len(rows)}")
    names: dict[tuple[str, Any], str] = {}  # (column, as sent) -> as kept; a bad one raises at its first row

    def key(what: str, v: Any, i: int) -> str:
        if (what, v) not in names:
            names[what, v] = _key(what, v, i)
        return names[what, v]

    seen: set[tuple[str, ...]] = set()
    out = []
    for i, (metric, region, period, value) in enumerate(rows):
        k = (key("metric", metric, i), key("region", region, i), key("period", period, i))  # as a question names them
        try:
            value = number_text(value)
        except ValueError as e:
            raise BadInput(f"row {i}: value {value!r} is not a number as the tools write one: {e}") from None
        if k in seen:
            raise BadInput(f"row {i}: ({', '.join(k)}) is in the dataset twice (names compare in NFC, "
                           "without the spaces at their ends, runs of spaces as one)")
        seen.add(k)
        out.append([*k, value])
    return out


class Datasets:
    def __init__(self, engine: Engine, max_per_tenant: int = 100) -> None:
        self._db = sessionmaker(engine, expire_on_commit=False)
        self._write = sessionmaker(writer(engine), expire_on_commit=False)
        self.max_per_tenant = max_per_tenant

    def room(self, tenant: str, name: str, db: Session | None = None) -> bool:
        """Whether the tenant has a dataset `name` already (True: an upload replaces it); else
        OverBudget where it has max_per_tenant, the most it may have.  Reads keys and a count,
        never the rows: the API asks before it parses an upload, so that a refusal costs no parse."""
        if db is None:
            with self._db() as fresh:
                return self.room(tenant, name, fresh)
        if db.scalar(select(DatasetRecord.name).where(DatasetRecord.tenant == tenant, DatasetRecord.name == name)):
            return True
        have = int(db.scalar(select(func.count()).select_from(DatasetRecord).where(DatasetRecord.tenant == tenant)) or 0)
        if have >= self.max_per_tenant:
            raise OverBudget(f"tenant {tenant!r} has {have} datasets, the most it may have "
                             "(tenant_max_datasets): replace or delete one")
        return False

    def put(self, tenant: str, name: str, rows: list[list[str]]) -> DatasetRecord:
        """Create or replace the tenant's dataset `name` (rows checked by the caller: parse_*);
        OverBudget for a new one past max_per_tenant.  Two uploads of a new name at once: the
        second replaces the first.  The rows it replaces are never read (10k rows took 40 ms of
        the API's CPU to load for nothing)."""
        now = datetime.now(UTC)
        for _ in range(3):
            try:
                with self._write.begin() as db:
                    if self.room(tenant, name, db):
                        db.execute(update(DatasetRecord).where(DatasetRecord.tenant == tenant, DatasetRecord.name == name)
                                   .values(rows=rows, n_rows=len(rows), updated_at=now))
                    else:
                        db.add(DatasetRecord(tenant=tenant, name=name, rows=rows, n_rows=len(rows), updated_at=now))
                return DatasetRecord(tenant=tenant, name=name, rows=rows, n_rows=len(rows), updated_at=now)
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
            return owned(db.get(DatasetRecord, (tenant, name)), tenant, f"dataset {name!r}")

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
