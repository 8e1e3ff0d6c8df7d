"""The MCP gateway: an unprivileged translator from MCP tool calls to Intents made in the caller's name.

identity  - who is calling (stdio: the kubeconfig's user; HTTP: a bearer token for this gateway)
access    - the caller's RBAC rules (SelfSubjectRulesReview), evaluated locally
review    - asking for those rules (and the caller's name), again and again
devices   - the watch of the Devices a caller may read (kube.informer, with the caller's client)
contracts - the contracts of their Capabilities, read by name as the caller
pauses    - where agents are paused, as far as the caller may read it, and how that is said
visible   - a Device as one caller may see it
view      - one caller's view: the parts above put together, and what changes are told
notify    - list-changed and resource-updated notices, coalesced, on both protocol generations
following - following an Intent to its outcome on the event loop
tools/    - one object per tool: its schemas and what it does
toolset   - which tools a caller sees
resources - the device index and one resource per device
prompts   - the diagnose_device prompt
tasks     - the MCP tasks extension for a call that waits for a person
server    - the MCP handlers and the session
serve     - stdio and Streamable HTTP transports, bearer-token authentication
"""
