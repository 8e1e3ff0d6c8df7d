"""Samples kept over time: the embedded store (SQLite, one file per controller ordinal), its rollups, retention.

- model.py: series keys, samples, how values are stored, the retention settings;
- schema.py: opening the file (WAL, pragmas) and its versioned migrations;
- store.py: the one writer (append, step buckets, prune) and read-only readers;
- buckets.py: step semantics, carry-forward and re-aggregation, pure;
- retention.py: bounded retention and the size bound (oldest first: raw, then 5-minute, then hourly);
- query.py, answers.py, times.py: reading back for an agent (limits, even downsampling, 32 KB answers, "24h");
- aio.py: the same for the event loop, every blocking call on a thread, samples staged and written a minute
  at a time.
Imports nothing of kopf, MQTT or MCP, nor of the rest of Corral: the controller wires it in (issue 42).

Sizing (bench/history_store.py, 3 metrics every 10 s): raw about 27 bytes a sample on disk, 0.70 MB per
device-day; 5-minute rollups about 51 KB and hourly about 4.4 KB per device-day. With the default retention
(raw 10 days, 5-minute 90, hourly 730) that is about 7 + 4.6 + 3.2 = 15 MB per device: a 10,000-device fleet needs
the size bound (Retention.max_bytes) or a volume of about 150 GB.
"""
