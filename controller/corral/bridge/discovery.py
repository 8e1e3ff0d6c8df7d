"""Reading Home Assistant MQTT discovery: a retained config message becomes Components, as Home Assistant reads it.

Pure: no MQTT. The bridge feeds every message on `<prefix>/+/+/config`, `<prefix>/+/+/+/config` here
(`read_config`), keeps what each topic last said (`Catalog`) and groups the components into devices.

What is read, following Home Assistant's own discovery code (homeassistant/components/mqtt/discovery.py):

- Topics `<prefix>/<component>/[<node_id>/]<object_id>/config`, ids of `[a-zA-Z0-9_-]`; and device-based
  discovery `<prefix>/device/[<node_id>/]<object_id>/config`, one message whose `components` (`cmps`) maps
  each component's object id to its configuration with its `platform` (`p`); the device's `device`, `origin`
  and shared options (availability, state_topic, command_topic, qos, encoding) apply to every component that
  does not set them itself.
- The payload is a JSON object; an empty payload (or an empty object) removes what the topic announced.
- Every abbreviated key is expanded (Home Assistant's list: ABBREVIATIONS, DEVICE_ABBREVIATIONS,
  ORIGIN_ABBREVIATIONS), also in availability entries and device-based components.
- The base topic `~`: in a key ending in `topic` (and an availability entry's `topic`), a leading or trailing
  `~` is replaced with the base.

What is left out, with a reason (a LeftOut, shown to people; never an exception): a payload over
MAX_CONFIG_BYTES, not UTF-8 or not a JSON object; a component the bridge does not map (model.COMPONENTS); a
device without identifiers or connections, or device-based discovery without device, origin or components (Home
Assistant refuses these too); a topic that is not text, empty, too long, contains NUL or a wildcard, or lies in a
reserved namespace (the bridge subscribes and publishes only exact topics of the device's own); availability that
is malformed. Text the device supplies (names, models, payloads) stays raw here; the mapping sanitizes it.

Which device a component belongs to (DeviceKey): source `ha:<node id>` from the topic alone, whose publisher the broker
pins (its node id, else its object id; never the payload's claim), identifier the device's identifiers[0], else its
first connection `type:value`, else the node id, else the unique_id, else the object id.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from corral.bridge.model import COMPONENTS, Component, DeviceInfo, DeviceKey, Discovered, LeftOut

MAX_CONFIG_BYTES = 16 * 1024
MAX_TOPIC = 512
MAX_COMPONENTS = 64  # in one device-based message
MAX_AVAILABILITY = 8
MAX_IDENTIFIER = 256  # a device identifier or unique_id longer than this does not name a device
RESERVED_TOPIC_PREFIXES = ("iot/", "$")  # Corral's own device protocol, and the broker's own topics
DEFAULT_PREFIX = "homeassistant"
DEVICE = "device"  # the component name of device-based discovery
TOPIC_BASE = "~"

# Home Assistant's abbreviations (homeassistant/components/mqtt/abbreviations.py), with the keys added since
# (components, platform, origin, reports_position, the kelvin and state_jammed keys, ...).
ABBREVIATIONS: dict[str, str] = {
    "act_t": "action_topic", "act_tpl": "action_template", "atype": "automation_type",
    "aux_cmd_t": "aux_command_topic", "aux_stat_tpl": "aux_state_template", "aux_stat_t": "aux_state_topic",
    "av_tones": "available_tones", "avty": "availability", "avty_mode": "availability_mode",
    "avty_t": "availability_topic", "avty_tpl": "availability_template",
    "away_mode_cmd_t": "away_mode_command_topic", "away_mode_stat_tpl": "away_mode_state_template",
    "away_mode_stat_t": "away_mode_state_topic", "b_tpl": "blue_template",
    "bri_cmd_tpl": "brightness_command_template", "bri_cmd_t": "brightness_command_topic",
    "bri_scl": "brightness_scale", "bri_stat_t": "brightness_state_topic", "bri_tpl": "brightness_template",
    "bri_val_tpl": "brightness_value_template", "bat_lev_t": "battery_level_topic",
    "bat_lev_tpl": "battery_level_template", "chrg_t": "charging_topic", "chrg_tpl": "charging_template",
    "clrm": "color_mode", "clrm_stat_t": "color_mode_state_topic", "clrm_val_tpl": "color_mode_value_template",
    "clr_temp_cmd_tpl": "color_temp_command_template", "clr_temp_cmd_t": "color_temp_command_topic",
    "clr_temp_k": "color_temp_kelvin", "clr_temp_stat_t": "color_temp_state_topic",
    "clr_temp_tpl": "color_temp_template", "clr_temp_val_tpl": "color_temp_value_template",
    "cln_t": "cleaning_topic", "cln_tpl": "cleaning_template", "cmd_off_tpl": "command_off_template",
    "cmd_on_tpl": "command_on_template", "cmd_t": "command_topic", "cmd_tpl": "command_template",
    "cmps": "components", "cod_arm_req": "code_arm_required", "cod_dis_req": "code_disarm_required",
    "cod_trig_req": "code_trigger_required", "cont_type": "content_type",
    "curr_temp_t": "current_temperature_topic", "curr_temp_tpl": "current_temperature_template",
    "def_ent_id": "default_entity_id", "dev": "device", "dev_cla": "device_class",
    "dir_cmd_t": "direction_command_topic", "dir_cmd_tpl": "direction_command_template",
    "dir_stat_t": "direction_state_topic", "dir_val_tpl": "direction_value_template",
    "dock_t": "docked_topic", "dock_tpl": "docked_template", "dsp_prc": "display_precision", "e": "encoding",
    "en": "enabled_by_default", "ent_cat": "entity_category", "ent_pic": "entity_picture",
    "err_t": "error_topic", "err_tpl": "error_template", "evt_typ": "event_types",
    "fanspd_t": "fan_speed_topic", "fanspd_tpl": "fan_speed_template", "fanspd_lst": "fan_speed_list",
    "flsh": "flash", "flsh_tlng": "flash_time_long", "flsh_tsht": "flash_time_short",
    "fx_cmd_tpl": "effect_command_template", "fx_cmd_t": "effect_command_topic", "fx_list": "effect_list",
    "fx_stat_t": "effect_state_topic", "fx_tpl": "effect_template", "fx_val_tpl": "effect_value_template",
    "exp_aft": "expire_after", "fan_mode_cmd_tpl": "fan_mode_command_template",
    "fan_mode_cmd_t": "fan_mode_command_topic", "fan_mode_stat_tpl": "fan_mode_state_template",
    "fan_mode_stat_t": "fan_mode_state_topic", "frc_upd": "force_update", "g_tpl": "green_template",
    "hold_cmd_tpl": "hold_command_template", "hold_cmd_t": "hold_command_topic",
    "hold_stat_tpl": "hold_state_template", "hold_stat_t": "hold_state_topic",
    "hs_cmd_t": "hs_command_topic", "hs_cmd_tpl": "hs_command_template", "hs_stat_t": "hs_state_topic",
    "hs_val_tpl": "hs_value_template", "ic": "icon", "img_e": "image_encoding", "img_t": "image_topic",
    "init": "initial", "hum_cmd_t": "target_humidity_command_topic",
    "hum_cmd_tpl": "target_humidity_command_template", "hum_stat_t": "target_humidity_state_topic",
    "hum_state_tpl": "target_humidity_state_template", "json_attr": "json_attributes",
    "json_attr_t": "json_attributes_topic", "json_attr_tpl": "json_attributes_template",
    "l_ver_t": "latest_version_topic", "l_ver_tpl": "latest_version_template",
    "lrst_t": "last_reset_topic", "lrst_val_tpl": "last_reset_value_template", "max": "max", "min": "min",
    "max_hum": "max_humidity", "min_hum": "min_humidity", "max_k": "max_kelvin", "min_k": "min_kelvin",
    "max_mirs": "max_mireds", "min_mirs": "min_mireds", "max_temp": "max_temp", "min_temp": "min_temp",
    "migr_discvry": "migrate_discovery", "mode": "mode", "mode_cmd_tpl": "mode_command_template",
    "mode_cmd_t": "mode_command_topic", "mode_stat_t": "mode_state_topic",
    "mode_stat_tpl": "mode_state_template", "modes": "modes", "name": "name", "o": "origin",
    "obj_id": "object_id", "off_dly": "off_delay", "on_cmd_type": "on_command_type", "ops": "options",
    "opt": "optimistic", "osc_cmd_t": "oscillation_command_topic", "osc_cmd_tpl": "oscillation_command_template",
    "osc_stat_t": "oscillation_state_topic", "osc_val_tpl": "oscillation_value_template", "p": "platform",
    "pct_cmd_t": "percentage_command_topic", "pct_cmd_tpl": "percentage_command_template",
    "pct_stat_t": "percentage_state_topic", "pct_val_tpl": "percentage_value_template", "pl": "payload",
    "pl_arm_away": "payload_arm_away", "pl_arm_home": "payload_arm_home", "pl_arm_nite": "payload_arm_night",
    "pl_arm_vacation": "payload_arm_vacation", "pl_arm_custom_b": "payload_arm_custom_bypass",
    "pl_avail": "payload_available", "pl_cln_sp": "payload_clean_spot", "pl_cls": "payload_close",
    "pl_dir_fwd": "payload_direction_forward", "pl_dir_rev": "payload_direction_reverse",
    "pl_disarm": "payload_disarm", "pl_hi_spd": "payload_high_speed", "pl_home": "payload_home",
    "pl_inst": "payload_install", "pl_lock": "payload_lock", "pl_loc": "payload_locate",
    "pl_lo_spd": "payload_low_speed", "pl_med_spd": "payload_medium_speed",
    "pl_not_avail": "payload_not_available", "pl_not_home": "payload_not_home", "pl_off": "payload_off",
    "pl_off_spd": "payload_off_speed", "pl_on": "payload_on", "pl_open": "payload_open",
    "pl_osc_off": "payload_oscillation_off", "pl_osc_on": "payload_oscillation_on", "pl_paus": "payload_pause",
    "pl_prs": "payload_press", "pl_rst": "payload_reset", "pl_rst_hum": "payload_reset_humidity",
    "pl_rst_mode": "payload_reset_mode", "pl_rst_pct": "payload_reset_percentage",
    "pl_rst_pr_mode": "payload_reset_preset_mode", "pl_stop": "payload_stop",
    "pl_stop_tilt": "payload_stop_tilt", "pl_strt": "payload_start", "pl_stpa": "payload_start_pause",
    "pl_ret": "payload_return_to_base", "pl_toff": "payload_turn_off", "pl_ton": "payload_turn_on",
    "pl_trig": "payload_trigger", "pl_unlk": "payload_unlock", "pos": "reports_position",
    "pos_clsd": "position_closed", "pos_open": "position_open", "pow_cmd_t": "power_command_topic",
    "pow_stat_t": "power_state_topic", "pow_stat_tpl": "power_state_template",
    "pr_mode_cmd_t": "preset_mode_command_topic", "pr_mode_cmd_tpl": "preset_mode_command_template",
    "pr_mode_stat_t": "preset_mode_state_topic", "pr_mode_val_tpl": "preset_mode_value_template",
    "pr_modes": "preset_modes", "ptrn": "pattern", "r_tpl": "red_template", "rel_s": "release_summary",
    "rel_u": "release_url", "ret": "retain", "rgb_cmd_tpl": "rgb_command_template",
    "rgb_cmd_t": "rgb_command_topic", "rgb_stat_t": "rgb_state_topic", "rgb_val_tpl": "rgb_value_template",
    "rgbw_cmd_tpl": "rgbw_command_template", "rgbw_cmd_t": "rgbw_command_topic",
    "rgbw_stat_t": "rgbw_state_topic", "rgbw_val_tpl": "rgbw_value_template",
    "rgbww_cmd_tpl": "rgbww_command_template", "rgbww_cmd_t": "rgbww_command_topic",
    "rgbww_stat_t": "rgbww_state_topic", "rgbww_val_tpl": "rgbww_value_template",
    "send_cmd_t": "send_command_topic", "send_if_off": "send_if_off", "set_fan_spd_t": "set_fan_speed_topic",
    "set_pos_tpl": "set_position_template", "set_pos_t": "set_position_topic", "pos_t": "position_topic",
    "pos_tpl": "position_template", "spd_cmd_t": "speed_command_topic", "spd_stat_t": "speed_state_topic",
    "spd_rng_min": "speed_range_min", "spd_rng_max": "speed_range_max", "spd_val_tpl": "speed_value_template",
    "spds": "speeds", "src_type": "source_type", "stat_cla": "state_class", "stat_clsd": "state_closed",
    "stat_closing": "state_closing", "stat_jam": "state_jammed", "stat_locked": "state_locked",
    "stat_locking": "state_locking", "stat_off": "state_off", "stat_on": "state_on", "stat_open": "state_open",
    "stat_opening": "state_opening", "stat_stopped": "state_stopped", "stat_unlocked": "state_unlocked",
    "stat_unlocking": "state_unlocking", "stat_t": "state_topic", "stat_tpl": "state_template",
    "stat_val_tpl": "state_value_template", "step": "step", "stype": "subtype",
    "sug_dsp_prc": "suggested_display_precision", "sup_dur": "support_duration", "sup_vol": "support_volume_set",
    "sup_feat": "supported_features", "sup_clrm": "supported_color_modes",
    "swing_mode_cmd_tpl": "swing_mode_command_template", "swing_mode_cmd_t": "swing_mode_command_topic",
    "swing_mode_stat_tpl": "swing_mode_state_template", "swing_mode_stat_t": "swing_mode_state_topic",
    "temp_cmd_tpl": "temperature_command_template", "temp_cmd_t": "temperature_command_topic",
    "temp_hi_cmd_tpl": "temperature_high_command_template", "temp_hi_cmd_t": "temperature_high_command_topic",
    "temp_hi_stat_tpl": "temperature_high_state_template", "temp_hi_stat_t": "temperature_high_state_topic",
    "temp_lo_cmd_tpl": "temperature_low_command_template", "temp_lo_cmd_t": "temperature_low_command_topic",
    "temp_lo_stat_tpl": "temperature_low_state_template", "temp_lo_stat_t": "temperature_low_state_topic",
    "temp_stat_tpl": "temperature_state_template", "temp_stat_t": "temperature_state_topic",
    "temp_unit": "temperature_unit", "tilt_clsd_val": "tilt_closed_value", "tilt_cmd_t": "tilt_command_topic",
    "tilt_cmd_tpl": "tilt_command_template", "tilt_inv_stat": "tilt_invert_state", "tilt_max": "tilt_max",
    "tilt_min": "tilt_min", "tilt_opnd_val": "tilt_opened_value", "tilt_opt": "tilt_optimistic",
    "tilt_status_t": "tilt_status_topic", "tilt_status_tpl": "tilt_status_template", "tit": "title",
    "trns": "transition", "t": "topic", "uniq_id": "unique_id", "unit_of_meas": "unit_of_measurement",
    "url_t": "url_topic", "url_tpl": "url_template", "val_tpl": "value_template",
    "whit_cmd_t": "white_command_topic", "whit_scl": "white_scale", "whit_val_cmd_t": "white_value_command_topic",
    "whit_val_scl": "white_value_scale", "whit_val_stat_t": "white_value_state_topic",
    "whit_val_tpl": "white_value_template", "xy_cmd_t": "xy_command_topic", "xy_cmd_tpl": "xy_command_template",
    "xy_stat_t": "xy_state_topic", "xy_val_tpl": "xy_value_template",
}
DEVICE_ABBREVIATIONS: dict[str, str] = {
    "cns": "connections", "cu": "configuration_url", "ids": "identifiers", "name": "name", "mf": "manufacturer",
    "mdl": "model", "mdl_id": "model_id", "hw": "hw_version", "sw": "sw_version", "sa": "suggested_area",
    "sn": "serial_number", "via_dev": "via_device",
}
ORIGIN_ABBREVIATIONS: dict[str, str] = {"name": "name", "sw": "sw_version", "url": "support_url"}

# Device-based discovery: options at the device level that its components inherit unless they set them
# (Home Assistant's SHARED_OPTIONS, and qos/encoding as its documentation lists them).
SHARED_OPTIONS: tuple[str, ...] = ("availability", "availability_mode", "availability_template",
                                   "availability_topic", "command_topic", "payload_available",
                                   "payload_not_available", "state_topic", "qos", "encoding")
AVAILABILITY_MODES: tuple[str, ...] = ("all", "any", "latest")
DEFAULT_PAYLOAD_AVAILABLE = "online"
DEFAULT_PAYLOAD_NOT_AVAILABLE = "offline"


@dataclass(frozen=True)
class LeftOutAt:
    """Something a message announced that is left out, and the device it belongs to."""

    key: DeviceKey
    device: DeviceInfo
    item: LeftOut


@dataclass(frozen=True)
class Reading:
    """What one discovery message says. `removed`: an empty payload (what the topic announced is gone).
    `ignored`: the topic is not a discovery config topic (a sentence; nothing else is set)."""

    topic: str
    components: tuple[Component, ...] = ()
    left_out: tuple[LeftOutAt, ...] = ()
    removed: bool = False
    ignored: str = ""


@dataclass(frozen=True)
class AvailabilityTopic:
    topic: str
    payload_available: str = DEFAULT_PAYLOAD_AVAILABLE
    payload_not_available: str = DEFAULT_PAYLOAD_NOT_AVAILABLE
    value_template: str | None = None


@dataclass(frozen=True)
class Availability:
    """A component's availability: `latest` (the last message on any topic decides), `all` (online when all are),
    `any` (online when one is). No topics: always available while the source is connected."""

    mode: Literal["all", "any", "latest"] = "latest"
    topics: tuple[AvailabilityTopic, ...] = ()


@dataclass(frozen=True)
class _Topic:
    prefix: str
    component: str
    node_id: str | None
    object_id: str


class _Malformed(Exception):
    """A configuration that cannot be read; the message is the reason (a sentence fragment)."""


def _valid_id(text: str) -> bool:
    return 0 < len(text) <= 128 and all(c.isascii() and (c.isalnum() or c in "_-") for c in text)


def parse_topic(topic: str, prefix: str = DEFAULT_PREFIX) -> _Topic | str:
    """The parts of a discovery topic, or why it is not one."""
    if not topic.startswith(prefix + "/"):
        return f"the topic is not under the discovery prefix {prefix!r}"
    parts = topic[len(prefix) + 1:].split("/")
    if len(parts) not in (3, 4) or parts[-1] != "config":
        return "the topic is not <prefix>/<component>/[<node_id>/]<object_id>/config"
    component, *ids = parts[:-1]
    if not (component and all(c.isascii() and (c.isalnum() or c == "_") for c in component) and len(component) <= 64):
        return "the topic's component is not a word"
    if not all(_valid_id(part) for part in ids):
        return "the topic's node or object id has characters outside [a-zA-Z0-9_-]"
    node_id, object_id = (ids[0], ids[1]) if len(ids) == 2 else (None, ids[0])
    return _Topic(prefix, component, node_id, object_id)


def _expand(payload: dict[str, Any], abbreviations: Mapping[str, str]) -> None:
    # As Home Assistant does: an abbreviation wins over the full key when both are present.
    for key in [k for k in payload if k in abbreviations]:
        payload[abbreviations[key]] = payload.pop(key)


def _expand_all(payload: dict[str, Any], component_only: bool = False) -> None:
    _expand(payload, ABBREVIATIONS)
    entries = payload.get("availability")
    for entry in entries if isinstance(entries, list) else [entries]:
        if isinstance(entry, dict):
            _expand(entry, ABBREVIATIONS)
    if component_only:
        return
    for key, abbreviations in (("origin", ORIGIN_ABBREVIATIONS), ("device", DEVICE_ABBREVIATIONS)):
        if isinstance(payload.get(key), dict):
            _expand(payload[key], abbreviations)
    components = payload.get("components")
    if isinstance(components, dict):
        for config in components.values():
            if isinstance(config, dict):
                _expand_all(config, component_only=True)


def _replace_base(config: dict[str, Any]) -> None:
    if TOPIC_BASE not in config:
        return
    base = config.pop(TOPIC_BASE)
    if not isinstance(base, str):
        raise _Malformed("its base topic ~ is not text")

    def substituted(value: str) -> str:
        # Exactly as Home Assistant: both tests look at the value as written, so for `~/x/~` the trailing
        # substitution is the one that stays (`~/x/<base>`), which is the topic the device expects to be used.
        result = value
        if value.startswith(TOPIC_BASE):
            result = base + value[1:]
        if value.endswith(TOPIC_BASE):
            result = value[:-1] + base
        return result

    for key, value in list(config.items()):
        if key.endswith("topic") and isinstance(value, str) and value:
            config[key] = substituted(value)
    entries = config.get("availability")
    for entry in entries if isinstance(entries, list) else [entries]:
        if isinstance(entry, dict) and isinstance(entry.get("topic"), str) and entry["topic"]:
            entry["topic"] = substituted(entry["topic"])


def _check_topic(key: str, value: object) -> None:
    if not isinstance(value, str):
        raise _Malformed(f"its {key} is not text")
    if not value or len(value) > MAX_TOPIC or "\0" in value:
        raise _Malformed(f"its {key} is empty, longer than {MAX_TOPIC} characters or contains NUL")
    if "+" in value or "#" in value:
        raise _Malformed(f"its {key} {value[:60]!r} contains an MQTT wildcard (the bridge uses exact topics only)")
    if value.startswith(RESERVED_TOPIC_PREFIXES):
        raise _Malformed(f"its {key} {value[:60]!r} lies in a namespace reserved for Corral or the broker")


def _text(value: object) -> str | None:
    # Home Assistant's cv.string: text, or a number written as text.
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return None


def availability(config: Mapping[str, Any]) -> Availability:
    """A component's availability, from a configuration read_config accepted (availability_topic with
    payload_available/payload_not_available/availability_template, or the availability list)."""
    mode = config.get("availability_mode", "latest")
    checked_mode: Literal["all", "any", "latest"] = mode if mode in ("all", "any") else "latest"
    topics: list[AvailabilityTopic] = []
    if isinstance(config.get("availability_topic"), str):
        topics.append(AvailabilityTopic(
            config["availability_topic"],
            _text(config.get("payload_available", DEFAULT_PAYLOAD_AVAILABLE)) or DEFAULT_PAYLOAD_AVAILABLE,
            _text(config.get("payload_not_available", DEFAULT_PAYLOAD_NOT_AVAILABLE)) or DEFAULT_PAYLOAD_NOT_AVAILABLE,
            config.get("availability_template") if isinstance(config.get("availability_template"), str) else None))
    entries = config.get("availability")
    for entry in (entries if isinstance(entries, list) else [entries] if entries else []):
        if isinstance(entry, dict) and isinstance(entry.get("topic"), str):
            template = entry.get("value_template")
            topics.append(AvailabilityTopic(
                entry["topic"],
                _text(entry.get("payload_available", DEFAULT_PAYLOAD_AVAILABLE)) or DEFAULT_PAYLOAD_AVAILABLE,
                _text(entry.get("payload_not_available", DEFAULT_PAYLOAD_NOT_AVAILABLE))
                or DEFAULT_PAYLOAD_NOT_AVAILABLE,
                template if isinstance(template, str) else None))
    return Availability(checked_mode, tuple(topics))


def _check_availability(config: Mapping[str, Any]) -> None:
    mode = config.get("availability_mode", "latest")
    if mode not in AVAILABILITY_MODES:
        raise _Malformed("its availability_mode is not one of all, any, latest")
    if "availability_topic" in config and "availability" in config:
        raise _Malformed("it has both availability_topic and availability (Home Assistant refuses that too)")
    if "availability_topic" in config:
        _check_topic("availability_topic", config["availability_topic"])
    for key in ("payload_available", "payload_not_available"):
        if key in config and _text(config[key]) is None:
            raise _Malformed(f"its {key} is not text")
    if "availability" not in config:
        return
    entries = config["availability"]
    entries = entries if isinstance(entries, list) else [entries]
    if len(entries) > MAX_AVAILABILITY:
        raise _Malformed(f"it has more than {MAX_AVAILABILITY} availability topics")
    for entry in entries:
        if not isinstance(entry, dict) or "topic" not in entry:
            raise _Malformed("an entry of its availability has no topic")
        _check_topic("availability topic", entry["topic"])
        for key in ("payload_available", "payload_not_available"):
            if key in entry and _text(entry[key]) is None:
                raise _Malformed(f"its availability {key} is not text")


def _check_device(device: object) -> None:
    if not isinstance(device, dict):
        raise _Malformed("its device is not a JSON object")
    if not _identifier(device, MAX_CONFIG_BYTES):
        raise _Malformed("its device has neither identifiers nor connections (Home Assistant refuses that too)")
    if not _identifier(device):
        raise _Malformed(f"its device identifier is longer than {MAX_IDENTIFIER} characters")


def _identifier(device: Mapping[str, Any], limit: int = MAX_IDENTIFIER) -> str:
    """identifiers[0], else the first connection as `type:value`; "" when none (or longer than limit)."""
    ids = device.get("identifiers")
    first = ids[0] if isinstance(ids, list) and ids else ids
    text = _text(first) or ""
    if not text:
        connections = device.get("connections")
        pair = connections[0] if isinstance(connections, list) and connections else None
        if isinstance(pair, list) and len(pair) == 2 and all(_text(p) is not None for p in pair):
            text = f"{_text(pair[0])}:{_text(pair[1])}"
    return text if len(text) <= limit else ""


def device_info(device: object) -> DeviceInfo:
    """What the device says about itself (raw text; not text: empty)."""
    if not isinstance(device, dict):
        return DeviceInfo()
    return DeviceInfo(name=_text(device.get("name")) or "", manufacturer=_text(device.get("manufacturer")) or "",
                      model=_text(device.get("model")) or "", sw_version=_text(device.get("sw_version")) or "")


def _check_config(config: dict[str, Any]) -> None:
    for key, value in config.items():
        if key.endswith("_topic"):
            _check_topic(key, value)
    _check_availability(config)
    if "device" in config:
        _check_device(config["device"])


def _key(where: _Topic, config: Mapping[str, Any], node_id: str | None) -> DeviceKey:
    device = config.get("device")
    identifier = _identifier(device) if isinstance(device, dict) else ""
    unique_id = _text(config.get("unique_id")) or ""
    unique_id = unique_id if len(unique_id) <= MAX_IDENTIFIER else ""
    identifier = identifier or node_id or unique_id or where.object_id
    return DeviceKey(source=f"ha:{node_id or where.object_id}", identifier=identifier)  # the topic's publisher


def _decode(payload: bytes) -> dict[str, Any]:
    try:
        text = payload.decode("utf-8")
        data = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as err:
        raise _Malformed("its payload is not UTF-8 JSON") from err
    if not isinstance(data, dict):
        raise _Malformed("its payload is not a JSON object")
    return data


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def read_config(topic: str, payload: bytes, prefix: str = DEFAULT_PREFIX) -> Reading:
    """One retained discovery message, read as Home Assistant reads it (see the module). Never raises."""
    where = parse_topic(topic, prefix)
    if isinstance(where, str):
        return Reading(topic, ignored=where)
    if not payload:
        return Reading(topic, removed=True)
    what = f"{where.component}.{where.object_id}"
    fallback = DeviceKey(f"ha:{where.node_id or where.object_id}", where.node_id or where.object_id)
    if len(payload) > MAX_CONFIG_BYTES:
        return _refused(topic, fallback, what, f"its discovery payload is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        data = _decode(payload)
    except _Malformed as err:
        return _refused(topic, fallback, what, str(err))
    if not data and where.component != DEVICE:
        return Reading(topic, removed=True)  # Home Assistant: an empty object is an empty config, a removal
    try:
        if where.component == DEVICE:
            return _read_device(topic, where, data)
        return _read_component(topic, where, data)
    except (_Malformed, RecursionError) as err:
        # RecursionError: a payload nested deep enough to exhaust the stack while being copied.
        return _refused(topic, fallback, what, str(err) if isinstance(err, _Malformed) else "it is nested too deep")


def _refused(topic: str, key: DeviceKey, what: str, reason: str) -> Reading:
    return Reading(topic, left_out=(LeftOutAt(key, DeviceInfo(), LeftOut(what, _sentence(reason))),))


def _sentence(reason: str) -> str:
    return reason[:1].upper() + reason[1:] + ("" if reason.endswith(".") else ".")


def _read_component(topic: str, where: _Topic, config: dict[str, Any]) -> Reading:
    _expand_all(config)
    if "origin" in config and not (isinstance(config["origin"], dict) and _text(config["origin"].get("name"))):
        raise _Malformed("its origin has no name (Home Assistant refuses that too)")
    _replace_base(config)
    return _component_reading(topic, where, where.component, where.object_id, config, where.node_id)


def _component_reading(topic: str, where: _Topic, component: str, object_id: str, config: dict[str, Any],
                       node_id: str | None) -> Reading:
    device = config.get("device")
    key = _key(where, config, node_id)
    info = device_info(device)
    what = f"{component}.{object_id}"
    if component not in COMPONENTS:
        reason = f"Home Assistant component {component[:40]!r} is not one the bridge maps ({', '.join(COMPONENTS)})."
        return Reading(topic, left_out=(LeftOutAt(key, info, LeftOut(what, reason)),))
    try:
        _check_config(config)
    except _Malformed as err:
        return Reading(topic, left_out=(LeftOutAt(key, info, LeftOut(what, _sentence(str(err)))),))
    return Reading(topic, components=(Component(key, component, object_id, config, info, topic),))


def _read_device(topic: str, where: _Topic, payload: dict[str, Any]) -> Reading:
    _expand_all(payload)
    device, origin, components = payload.get("device"), payload.get("origin"), payload.get("components")
    if not isinstance(origin, dict) or not _text(origin.get("name")):
        raise _Malformed("its device-based discovery has no origin with a name (Home Assistant refuses that too)")
    _check_device(device)
    if not isinstance(components, dict) or not components:
        raise _Malformed("its device-based discovery has no components")
    if len(components) > MAX_COMPONENTS:
        raise _Malformed(f"its device-based discovery has more than {MAX_COMPONENTS} components")
    node_id = where.node_id or where.object_id  # Home Assistant: the device's object id is its components' node
    found: list[Component] = []
    left_out: list[LeftOutAt] = []
    for object_id, config in components.items():
        if not isinstance(config, dict):
            key = _key(where, payload, node_id)
            left_out.append(LeftOutAt(key, device_info(device), LeftOut(
                f"{DEVICE}.{object_id[:64]}", "Its configuration is not a JSON object.")))
            continue
        config = dict(config)
        platform = config.pop("platform", None)
        if not _valid_id(object_id) or not isinstance(platform, str):
            key = _key(where, payload, node_id)
            left_out.append(LeftOutAt(key, device_info(device), LeftOut(
                f"{DEVICE}.{object_id[:64]}", "Its object id is not [a-zA-Z0-9_-] or it has no platform (p).")))
            continue
        if not config:
            continue  # Home Assistant: a component with only its platform is being removed
        config["device"] = device
        config["origin"] = origin
        for option in SHARED_OPTIONS:
            if option in payload and option not in config:
                config[option] = copy.deepcopy(payload[option])  # each component substitutes ~ in its own
        if TOPIC_BASE not in config and TOPIC_BASE in payload:
            config[TOPIC_BASE] = payload[TOPIC_BASE]
        try:
            _replace_base(config)
        except _Malformed as err:
            left_out.append(LeftOutAt(_key(where, config, node_id), device_info(device),
                                      LeftOut(f"{platform[:40]}.{object_id}", _sentence(str(err)))))
            continue
        reading = _component_reading(topic, where, platform, object_id, config, node_id)
        found.extend(reading.components)
        left_out.extend(reading.left_out)
    return Reading(topic, components=tuple(found), left_out=tuple(left_out))


@dataclass
class Catalog:
    """What every discovery topic last said, grouped into devices. The bridge feeds it every message."""

    prefix: str = DEFAULT_PREFIX
    readings: dict[str, Reading] = field(default_factory=dict)
    _topics: dict[DeviceKey, set[str]] = field(default_factory=dict)  # which topics speak of a device

    def update(self, topic: str, payload: bytes) -> set[DeviceKey]:
        """Read one message; the devices whose discovery changed (before or after)."""
        reading = read_config(topic, payload, self.prefix)
        if reading.ignored:
            return set()
        before = self.readings.pop(topic, None)
        for key in _keys(before):
            topics = self._topics.get(key, set())
            topics.discard(topic)
            if not topics:
                self._topics.pop(key, None)
        if not reading.removed:
            self.readings[topic] = reading
            for key in _keys(reading):
                self._topics.setdefault(key, set()).add(topic)
        return _keys(before) | _keys(reading)

    def devices(self) -> list[Discovered]:
        """Every device discovered, with its components and what was left out (ordered by key)."""
        return group(self.readings.values())

    def device(self, key: DeviceKey) -> Discovered | None:
        """One device as discovered now (None when nothing speaks of it any more)."""
        readings = [self.readings[topic] for topic in self._topics.get(key, ())]
        for found in group(readings):
            if found.key == key:
                return found
        return None


def _keys(reading: Reading | None) -> set[DeviceKey]:
    if reading is None:
        return set()
    return {c.key for c in reading.components} | {item.key for item in reading.left_out}


def group(readings: Iterable[Reading]) -> list[Discovered]:
    """Components and left-out items grouped into Discovered devices by DeviceKey. A device's information is the
    first non-empty one its components carry (ordered by discovery topic, then object id)."""
    components: dict[DeviceKey, list[Component]] = {}
    left_out: dict[DeviceKey, list[LeftOut]] = {}
    infos: dict[DeviceKey, DeviceInfo] = {}
    for reading in sorted(readings, key=lambda r: r.topic):
        for component in reading.components:
            components.setdefault(component.key, []).append(component)
            if component.device != DeviceInfo():
                infos.setdefault(component.key, component.device)
        for item in reading.left_out:
            left_out.setdefault(item.key, []).append(item.item)
            if item.device != DeviceInfo():
                infos.setdefault(item.key, item.device)
    keys = sorted(set(components) | set(left_out), key=lambda k: (k.source, k.identifier))
    return [Discovered(key, infos.get(key, DeviceInfo()),
                       tuple(sorted(components.get(key, []), key=lambda c: (c.component, c.object_id))),
                       tuple(left_out.get(key, [])))
            for key in keys]
