"""Ready-made fleets for `corral sim --preset NAME`."""

from __future__ import annotations

from corral_sim.fleet import DeviceSpec

# A household of 43 devices in 8 rooms: (room, device id, device type).
HOME: tuple[tuple[str, str, str], ...] = (
    ("living room", "living-ac", "thermostat"),
    ("living room", "living-climate", "env_fan"),
    ("living room", "living-ceiling-light", "light"),
    ("living room", "living-floor-lamp", "light"),
    ("living room", "living-tv-strip", "rgb_light"),
    ("living room", "living-blind-left", "blind"),
    ("living room", "living-blind-right", "blind"),
    ("living room", "living-tv-plug", "relay"),
    ("living room", "living-window", "door_contact"),
    ("kitchen", "kitchen-climate", "sht30"),
    ("kitchen", "kitchen-light", "light"),
    ("kitchen", "kitchen-coffee-plug", "relay"),
    ("kitchen", "kitchen-sink-valve", "water_valve"),
    ("kitchen", "kitchen-scale", "scale"),
    ("kitchen", "kitchen-window", "door_contact"),
    ("bedroom", "bedroom-ac", "thermostat"),
    ("bedroom", "bedroom-fan", "env_fan"),
    ("bedroom", "bedroom-light", "light"),
    ("bedroom", "bedroom-lamp", "rgb_light"),
    ("bedroom", "bedroom-blind", "blind"),
    ("bedroom", "bedroom-window", "door_contact"),
    ("kids room", "kids-climate", "sht30"),
    ("kids room", "kids-light", "light"),
    ("kids room", "kids-nightlight", "rgb_light"),
    ("kids room", "kids-blind", "blind"),
    ("kids room", "kids-window", "door_contact"),
    ("bathroom", "bathroom-climate", "sht30"),
    ("bathroom", "bathroom-fan", "env_fan"),
    ("bathroom", "bathroom-light", "light"),
    ("bathroom", "bathroom-window", "door_contact"),
    ("hallway", "front-door-lock", "lock"),
    ("hallway", "front-door", "door_contact"),
    ("hallway", "hallway-light", "light"),
    ("office", "office-heater", "space_heater"),
    ("office", "office-light", "light"),
    ("office", "office-blind", "blind"),
    ("office", "office-monitor-plug", "relay"),
    ("utility room", "main-water-valve", "water_valve"),
    ("utility room", "washer-plug", "relay"),
    ("utility room", "pet-feeder", "pet_feeder"),
    ("utility room", "pet-water-scale", "scale"),
    ("utility room", "back-door-lock", "lock"),
    ("utility room", "leak-probe", "leak_probe"),  # under the main water valve (docs/controller.md, Interlocks)
)

# What the people of that household call each device (the demo sets them as the Devices' overlay, with the
# room as the location): the approval card reads "Front door · Hallway", not the device id twice.
HOME_ALIASES: dict[str, str] = {
    "living-ac": "Living room AC", "living-climate": "Living room climate", "living-ceiling-light": "Ceiling light",
    "living-floor-lamp": "Floor lamp", "living-tv-strip": "TV light strip", "living-blind-left": "Left blind",
    "living-blind-right": "Right blind", "living-tv-plug": "TV plug", "living-window": "Living room window",
    "kitchen-climate": "Kitchen climate", "kitchen-light": "Kitchen light", "kitchen-coffee-plug": "Coffee machine",
    "kitchen-sink-valve": "Sink water valve", "kitchen-scale": "Kitchen scale", "kitchen-window": "Kitchen window",
    "bedroom-ac": "Bedroom AC", "bedroom-fan": "Bedroom fan", "bedroom-light": "Bedroom light",
    "bedroom-lamp": "Bedside lamp", "bedroom-blind": "Bedroom blind", "bedroom-window": "Bedroom window",
    "kids-climate": "Kids' room climate", "kids-light": "Kids' room light", "kids-nightlight": "Night light",
    "kids-blind": "Kids' room blind", "kids-window": "Kids' room window",
    "bathroom-climate": "Bathroom climate", "bathroom-fan": "Bathroom fan", "bathroom-light": "Bathroom light",
    "bathroom-window": "Bathroom window",
    "front-door-lock": "Front door", "front-door": "Front door contact", "hallway-light": "Hallway light",
    "office-heater": "Office heater", "office-light": "Office light", "office-blind": "Office blind",
    "office-monitor-plug": "Monitor plug",
    "main-water-valve": "Main water valve", "washer-plug": "Washing machine", "pet-feeder": "Pet feeder",
    "pet-water-scale": "Pet water bowl", "back-door-lock": "Back door", "leak-probe": "Leak probe",
}

PRESETS: dict[str, tuple[tuple[str, str, str], ...]] = {"home": HOME}
ALIASES: dict[str, dict[str, str]] = {"home": HOME_ALIASES}


def overlay_of(name: str) -> dict[str, dict[str, str]]:
    """Device id -> the overlay a preset's household gives it (alias, and the room as its location)."""
    aliases = ALIASES.get(name, {})
    return {device_id: {"alias": aliases.get(device_id, ""), "location": room[:1].upper() + room[1:]}
            for room, device_id, _ in PRESETS[name]}


def preset(name: str) -> list[DeviceSpec]:
    try:
        entries = PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown preset {name!r}; available: {', '.join(sorted(PRESETS))}") from None
    return [DeviceSpec(device_type, device_id, room) for room, device_id, device_type in entries]
