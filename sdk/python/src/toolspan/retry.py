"""Retry policy: how many attempts, how long to wait between them, and a per-call deadline."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional

__all__ = ["RetryPolicy", "NO_RETRY"]


@dataclass(frozen=True)
class RetryPolicy:
    """Retries only what the envelope calls ``retryable``.

    The wait before attempt ``n + 1`` is exponential back-off with jitter,
    ``initial_backoff_s * multiplier ** (n - 1)`` capped at ``max_backoff_s`` and drawn
    uniformly from ``[(1 - jitter) * b, b]``, and never shorter than the envelope's
    ``retry_after_ms``. No attempt starts, and no wait reaches, past ``deadline_s`` seconds
    after the call began; async tools are also cut off at the deadline (a ``timeout``)."""

    max_attempts: int = 1
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 10.0
    multiplier: float = 2.0
    jitter: float = 0.5
    deadline_s: Optional[float] = None

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError("jitter must be between 0 and 1")

    def backoff_s(self, attempt: int, retry_after_ms: Optional[int], rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        base = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (attempt - 1))
        r = (rng or random).random()
        wait = base * (1.0 - self.jitter * r)
        if retry_after_ms is not None:
            wait = max(wait, retry_after_ms / 1000.0)
        return wait


NO_RETRY = RetryPolicy()
