"""A real probe posing as a rank on another node (tests of relays and remote viewing).

``python node_probe.py HOST NAME [STEP_S] [RANK WORLD [WAIT_S]]``: the process's host name is
HOST (socket.gethostname patched before the probe starts: several "nodes" on one test
machine), it registers in $GPUTOP_RUNTIME_DIR like any probe and steps through
``probe.watch`` every STEP_S seconds until killed, each batch arriving WAIT_S late (a slow
loader). With RANK and WORLD it is rank RANK of torchrun job "node-probe-job". Prints
"ready" once publishing.
"""

from __future__ import annotations

import os
import socket
import sys
import time

host, name = sys.argv[1], sys.argv[2]
step_s = float(sys.argv[3]) if len(sys.argv) > 3 else 0.02
if len(sys.argv) > 5:
    os.environ["RANK"], os.environ["WORLD_SIZE"] = sys.argv[4], sys.argv[5]
    os.environ["LOCAL_RANK"] = sys.argv[4]
    os.environ["TORCHELASTIC_RUN_ID"] = "node-probe-job"
wait_s = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
socket.gethostname = lambda: host  # type: ignore[assignment]

from gputop_dl import probe  # noqa: E402
from gputop_dl.probe.core import Probe  # noqa: E402

p = Probe(name=name, sample_host=True, system_interval_s=0.5)
print("ready" if p.enabled else f"disabled: {p.error}", flush=True)


def batches():
    n = 0
    while True:
        n += 1
        if wait_s:
            time.sleep(wait_s)
        yield n


for _batch in probe.watch(batches()):
    time.sleep(step_s)
