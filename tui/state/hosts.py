"""Per-host system samples: each node's history, from whichever source samples it."""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass

from gputop_dl.probe.samples import SystemSample
from gputop_dl.tui.state.clean import clean_text

AGENT_DEFERS_S = 5.0  # an agent's host samples are ignored while a probe samples the host
MAX_HOSTS = 256  # hosts remembered; the one heard from longest ago is forgotten first
# A history replay (docs/protocol.md) repeats a publisher's last REPLAYED_SAMPLES samples,
# taken every interval while it is watched, every UNWATCHED_SAMPLE_S or slower while not
# (probe.core HISTORY_SYSTEMS, UNWATCHED_SAMPLE_S).
REPLAYED_SAMPLES = 60
UNWATCHED_SAMPLE_S = 5.0


def keep_recent(history: deque[SystemSample], sample: SystemSample, keep_s: float) -> bool:
    """Keep ``sample`` in ``history`` (oldest first) unless it holds a sample of that time
    already, and drop the samples more than ``keep_s`` older than the newest. True when
    ``sample`` was kept.

    Every subscription a probe sees makes it send its last samples again, to every
    subscriber (docs/protocol.md, "History on attach"): a sample of a time held is such a
    repeat (appended again, it counted twice in every median and count over the window);
    an older one not held is one this viewer missed (it attached late, or the sample was
    lost), put in its place in time. A sample older than any replay reaches is no replay:
    the clock stepped back, and it is appended (dropping nothing), as is one stepped
    forward (leaving only the newest sample).

    The deque's maxlen bounds a flood; this bounds the time covered: a source sampling
    every 5 s would otherwise keep five windows' worth (and a 30,000-core sample is big)."""
    at, newest = sample.time, history[-1].time if history else None
    if newest is None or at > newest or newest - at > replay_reach_s(sample):
        history.append(sample)
        oldest = at - keep_s
        while history[0].time < oldest:
            history.popleft()
        return True
    if at < newest - keep_s:
        return False  # a replayed sample older than the time kept
    index = bisect_left(history, at, key=_sample_time)
    if index < len(history) and history[index].time == at:
        return False  # held already: a replay repeats it
    if len(history) == history.maxlen:
        if index == 0:
            return False  # it would be the oldest, the one a full history lets go
        history.popleft()
        index -= 1
    history.insert(index, sample)
    return True


def replay_reach_s(sample: SystemSample) -> float:
    """How much older than the newest sample a replayed one of its publisher may be."""
    return REPLAYED_SAMPLES * max(UNWATCHED_SAMPLE_S, sample.interval_s or 0.0)


def _sample_time(sample: SystemSample) -> float:
    return sample.time


MIN_HISTORY_S = 60.0  # at least a minute of a host's samples, whatever the viewer's window


class Host:
    def __init__(self, history_s: float) -> None:
        self.history: deque[SystemSample] = deque(maxlen=math.ceil(history_s))
        self.probe_sample_received: float | None = None
        self.last_received: float | None = None


class Hosts:
    """Host name -> its samples, bounded: a publisher inventing host names cannot grow it."""

    def __init__(self, history_s: float) -> None:
        self.history_s = max(MIN_HISTORY_S, history_s)
        self._hosts: dict[str, Host] = {}

    def names(self) -> tuple[str, ...]:
        return tuple(self._hosts)

    def get(self, host: str | None) -> Host | None:
        return None if host is None else self._hosts.get(host)

    def add(self, sample: SystemSample, received: float, *, from_agent: bool) -> None:
        """Keep a host-wide sample; an agent's only while no probe samples that host
        (a probe's samples carry its processes too). A sample of a time the host's
        history holds is a replay's repeat (keep_recent): two samplers of one node do
        not sample at the same microsecond."""
        host = self._hosts.get(sample.host)
        if host is None:
            if len(self._hosts) >= MAX_HOSTS:
                oldest = min(self._hosts, key=lambda name: self._hosts[name].last_received or 0.0)
                del self._hosts[oldest]
            host = self._hosts[sample.host] = Host(self.history_s)
        host.last_received = received
        if from_agent:
            recent = host.probe_sample_received
            if recent is not None and received - recent <= AGENT_DEFERS_S:
                return
        else:
            host.probe_sample_received = received
        keep_recent(host.history, sample, self.history_s)


# ------------------------------------------------------------ remote host links
LINK_LIVE, LINK_CONNECTING = "live", "connecting"
MAX_LINKS = 4096  # hosts given with --hosts are bounded by the hostlist parser too
NAMED_IN_SUMMARY = 3  # hosts named per state before "and N more"


@dataclass(frozen=True)
class Link:
    """The ssh link to one remote host (tui.remote): its state and ssh's own words."""

    host: str
    endpoint: str
    state: str  # connecting, live, auth failed, not installed, unreachable, lost
    detail: str
    since: float | None
    ever_live: bool


class Links:
    """Host -> its link's newest state, in the order the hosts were given."""

    def __init__(self) -> None:
        self._links: dict[str, Link] = {}

    def apply(self, endpoint: str, host: str, state: str, detail: str, now: float | None) -> Link:
        old = self._links.get(endpoint)
        if old is None and len(self._links) >= MAX_LINKS:
            return Link(host, endpoint, state, detail, now, False)
        ever = (old is not None and old.ever_live) or state == LINK_LIVE
        since = old.since if old is not None and old.state == state else now
        link = self._links[endpoint] = Link(host, endpoint, state, detail, since, ever)
        return link

    def all(self) -> tuple[Link, ...]:
        return tuple(self._links.values())


def link_names(links: Sequence[Link]) -> list[str]:
    """Each link's name in the summary: its host, or where two links share a host (two
    ports, two users) its address without the scheme, which tells them apart."""
    hosts = Counter(link.host for link in links)
    return [
        link.host if hosts[link.host] == 1 else clean_text(link.endpoint.removeprefix("ssh://"))
        for link in links
    ]


def link_summary(links: Sequence[Link]) -> str:
    """One line for the status bar: each host's state, or counts when there are many
    ("16 hosts: 14 live, 1 lost (node07), 1 auth failed (node03)")."""
    if not links:
        return ""
    names = link_names(links)
    if len(links) <= NAMED_IN_SUMMARY:
        pairs = zip(names, links, strict=True)
        return "ssh: " + ", ".join(f"{name} {link.state}" for name, link in pairs)
    by_state: dict[str, list[str]] = {}
    for name, link in zip(names, links, strict=True):
        by_state.setdefault(link.state, []).append(name)
    parts = []
    for state, hosts in sorted(by_state.items(), key=lambda kv: (kv[0] != LINK_LIVE, kv[0])):
        if state == LINK_LIVE:
            parts.append(f"{len(hosts)} live")
            continue
        named = ", ".join(hosts[:NAMED_IN_SUMMARY])
        more = f" and {len(hosts) - NAMED_IN_SUMMARY} more" if len(hosts) > NAMED_IN_SUMMARY else ""
        parts.append(f"{len(hosts)} {state} ({named}{more})")
    return f"ssh {len(links)} hosts: " + ", ".join(parts)
