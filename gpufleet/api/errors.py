"""Every API error has one shape, `{"error": {"code": ..., "message": ...}}` (plus `field`
when one input is at fault), and each refusal one status, set here."""

from __future__ import annotations

from django.http import JsonResponse
from ninja import Schema
from pydantic import Field

from gpufleet.claims import services

# A refused claim change, by its stable code: 422 when the claim itself is wrong, 403 when
# the caller may not make it (gpufleet.claims.rights; an admin's reason to book over a team's
# quota from anyone else included), 404 when it is gone, 428 Precondition Required when an edit
# or delete lacks the claim's version (RFC 6585: the status for refusing changes that could be
# lost updates), 409 (any other code, quota_exceeded included) when it conflicts with the
# node's state, other claims or the team's quotas.
CLAIM_STATUS = {
    "unknown_device": 422,
    "duplicate_device": 422,
    "invalid": 422,
    services.NotAllowed.code: 403,
    services.ClaimGone.code: 404,
    services.VersionRequired.code: 428,
    services.OverrideRefused.code: 403,
}
CONFLICT = 409


class ErrorDetail(Schema):
    code: str = Field(description="stable and machine-readable, such as not_found or insufficient")
    message: str = Field(description="a sentence for people")
    field: str | None = Field(None, description="the input at fault, when one is; absent otherwise")
    ends_by: str | None = Field(
        None, description="a claim refused for a booking that starts later fits if it ends by then (ISO 8601)")
    conflicts: list[ConflictDetail] | None = Field(
        None, description="series_conflict: every occurrence of the repeating booking that does not fit")


class ConflictDetail(Schema):
    """One occurrence of a repeating booking that does not fit, with the ledger's refusal."""

    name: str
    starts_at: str
    ends_at: str
    code: str
    message: str


class Error(Schema):
    """Every error answer's body, whatever its status."""

    error: ErrorDetail


def errors(*statuses: int) -> dict[int, type[Error]]:
    """The OpenAPI `response` entries for these error statuses: one shape for all."""
    return dict.fromkeys(statuses, Error)


class ApiError(Exception):
    """Raised anywhere in the API to answer with this error."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None, ends_by: str | None = None,
                 conflicts: list[dict] | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field
        self.ends_by, self.conflicts = ends_by, conflicts

    @classmethod
    def from_claim_error(cls, exc: services.ClaimError) -> ApiError:
        field = services.VERSION_FIELD if isinstance(exc, services.VersionRequired) else None
        if isinstance(exc, (services.BadTerms, services.OverrideRefused)):
            field = exc.field
        ends_by = exc.error.ends_by if isinstance(exc, services.ClaimRejected) else None
        conflicts = None
        if isinstance(exc, services.SeriesRejected):
            conflicts = [{"name": claim.name, "starts_at": claim.starts_at.isoformat(), "ends_at": claim.ends_at.isoformat(),
                          "code": error.code, "message": services.sentence(str(error))} for claim, error in exc.conflicts]
        return cls(CLAIM_STATUS.get(exc.code, CONFLICT), exc.code, exc.message, field,
                   ends_by.isoformat() if ends_by is not None else None, conflicts)


def unsupported_media_type(content_type: str) -> ApiError:
    """A body sent as anything but JSON (a form post, say): 415, saying what to send."""
    sent = content_type or "no Content-Type"
    return ApiError(415, "unsupported_media_type", f"send the body as JSON (Content-Type: application/json), not {sent}")


def error(status: int, code: str, message: str, field: str | None = None, ends_by: str | None = None,
          conflicts: list[dict] | None = None) -> JsonResponse:
    body = Error(error=ErrorDetail(code=code, message=message, field=field or None, ends_by=ends_by, conflicts=conflicts))
    return JsonResponse(body.model_dump(exclude_none=True), status=status)


def answer(exc: ApiError) -> JsonResponse:
    return error(exc.status, exc.code, exc.message, exc.field, exc.ends_by, exc.conflicts)
