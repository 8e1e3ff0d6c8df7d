"""The work queue and its rate limiter, without a cluster: one shape of reconcile, retries that back off."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from corral.kube.workqueue import RateLimiter, Result, WorkQueue, run_workers


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_failures_back_off_exponentially_per_key_up_to_the_cap_and_forget_starts_over() -> None:
    limiter: RateLimiter[str] = RateLimiter(base_s=0.01, cap_s=1.0, rate_per_s=1000, burst=1000, clock=Clock())
    delays = [limiter.when("a") for _ in range(10)]
    assert delays[:4] == [0.01, 0.02, 0.04, 0.08]
    assert delays[-1] == 1.0 and max(delays) == 1.0, "capped"
    assert limiter.when("b") == 0.01, "another key has a backoff of its own"
    limiter.forget("a")
    assert limiter.when("a") == 0.01


def test_the_token_bucket_spaces_out_a_flood_of_failing_keys() -> None:
    clock = Clock()
    limiter: RateLimiter[int] = RateLimiter(base_s=0.001, cap_s=1.0, rate_per_s=10, burst=3, clock=clock)
    delays = [limiter.when(key) for key in range(6)]  # six different keys fail at the same moment
    assert delays[:3] == [0.001] * 3, "the burst passes"
    assert delays[3:] == pytest.approx([0.1, 0.2, 0.3]), "then one retry per 1/rate seconds, queued behind each other"


def test_result_sooner_keeps_the_earliest_requeue() -> None:
    assert Result.after(5).sooner(Result.after(2)) == Result.after(2)
    assert Result.done().sooner(Result.after(3)) == Result.after(3)
    assert Result.after(1).sooner(Result.done()) == Result.after(1)
    assert Result.done().sooner(Result.done()) == Result.done()


def test_a_key_added_while_it_is_handled_runs_once_more_afterwards_never_twice_at_once() -> None:
    async def scenario() -> tuple[list[str], int]:
        queue: WorkQueue[str] = WorkQueue("test")
        runs: list[str] = []
        running = 0
        most = 0

        async def reconcile(key: str) -> Result:
            nonlocal running, most
            running += 1
            most = max(most, running)
            runs.append(key)
            if len(runs) == 1:
                queue.add("a")  # changed while being handled
                queue.add("a")
            await asyncio.sleep(0.01)
            running -= 1
            return Result.done()

        queue.add("a")
        workers = asyncio.ensure_future(run_workers(queue, reconcile, 4))
        await asyncio.sleep(0.1)
        workers.cancel()
        return runs, most

    runs, most = asyncio.run(scenario())
    assert runs == ["a", "a"] and most == 1


def test_requeue_after_is_an_answer_and_errors_retry_with_backoff() -> None:
    async def scenario() -> list[tuple[str, float]]:
        loop = asyncio.get_running_loop()
        queue: WorkQueue[str] = WorkQueue("test", RateLimiter(base_s=0.02, cap_s=1.0))
        seen: list[tuple[str, float]] = []
        start = loop.time()

        async def reconcile(key: str) -> Result:
            seen.append((key, loop.time() - start))
            if key == "flaky" and len([k for k, _ in seen if k == "flaky"]) < 4:
                raise RuntimeError("the API server is away")
            if key == "poller" and len([k for k, _ in seen if k == "poller"]) < 3:
                return Result.after(0.05)
            return Result.done()

        queue.add("flaky")
        queue.add("poller")
        workers = asyncio.ensure_future(run_workers(queue, reconcile, 2))
        await asyncio.sleep(0.5)
        workers.cancel()
        return seen

    seen = asyncio.run(scenario())
    flaky = [t for k, t in seen if k == "flaky"]
    poller = [t for k, t in seen if k == "poller"]
    assert len(flaky) == 4, "retried until it succeeded, then left alone"
    gaps = [b - a for a, b in itertools.pairwise(flaky)]
    assert gaps[0] >= 0.02 and gaps[1] >= 0.04 and gaps[2] >= 0.08, gaps
    assert len(poller) == 3 and all(b - a >= 0.05 for a, b in itertools.pairwise(poller))


def test_an_earlier_timer_wins_and_a_closed_queue_takes_nothing() -> None:
    async def scenario() -> list[str]:
        queue: WorkQueue[str] = WorkQueue("test")
        queue.add_after("a", 0.05)
        queue.add_after("a", 5.0)  # later: ignored
        got = [await asyncio.wait_for(queue.get(), 1)]
        queue.done("a")
        queue.close()
        queue.add("b")
        return got + ([] if len(queue) == 0 else ["b"])

    assert asyncio.run(scenario()) == ["a"]
