"""Typed sync and async client for the Parlance service's HTTP API."""

from . import models
from .client import AsyncClient, Client
from .errors import (
    BadGateway,
    BadRequest,
    Conflict,
    DeadlineExceeded,
    Invalid,
    LimitExceeded,
    MethodNotAllowed,
    NotAllowed,
    NotFound,
    ProblemError,
    RateLimited,
    ServerError,
    TooLarge,
    Unauthorized,
    Unavailable,
    UnsupportedMediaType,
)

__all__ = [
    "AsyncClient",
    "BadGateway",
    "BadRequest",
    "Client",
    "Conflict",
    "DeadlineExceeded",
    "Invalid",
    "LimitExceeded",
    "MethodNotAllowed",
    "NotAllowed",
    "NotFound",
    "ProblemError",
    "RateLimited",
    "ServerError",
    "TooLarge",
    "Unauthorized",
    "Unavailable",
    "UnsupportedMediaType",
    "models",
]
