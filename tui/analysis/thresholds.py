"""Every threshold of the analyzer, in one place, with the reason for its value.

``docs/verdicts.md`` is the user-facing table of these; keep the two in step. Shares are
fractions (0.20 = 20 %), CPU figures percent of one core, rates bytes per second.
Pairs named ``*_ENTER`` / ``*_EXIT`` implement hysteresis: a condition starts at ENTER and,
once shown, holds until the figure falls below EXIT, so noise near a threshold cannot
make the verdict flap.
"""

from __future__ import annotations

# --- step window ------------------------------------------------------------------------
MIN_STEPS = 5  # fewer usable steps: "warming up", never a guess (TraceML needs ~2 to warn) ...
MIN_SLOW_STEPS = 2  # ... unless at least 2 of them cover WARM_S: slow steps (1-2 s, usual
WARM_S = 3.0  #   for large models) would otherwise keep a verdict back for 5-10 s
SKIP_FIRST_STEPS = 1  # step 0 carries one-off start-up work (lazy init, autotune, compile)
STEP_WINDOW_S = 3.0  # steps of the last 3 s: a change near a threshold shows in < 3 s
# A shown input-bound verdict is lowered (warning -> info -> compute-bound) only when the
# last 8 s agree with the last 3 s: a loader that delivers in rounds (balanced runs) swings
# the 3 s share across the thresholds, and the verdict must not follow every swing. A
# rising wait is shown from the 3 s window at once.
STABLE_WINDOW_S = 8.0
MAX_WINDOW_STEPS = 300  # bounds the work for very fast steps
# Confidence grows with consistent evidence in time, not in steps (a 1 s step is as much
# evidence as ten 0.1 s steps): full after 5 s of chunks that agree with the verdict.
CONFIDENT_S = 5.0
CHUNK_S = 1.0  # consistency is checked on chunks of at least 1 s of steps ...
CONFIDENCE_HORIZON_S = 30.0  # ... over at most the last 30 s
OUTLIER_FACTOR = 10.0  # a step 10x the median period (epoch start, resume after a stall) ...
OUTLIER_REPEAT = 3.0  # ... with no other step within 3x of it in the history is a one-off;
#   a loader whose workers deliver in rounds makes such long steps again and again: they count

# --- data wait (TensorFlow Profiler: <5 % not, 5-20 % moderately, >20 % highly bound) ----
INPUT_WARN_ENTER = 0.20
INPUT_WARN_EXIT = 0.15
INPUT_INFO_ENTER = 0.05
INPUT_INFO_EXIT = 0.03
BURSTY_RATIO = 0.5  # median step wait < half the mean: batches arrive in bursts

# --- copies and host overhead (TF flags launch/"other" host time at 3 % / 15 %) ---------
H2D_PHASE_NAMES = ("h2d", "to_device", "copy")
H2D_ENTER = 0.15
H2D_EXIT = 0.10
PCIE_RX_HIGH_BPS = 6e9  # half of PCIe 3.0 x16: copies dominate the link
# Host overhead: the device had caught up with the host (and waited for it) in at least
# half of the steps whose own data wait is small, and such steps are at least half of the
# steps with device timing. Below 40 % it clears (hysteresis).
CAUGHT_UP_ENTER = 0.5
CAUGHT_UP_EXIT = 0.4
# NVML utilisation at or above which the device is busy, not waiting for the host: a
# per-step sync (.item()) makes every step "caught up" on a device-bound run too.
OVERHEAD_MAX_UTIL_PCT = 70.0
SMALL_WAIT_SHARE = 0.05  # a step waiting under 5 % of its period for data is not input-bound

# --- stall --------------------------------------------------------------------------------
STALL_FACTOR = 5.0  # no step for 5 typical periods ...
STALL_MIN_S = 10.0  # ... and at least 10 s (flush latency, epoch ends, short hiccups)
# The probe takes the training thread's stack at the same threshold, at its next wake-up
# (0.5 s at most): a viewer waits this long for it before it says "stalled" (the stack
# may show the loop left: a framework's validation, not a hang).
STACK_GRACE_S = 1.5
STALL_TYPICAL_STEPS = 30  # typical period = median of the last 30 steps
# Before a typical step is known (fewer than MIN_STEPS): no step for this long in the
# loop is a warning, not a stall: a first step may take minutes (torch.compile, NCCL or
# HCCL setup, cuDNN autotuning, workers starting), and a hang there looks the same.
FIRST_STEPS_STALL_S = 30.0
# At a pass's start (the loop entered, no step since) the wait is judged against what the
# loader's last starts took (LoaderPasses.waits): workers forked and initialised again at
# every epoch may take longer than the stall threshold every time. Up to this many times
# the longest of the last few, "starting a pass" (info), a stall past it; without those
# figures, a warning until FIRST_STEPS_STALL_S, as for a first step.
PASS_START_STALL_FACTOR = 2.0
PASS_START_STALL_STARTS = 5  # the last starts of the loader looked at

