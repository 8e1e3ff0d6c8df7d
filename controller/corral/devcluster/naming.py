"""The demo's household names its devices: an alias and a location on each Device's overlay, as a person would.

Without them the approval card read "front-door-lock · front-door-lock · home"; with them it reads
"Front door" in the "Hallway", marked as what a person called it. A name someone has given a Device already
(with `iot.set_alias` or kubectl) is theirs: only Devices without an alias are named, so a restarted demo does
not undo a rename. Merge patches, as overlay Intents make them: overlay text is people's data, last writer wins,
and no field manager ends up owning it against the next writer.
"""

from __future__ import annotations

from collections.abc import Mapping

import kubernetes

from corral.api.codes import GROUP, VERSION


def name_devices(admin: kubernetes.client.ApiClient, namespace: str, overlays: Mapping[str, Mapping[str, str]],
                 field_manager: str) -> int:
    """Give each Device in `overlays` (name -> alias and location) that has no alias yet its overlay; the number
    named."""
    objects = kubernetes.client.CustomObjectsApi(admin)
    named = 0
    for item in objects.list_namespaced_custom_object(GROUP, VERSION, namespace, "devices")["items"]:
        name = item["metadata"]["name"]
        wanted, overlay = overlays.get(name), (item.get("spec") or {}).get("overlay") or {}
        if not wanted or overlay.get("alias"):
            continue
        fields = {key: text for key, text in wanted.items() if text and not overlay.get(key)}
        objects.patch_namespaced_custom_object(GROUP, VERSION, namespace, "devices", name,
                                               {"spec": {"overlay": fields}},
                                               field_manager=field_manager,
                                               _content_type="application/merge-patch+json")
        named += 1
    return named
