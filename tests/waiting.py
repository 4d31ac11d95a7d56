"""Bounded polling for tests: wait until a condition holds, or fail instead of hanging.

The timeout is a guard against a hang, not a measure: it is generous on purpose, and no test
asserts how long a wait took.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    check: Callable[[], T],
    timeout: float,
    what: str,
    interval: float = 0.05,
    detail: Callable[[], str] | None = None,
) -> T:
    """Poll ``check`` until it returns something truthy and return that value.

    ``check`` runs at least once, even with ``timeout`` 0. After ``timeout`` seconds raise
    ``TimeoutError`` naming ``what``; ``detail``, if given, is called then and its text (a
    process's output, the last response) appended, so the failure shows the state it gave up on.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() >= deadline:
            message = f"gave up after {timeout:g} s waiting for {what}"
            if detail is not None:
                message += f"\n{detail()}"
            raise TimeoutError(message)
        time.sleep(interval)
