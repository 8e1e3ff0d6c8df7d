"""Objects become models where they enter: kube.typed.parse and kube.cache.TypedCache."""

from __future__ import annotations

from typing import Any

import pytest

from corral.api.pause import AgentPause
from corral.kube.cache import TypedCache
from corral.kube.typed import Body, Malformed, parse


def pause(version: str = "10", *, uid: str = "u1", paused: bool = True, **spec: Any) -> Body:
    return {"apiVersion": "corral.dev/v1alpha1", "kind": "AgentPause",
            "metadata": {"name": "agents", "namespace": "home", "uid": uid, "resourceVersion": version},
            "spec": {"paused": paused, "by": "ada", "since": "2026-12-02T10:00:00Z", **spec}}


def test_parse_gives_the_model_read_through_attributes() -> None:
    model = parse(AgentPause, pause(reason="storm coming"))
    assert isinstance(model, AgentPause)
    assert (model.metadata.namespace, model.metadata.name, model.metadata.resource_version) == ("home", "agents", "10")
    assert model.spec.paused is True and model.spec.reason == "storm coming" and model.spec.by == "ada"


def test_a_malformed_body_names_the_object_and_each_refused_field() -> None:
    body = pause(reason="line\nbreak")
    del body["spec"]["by"]
    with pytest.raises(Malformed) as caught:
        parse(AgentPause, body)
    err = caught.value
    assert (err.kind, err.namespace, err.name) == ("AgentPause", "home", "agents")
    assert str(err).startswith("AgentPause home/agents is malformed: ")
    fields = [problem.split(":")[0] for problem in err.problems]
    assert sorted(fields) == ["spec.by", "spec.reason"]
    assert "control characters" in str(err)
    assert isinstance(err, ValueError)


def test_a_body_without_usable_metadata_is_still_named_as_well_as_it_can_be() -> None:
    with pytest.raises(Malformed) as caught:
        parse(AgentPause, {"kind": "AgentPause", "metadata": "nonsense", "spec": {}})
    assert str(caught.value).startswith("AgentPause ? is malformed: ")


def test_many_refused_fields_are_cut_to_a_few_and_the_rest_counted() -> None:
    body = pause(reason=1, paused="maybe", by=2, since="never", extra=True)
    body["status"] = {"enforced": "perhaps", "message": 3}
    with pytest.raises(Malformed) as caught:
        parse(AgentPause, body)
    assert len(caught.value.problems) == 6 and caught.value.problems[-1] == "and 2 more"


def test_the_typed_cache_keeps_the_newer_version_and_ignores_an_older_one() -> None:
    cache: TypedCache[AgentPause] = TypedCache(AgentPause)
    first = cache.upsert(pause("10", paused=True))
    assert first is not None and first.created and first.after.spec.paused is True

    second = cache.upsert(pause("12", paused=False))
    assert second is not None and not second.created
    assert second.before is not None and second.before.spec.paused is True and second.after.spec.paused is False

    assert cache.upsert(pause("11", paused=True)) is None  # an older watch event after a newer write answer
    assert cache.upsert(pause("12", paused=False)) is None  # the same version again: nothing changed
    got = cache.get(("home", "agents"))
    assert got is not None and got.spec.paused is False and got.metadata.resource_version == "12"
    assert len(cache) == 1 and [key for key, _ in cache.items()] == [("home", "agents")]
    assert cache.body(("home", "agents")) == pause("12", paused=False)


def test_a_malformed_body_raises_and_leaves_nothing_of_that_object_cached() -> None:
    cache: TypedCache[AgentPause] = TypedCache(AgentPause)
    cache.upsert(pause("10"))
    with pytest.raises(Malformed, match=r"spec\.paused"):
        cache.upsert(pause("11", paused="sometimes"))
    assert ("home", "agents") not in cache and cache.get(("home", "agents")) is None
    assert cache.body(("home", "agents")) is None and len(cache) == 0

    again = cache.upsert(pause("12", paused=False))  # fixed by a later write: it enters as new
    assert again is not None and again.created and again.after.spec.paused is False


def test_a_deleted_object_stays_deleted_when_an_older_version_arrives_after_the_delete() -> None:
    cache: TypedCache[AgentPause] = TypedCache(AgentPause)
    cache.upsert(pause("10"))
    removed = cache.remove(pause("12"))
    assert removed is not None and removed.metadata.resource_version == "10"
    assert cache.upsert(pause("11")) is None  # a write answer that was on its way when DELETED came
    assert ("home", "agents") not in cache

    recreated = cache.upsert(pause("13", uid="u2"))  # a new object under the same name
    assert recreated is not None and recreated.created and recreated.after.metadata.uid == "u2"
