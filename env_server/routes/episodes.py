"""Ended episodes, to read what the model did: `GET /episodes` and `/episodes/{id}` as JSON, and the
episode viewer (`/viewer`), the same records as web pages.

Every route here sits behind the bearer token like the rest. A browser cannot send that header, so
`/viewer/login` exchanges the token for a cookie that the request guard accepts on the viewer's
`GET` pages only (env_server.middleware): a read-only page, strict same-site, never an action.
"""

from __future__ import annotations

import hmac
from urllib.parse import parse_qs

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, Response

from env_server.episode_page import episode_page, index_page, login_page, not_found_page
from env_server.http_errors import errors
from env_server.middleware import VIEWER_COOKIE
from env_server.models import ApiErrorCode, EpisodePage, EpisodeRecord, EpisodeSummary
from env_server.service import Service, service_of
from env_server.service_errors import ServiceError

router = APIRouter()


@router.get("/episodes", response_model=EpisodePage, responses=errors(422), tags=["Episodes"])
async def list_episodes(
    request: Request,
    offset: int = Query(default=0, ge=0),
    limit: int = Query(default=50, ge=1, le=1000),
) -> EpisodePage:
    """The recently ended episodes (graded, failed, aborted, abandoned, closed), newest first."""
    recent = service_of(request).episodes.recent()
    page = [EpisodeSummary.of(record) for record in recent[offset : offset + limit]]
    return EpisodePage(episodes=page, total=len(recent), offset=offset, limit=limit)


@router.get("/episodes/{episode_id}", response_model=EpisodeRecord, responses=errors(404), tags=["Episodes"])
async def get_episode(request: Request, episode_id: str) -> EpisodeRecord:
    """One recently ended episode's whole record: every action, every call's answer, the hints, the flags."""
    return _record(service_of(request), episode_id)


@router.get("/viewer", response_class=HTMLResponse, tags=["Episodes"])
async def viewer_index(request: Request) -> HTMLResponse:
    service = service_of(request)
    summaries = [EpisodeSummary.of(record) for record in service.episodes.recent()]
    return HTMLResponse(index_page(summaries, service.settings.recent_episodes))


@router.get("/viewer/login", response_class=HTMLResponse, tags=["Episodes"])
async def viewer_login_form() -> HTMLResponse:
    return HTMLResponse(login_page())


@router.post(
    "/viewer/login",
    response_class=HTMLResponse,
    status_code=303,
    responses={303: {"description": "Signed in: on to the viewer, with its cookie."},
               401: {"description": "Not this service's token: the form again.", "content": {"text/html": {}}}},
    tags=["Episodes"],
)
async def viewer_login(request: Request) -> Response:
    """The service's token for a cookie the viewer's pages accept; the form again, 401, for a wrong one.
    The form's body is read here (one field) rather than through FastAPI's `Form`, which needs python-multipart."""
    token = parse_qs((await request.body()).decode("utf-8", "replace")).get("token", [""])[0]
    expected = service_of(request).settings.api_token
    if expected is not None and not hmac.compare_digest(token.encode(), expected.get_secret_value().encode()):
        return HTMLResponse(login_page(failed=True), status_code=401)
    # A redirect with a page of its own (a link), so that the answer has the content type it documents.
    response = HTMLResponse("<a href='../viewer'>Open the viewer</a>", status_code=303, headers={"location": "../viewer"})
    if expected is not None:
        response.set_cookie(VIEWER_COOKIE, token, httponly=True, samesite="strict", path="/viewer")
    return response


@router.get(
    "/viewer/{episode_id}",
    response_class=HTMLResponse,
    responses={404: {"description": "No recently ended episode of that id: a page that says so.", "content": {"text/html": {}}}},
    tags=["Episodes"],
)
async def viewer_episode(request: Request, episode_id: str) -> HTMLResponse:
    """A page, also when the episode is not kept: a browser shows the reason, not a JSON body."""
    service = service_of(request)
    record = service.episodes.get(episode_id)
    if record is None:
        return HTMLResponse(not_found_page(episode_id, service.settings.recent_episodes), status_code=404)
    return HTMLResponse(episode_page(record))


def _record(service: Service, episode_id: str) -> EpisodeRecord:
    record = service.episodes.get(episode_id)
    if record is None:
        raise ServiceError(
            ApiErrorCode.NOT_FOUND,
            f"no recently ended episode {episode_id!r}: the service keeps the last {service.settings.recent_episodes} "
            "(GET /episodes lists them); an episode still going on is read with GET /sessions/{id}/trajectory",
        )
    return record
