"""The one error type of the dev plane: its message is meant for a person to act on."""


class DevClusterError(RuntimeError):
    """The local plane could not be built, started or stopped; the message says why and what to do."""
