"""Slurm hostlist syntax: ``node[01-03,07],gpu[1-2]`` -> node01 node02 node03 node07 gpu1 gpu2.

What ``scontrol show hostnames`` does, for the forms ``$SLURM_JOB_NODELIST`` takes:
comma-separated names, each with any number of bracketed ranges (``rack[1-2]-n[1-4]``
is the product), ranges keeping their zero padding (``[08-11]`` -> 08 09 10 11). Pure
and bounded: a list that would expand past MAX_HOSTS is refused, not built.
"""

from __future__ import annotations

MAX_HOSTS = 65_536


class HostlistError(ValueError):
    """Not a hostlist; the message says where."""


def _split_top(text: str) -> list[str]:
    """Split on the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            if depth:
                raise HostlistError(f"{text!r}: nested '['")
            depth = 1
        elif ch == "]":
            if not depth:
                raise HostlistError(f"{text!r}: ']' without '['")
            depth = 0
        elif ch == "," and not depth:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise HostlistError(f"{text!r}: '[' not closed")
    parts.append(text[start:])
    return parts


def _range(text: str, spec: str) -> list[str]:
    """The values of one bracket's ``01-03,7`` (padding of the lower bound kept)."""
    values: list[str] = []
    for item in spec.split(","):
        low, sep, high = item.strip().partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise HostlistError(f"{text!r}: {item!r} is not a number or a range")
        if not sep:
            values.append(low)
            continue
        if int(high) < int(low):
            raise HostlistError(f"{text!r}: range {item!r} goes down")
        if int(high) - int(low) + 1 + len(values) > MAX_HOSTS:
            raise HostlistError(f"{text!r}: more than {MAX_HOSTS} hosts")
        width = len(low) if low.startswith("0") else 0
        values.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return values


def _expand_one(text: str, name: str) -> list[str]:
    names = [""]
    rest = name
    while rest:
        head, bracket, tail = rest.partition("[")
        names = [n + head for n in names]
        if not bracket:
            break
        spec, _close, rest = tail.partition("]")
        values = _range(text, spec)
        if len(names) * len(values) > MAX_HOSTS:
            raise HostlistError(f"{text!r}: more than {MAX_HOSTS} hosts")
        names = [n + v for n in names for v in values]
    return names


def expand(text: str) -> list[str]:
    """The host names of a hostlist, in order, duplicates removed."""
    text = text.strip()
    if not text:
        raise HostlistError("empty host list")
    hosts: list[str] = []
    for part in _split_top(text):
        part = part.strip()
        if not part:
            raise HostlistError(f"{text!r}: empty name between commas")
        if any(ch.isspace() for ch in part):
            raise HostlistError(f"{text!r}: space in a host name")
        hosts.extend(_expand_one(text, part))
        if len(hosts) > MAX_HOSTS:
            raise HostlistError(f"{text!r}: more than {MAX_HOSTS} hosts")
    return list(dict.fromkeys(hosts))


__all__ = ["MAX_HOSTS", "HostlistError", "expand"]
