"""Provides RemoteConfig: which OpenAI-compatible servers a remote engine uses, and how patiently."""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True)
class RemoteConfig:
    """The servers (each an OpenAI-compatible base URL) and the client's limits.

    `max_in_flight` is per server: more requests than that wait on the client (their queue time
    is measured there) instead of piling up in a server that would queue them out of sight.
    """

    urls: tuple[str, ...]
    model: str | None = None  # None: the first model the first reachable server lists
    api_key: str | None = None
    max_in_flight: int = 4
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 120.0  # longest silence between two stream chunks
    max_retries: int = 3  # for 429 and 5xx answers (Retry-After honoured) and refused connections
    max_retry_wait_s: float = 30.0
    probe_interval_s: float = 5.0  # how often a server marked dead is asked again (/v1/models)

    def __post_init__(self) -> None:
        if not self.urls:
            raise ValueError("give at least one server URL (--remote http://host:port)")
        for url in self.urls:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError(f"not a server URL: {url!r}; use http://host:port (optionally with /v1)")
        if self.max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")


def base_url(url: str) -> str:
    """The API root for a URL given with or without its /v1 suffix."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def api_key_from_env(var: str | None) -> str | None:
    """The key in environment variable `var`; a named variable that is unset is an error (a
    silent missing key would only surface later as a 401 on every pane)."""
    if var is None:
        return None
    key = os.environ.get(var)
    if not key:
        raise ValueError(f"environment variable {var} (from --api-key-env) is not set or empty")
    return key
