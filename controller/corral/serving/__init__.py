"""The controller's HTTPS server: read-only views for callers with Kubernetes credentials (the audit log;
readings come with the Agent truth issue)."""