# --- host samples -------------------------------------------------------------------------
# Input-bound by the starts of passes: their first steps hold this share of the window's
# data wait (workers started again each epoch, a loader's costly iter()).
PASS_START_SHARE = 0.5
PASS_OTHER_STEPS = 3  # steps besides the starts, to know what a batch waits anyway
PASS_LOADER_SHARE = 0.1  # a loader whose starts cost this share of the wait is named
MIN_SYSTEMS = 2  # host-based causes need at least two samples (one can be a transient)
SYSTEM_WINDOW_S = 6.0  # host figures are medians over the samples of the last 6 s
# A run this young (since its first step, or its process's start) may have no host sample
# of its loop yet: a probe samples the node once a second, every 5 s while no viewer is
# connected, and a sample begun before the first step is the start-up's. Until then the
# cause waits for them rather than advising an agent.
HOST_SAMPLES_DUE_S = 15.0
CORE_PINNED_PCT = 90.0  # a core this busy is pinned
PROCESS_SATURATED_PCT = 90.0  # a process this busy (of one core) is CPU-bound (= sampler)
# A worker that waits (a remote store, a sleep) is counted at least this much of a core
# in the advice (suggest_workers): its CPU measured near 0 must not make room for
# hundreds (the +4 / doubling step bounds the range anyway).
MIN_WORKER_CORES = 0.05
FREE_CORES_FOR_WORKERS = 0.75  # idle core-equivalents worth another worker: a core 84 %
#   idle is one (the advice must not say "no core idle" beside it)
HOST_CPU_FULL_FREE_CORES = 0.5  # below this the host CPU is full
# The CPU is said full (by any of the free-core bounds here) only where that many of the
# window's host samples show it, not only their median: another process's burst of a
# few seconds (a second run importing torch, ~2 s of a core) filled the cores in half
# the samples and read "cpu-contention" for a moment. Once said (cpu-contention,
# cpu-workers), the median holds it, as before: a lull does not take it back either.
CPU_FULL_ENTER_SHARE = 0.75
NO_IDLE_CORE = 0.25  # with num_workers=0: below this no core is left for a worker
OTHERS_CPU_SHARE = 0.5  # training uses less than half the busy cores: others fill the CPU
OTHERS_CPU_SHARE_BAND = 0.1  # hysteresis: once shown, contention holds up to 60 %; once
#   cpu-workers is shown, contention needs the training under 40 % (a shared node swings)
IOWAIT_HIGH_CORES = 0.5  # half a core's worth of time waiting on I/O
IO_PRESSURE_HIGH_PCT = 20.0  # PSI io "some" avg10: tasks stalled on I/O 20 % of the time
# A loader process well below one core while the loop waits for it is blocked, not busy;
# with some sign of I/O (weaker figures than above) the reads are what it waits for.
LOADER_BLOCKED_CPU_PCT = 60.0
# With num_workers=0 and no core idle, that line also tells a main process whose loading
# computes (the full CPU is the cause: cpu-contention, cpu-workers) from one whose loading
# may wait (few-workers). A main process starved by others hovers near it, and the cause
# flipped between the two every few samples. Once a full-CPU cause is shown it holds
# down to the EXIT figure; once few-workers is shown, a full-CPU cause needs the ENTER
# figure (a fresh judgement uses the line itself).
FULL_LOADER_CPU_ENTER_PCT = 70.0
FULL_LOADER_CPU_EXIT_PCT = 50.0
IOWAIT_SOME_CORES = 0.25
IO_PRESSURE_SOME_PCT = 10.0
DISK_READ_ACTIVE_BPS = 20e6
# The node reads, but the loading processes themselves (main + workers, /proc/<pid>/io
# read_bytes: what reached the disk) read next to nothing and under a tenth of what the
# node reads: the reads are another process's (a job sharing the node), not what the
# loader waits on. "Next to nothing": a loader that waits on the disk keeps reads in
# flight the whole wait, and even a saturated seek-bound disk serves them at 75-100 IOPS
# of 4 KB (300-400 kB/s: a review found 1 MB/s, the bound first chosen, called such a
# loader's disk "another process's"); 32 kB/s is a few stray reads. The share keeps a
# rank among many on its node (each a few % of the node's reads) from reading as
# "another process" only when its own rate is tiny as well. Cached reads count 0: a
# loader served from the page cache does not wait on the disk either.
LOADER_OWN_READS_LOW_BPS = 32e3
LOADER_OWN_READS_LOW_SHARE = 0.1
DISK_BUSY_ENTER = 70.0  # data device busy %: near saturation for a single queue
# With num_workers=0 and a main process whose CPU in the wait is unknown (its CPU over
# the step could be the wait's or the step's): a disk this busy, or iowait or I/O
# pressure, says the wait is the reads'; less (a fast disk 1 % busy) says it computes.
DISK_BUSY_SOME = 25.0
WRITES_OVER_READS = 2.0  # a busy data disk writing this many times what it reads: writes
DISK_BUSY_EXIT = 60.0
SWAP_IN_ENTER_BPS = 1e6  # any sustained swap-in during training is a bottleneck (seed 003)
SWAP_IN_EXIT_BPS = 0.5e6
CPU_QUOTA_ENTER_PCT = 10.0  # cgroup: share of CPU periods throttled
CPU_QUOTA_EXIT_PCT = 5.0
NET_RX_HIGH_BPS = 10e6  # network receive that supports "the data comes over the network"
NETWORK_FS_PREFIXES = (
    "nfs",
    "cifs",
    "smb",
    "fuse",
    "lustre",
    "ceph",
    "glusterfs",
    "gpfs",
    "beegfs",
    "9p",
    "afs",
    "wekafs",
    "panfs",
    "orangefs",
    "pvfs2",
)

