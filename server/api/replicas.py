"""/api/v1/replicas: the coordinator processes on this database (admins)."""

from __future__ import annotations

from fastapi import APIRouter

from mwms.server.api.auth import AdminOnly
from mwms.server.api.deps import ReadSession
from mwms.server.schemas import ReplicaOut
from mwms.server.services.fleet.replicas import list_replicas

router = APIRouter(prefix="/api/v1", tags=["replicas"])


@router.get("/replicas", response_model=list[ReplicaOut])
def replicas(session: ReadSession, _admin: AdminOnly) -> list[ReplicaOut]:
    """Every replica on record (gone ones for a week): alive first, with what it serves, the agent streams
    it holds and the background loops it leads."""
    return [ReplicaOut(**vars(view)) for view in list_replicas(session)]
