"""Audit: every decision and every change to a device leaves a Kubernetes Event a person can read."""
