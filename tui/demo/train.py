"""A real, small PyTorch training on the CPU, instrumented with the probe.

Run by ``gputop demo`` (and by the end-to-end tests and benchmarks) as a child process:

    python -m gputop_dl.tui.demo.train --scenario input-bound --duration 60

Scenarios set the truth by construction:
  input-bound    JPEG decode + augmentation in the main process (num_workers=0), small CNN
  compute-bound  tensors decoded once and cached in memory, a heavier CNN
  balanced       two loader workers, a medium CNN
  disk-bound     raw image files read with the page cache dropped before every read
  stall          balanced, then one step hangs for --stall-after/--stall-seconds
  worker-restarts  short epochs from two workers not kept between them
                 (persistent_workers=False), each taking 0.5 s to start
"""

from __future__ import annotations

import _thread
import argparse
import io
import json
import math
import multiprocessing
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from gputop_dl import probe

SCENARIOS = (
    "input-bound",
    "compute-bound",
    "balanced",
    "disk-bound",
    "stall",
    "worker-restarts",
    "bench",
)
WORKER_START_S = 0.5  # worker-restarts: what opening a dataset's shards costs a worker
CROP = 64


def make_jpegs(folder: Path, count: int, size: int) -> list[Path]:
    """Write ``count`` synthetic photos-like JPEGs once; reuse them on later runs."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"img_{i:05d}.jpg" for i in range(count)]
    if all(p.exists() for p in paths):
        return paths
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:size, 0:size]
    for i, path in enumerate(paths):
        # Smooth gradients plus noise: compresses like a photo, decodes like one.
        base = np.stack([(xx * (i % 7 + 1)) % 256, (yy * (i % 5 + 1)) % 256, (xx + yy) % 256], -1)
        noise = rng.integers(0, 48, size=(size, size, 3))
        img = Image.fromarray(((base + noise) % 256).astype(np.uint8))
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=90)
        path.write_bytes(buf.getvalue())
    return paths


def make_raw(folder: Path, count: int, size: int) -> list[Path]:
    """Uncompressed uint8 images: reading them costs disk, not CPU."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"raw_{i:05d}.bin" for i in range(count)]
    if all(p.exists() for p in paths):
        return paths
    rng = np.random.default_rng(1)
    for path in paths:
        with open(path, "wb") as f:
            f.write(rng.integers(0, 255, size=(size, size, 3), dtype=np.uint8).tobytes())
            f.flush()
            os.fsync(f.fileno())  # dirty pages would survive POSIX_FADV_DONTNEED
    return paths


def augment(arr: np.ndarray, rng: np.random.Generator) -> torch.Tensor:
    h, w, _ = arr.shape
    y, x = rng.integers(0, h - CROP + 1), rng.integers(0, w - CROP + 1)
    crop = arr[y : y + CROP, x : x + CROP]
    if rng.random() < 0.5:
        crop = crop[:, ::-1]
    t = torch.from_numpy(np.ascontiguousarray(crop)).permute(2, 0, 1).float().div_(255.0)
    return (t - 0.5) / 0.25


class JpegFolder(Dataset[Any]):
    """Decode with Pillow, resize, crop, flip: the classic CPU-heavy input pipeline."""

    def __init__(self, root: Path, paths: list[Path], resize: int) -> None:
        self.root = str(root)
        self.paths = paths
        self.resize = resize
        self.rng = np.random.default_rng()

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        with Image.open(self.paths[i]) as img:
            rgb = img.convert("RGB").resize((self.resize, self.resize), Image.Resampling.BILINEAR)
            arr = np.asarray(rgb)
        return augment(arr, self.rng), i % 10


