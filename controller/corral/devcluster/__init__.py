"""The local development plane: a real kube-apiserver (with embedded etcd) and a Mosquitto broker.

Used by `corral dev up/down/status` and by the test fixtures, so that CRDs,
RBAC, admission policies and MQTT are exercised against the real thing.
"""
