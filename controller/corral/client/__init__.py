"""Kubernetes-side helpers for the people and agents who use Corral (the CLI and the MCP gateway).

They act with the caller's own identity; nothing here needs rights of its own.
"""