class RawFolder(Dataset[Any]):
    """Read raw files with the page cache dropped first, so every read hits the disk."""

    def __init__(self, root: Path, paths: list[Path], size: int) -> None:
        self.root = str(root)
        self.paths = paths
        self.size = size
        self.rng = np.random.default_rng()

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        fd = os.open(self.paths[i], os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            data = os.read(fd, self.size * self.size * 3)
        finally:
            os.close(fd)
        arr = np.frombuffer(data, dtype=np.uint8).reshape(self.size, self.size, 3)
        return augment(arr, self.rng), i % 10


def open_shards(_worker: int) -> None:
    """A worker's start (its ``worker_init_fn``): a dataset opening and indexing its
    shards, as real ones do, every time a worker starts."""
    time.sleep(WORKER_START_S)
    # torch's worker watches its parent only from after this function, comparing with
    # the parent it sees then: a training killed meanwhile (kill -9, the OOM killer) left
    # this worker polling its queue forever, 350 MB each.
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:
        os._exit(0)


def cnn(width: int, depth: int) -> nn.Module:
    layers: list[nn.Module] = []
    channels = 3
    for i in range(depth):
        out = width * (2 ** min(i, 2))
        layers += [nn.Conv2d(channels, out, 3, padding=1), nn.BatchNorm2d(out), nn.ReLU()]
        if i < 3:
            layers.append(nn.MaxPool2d(2))
        channels = out
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 10)]
    return nn.Sequential(*layers)


def build(scenario: str, data_root: Path, batch: int) -> tuple[DataLoader[Any], nn.Module]:
    if scenario == "input-bound":
        paths = make_jpegs(data_root / "jpeg512", 256, 512)
        loader = DataLoader(
            JpegFolder(data_root / "jpeg512", paths, 256),
            batch_size=batch,
            shuffle=True,
            num_workers=0,
        )
        return loader, cnn(8, 2)
    if scenario == "compute-bound":
        paths = make_jpegs(data_root / "jpeg128", 256, 128)
        ds = JpegFolder(data_root / "jpeg128", paths, 96)
        xs = torch.stack([ds[i][0] for i in range(len(ds))])
        ys = torch.tensor([i % 10 for i in range(len(ds))])
        loader = DataLoader[Any](
            TensorDataset(xs, ys), batch_size=batch, shuffle=True, num_workers=0
        )
        return loader, cnn(32, 4)
    if scenario == "bench":
        # cached tensors and a small model: a ~10 ms CPU step, to measure the probe's cost
        xs = torch.randn(512, 3, CROP, CROP)
        ys = torch.randint(0, 10, (512,))
        loader = DataLoader[Any](
            TensorDataset(xs, ys), batch_size=batch, shuffle=True, num_workers=0
        )
        return loader, cnn(8, 1)
    if scenario == "worker-restarts":
        # epochs of 8 steps; each starts two workers again (the torch default)
        xs = torch.randn(256, 3, CROP, CROP)
        ys = torch.randint(0, 10, (256,))
        loader = DataLoader[Any](
            TensorDataset(xs, ys),
            batch_size=batch,
            shuffle=True,
            num_workers=2,
            persistent_workers=False,
            worker_init_fn=open_shards,
        )
        return loader, cnn(8, 2)
    if scenario == "disk-bound":
        # ~56 MB read from the disk per step of 32, and little else to do
        paths = make_raw(data_root / "raw768", 192, 768)
        loader = DataLoader(
            RawFolder(data_root / "raw768", paths, 768),
            batch_size=batch,
            shuffle=True,
            num_workers=0,
        )
        return loader, cnn(4, 1)
    # balanced and stall
    paths = make_jpegs(data_root / "jpeg256", 256, 256)
    loader = DataLoader(
        JpegFolder(data_root / "jpeg256", paths, 128),
        batch_size=batch,
        shuffle=True,
        num_workers=2,
        persistent_workers=True,
    )
    return loader, cnn(16, 3)


_stop_signals: list[int] = []  # also checked after each step: see _stop


def _stop(sig: int, _frame: object) -> None:
    # Raised wherever the main thread is; Python drops an exception raised inside some
    # callbacks (an at-fork hook while the DataLoader starts its workers), so the loop
    # also checks the flag.
    _stop_signals.append(sig)
    raise SystemExit(128 + sig)


def _check_stop() -> None:
    if _stop_signals:
        raise SystemExit(128 + _stop_signals[0])


ORPHAN_GRACE_S = 20.0


