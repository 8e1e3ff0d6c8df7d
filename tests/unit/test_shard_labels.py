"""ShardLabels: what the owner writes (and when it writes nothing) before a status write, when devices are sharded.

On the API server (the fence selecting by this label): tests/integration/test_api_fencing.py.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from corral.kube.client import APPLY
from corral.kube.objects import Kube
from corral.reconcile.shardlabels import SHARD_LABEL, SHARDS_MANAGER, ShardLabels


class RecordingApi:
    """Stands in for the HTTP client: records each request and answers with the body it was sent."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    async def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        self.requests.append({"method": method, "path": path, **kwargs})
        return dict(kwargs["body"])


class FakeKube:
    def __init__(self) -> None:
        self.api = RecordingApi()


def ensure(shards: int, plural: str, labels: dict[str, str], shard: int) -> tuple[Any, list[dict[str, Any]]]:
    kube = FakeKube()
    body = {"metadata": {"namespace": "home", "name": "lamp", "labels": labels}}
    answer = asyncio.run(ShardLabels(cast(Kube, kube), shards).ensure(plural, body, shard))
    return answer, kube.api.requests


def test_an_unlabelled_object_is_labelled_with_its_shard_by_server_side_apply() -> None:
    answer, (sent,) = ensure(4, "intents", {"other": "x"}, 3)
    assert sent["method"] == "PATCH" and sent["path"] == "/apis/corral.dev/v1alpha1/namespaces/home/intents/lamp"
    assert sent["content_type"] == APPLY
    assert sent["params"] == {"fieldManager": SHARDS_MANAGER, "force": "true"}
    assert sent["body"]["kind"] == "Intent"
    assert sent["body"]["metadata"] == {"name": "lamp", "labels": {SHARD_LABEL: "3"}}  # only the label: nothing else owned
    assert answer is not None


def test_nothing_is_written_with_one_shard_or_when_the_label_is_right() -> None:
    assert ensure(1, "devices", {}, 0) == (None, [])
    assert ensure(2, "devices", {SHARD_LABEL: "1"}, 1) == (None, [])
    _, (sent,) = ensure(2, "devices", {SHARD_LABEL: "0"}, 1)  # a wrong label is corrected
    assert sent["body"]["metadata"]["labels"] == {SHARD_LABEL: "1"}


@pytest.mark.parametrize(("plural", "shard", "says"), [
    ("devices", 2, "shard 2 is outside 0..1"),
    ("approvals", 0, "only devices, intents carry a shard label"),
])
def test_a_shard_or_kind_that_cannot_be_is_refused(plural: str, shard: int, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        ensure(2, plural, {}, shard)
