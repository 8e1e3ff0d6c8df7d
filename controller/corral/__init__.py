"""Corral: let AI agents operate physical devices safely.

A Kubernetes controller drives MQTT devices toward declared target states; an
MCP gateway turns agents' tool calls into Intents under the caller's own
Kubernetes identity. See DESIGN.md for the public shape of the product.
"""

__version__ = "0.1.0"
