"""`corral ARGS...` with the event loop's default executor cut down to one thread.

A test runs the gateway this way to prove that nothing it waits on holds a thread of that executor: with
one worker, a single long wait there would stall every other caller. Only the environment is changed;
the product code is the same as `corral` runs it.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from corral.cli.main import main

_run = asyncio.run


def _run_with_one_worker(coro: Coroutine[Any, Any, Any], **kwargs: Any) -> Any:
    async def constrained() -> Any:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))
        return await coro

    return _run(constrained(), **kwargs)


asyncio.run = _run_with_one_worker
sys.exit(main())
