"""A case's files as they are chosen: paired by name, checked and staged for this user
(their ids then make the case), dropped on "Clear"."""

from __future__ import annotations

from http import HTTPStatus

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool

from pathmaster.records import InvalidInput
from services.shared import DEFAULT_CLASS  # what the coordinator takes for no class
from services.gateway.accounts import Session, may_send
from services.gateway.errors import HttpError
from services.gateway.facade import Gateway
from services.gateway.pairing import extension_problem, pair_files
from services.gateway.requests import PairRequest, client_of, read_json, read_one_file
from services.gateway.staging import StagingFull, content_id
from services.gateway.upload import check_file, file_role


def upload_router(gateway: Gateway, signed_in) -> APIRouter:
    """The routes of a case's files (`signed_in`: the session dependency)."""
    router = APIRouter()

    @router.post("/api/pair", summary="How files pair into cells, by name",
              openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                  "schema": PairRequest.model_json_schema()}}}})
    async def pair(request: Request, _session: Session = Depends(signed_in)):
        names = (await read_json(request, PairRequest)).names
        return pair_files(names).as_dict()

    def may_stage(session: Session) -> None:
        """403 unless `session`'s role may send cases at all (the class is checked when the
        case is sent)."""
        if not any(may_send(session.role, name) for name in
                   (*(gateway.client.learnt_classes() or ()), DEFAULT_CLASS)):
            raise HttpError(HTTPStatus.FORBIDDEN, f"As a {session.role} you cannot send cases.")

    @router.post("/api/upload", summary="Stage one file of a case as soon as it is chosen",
              openapi_extra={"requestBody": {"required": True, "content": {"multipart/form-data": {
                  "schema": {"type": "object", "required": ["file"], "properties": {
                      "file": {"type": "string", "format": "binary"}}}}}}})
    async def upload(request: Request, session: Session = Depends(signed_in)):
        """Check one file (decoded as what its name says: image, background or mask) and
        hold it for this user; its id goes in the case (POST /api/case as JSON). The same
        bytes staged again are not checked again. Refused, naming the file: a file that is
        not a usable image (400), over a file's or this user's limits (413), or while the
        gateway holds all it may (503)."""
        may_stage(session)
        name, data = await read_one_file(request)
        client = client_of(request)
        role = file_role(name)
        file_id = content_id(data)
        try:
            problem = extension_problem(name)  # by name: whether or not the bytes are held
            if problem:
                raise InvalidInput(problem, name)
            staged = gateway.staged.known(session.name, file_id, role)
            if staged is None:
                gateway.staged.check_room(session.name, len(data))
                role, header = await run_in_threadpool(check_file, name, data)
                file_id = gateway.staged.put(session.name, data, header, role)
            else:
                header = staged.header
        except InvalidInput as exc:
            gateway.audit.record("upload-refused", session.name, session.role, client, bytes=len(data))
            raise HttpError(HTTPStatus.BAD_REQUEST, f"{name}: {exc.problem}",
                            extra={"file": name, "problem": exc.problem, "code": exc.code})
        except StagingFull as exc:
            gateway.audit.record("upload-refused", session.name, session.role, client, bytes=len(data))
            raise HttpError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE if exc.per_user
                            else HTTPStatus.SERVICE_UNAVAILABLE, f"{name}: {exc}",
                            extra={"file": name, "problem": str(exc)})
        gateway.audit.record("upload", session.name, session.role, client, bytes=len(data))
        return {"id": file_id, "name": name, "role": role, "bytes": len(data),
                "width": header.width, "height": header.height}

    @router.delete("/api/upload", summary="Drop this user's staged files")
    def drop_uploads(session: Session = Depends(signed_in)):
        return {"dropped": gateway.staged.discard(session.name)}

    return router
