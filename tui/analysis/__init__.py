"""Helpers of the bottleneck analyzer (``tui.analyzer`` is the public entry point).

Everything here is pure: plain records in, plain figures out, no I/O and no clock.
"""