# --- accelerators -------------------------------------------------------------------------
GPU_MEM_FULL_ENTER = 0.95  # "stay away from max GPU memory" (seed 002): OOM risk
GPU_MEM_FULL_EXIT = 0.92
THROTTLE_SLOWDOWN_REASONS = frozenset(
    {
        "hw_slowdown",
        "hw_thermal",
        "hw_thermal_slowdown",
        "sw_thermal",
        "sw_thermal_slowdown",
        "hw_power_brake",
        "hw_power_brake_slowdown",
    }
)
THROTTLE_POWER_CAP_REASONS = frozenset({"sw_power_cap"})  # normal at full load: info only
BUSY_UTIL_PCT = 50.0  # a GPU busier than this is "busy" (power cap matters then)
THROTTLE_SAMPLE_SHARE = 0.5  # a reason must show in half the recent samples of the GPU
BATCH_HINT_UTIL_PCT = 90.0  # GPU busy ...
BATCH_HINT_MEM_MAX = 0.5  # ... and memory half empty: a larger batch may fit and help
LOW_GPU_UTIL_PCT = 50.0  # compute-bound by the host clock but the GPU mostly idle

# --- outside the loop ---------------------------------------------------------------------
OUTSIDE_SHOW_S = 2.0  # left the loop this long ago: say so (shorter: an epoch boundary)
# Outside the loop this many times as long as the usual time it was left the same way
# (and a minute more at least): a warning, it may hang there (a validation, a checkpoint).
AWAY_LONG_FACTOR = 3.0
AWAY_LONG_MIN_S = 60.0

# --- tracker ------------------------------------------------------------------------------
PERSIST_S = 2.0  # a new verdict must hold this long ...
PERSIST_UPDATES = 2  # ... over at least this many consecutive updates before it is shown
# Back in the loop (after an evaluation, a stall), the cause judged before it stands while
# the new verdict of the same kind cannot name one for want of host samples of the loop as
# it runs now: at most this long (HOST_SAMPLES_DUE_S: then missing samples are news).
CARRY_S = 15.0
# "Without the data wait" beyond this many times today's rate is no figure to act on: the
# step's own work is a sliver of it (a sleep in __getitem__ read "+17327 %"), and the
# loader's own rate, not the step, is the bound.
MAX_HEADROOM_FACTOR = 10.0
# Compute on the host (no accelerator) with its main process under this share of a core
# while the cores it may use are full: starved of CPU by others ...
STARVED_MAIN_PCT = 60.0
STARVED_EXIT_PCT = 70.0  # once said, starved until the main process gets this much
OTHER_NAMED_MIN_PCT = 10.0  # ... named when they take at least this much of a core
