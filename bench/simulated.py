"""A simulated node's worth of runs for the viewer benches (bench/soak.py,
bench/viewer_flood.py), run as a script in a child process: the real protocol over a
real socket, cheaper than real trainings.

    python simulated.py ENDPOINT RUNS STEPS_PER_S SECONDS PREFIX

ENDPOINT ``discover`` binds an ipc socket in the runtime dir and registers it, as a probe
does. Run ``r`` is ``PREFIX-r:1000+r`` on host ``PREFIX-<r // 8>``; its steps are sent as a
probe flushes them at that rate (probe.core.flush_period; GPUTOP_BENCH_FLUSH_S: another
period): CUDA-timed records, or with GPUTOP_BENCH_STEPS=runs host-timed steps as a settled
``watch`` loop sends them (runs of clock readings, docs/protocol.md "StepRun"); one
64-core node sample a second. SECONDS 0 runs until killed; otherwise it then prints the last step
index of each run (JSON) and keeps the socket open while the viewer drains.
"""

from __future__ import annotations

SCRIPT = """
import json, os, socket, sys, time
from gputop_dl.probe import discovery
from gputop_dl.probe.core import flush_period
from gputop_dl.probe.messages import Hello, StepRecord, Steps, System
from gputop_dl.probe.protocol import HostRun, encode, encode_steps, pack_readings
from gputop_dl.probe.samples import CpuCore, CpuSample, SystemSample
from gputop_dl.probe.transport import Publisher

endpoint, runs, rate = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
# As a probe flushes at this rate; GPUTOP_BENCH_FLUSH_S: another period, to compare.
FLUSH_S = float(os.environ.get("GPUTOP_BENCH_FLUSH_S", flush_period(rate)))
seconds, prefix = float(sys.argv[4]), sys.argv[5]
AS_RUNS = os.environ.get("GPUTOP_BENCH_STEPS") == "runs"
if endpoint == "discover":
    pub = Publisher(discovery.ipc_endpoint(os.getpid()))
    discovery.register(discovery.Record(pub.endpoint, os.getpid(), socket.gethostname(),
                                        prefix, "probe", time.time()))
else:
    pub = Publisher(endpoint)
start = time.time()
# Other hosts' runs (as through an agent or a relay): their pids are not checked.
ids = [f"{prefix}-{r}:{1000 + r}" for r in range(runs)]
hellos = [encode(Hello(source_id=ids[r], role="probe", name=prefix, host=f"{prefix}-{r // 8}",
                       pid=1000 + r, started=start, probe_version="0", rank=r,
                       world_size=runs)) for r in range(runs)]
time.sleep(1.0)  # the subscriber joins
last = [-1] * runs
flushes = 0
t0 = next_at = time.time()
while not seconds or time.time() - t0 < seconds:
    next_at += FLUSH_S  # as a probe flushes
    now = time.time()
    per = round(rate * FLUSH_S)
    for r in range(runs):
        if flushes % round(2 / FLUSH_S) == 0:  # a hello every 2 s
            pub.send(hellos[r])
        if AS_RUNS:  # readings in ns of a clock that read 0 at ``start``
            ends = [now - (per - 1 - i) / rate - start for i in range(per)]
            readings = [round((ends[0] - 1 / rate) * 1e9)]
            for end in ends:
                readings += [round((end - 0.7 / rate) * 1e9), round(end * 1e9)]
            run = HostRun(last[r] + 1, pack_readings(readings), [32] * per)
            pub.send(encode_steps(ids[r], start, [], flushes, 0, 0, [run], 0))
        else:
            recs = tuple(StepRecord(index=last[r] + 1 + i, end_time=now - (per - 1 - i) / rate,
                                    period_s=1 / rate, wait_s=0.3 / rate, samples=32,
                                    device_s=0.6 / rate) for i in range(per))
            pub.send(encode(Steps(source_id=ids[r], records=recs, sent=flushes, dropped=0)))
        last[r] += per
    if flushes % round(1 / FLUSH_S) == 0:  # a node sample a second
        cores = tuple(CpuCore(c, 20.0, 5.0, 0.0, 0.0, 75.0) for c in range(64))
        sample = SystemSample(time=now, host=f"{prefix}-0", interval_s=1.0,
                              cpu=CpuSample(cores, None))
        pub.send(encode(System(source_id=ids[0], sample=sample)))
    flushes += 1
    time.sleep(max(0.0, next_at - time.time()))
print(json.dumps(last), flush=True)
time.sleep(60)  # keep the socket open while the viewer drains; killed by the bench
"""
