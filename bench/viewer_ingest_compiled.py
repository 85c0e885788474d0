"""What compiling the viewer's state would buy: bench/viewer_ingest.py on this checkout as
it is, and on a copy whose hot state modules are compiled with mypyc (from the same,
unchanged sources), run alternately.

gputop ships pure Python: a compiled wheel ties the package to one interpreter and
platform, and the probe must install anywhere. This bench measures the option, for the
packaging decision (the ingest goal is <= 2 us per step). mypyc comes with mypy (a
development dependency); a C compiler is needed, and the bench says so when there is
none.

    python bench/viewer_ingest_compiled.py [rounds]
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The modules a step record passes through in the viewer (decode aside: msgspec is C).
COMPILED = ("throughput", "steplog", "run", "viewer")
FIGURE = re.compile(r"ingest \(decode\+apply\) per step\s+median\s+([\d.]+) us")


def compile_copy(where: Path) -> str | None:
    """Copy the package to ``where`` and compile COMPILED there; None, or why not."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        return "no C compiler (cc, gcc) on this machine"
    mypyc = Path(sys.executable).parent / "mypyc"
    if not mypyc.exists():
        return f"{mypyc} not found (mypy, a development dependency, brings it)"
    shutil.copytree(
        ROOT / "gputop_dl", where / "gputop_dl", ignore=shutil.ignore_patterns("__pycache__")
    )
    sources = [f"gputop_dl/tui/state/{name}.py" for name in COMPILED]
    done = subprocess.run(
        [str(mypyc), "--ignore-missing-imports", *sources],
        cwd=where,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        return "mypyc failed: " + (done.stdout + done.stderr).strip()[-500:]
    return None


def ingest(pythonpath: str) -> float:
    env = dict(os.environ, PYTHONPATH=pythonpath, GPUTOP_BENCH_REPEATS="3")
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "viewer_ingest.py")],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=tempfile.gettempdir(),  # not the checkout: its gputop_dl must not come first
    ).stdout
    found = FIGURE.search(out)
    if found is None:
        raise RuntimeError(f"no ingest figure in:\n{out}")
    return float(found.group(1))


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    with tempfile.TemporaryDirectory() as tmp:
        why = compile_copy(Path(tmp))
        if why is not None:
            print(f"viewer ingest, compiled: skipped ({why})")
            return
        plain: list[float] = []
        compiled: list[float] = []
        for _ in range(rounds):  # alternately: this machine's speed drifts
            plain.append(ingest(""))
            compiled.append(ingest(tmp))
    print(
        f"viewer ingest per step (bench/viewer_ingest.py, 3 repeats each, {rounds} rounds "
        "alternately)"
    )
    print(f"  pure Python:                    {', '.join(f'{v:.2f}' for v in plain)} us")
    print(f"  {', '.join(COMPILED)} compiled (mypyc): {', '.join(f'{v:.2f}' for v in compiled)} us")
    print("goal: <= 2 us per step")


if __name__ == "__main__":
    main()
