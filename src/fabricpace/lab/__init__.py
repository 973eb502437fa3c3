"""The fabric lab: a real small cluster on one Linux machine.

Nodes are network namespaces, leaf switches are bridges joined through a spine by tc-shaped uplinks, and
ranks are real gloo DDP processes with the observer on. Faults: cgroup CPU throttling, GC pressure, a
foreign bulk TCP flow, interleaved placement, an uplink rate change mid-run. Modules:

    config    topology, names, addresses, rates         fabric    up / status / down / shaping
    state     crash-safe record of what was created      traffic   bounded TCP transfers (measure, foreign)
    cgroup    CPU quota of throttled ranks               noise     GC pressure inside a worker
    scenario  scenario files (pydantic)                  launcher  run a scenario
    annotate  topology, fault timeline into the run dir  mirror    the lab as a cluster file, hosts file;
                                                                   placements (orders, hosts files)
    worker    ``python -m fabricpace.lab.worker``: the training process
"""
