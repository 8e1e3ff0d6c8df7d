"""kopf glue: watch Devices, feed MQTT messages in, reconcile each device toward its target state.

Handlers stay thin: they update caches and queue device ids; `controller.py`
does the work with the pure planning in `devices/plan.py`.
"""
