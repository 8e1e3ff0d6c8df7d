"""The MCP gateway: an unprivileged translator from MCP tool calls to Intents made in the caller's name.

access   - the caller's RBAC rules (SelfSubjectRulesReview), evaluated locally
visible  - a Device as one caller may see it
toolset  - which tools a caller sees, their schemas, and argument checks
view     - one caller's watch cache, kept with its own token
notify   - list-changed and resource-updated notices, coalesced, on both protocol generations
server   - the MCP handlers
serve    - stdio and Streamable HTTP transports, bearer-token authentication
"""
