"""/v1/datasets: a tenant's own tables for the agent's metric tool (runtime/jobs/datasets.py):
upload (JSON rows or CSV; a new upload of a name replaces it whole), list, read, delete.  An
agent job names one in its spec (`dataset`)."""

from __future__ import annotations

import csv
import json
from typing import Annotated, Any

from anyio.to_thread import run_sync
from fastapi import APIRouter, HTTPException, Path, Request, Response
from pydantic import BaseModel

from runtime.api.deps import Svc, Tenant
from runtime.api.models import ERRORS, Utc
from runtime.api.services import Services
from runtime.errors import BadInput
from runtime.jobs import datasets
from runtime.tables import DatasetRecord

router = APIRouter(prefix="/v1/datasets", tags=["datasets"])
Name = Annotated[str, Path(pattern=datasets.NAME)]

_ROW = {"type": "object", "additionalProperties": False, "required": list(datasets.COLUMNS),
        "properties": {c: {"type": "string"} if c != "value" else {"anyOf": [{"type": "string"}, {"type": "number"}]}
                       for c in datasets.COLUMNS}}
_BODY: dict[str, Any] = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": {"type": "object", "additionalProperties": False, "required": ["rows"],
                                    "properties": {"rows": {"type": "array", "items": _ROW, "minItems": 1,
                                                            "maxItems": datasets.MAX_ROWS}}}},
    "text/csv": {"schema": {"type": "string", "description": "header metric,region,period,value"}}}}}


class DatasetView(BaseModel):
    name: str
    rows: int
    updated_at: Utc | None


class DatasetRows(DatasetView):
    data: list[list[str]]  # [metric, region, period, value] per row


class DatasetList(BaseModel):
    datasets: list[DatasetView]


def _view(r: DatasetRecord) -> DatasetView:
    return DatasetView(name=r.name, rows=r.n_rows, updated_at=r.updated_at)


@router.put("/{name}", response_model=DatasetView, responses={**ERRORS, 415: ERRORS[422]}, openapi_extra=_BODY)
async def put_dataset(name: Name, request: Request, who: Tenant, svc: Svc) -> DatasetView:
    """Create or replace the dataset `name`: JSON `{"rows": [{"metric", "region", "period",
    "value"}]}` or CSV with that header; values numbers as the tools write them (512, -2.4);
    each (metric, region, period) once; at most 10000 rows.  Checked whole: a bad row is a 422
    naming it, and nothing is written.  An upload takes a rate-limit token per 64 KiB of body
    (1 to tenant_burst: its parse and check cost by size; 10k rows of JSON take about 11), a
    refused one too."""
    kind = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if kind not in ("text/csv", "application/json"):
        raise HTTPException(415, f"a dataset is application/json or text/csv, not {kind}")
    raw = await request.body()
    # the loop only reads the body: parsing and checking 10k rows takes 0.04-0.11 s, and the
    # token and the write are blocking calls (Redis, SQL); a worker thread does them all, one
    # upload at a time (svc.parsing): more threads parsing would only take the GIL from the loop
    return await run_sync(_put, svc, who, name, kind, raw, limiter=svc.parsing)


#: an upload's bytes per rate-limit token
TOKEN_BYTES = 64 * 1024


def _put(svc: Services, who: str, name: str, kind: str, raw: bytes) -> DatasetView:
    # first: a refused upload has paid for its parse too
    svc.limiter.take(who, min(svc.settings.tenant_burst, 1 + len(raw) // TOKEN_BYTES))
    svc.datasets.room(who, name)  # a new name past tenant_max_datasets: refused before the parse
    try:
        if kind == "text/csv":
            rows = datasets.parse_csv(raw.decode("utf-8-sig"))  # a BOM first (Excel's "CSV UTF-8") is no header
        else:
            rows = datasets.parse_json(json.loads(raw))
    except (UnicodeDecodeError, ValueError, csv.Error, RecursionError) as e:
        if isinstance(e, BadInput):
            raise
        raise BadInput(f"the body is not {kind}: {e}") from None
    return _view(svc.datasets.put(who, name, rows))  # OverBudget for a new one past tenant_max_datasets


@router.get("", response_model=DatasetList, responses=ERRORS)
def list_datasets(who: Tenant, svc: Svc) -> DatasetList:
    return DatasetList(datasets=[_view(r) for r in svc.datasets.listing(who)])


@router.get("/{name}", response_model=DatasetRows, responses=ERRORS)
def get_dataset(name: Name, who: Tenant, svc: Svc) -> DatasetRows:
    r = svc.datasets.get(who, name)
    return DatasetRows(name=r.name, rows=r.n_rows, updated_at=r.updated_at, data=r.rows)


@router.delete("/{name}", status_code=204, responses=ERRORS)
def delete_dataset(name: Name, who: Tenant, svc: Svc) -> Response:
    """A job that names it and has not yet read it fails (not_found) when it does."""
    svc.datasets.delete(who, name)
    return Response(status_code=204)
