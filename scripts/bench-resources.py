#!/usr/bin/env python3
"""bench-resources.py FILE...: ghcrsync's own share of the machine over the runs that wrote FILEs
(GHCRSYNC_RESOURCES, cmd/ghcrsync/profile.go): prints "CPU_S HEAP_MIB", each the median over the
runs — CPU is user + system seconds, the heap the Go heap at its peak. A run that wrote nothing
is left out; none at all prints "null null"."""
import json
import statistics
import sys

runs = []
for path in sys.argv[1:]:
    try:
        runs.append(json.load(open(path)))
    except (OSError, ValueError):
        pass

if not runs:
    print("null null")
else:
    cpu = statistics.median(r["cpu_user_s"] + r["cpu_system_s"] for r in runs)
    heap = statistics.median(r["peak_heap_bytes"] for r in runs) / (1 << 20)
    print(f"{cpu:.2f} {heap:.0f}")
