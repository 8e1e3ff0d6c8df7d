"""The CPython side of the device firmware: the catalog generator and the simulated fleet behind `corral sim`.

    catalog   firmware/devices/*.json -> frozen modules in corral_fw/contracts/ (and --check)
    fleet     many firmware instances, each with its own MQTT connection, on one thread
    presets   ready-made fleets (`home`)
"""
