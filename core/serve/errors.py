"""A request that cannot be served, in OpenAI's error shape: every endpoint's refusals."""
from __future__ import annotations


class RequestError(Exception):
    """A request that cannot be served, as OpenAI reports it: an HTTP status and ``{"error": {...}}``."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.param, self.code, self.kind = message, status, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}
