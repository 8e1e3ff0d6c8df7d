"""The Device controller: what devices say over MQTT (ingest), what the controller knows of them (runtime), and
reconciling each toward its Device's target (reconciler; before a plan, admission; around it, holds and failsafes;
after it, writes and status). Its inputs are mapped to device ids in wiring; the Devices are models in cache.
Around it: the driver (commands and acks), trust and capabilities (contracts), accounts and refusals (the broker),
notices (Events and records), targets (an Intent's target applied), and port (what the Intent controller may ask).
"""
