"""Rules: acting without an agent (the controller), and their revisions (revisions.py)."""
