"""The bottleneck banner: the verdict, why, what to do, and what it would gain.

Its severity sets a class (``-ok``, ``-info``, ``-warning``, ``-critical``, ``-muted``)
that ``app.tcss`` colours. Without a probe it says how to instrument a script.

On a terminal too small for all of it (a 40x10 tmux pane) the app caps its rows
(:meth:`Banner.set_max_rows`): the lines are grouped by what they say, and the groups
kept by priority (the headline first, then the job, the first advice, the headroom),
so the verdict stays on screen and a cut shows as "…".
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.text import Text

from gputop_dl.tui.analysis.stuck import USER_FRAME
from gputop_dl.tui.format import fmt_duration, fmt_share
from gputop_dl.tui.state import INSTRUMENT_HINT, OUR_PROTOCOL, RunSummary, upgrade_advice
from gputop_dl.tui.widgets.base import Panel, wrap

if TYPE_CHECKING:
    from gputop_dl.tui.analyzer import Verdict

SEVERITIES = ("ok", "info", "warning", "critical", "muted")
SEVERITY_GLYPHS = {"ok": "✓", "info": "●", "warning": "▲", "critical": "✖", "muted": "■"}
WIDE_BANNER = 118  # from this many columns the banner adds the evidence and the notes
# (screen rows below which, lines of a narrow banner): 80x24 keeps 5 lines, so that
# all the panels' titles stay in view under it
NARROW_BUDGET = ((30, 5), (44, 7), (sys.maxsize, 9))
MAX_WRAP = 4  # lines one bullet may take before it is cut (a sentence, not a page)
# Lines under an evidence item (a stalled run's stack: "  at file:line in f()") shown with
# it: the innermost frame, and the user's own innermost frame when the stack names it
# (else the next frame).
MAX_DETAIL = 2
# How long "nothing received yet" goes without the hint to instrument a script: before
# that it is as likely a script still importing torch or building its loader (the demo's
# probe speaks ~3 s after its launch). See Banner._hint_due.
HINT_AFTER_S = 10.0
# Which lines stay when the rows are capped: lower first (see fit_rows).
HEADLINE, JOB, FIRST_ADVICE, HEADROOM, MORE_ADVICE, EVIDENCE, NOTE = range(7)

# Verdicts whose headline gives the condition's own duration ("Stalled: no step for 2 min",
# "Outside the training loop for 25 s", "No step for 40 s in the training loop",
# "Starting a pass: no batch for 12 s"): no second duration beside it (held_for). The
# untimed "Warming up: 3 of 5 steps" goes without it too: the header gives the uptime.
TIMED_KINDS = frozenset({"stalled", "outside-loop", "warming-up", "starting-pass"})

Group = tuple[int, list[Text]]  # (priority, lines): lines that go or stay together


class Banner(Panel):
    COMPONENT_CLASSES = {
        "banner--kind",
        "banner--headline",
        "banner--evidence",
        "banner--advice",
        "banner--headroom",
        "banner--code",
        "banner--note",
        "banner--job",
    }

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.run: RunSummary | None = None
        self.host: str | None = None
        self.now = 0.0
        self.agent_only: tuple[str, ...] = ()  # nodes an agent reports on, with no run
        self.severity = "info"
        self._set_severity("info")
        self.job_text: str | None = None  # the selected run's job verdict (a job of > 1 rank)
        self.max_rows: int | None = None  # set by the app on a small terminal
        # (what the banner waits on: a placeholder's key, None for nothing heard at all;
        # since when): see _hint_due
        self._waiting: tuple[str | None, float] | None = None
        self.hint_due = False  # the hint under "nothing received yet" (_hint_due)

    def show(
        self,
        run: RunSummary | None,
        host: str | None,
        now: float,
        job_text: str | None = None,
        agent_only: Sequence[str] = (),
    ) -> None:
        agent_only = tuple(agent_only)
        hint_due = self._hint_due(run, host, agent_only, now)
        if self.unchanged(*_shown_of(run, now), host, job_text, agent_only, hint_due):
            return  # the same lines: not even built again (a refresh comes every second)
        self.run, self.host, self.now, self.job_text = run, host, now, job_text
        self.hint_due = hint_due
        self.agent_only = agent_only
        self._set_severity(self._severity())
        self.changed()

    def _hint_due(
        self, run: RunSummary | None, host: str | None, agent_only: tuple[str, ...], now: float
    ) -> bool:
        """Whether the "instrument a script" hint goes under "nothing received yet".

        Nothing heard is what every instrumented script looks like at first: its probe
        starts at its first ``probe.watch()``, after its imports and its set-up. So while
        the viewer has heard of nothing at all (no run, no node) or an endpoint it listens
        to sent nothing, the hint waits HINT_AFTER_S (again for another endpoint shown);
        it never comes for an endpoint a probe registered itself (named by its discovery
        record: the probe is there, silent so far). Elsewhere: True."""
        key: str | None
        if run is None and host is None and not agent_only:
            key = None
        elif run is not None and run.is_placeholder and run.connection.state != "error":
            if run.name != run.endpoint:
                self._waiting = None
                return False
            key = run.key
        else:
            self._waiting = None
            return True
        if self._waiting is None or self._waiting[0] != key:
            self._waiting = (key, now)
        return now - self._waiting[1] >= HINT_AFTER_S

    def _set_severity(self, severity: str) -> None:
        self.severity = severity
        for name in SEVERITIES:
            self.set_class(name == severity, f"-{name}")

    def _severity(self) -> str:
        run = self.run
        if run is None or run.is_placeholder:
            return "critical" if run is not None and run.connection.state == "error" else "info"
        state = run.connection.state
        if state == "incompatible":
            return "critical"
        if state in ("exited", "lost"):
            return "muted"
        if run.verdict is None:
            return "warning" if state == "stale" else "info"
        return run.verdict.severity if run.verdict.severity in SEVERITIES else "info"

    @property
    def budget(self) -> int:
        """Lines a narrow banner may take for more than the headline, the first advice
        and the headroom (which it always shows): fewer on a shorter screen."""
        height = self.screen.size.height if self.is_attached else 0
        return next(lines for rows, lines in NARROW_BUDGET if height < rows)

    def layout_key(self) -> tuple[int, int | None]:
        return self.budget, self.max_rows

    def set_max_rows(self, rows: int | None) -> bool:
        """Cap the banner at ``rows`` lines (None: no cap); True when the cap changed
        (then the banner is built again, and its height may change)."""
        if rows == self.max_rows:
            return False
        self.max_rows = rows
        self.changed()
        return True

    # ---------------------------------------------------------------- rendering

    def build(self, width: int) -> list[Text]:
        groups = self._build(width)
        if self.job_text:  # under the run's headline: the job it is a rank of
            job = self._item("◆", self.job_text, "banner--job")
            groups[1:1] = [(JOB, wrap(job, width, max_lines=2, indent=4))]
        return fit_rows(groups, self.max_rows, width)

    def _build(self, width: int) -> list[Group]:
        run = self.run
        if run is None and self.agent_only:
            nodes = self.agent_only
            node = self.host if self.host in nodes else nodes[0]
            more = f" (and {len(nodes) - 1} more nodes)" if len(nodes) > 1 else ""
            return in_order(
                self._headline(
                    "info", "NO RUN", f"node {node}: no training run (agent only){more}."
                ),
                self._hint("Instrument a script:"),
            )
        if run is None:
            # No host: nothing samples one (`--no-local`, or before the first sample).
            what = f": showing {self.host}" if self.host else ", and no node sampled yet"
            none = self._headline("info", "NO PROBE", f"No training run attached{what}.")
            if not self.hint_due:
                return in_order(none)
            return in_order(none, self._hint("Instrument a script:"))
        if run.is_placeholder:
            if run.connection.state == "error":
                return in_order(self._headline("critical", "NO CONNECTION", run.connection.text))
            where = run.name if run.name == run.endpoint else f"{run.name} at {run.endpoint}"
            waiting = self._headline("info", "WAITING", f"{where}: nothing received yet.")
            if not self.hint_due:
                return in_order(waiting)
            return in_order(waiting, self._hint("Not instrumented yet?"))
        state = run.connection.state
        if state == "incompatible":
            theirs = f"{run.theirs[0]}.{run.theirs[1]}" if run.theirs else "another version"
            headline = (
                f"the probe speaks protocol {theirs}, this gputop speaks {OUR_PROTOCOL}: "
                "its messages cannot be read"
            )
            return [
                (HEADLINE, wrap(self._headline("critical", "INCOMPATIBLE", headline), width)),
                (FIRST_ADVICE, [self._item("→", upgrade_advice(run.theirs), "banner--advice")]),
            ]
        verdict = run.verdict
        if verdict is None:
            if state == "exited":
                return in_order(
                    self._headline("muted", "EXITED", f"The run {run.connection.text}.")
                )
            if state == "lost":
                return in_order(self._headline("muted", "LOST", f"{run.connection.text}."))
            if state == "stale":
                return in_order(
                    self._headline(
                        "warning", "STALE", f"{run.connection.text}: is the process still running?"
                    )
                )
            return in_order(
                self._headline("info", "WAITING", "Connected; waiting for the first steps.")
            )
        return self._verdict_lines(run, verdict, width)

    def _headline(self, severity: str, kind: str, headline: str, right: str = "") -> Text:
        line = Text()
        line.append(SEVERITY_GLYPHS.get(severity, "●"), self.style("banner--kind"))
        if kind:
            line.append(f" {kind}", self.style("banner--kind"))
        line.append(" ")
        line.append(headline, self.style("banner--headline"))
        if right:
            line.append(f"   {right}", self.style("banner--note"))
        return line

    def _hint(self, lead: str) -> Text:
        line = Text(f"  {lead} ", self.style("banner--note"))
        line.append(INSTRUMENT_HINT, self.style("banner--code"))
        return line

    def _verdict_lines(self, run: RunSummary, verdict: Verdict, width: int) -> list[Group]:
        state = run.connection.state
        prefix = ""
        if state in ("exited", "lost"):
            # The run ended: its bottleneck as last judged in its loop (ended_verdict),
            # said as the past, not the state it ended in.
            prefix = f"{run.connection.text}. Last verdict: "
        elif state == "stale" and run.connection.age_s is not None:
            prefix = f"(as of {fmt_duration(run.connection.age_s)} ago) "
        kind = verdict.kind.replace("-", " ").upper()
        if verdict.headline.replace("-", " ").upper().startswith(kind):
            kind = ""  # the headline names it already: do not say it twice
        wide = width >= WIDE_BANNER
        right = ""
        if wide:
            facts = []
            held = held_for(verdict, state, self.now)
            if held is not None:
                facts.append(f"for {held}")
            if verdict.confidence > 0:
                facts.append(f"confidence {fmt_share(verdict.confidence)}")
            right = " · ".join(facts)
        severity = self._severity()
        headline = self._headline(severity, kind, prefix + verdict.headline, right)
        lines = wrap(headline, width, max_lines=MAX_WRAP)
        evidence = list(verdict.evidence)
        advice = list(verdict.advice)
        notes: tuple[str, ...] = tuple(getattr(verdict, "notes", ()) or ())
        headroom = [verdict.headroom] if verdict.headroom else []
        if wide:
            return [
                (HEADLINE, lines),
                (EVIDENCE, self._evidence(evidence, 3, width)),
                (FIRST_ADVICE, self._items("→", advice[:1], "banner--advice", width)),
                (MORE_ADVICE, self._items("→", advice[1:2], "banner--advice", width)),
                (HEADROOM, self._items("⇡", headroom, "banner--headroom", width)),
                (NOTE, self._items("·", notes[:1], "banner--note", width)),
            ]
        # Narrow: what to do before why, every line wrapped, none cut; then the
        # second piece of advice and the first of evidence while the screen has room.
        first = self._items("→", advice[:1], "banner--advice", width)
        second = self._items("→", advice[1:2], "banner--advice", width)
        gain = self._items("⇡", headroom, "banner--headroom", width)
        lead = getattr(verdict, "lead", 0)
        why = self._evidence(evidence[lead:] if 0 < lead < len(evidence) else evidence, 1, width)
        budget = self.budget - len(lines) - len(first) - len(gain)
        if len(second) > budget:
            second = []
        if len(second) + len(why) > budget:
            why = []
        return [
            (HEADLINE, lines),
            (FIRST_ADVICE, first),
            (MORE_ADVICE, second),
            (HEADROOM, gain),
            (EVIDENCE, why),
        ]

    def _evidence(self, evidence: Sequence[str], count: int, width: int) -> list[Text]:
        """The first ``count`` pieces of evidence as bullets, each with its first details."""
        lines: list[Text] = []
        for head, details in evidence_items(evidence)[:count]:
            lines += self._items("•", [head], "banner--evidence", width)
            lines += self._items(" ", shown_details(details), "banner--evidence", width)
        return lines

    def _items(self, glyph: str, texts: Sequence[str], component: str, width: int) -> list[Text]:
        """Each text as a bullet, word-wrapped under its first word."""
        lines: list[Text] = []
        for text in texts:
            lines += wrap(self._item(glyph, text, component), width, max_lines=MAX_WRAP, indent=4)
        return lines

    def _item(self, glyph: str, text: str, component: str) -> Text:
        return Text(f"  {glyph} {text}", self.style(component))


def in_order(*lines: Text) -> list[Group]:
    """Lines each of which matters less than the one before."""
    return [(priority, [line]) for priority, line in enumerate(lines)]


def fit_rows(groups: Sequence[Group], rows: int | None, width: int) -> list[Text]:
    """The groups' lines in their order on screen, in at most ``rows`` lines (None: all).

    Groups are kept by priority (lowest first) while they fit whole; the first that does
    not is cut to the rows left and the rest left out: the headline and the first advice
    before evidence. Where anything was left out, the last line shown ends in "…"."""
    shown = sum(len(lines) for _priority, lines in groups)
    if rows is None or shown <= rows:
        return [line for _priority, lines in groups for line in lines]
    kept: dict[int, int] = {}  # group position -> its lines kept
    left = max(1, rows)
    for position in sorted(range(len(groups)), key=lambda i: groups[i][0]):
        kept[position] = min(left, len(groups[position][1]))
        left -= kept[position]
        if not left:
            break
    out = [
        line
        for position, (_priority, lines) in enumerate(groups)
        for line in lines[: kept.get(position, 0)]
    ]
    out[-1] = ellipsized(out[-1], width)
    return out


def ellipsized(line: Text, width: int) -> Text:
    """``line`` (a copy) ending in "…": more was there."""
    line = line.copy()
    line.rstrip()
    if not line.plain.endswith("…"):
        line.truncate(max(1, width - 1))
        line.rstrip()
        line.append("…")
    return line


def evidence_items(evidence: Sequence[str]) -> list[tuple[str, list[str]]]:
    """Evidence lines as items: a line, and the indented lines under it (a stack's
    frames under "… stack …, innermost first:"), which mean nothing without their head."""
    items: list[tuple[str, list[str]]] = []
    for line in evidence:
        if line.startswith("  ") and items:
            items[-1][1].append(line.strip())
        else:
            items.append((line, []))
    return items


def shown_details(details: list[str]) -> list[str]:
    """At most MAX_DETAIL of an item's details: the first ones, the user's frame kept."""
    user = [d for d in details if d.startswith(USER_FRAME)]
    return [*details[: MAX_DETAIL - len(user[:1])], *user[:1]]


def held_for(verdict: Verdict, state: str, now: float) -> str | None:
    """How long a live run's verdict has been shown ("3m05s"), said beside its headline;
    None under a second, for a run not live, and for the verdicts whose headline says how
    long the condition has lasted ("Outside the training loop for 25 s"): the time shown
    starts once the condition was judged, a few seconds later, and the two read as two
    answers to one question ("for 25 s ... for 24s")."""
    since: float | None = getattr(verdict, "since", None)
    if since is None or state != "live" or now - since < 1.0 or verdict.kind in TIMED_KINDS:
        return None
    return fmt_duration(now - since)


def _shown_of(run: RunSummary | None, now: float) -> tuple[object, ...]:
    """What of ``run`` and ``now`` the banner shows: a run summary changes at every
    refresh (rates, ages), its banner far less often. Anything the lines read must be
    here; something more only costs a rebuild."""
    if run is None:
        return (None,)
    connection = run.connection
    live = connection.state == "live"
    # "(as of 12s ago)" of a run no longer live; "for 3m05s" of a live run's verdict
    age = None if live or connection.age_s is None else fmt_duration(connection.age_s)
    held = held_for(run.verdict, connection.state, now) if run.verdict is not None else None
    return (
        run.key,
        run.name,
        run.endpoint,
        run.is_placeholder,
        run.theirs,
        connection.state,
        connection.text,
        age,
        run.verdict,
        held,
    )
