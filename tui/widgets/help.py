"""The help screen: what each panel shows and what each verdict means."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

from gputop_dl.tui.state import INSTRUMENT_HINT

HELP_TEXT = f"""\
**gputop**: a `top` for training runs. Is the accelerator busy, and if not, why?

## Panels

- **Header**: run name, rank/world, host, uptime, step count, samples/s now (last 5 s)
  and on average (an ended run has no rate now), and the connection: `● live`,
  `◐ stale` (no message for more than 3 s), `■ exited` (with the reason: a goodbye, or
  the process gone without one), `◌ lost` (a remote run silent for 6 s),
  `✖ incompatible` (protocol versions differ), `◌ connecting` (nothing received yet);
  in a replay `▶ replay` with its speed, `⏸ replay paused` or `■ replay ended` instead of `live`.
  With several runs or ranks a second line lists them: `tab`/`shift+tab` or `1`-`9`
  switch. When the run shown ends and a new one starts (a training restarted under
  another name), the new one is shown and a notice says so, unless you picked the run
  shown with `tab` or a number: then it stays, and the notice names the key of the new
  one.
- **Banner**: the bottleneck verdict. Its colour is its severity (green fine, blue
  information, yellow worth fixing, red stuck). Lines: `•` evidence, `→` advice,
  `⇡` headroom (what the run would gain without the bottleneck).
- **Throughput**: samples/s per half second on a scale from zero, newest on the right;
  a red floor is a stall in progress. `wait` is the share of each step spent waiting for
  the next batch; the bar splits the last 5 s into data wait and compute.
- **Accelerators**: per GPU/HPU utilisation and memory bars, temperature, power/limit,
  SM clock, PCIe receive/transmit. `n/a` means the driver did not report it.
- **CPU**: one stacked bar per core: user, system, **iowait**, steal. The line above
  shows the DataLoader workers' CPU, each in % of one core, busiest first
  (`4 workers, all saturated (98%, 97%, 96%, 95%)`, `2 workers, none saturated (5%, 3%)`):
  a worker at ≥90 % of a core is saturated and cannot go faster.
- **Memory**: RAM used/cache/available, swap and its in/out rate, pressure (PSI) and
  container limits.
- **Disk**: read/write and busy % per device; `◆` marks the device holding the data.
- **Network**: receive/transmit per interface.
- **Rank board** (`j`): the ranks of the selected run's job (runs whose probes report
  the same `torchrun` run id, Slurm job or rendezvous address), one row each: host, rank
  (local rank), step time, samples/s, data wait, *own time* (the share of each step spent
  outside the collective: data wait and named phases), its device's utilisation and
  memory, its verdict. `o` cycles the sort column, `r` reverses it; the straggler's row is
  highlighted. The job verdict heads it, and shows under the banner's headline (`◆ job`).
- **Top processes** (`t`): the node's busiest processes by CPU over the span its title
  gives (~5 samples), then the largest in memory; `◆ main` and `◆ worker` are the
  selected run's own, `◆ training` another run's (another rank on the node). Reading
  every process costs the training process CPU, so on a node of thousands the sampler
  reads the table less often (at most 0.1 % of a core), and the title says when it was
  read.

On a terminal under 44 rows the panels take compact forms (all cores in one bar with
the busiest by number `#3 96%`, four accelerators a line with utilisation and `m`
memory %, one line a disk or interface); when they still do not fit they scroll, and
the line under them names what is below the fold. On a terminal too small for the
verdict, the graph and a few rows of panels (a 40x10 pane), the verdict comes first:
the graph is hidden, the panels keep the rows left (or are hidden too), and that line
says what is hidden: a larger terminal shows it.

## Verdicts

- **input-bound**: steps wait for data; the cause says why (too few workers, workers
  CPU-bound, disk, network file system, swap, CPU quota...). Fix the input pipeline.
- **compute-bound**: the accelerator is the limit: the healthy state.
- **stalled**: no step has finished for a long time (hang, deadlock, slow I/O).
- **warming up**: too few steps to tell yet.
- **job: straggler**: one rank (or one node's ranks) spends more of each step outside
  the collective than the others, who wait for it: named, with how much faster the job
  would step without it and its own cause. **job: alike**: no rank stands out; the
  ranks' common verdict.

## Instrumenting a script

    {INSTRUMENT_HINT}

## Keys

`q` quit · `p` pause the display (data keeps arriving) · `tab`/`shift+tab`, `1`-`9`
switch run · `t` show/hide the top processes · `j` rank board of the job (`o` sort
column, `r` reverse, `j`/`escape` back) · `PgDn`/`PgUp`, `↓`/`↑` scroll the panels ·
`s` save an SVG screenshot · `?` or `escape` close this help

## Recording and replay

`r` records what the viewer receives until `r` again, into `$GPUTOP_RECORD_DIR` (default
`~/.local/share/gputop/recordings`); the line under the problems shows the file and its
size. `gputop FILE` replays a recording: `space` or `p` play/pause, `+`/`-` speed 1 to 60 times,
`←`/`→` 10 s back/forward; the time line shows where you are.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape,question_mark,q", "dismiss", "Close help"),
    ]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-body"):
            yield Markdown(HELP_TEXT)
