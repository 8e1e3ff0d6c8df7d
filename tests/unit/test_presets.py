"""The demo's household (corral_sim.presets): every device has a name a person would give it and the room it is in,
as valid overlay text, so the approval card reads "Front door" in the "Hallway"."""

from __future__ import annotations

from corral.api.device import Overlay
from corral_sim.presets import HOME, overlay_of


def test_every_device_of_the_home_has_an_alias_and_its_room_as_location() -> None:
    overlays = overlay_of("home")
    assert set(overlays) == {device_id for _, device_id, _ in HOME}
    for device_id, overlay in overlays.items():
        Overlay.model_validate(overlay)  # what the API server would accept
        assert overlay["alias"] and overlay["alias"] != device_id, device_id
    assert overlays["front-door-lock"] == {"alias": "Front door", "location": "Hallway"}
    assert overlays["back-door-lock"] == {"alias": "Back door", "location": "Utility room"}
    # Two devices called the same would be one too many to tell apart on a card.
    aliases = [o["alias"] for o in overlays.values()]
    assert len(set(aliases)) == len(aliases)
