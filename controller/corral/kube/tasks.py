"""Background tasks of the reconcilers (informers, account keeping, collection): stopped the same way."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any


async def cancel_all(tasks: Iterable[asyncio.Task[Any] | None]) -> None:
    """Cancel the tasks and wait until each has ended; a task that ended already is fine."""
    running = [task for task in tasks if task is not None]
    for task in running:
        task.cancel()
    for task in running:
        with contextlib.suppress(asyncio.CancelledError):
            await task
