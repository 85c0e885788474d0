"""Which job a training process belongs to, from what its launcher set (facts only).

torchrun / torch.distributed.elastic, Slurm, MPI launchers and Lightning each say who is
in which world in their own environment variables; a process group already initialised
says it best. :func:`job_identity` is pure (tested with tables); :func:`current` reads
this process's environment and ``torch.distributed`` (on the publisher thread: a few
dictionary lookups, no system call).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from gputop_dl.probe.samples import MAX_COUNT

# Tried in order: the first variable that holds an integer wins.
RANK_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
LOCAL_RANK_VARS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
WORLD_SIZE_VARS = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "ip6-localhost"})
MAX_KEY = 200  # a job key longer than this is cut (the wire limits strings anyway)


@dataclass(frozen=True)
class JobIdentity:
    job: str | None  # "torchrun:<run id>", "slurm:<job>.<step>", "<addr>:<port>"; None: none
    rank: int | None
    local_rank: int | None
    world_size: int | None


def _int(environ: Mapping[str, str], names: tuple[str, ...]) -> int | None:
    for name in names:
        try:
            value = int(environ[name])
        except (KeyError, ValueError):
            continue
        if 0 <= value <= MAX_COUNT:  # past it no hello would decode
            return value
    return None


def job_key(environ: Mapping[str, str], host: str) -> str | None:
    """The key every rank of one job shares: torchrun's rendezvous run id when set (not
    "none"; a restarted job keeps it), else Slurm's job and step, else the rendezvous
    address (prefixed with ``host`` when it is a loopback one: then every rank is on this
    node, and another node's ``localhost:29500`` is another job)."""
    run_id = environ.get("TORCHELASTIC_RUN_ID", "").strip()
    if run_id and run_id.lower() != "none":
        return f"torchrun:{run_id}"[:MAX_KEY]
    slurm = environ.get("SLURM_JOB_ID", "").strip()
    if slurm:
        step = environ.get("SLURM_STEP_ID", "").strip()
        return (f"slurm:{slurm}.{step}" if step else f"slurm:{slurm}")[:MAX_KEY]
    addr = environ.get("MASTER_ADDR", "").strip()
    port = environ.get("MASTER_PORT", "").strip()
    if addr and port:
        where = f"{host}/" if addr.lower() in LOOPBACK_HOSTS or addr.startswith("127.") else ""
        return f"{where}{addr}:{port}"[:MAX_KEY]
    return None


def job_identity(
    environ: Mapping[str, str], host: str, group: tuple[int, int] | None = None
) -> JobIdentity:
    """``group``: (rank, world size) of an initialised default process group, which
    overrides the environment (Lightning sets no ``RANK``; the group knows)."""
    rank = _int(environ, RANK_VARS)
    world = _int(environ, WORLD_SIZE_VARS)
    if group is not None:
        rank, world = group
    return JobIdentity(job_key(environ, host), rank, _int(environ, LOCAL_RANK_VARS), world)


def process_group() -> tuple[int, int] | None:
    """(rank, world size) of torch's default process group, if torch is imported and the
    group initialised; never imports torch."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return None
    with contextlib.suppress(Exception):
        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    return None


def current(host: str) -> JobIdentity:
    """This process's job identity now."""
    return job_identity(os.environ, host, process_group())
