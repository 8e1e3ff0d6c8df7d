"""Approval requests to people's webhooks: the pure payloads and the sender with retries."""