def _exit_with_parent() -> None:
    """Stop (as on SIGTERM) when the parent is gone, even killed with -9: no orphan
    training keeps publishing."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(ORPHAN_GRACE_S)  # a clean stop takes a few seconds; this one did not
        _remove_own_socket()
        os._exit(128 + signal.SIGTERM)

    threading.Thread(target=watch, name="demo-parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--scenario", choices=SCENARIOS, default="input-bound")
    ap.add_argument(
        "--duration", type=float, default=0.0, help="seconds to train (0: until killed)"
    )
    ap.add_argument("--steps", type=int, default=0, help="steps to train (0: no limit)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--data-dir", default=os.path.join(tempfile.gettempdir(), "gputop-demo-data"))
    ap.add_argument("--no-probe", action="store_true", help="train without the probe (benchmarks)")
    ap.add_argument("--stall-after", type=float, default=8.0, help="stall: seconds before the hang")
    ap.add_argument("--stall-seconds", type=float, default=3600.0, help="stall: length of the hang")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--result", help="write {steps, samples, seconds} as JSON here at the end")
    ap.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="stop when the process that started this one ends (gputop demo sets it)",
    )
    args = ap.parse_args(argv)
    # --duration counts from the process's start: imports and data preparation included.
    launched = psutil.Process().create_time()
    # SIGTERM/SIGHUP end the training like Ctrl-C: the probe closes and removes its socket.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stop)
    if args.exit_with_parent:
        _exit_with_parent()
    if args.duration:
        # The loop checks the deadline after each step; this cuts a step (or the imports
        # and data preparation) that would run past it.
        _interrupt_at(launched + args.duration + DEADLINE_GRACE_S)
    try:
        return _train(args, launched)
    except KeyboardInterrupt:
        return 0 if args.duration and time.time() >= launched + args.duration else 130
    finally:
        _remove_own_socket()


DEADLINE_GRACE_S = 2.0


def _interrupt_at(deadline: float) -> None:
    def interrupt() -> None:
        time.sleep(max(0.0, deadline - time.time()))
        _thread.interrupt_main()

    threading.Thread(target=interrupt, name="demo-deadline", daemon=True).start()


def _remove_own_socket() -> None:
    """The probe removes the socket it names itself, not one given in $GPUTOP_LISTEN;
    a stale one would tell later viewers that something is there."""
    listen = os.environ.get("GPUTOP_LISTEN", "")
    if listen.startswith("ipc://"):
        Path(listen.removeprefix("ipc://")).unlink(missing_ok=True)


def _train(args: argparse.Namespace, launched: float) -> int:
    if not args.no_probe:
        # Started before the data is made (by default the probe starts at the first
        # probe.watch(), after it): meanwhile the viewer shows the run, no step yet, and
        # the CPU making the data, not an endpoint that sent nothing.
        probe.default()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    loader, model = build(args.scenario, Path(args.data_dir), args.batch_size)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    print(f"demo: scenario {args.scenario}, pid {os.getpid()}", file=sys.stderr, flush=True)

    steps = samples = 0
    start = time.perf_counter()
    stalled = False
    done = False
    while not done:
        batches = loader if args.no_probe else probe.watch(loader)
        for x, y in batches:
            loss = loss_fn(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            steps += 1
            samples += x.shape[0]
            _check_stop()
            elapsed = time.perf_counter() - start
            left = args.duration - (time.time() - launched) if args.duration else math.inf
            if args.scenario == "stall" and not stalled and elapsed > args.stall_after:
                stalled = True
                _check_stop()
                time.sleep(max(0.0, min(args.stall_seconds, left)))  # a hung collective
                left = args.duration - (time.time() - launched) if args.duration else left
            if left <= 0 or (args.steps and steps >= args.steps):
                done = True
                break
    seconds = time.perf_counter() - start
    if args.result:
        Path(args.result).write_text(
            json.dumps({"steps": steps, "samples": samples, "seconds": seconds})
        )
    print(f"demo: {steps} steps, {samples / seconds:.1f} samples/s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
