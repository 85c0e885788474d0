"""The row under the panels that says what is out of sight, and how to see it.

Two kinds of out of sight: *below* the fold (panels the scroll reaches: PgDn) and
*hidden* (what a small terminal has no row for at all, the graph and maybe every panel:
only a larger terminal shows it). Pure text: the app measures, this words it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

# Where the panels' scroll is: more below ("down"), at the end of what scrolls ("up"),
# or not scrolling at all ("").
Scroll = Literal["down", "up", ""]


def more_text(below: Sequence[str], hidden: Sequence[str], *, scroll: Scroll, width: int) -> str:
    """The hint for ``below`` (panel titles under the fold), ``hidden`` (titles with no
    room on screen) and where the panels' scroll is (``scroll``), in ``width`` cells.

    Without anything hidden it is the scroll hint it always was; with something hidden
    the names shrink to counts until the hint fits: on a 40-column pane it still says
    that something is hidden and that a larger terminal shows it."""
    if not hidden:
        if scroll == "down":
            return f"↓ {', '.join(below) or 'more'} below: PgDn or ↓ to scroll"
        return "↑ more above: PgUp or ↑ to scroll"
    # The most informative that fits: the hidden part shrinks first (its names are
    # few), then the scroll part.
    candidates = [
        _join(part, gone) for part in _scroll_forms(below, scroll) for gone in _hidden_forms(hidden)
    ]
    fitting = (text for text in candidates if len(text) <= width)
    return next(fitting, candidates[-1])  # the shortest: cut by the widget if need be


def _scroll_forms(below: Sequence[str], scroll: Scroll) -> list[str]:
    """What the scroll reaches, longest form first ("" when the panels do not scroll)."""
    if below:
        return [
            f"↓ {', '.join(below)} below: PgDn",
            f"↓ {len(below)} panels below: PgDn",
            f"↓ {len(below)} more: PgDn",
        ]
    if scroll == "down":  # the last panel's own rows
        return ["↓ more below: PgDn", "↓ PgDn"]
    return ["↑ more above: PgUp", "↑ PgUp"] if scroll == "up" else [""]


def _hidden_forms(hidden: Sequence[str]) -> list[str]:
    """What no row shows, longest form first."""
    names = ", ".join(hidden)
    count = f"{len(hidden)} panels" if len(hidden) > 1 else names
    forms = [
        f"{names} hidden: enlarge the terminal",
        f"{names} hidden: enlarge terminal",
        f"{count} hidden: enlarge terminal",
        f"{len(hidden)} hidden: enlarge terminal",
    ]
    return list(dict.fromkeys(forms))  # one of each (a single name has no count)


def _join(scroll: str, hidden: str) -> str:
    if not scroll:
        return f"↓ {hidden}"
    return f"{scroll} · {hidden}"
