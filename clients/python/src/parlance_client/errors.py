"""Problem details (RFC 9457) answers, raised as typed exceptions.

Every error answer of the service is ``application/problem+json``; its
``type`` is ``urn:parlance:problem:<kind>`` (the kinds are listed in the
service's docs/api.md). :func:`raise_for_problem` maps the kind, else the
status, to the most specific class below.
"""

from typing import Any, Dict, Mapping, Optional, Type

import httpx

PROBLEM_PREFIX = "urn:parlance:problem:"


class ProblemError(Exception):
    """An error answer: its status and the problem's members.

    ``extra`` holds the members beyond ``type``, ``title``, ``status`` and
    ``detail`` (``field``, ``state``, ``command``, ``reason``, ``max``, ...).
    """

    def __init__(
        self,
        status: int,
        type: str,
        title: str,
        detail: str,
        extra: Optional[Mapping[str, Any]] = None,
        headers: Optional[Mapping[str, str]] = None,
    ) -> None:
        super().__init__(f"{status} {type}: {detail}")
        self.status = status
        self.type = type
        self.title = title
        self.detail = detail
        self.extra: Dict[str, Any] = dict(extra or {})
        self.headers: Dict[str, str] = dict(headers or {})

    @property
    def kind(self) -> str:
        """The problem kind: ``not-found`` for ``urn:parlance:problem:not-found``."""
        return self.type[len(PROBLEM_PREFIX) :] if self.type.startswith(PROBLEM_PREFIX) else self.type

    def __getitem__(self, member: str) -> Any:
        return self.extra[member]


class BadRequest(ProblemError):
    """400: the body is not JSON, or a path or query value does not parse."""


class Unauthorized(ProblemError):
    """401: no key, or an unknown key."""


class NotFound(ProblemError):
    """404: no such record for this product, or no such route."""


class MethodNotAllowed(ProblemError):
    """405: the route does not take this method."""


class Conflict(ProblemError):
    """409: the state does not allow the command, or another write won."""


class NotAllowed(Conflict):
    """409 ``not-allowed``: the command is not allowed in the record's state
    (``state``, ``command`` and maybe ``reason`` in :attr:`extra`)."""

    @property
    def state(self) -> Optional[str]:
        return self.extra.get("state")

    @property
    def command(self) -> Optional[str]:
        return self.extra.get("command")

    @property
    def reason(self) -> Optional[str]:
        return self.extra.get("reason")


class TooLarge(ProblemError):
    """413, 414, 431: the body, the target or the headers are over a limit."""


class UnsupportedMediaType(ProblemError):
    """415: a body without ``content-type: application/json``."""


class Invalid(ProblemError):
    """422: valid JSON, but a value no state takes (``field`` when known)."""

    @property
    def field(self) -> Optional[str]:
        return self.extra.get("field")


class LimitExceeded(Invalid):
    """422 ``limit-exceeded``: a size or work limit (``field``, ``max``)."""


class RateLimited(ProblemError):
    """429: too many requests; retry after :attr:`retry_after` seconds."""

    @property
    def retry_after(self) -> Optional[float]:
        return _retry_after(self.headers)


class ServerError(ProblemError):
    """500 and other 5xx without a more specific class."""


class BadGateway(ServerError):
    """502 ``llm-failed``: the language model refused the request."""


class Unavailable(ServerError):
    """503 ``unavailable`` or ``contended``: nothing was changed; retry after
    :attr:`retry_after` seconds."""

    @property
    def retry_after(self) -> Optional[float]:
        return _retry_after(self.headers)


class DeadlineExceeded(ServerError):
    """504: the request did not finish within its time budget."""


_BY_KIND: Dict[str, Type[ProblemError]] = {
    "bad-request": BadRequest,
    "unauthorized": Unauthorized,
    "not-found": NotFound,
    "method-not-allowed": MethodNotAllowed,
    "not-allowed": NotAllowed,
    "conflict": Conflict,
    "payload-too-large": TooLarge,
    "uri-too-long": TooLarge,
    "headers-too-large": TooLarge,
    "unsupported-media-type": UnsupportedMediaType,
    "invalid-request": Invalid,
    "limit-exceeded": LimitExceeded,
    "llm-failed": BadGateway,
    "contended": Unavailable,
    "unavailable": Unavailable,
    "deadline-exceeded": DeadlineExceeded,
}

_BY_STATUS: Dict[int, Type[ProblemError]] = {
    400: BadRequest,
    401: Unauthorized,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    413: TooLarge,
    414: TooLarge,
    415: UnsupportedMediaType,
    422: Invalid,
    429: RateLimited,
    431: TooLarge,
    502: BadGateway,
    503: Unavailable,
    504: DeadlineExceeded,
}


def _retry_after(headers: Mapping[str, str]) -> Optional[float]:
    for name, value in headers.items():
        if name.lower() == "retry-after":
            try:
                return float(value)
            except ValueError:
                return None
    return None


def problem_from_response(response: httpx.Response) -> ProblemError:
    """The exception for an error answer (any status >= 400)."""
    body: Dict[str, Any] = {}
    try:
        parsed = response.json()
        if isinstance(parsed, dict):
            body = parsed
    except ValueError:
        pass
    type_ = str(body.get("type", "about:blank"))
    kind = type_[len(PROBLEM_PREFIX) :] if type_.startswith(PROBLEM_PREFIX) else ""
    cls = _BY_KIND.get(kind) or _BY_STATUS.get(response.status_code)
    if cls is None:
        cls = ServerError if response.status_code >= 500 else ProblemError
    extra = {k: v for k, v in body.items() if k not in ("type", "title", "status", "detail")}
    return cls(
        status=int(body.get("status", response.status_code)),
        type=type_,
        title=str(body.get("title", response.reason_phrase)),
        detail=str(body.get("detail", response.text)),
        extra=extra,
        headers=response.headers,
    )


def raise_for_problem(response: httpx.Response) -> None:
    """Raises the typed :class:`ProblemError` for an error answer."""
    if response.status_code >= 400:
        raise problem_from_response(response)
