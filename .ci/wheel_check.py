"""Build the wheel and use it as a user would, outside the repository (``make wheel-check``).

1. ``pip wheel`` builds gputop-dl's wheel.
2. A fresh venv gets it with the ``viewer`` extra, NOT editable: ``gputop --help``,
   ``python -m gputop_dl --help`` and ``from gputop_dl import probe`` run from a folder
   outside the repository, and the code imported is the installed copy.
3. A second fresh venv gets the base install (the probe alone, for a training env): the probe
   imports, Textual is absent, ``gputop`` says which extra the viewer needs.

Prints what the probe-only install adds (distributions, MB) and the probe's import time
(median and spread of several runs). Exits non-zero on the first failed check.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
IMPORT_RUNS = 7
MEASURE_IMPORT = (
    "import time; t = time.perf_counter(); from gputop_dl import probe; "
    "print(time.perf_counter() - t)"
)


def run(cmd: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONWARNINGS"] = "ignore"  # setuptools' notes are not what is checked here
    env["GPUTOP_RUNTIME_DIR"] = str(cwd / "run")  # not the runs of this machine's user
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if check and out.returncode != 0:
        sys.exit(f"FAILED: {' '.join(cmd)}\n{out.stdout}\n{out.stderr}")
    return out


def venv(path: Path, work: Path) -> Path:
    run([sys.executable, "-m", "venv", str(path)], work)
    return path / "bin"


def site_packages(bin_dir: Path, work: Path) -> Path:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return Path(run([str(bin_dir / "python"), "-c", code], work).stdout.strip())


def distributions(bin_dir: Path, work: Path) -> set[str]:
    out = run([str(bin_dir / "python"), "-m", "pip", "list", "--format=freeze"], work).stdout
    return {line.split("==")[0].lower() for line in out.splitlines() if "==" in line}


def size_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 1e6


def expect(condition: bool, what: str) -> None:
    if not condition:
        sys.exit(f"FAILED: {what}")
    print(f"  ok  {what}")


def main() -> int:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gputop-wheel-") as tmp:
        work = Path(tmp)
        run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", "dist", str(REPO)], work
        )
        wheels = sorted((work / "dist").glob("gputop_dl-*.whl"))
        expect(len(wheels) == 1, f"one wheel built: {wheels[0].name if wheels else None}")
        wheel = wheels[0]

        print("full install (viewer extra), not editable, run outside the repository:")
        full = venv(work / "full", work)
        run([str(full / "pip"), "install", "-q", f"{wheel}[viewer]"], work)
        helped = run([str(full / "gputop"), "--help"], work)
        expect("usage: gputop" in helped.stdout, "gputop --help")
        module = run([str(full / "python"), "-m", "gputop_dl", "--help"], work)
        expect("usage: gputop" in module.stdout, "python -m gputop_dl --help")
        where = run(
            [str(full / "python"), "-c", "from gputop_dl import probe; print(probe.__file__)"],
            work,
        ).stdout.strip()
        expect(
            where.startswith(str(site_packages(full, work))) and str(REPO) not in where,
            f"from gputop_dl import probe (the installed copy: {where})",
        )
        css = run(
            [str(full / "python"), "-c", "import gputop_dl.tui.app as a, pathlib; "
             "print((pathlib.Path(a.__file__).parent / a.GputopApp.CSS_PATH).is_file())"],
            work,
        ).stdout.strip()  # fmt: skip
        expect(css == "True", "the viewer's stylesheet is in the wheel")

        print("probe-only install (base, no extras), as in a training environment:")
        probe = venv(work / "probe", work)
        before_dists = distributions(probe, work)
        site = site_packages(probe, work)
        before_mb = size_mb(site)
        run([str(probe / "pip"), "install", "-q", str(wheel)], work)
        added = sorted(distributions(probe, work) - before_dists)
        added_mb = size_mb(site) - before_mb
        run([str(probe / "python"), "-c", "from gputop_dl import probe"], work)
        expect(True, "from gputop_dl import probe")
        textual = run([str(probe / "python"), "-c", "import textual"], work, check=False)
        expect(textual.returncode != 0, "Textual is absent")
        viewer = run([str(probe / "gputop")], work, check=False)
        expect(
            viewer.returncode == 2 and "pip install 'gputop-dl[viewer]'" in viewer.stderr,
            "gputop (viewer) names the extra it needs, exit 2",
        )
        exporter = run([str(probe / "gputop"), "exporter"], work, check=False)
        expect(
            exporter.returncode == 2
            and "prometheus_client is missing" in exporter.stderr
            and "Traceback" not in exporter.stderr,
            "gputop exporter names the extra it needs, exit 2",
        )
        snap = run([str(probe / "gputop"), "snapshot", "--wait", "0.5"], work, check=False)
        expect(snap.returncode == 1 and "no training run found" in snap.stdout, "gputop snapshot")

        times = sorted(
            float(run([str(probe / "python"), "-c", MEASURE_IMPORT], work).stdout)
            for _ in range(IMPORT_RUNS)
        )
        median = statistics.median(times) * 1000
        print(
            f"probe-only install adds {len(added)} distributions, {added_mb:.1f} MB: "
            f"{', '.join(added)}"
        )
        print(
            f"'from gputop_dl import probe' takes {median:.0f} ms median "
            f"(min {times[0] * 1000:.0f}, max {times[-1] * 1000:.0f}, {IMPORT_RUNS} runs)"
        )
    print(f"wheel check passed in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
