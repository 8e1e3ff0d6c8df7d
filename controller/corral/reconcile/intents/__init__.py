"""The Intent controller: gather the facts, let `decide` judge, then act on what it returned.

wiring.py (caches, queues, which watch events queue which keys) -> reconciler.py (one Intent: gather.py ->
corral.decide -> effects.py -> dispatch.py) -> one module per kind (actuate, read, overlay, lease) -> execute.py
(the per-Device execution queue). outcomes.py writes what was decided (audit record, status, Event); grants.py
and ratelimits.py keep the standing grants and each requester's Intents.
"""
