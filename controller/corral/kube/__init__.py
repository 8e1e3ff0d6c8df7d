"""The Kubernetes floor every component stands on: the async client, the one informer (list, watch, resume,
backoff), the object cache, the work queue and its rate limiter, access reviews, conditions and Events.

Nothing here knows a reconciler, the gateway, the CLI or the HTTPS server: they import this, never the reverse.
"""
