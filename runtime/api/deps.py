"""What routes take as parameters, as `Annotated` aliases: the app's Services, the caller's
tenant (from its API key) and the path and query parameters the routes share."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Query, Request

from runtime.api.auth import tenant_of
from runtime.api.models import ID
from runtime.api.services import Services
from runtime.jobs.table import JOB_ID


def services(request: Request) -> Services:
    svc: Services = request.app.state.services
    return svc


def tenant(request: Request) -> str:
    return tenant_of(services(request).keyring, request.headers)


Svc = Annotated[Services, Depends(services)]
Tenant = Annotated[str, Depends(tenant)]
SessionId = Annotated[str, Path(pattern=ID)]
JobId = Annotated[str, Path(pattern=f"^{JOB_ID.pattern}$")]
Limit = Annotated[int, Query(ge=1, le=200)]  # how many a listing returns at most
