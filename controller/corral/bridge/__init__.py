"""The bridge: devices that already describe themselves over MQTT (Home Assistant MQTT discovery, zigbee2mqtt's
exposes), brought under the same contract allow-list, trust and audit as Corral's own firmware (docs/bridge.md)."""
