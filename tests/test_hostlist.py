"""Slurm hostlist expansion: a table of what ``scontrol show hostnames`` prints."""

from __future__ import annotations

import pytest

from gputop_dl.tui.hostlist import MAX_HOSTS, HostlistError, expand


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("node1", ["node1"]),
        ("node[01-16]", [f"node{i:02d}" for i in range(1, 17)]),
        ("node[01-03,07],gpu[1-2]", ["node01", "node02", "node03", "node07", "gpu1", "gpu2"]),
        ("gpu[001-004,010],cpu07", ["gpu001", "gpu002", "gpu003", "gpu004", "gpu010", "cpu07"]),
        ("n[8-11]", ["n8", "n9", "n10", "n11"]),
        ("n[08-11]", ["n08", "n09", "n10", "n11"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("a,b,a", ["a", "b"]),
        (" a , b ", ["a", "b"]),
        ("x[7]", ["x7"]),
        ("node-[1-2].cluster", ["node-1.cluster", "node-2.cluster"]),
    ],
)
def test_expand(text: str, hosts: list[str]) -> None:
    assert expand(text) == hosts


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "empty"),
        ("node[1-3", "not closed"),
        ("node1-3]", "without"),
        ("node[[1]]", "nested"),
        ("node[3-1]", "goes down"),
        ("node[a-b]", "not a number"),
        ("node[1-]", "not a number"),
        ("a,,b", "empty name"),
        ("a b", "space"),
        (f"n[0-{MAX_HOSTS}]", "more than"),
        ("a[0-999]b[0-999]", "more than"),
    ],
)
def test_refused(text: str, why: str) -> None:
    with pytest.raises(HostlistError, match=why):
        expand(text)
