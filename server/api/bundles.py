"""/api/v1/bundles: program archives, stored once per sha256."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, File, UploadFile
from fastapi.responses import JSONResponse

from server.api.deps import RuntimeDep
from server.schemas import BundleOut, ErrorOut
from server.services.bundles import record_bundle, spool_upload

router = APIRouter(prefix="/api/v1/bundles", tags=["bundles"])


@router.post(
    "",
    status_code=201,
    response_model=BundleOut,
    responses={200: {"model": BundleOut}, 400: {"model": ErrorOut}},
)
async def upload_bundle(
    rt: RuntimeDep, file: Annotated[UploadFile, File(description=".tar.gz or .zip of the program")]
) -> JSONResponse:
    """Stores a program bundle; 201 when new, 200 when the same content was already stored."""
    settings = rt.settings

    def store() -> BundleOut:
        spooled, digest, size, archive_format = spool_upload(
            file.file, settings.bundle_dir, settings.max_upload_bytes
        )
        with rt.db.write() as session:
            bundle, created = record_bundle(
                session, settings.bundle_dir, spooled, digest, size, archive_format, file.filename or ""
            )
            return BundleOut(
                digest=bundle.digest, size=bundle.size, format=bundle.archive_format, created=created
            )

    out = await asyncio.to_thread(store)
    return JSONResponse(status_code=201 if out.created else 200, content=out.model_dump())
