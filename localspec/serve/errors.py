"""The one refusal type of `localspec serve`: an HTTP status with OpenAI's error body (the Ollama
routes answer the same refusals in Ollama's shape, `{"error": message}`)."""

from __future__ import annotations


class ApiError(Exception):
    """A refusal: HTTP `status` with OpenAI's error body."""

    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 code: str | None = None, kind: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.message, self.status, self.param, self.code, self.kind = message, status, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}
