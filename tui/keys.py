"""``gputop keys``: the user's CURVE key pair, for authenticated TCP.

Writes ``gputop.key_secret`` (the pair, mode 0600) and ``gputop.key`` (the public key)
in $XDG_CONFIG_HOME/gputop (mode 0700), and adds the public key to ``authorized_keys``
there. A probe, agent or relay that listens on a network address then admits only
clients whose key is listed; copy the directory to the nodes (or share the home
directory) and every node accepts the same user's viewers. See docs/protocol.md,
"Authenticated TCP".
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from pathlib import Path

from gputop_dl.probe.transport import (
    AUTHORIZED_FILE,
    KEY_FILE,
    is_key,
    keys_dir,
    load_keys,
    parse_authorized,
    write_keypair,
)


def _private_dir(path: Path) -> str | None:
    """Create ``path`` 0700 (parents too); why it cannot hold a secret key, or None."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(path)
    except OSError as exc:
        return f"cannot create {path}: {exc.strerror}"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if st.st_uid != os.getuid():
        return f"{path} belongs to another user"
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, 0o700)  # ours: close it before a secret goes in
    return None


def authorize(directory: Path, public: bytes, comment: str) -> bool:
    """Add ``public`` to the authorized_keys file (created 0600); False if listed."""
    path = directory / AUTHORIZED_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        text = "# gputop: CURVE public keys allowed to connect, one per line\n"
    if public in parse_authorized(text):
        return False
    if text and not text.endswith("\n"):
        text += "\n"
    text += f"{public.decode()}  # {comment}\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)
    return True


def _joined(argv: list[str], option: str) -> list[str]:
    """``OPTION VALUE`` as ``OPTION=VALUE``: a Z85 key may begin with "-" or ".", which
    argparse would take for an option and refuse ("expected one argument")."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] == option and i + 1 < len(argv):
            out.append(f"{option}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def cmd_keys(argv: list[str]) -> int:
    from gputop_dl.tui.cli import (
        EXIT_CODES_KEYS,
        EXIT_NO_RUN,
        EXIT_OK,
        EXIT_USAGE,
        HelpFormatter,
    )

    ap = argparse.ArgumentParser(
        prog="gputop keys",
        description="Create your CURVE key pair for authenticated TCP (once), or show it. "
        "A probe, agent or relay listening on a network address then admits only the "
        "public keys in authorized_keys (yours is added). Copy the directory to the nodes, "
        "or share it through the home directory.",
        formatter_class=HelpFormatter,
        epilog=EXIT_CODES_KEYS,
    )
    ap.add_argument(
        "--authorize",
        metavar="PUBLIC_KEY",
        help="also admit this public key (another user's or machine's gputop.key)",
    )
    ap.add_argument("--force", action="store_true", help="replace an existing key pair")
    args = ap.parse_args(_joined(argv, "--authorize"))
    directory = keys_dir()
    if (problem := _private_dir(directory)) is not None:
        print(f"gputop keys: {problem}", file=sys.stderr)
        return EXIT_NO_RUN
    if args.authorize is not None and not is_key(args.authorize.encode()):
        print(f"gputop keys: {args.authorize!r} is not a CURVE public key", file=sys.stderr)
        return EXIT_USAGE
    keys = load_keys(directory)
    secret = directory / KEY_FILE
    if keys is None and not args.force and (secret.exists() or secret.is_symlink()):
        # Replaced silently, every node that holds the old public key would refuse this
        # user's viewers (and its probes this user's) with no word of why.
        print(
            f"gputop keys: {secret} exists but is no CURVE key pair that can be read (damaged, "
            "unreadable or too large); it was left as it is. gputop keys --force replaces it: "
            "nodes and viewers that hold the old public key must then be given the new one",
            file=sys.stderr,
        )
        return EXIT_NO_RUN
    try:
        if keys is None or args.force:
            for name in (KEY_FILE, "gputop.key"):
                (directory / name).unlink(missing_ok=True)
            write_keypair(directory)
            keys = load_keys(directory)
            if keys is None:
                print(f"gputop keys: could not read back the keys in {directory}", file=sys.stderr)
                return EXIT_NO_RUN
            print(f"created {secret} (secret, mode 0600)")
        authorize(directory, keys.public, f"{os.environ.get('USER', 'me')} (gputop keys)")
        if args.authorize is not None:
            authorize(directory, args.authorize.encode(), "added with gputop keys --authorize")
    except OSError as exc:  # a read-only or full file system: said, not a traceback
        print(f"gputop keys: cannot write the keys in {directory}: {exc}", file=sys.stderr)
        return EXIT_NO_RUN
    print(f"public key: {keys.public.decode()}")
    print(f"authorized: {directory / AUTHORIZED_FILE}")
    return EXIT_OK


__all__ = ["authorize", "cmd_keys"]
