"""Endpoints given on the command line: their syntax, and whether anything listens there.

ZeroMQ connects lazily and retries forever, so a viewer given a wrong endpoint would wait
on "connecting" for ever. These checks use a plain socket (or ``os.stat``) once, before
any ZeroMQ socket exists, so the user hears at once what is wrong and where.
"""

from __future__ import annotations

import os
import socket
import stat

SCHEMES = ("ipc://", "tcp://")
EXPECTED = "expected ipc://PATH or tcp://HOST:PORT"


class EndpointError(ValueError):
    """The text is not an endpoint gputop can use; the message says why."""


def parse(text: str, *, listen: bool = False) -> str:
    """Return ``text`` if it is a well-formed endpoint, else raise :class:`EndpointError`.

    ``listen``: the endpoint is to be bound, so ``tcp://HOST:*`` (any free port) is allowed.
    """
    if text.startswith("ipc://"):
        if not text.removeprefix("ipc://"):
            raise EndpointError(f"{text!r}: no socket path ({EXPECTED})")
        return text
    if text.startswith("tcp://"):
        host, port = _split_tcp(text)
        if not host:
            raise EndpointError(f"{text!r}: no host ({EXPECTED})")
        if listen and port == "*":
            return text
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise EndpointError(f"{text!r}: the port must be a number from 1 to 65535")
        return text
    raise EndpointError(f"{text!r} is not an endpoint ({EXPECTED})")


def _split_tcp(text: str) -> tuple[str, str]:
    rest = text.removeprefix("tcp://")
    host, sep, port = rest.rpartition(":")
    if not sep:
        raise EndpointError(f"{text!r}: no port ({EXPECTED})")
    return host.strip("[]"), port


def unreachable(endpoint: str, timeout_s: float = 1.0) -> str | None:
    """Why nothing can be received from ``endpoint`` (a parsed one), or None if something
    listens there. One connect attempt, closed at once: ZeroMQ ignores such a peer."""
    if endpoint.startswith("ipc://"):
        return _ipc_unreachable(endpoint.removeprefix("ipc://"), timeout_s)
    host, port = _split_tcp(endpoint)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return None
    except socket.gaierror:
        return f"unknown host {host!r} in {endpoint}"
    except ConnectionRefusedError:
        return f"nothing listens on {endpoint}"
    except TimeoutError:
        return f"no answer from {endpoint} within {timeout_s:g} s"
    except OSError as exc:
        return f"cannot reach {endpoint}: {exc.strerror or exc}"


def _ipc_unreachable(path: str, timeout_s: float) -> str | None:
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return f"no such socket: {path}"
    except OSError as exc:
        return f"cannot use {path}: {exc.strerror}"
    if not stat.S_ISSOCK(mode):
        return f"not a socket: {path}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect(path)
        except ConnectionRefusedError:
            return f"nothing listens on ipc://{path} (a socket left by a process that ended)"
        except OSError as exc:
            return f"cannot connect to ipc://{path}: {exc.strerror or exc}"
    return None
