"""The gateway's threads for the official Kubernetes client's blocking calls: a bounded pool of its own.

Only the few short calls still made with the official client run here: a caller's RBAC review and who it
is (`review`), a bearer token's SelfSubjectReview (`identity`), and a device's Events for the diagnosis prompt
(`prompts`, whose text keeps the official client's time format). Watches, Intents, Capabilities and the
agents switch go through `kube.client` on the event loop, and nothing that waits for a person or a device
holds a thread (`following`). Keeping the pool apart from
the event loop's default executor means nothing else in the process (or a library) can starve it.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
THREADS = 32

_pool: ThreadPoolExecutor | None = None


async def blocking(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking call on the gateway's API threads."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="corral-gateway-api")
    return await asyncio.get_running_loop().run_in_executor(_pool, functools.partial(fn, *args, **kwargs))
