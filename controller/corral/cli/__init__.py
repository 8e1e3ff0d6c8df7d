"""The `corral` command line."""
