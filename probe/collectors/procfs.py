"""Whole reads of /proc and /sys files, and listings of their directories, that keep
the GIL.

Python lets go of the GIL around each system call of a file read: ``open()`` and
``read()`` make six or seven (open, fstat, ioctl, lseek, read, read, close), ``os.open``
and ``os.read`` three. In a training process whose main thread runs Python, each of
them hands the GIL to that thread, and taking it back forces the thread off it after
the switch interval: a context switch of the training thread, and CPU on both sides.
The node sampler reads dozens of these files a second (hundreds in a walk of /proc);
measured beside a busy training thread (``bench/sampler_cost.py``), 96 context switches
of the training thread and 6.3 ms of the sampler's CPU per sample. The files are made
in memory by the kernel and answer in microseconds, so here the read runs through
libc with the GIL held: a sample hands the GIL over a few times, not a hundred.
``os.listdir`` lets go of it around each entry it reads (``readdir``): a walk of /proc,
or of a training process's threads, once per process or thread. :func:`list_dir` reads
the entries through ``getdents64`` in 64 KB at a time, with the GIL held.

Only for files the kernel answers at once: /proc's counters, /proc/<pid>/stat, cgroup
files, and the directories of /proc and /sys. Never a network filesystem, nor
/proc/<pid>/cmdline or /proc/<pid>/environ (they take the process's memory lock, which a
process stuck in reclaim holds): while such a read waits, the whole training process
would wait with it.

Linux (glibc or musl) through ctypes; where that is missing, ``os.open``/``os.read``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import threading
from typing import Any

CHUNK = 1 << 16  # one read takes most files whole (the next finds the end)

_local = threading.local()  # a buffer per thread: two samplers may read at once


def _libc() -> ctypes.PyDLL | None:
    """libc's open/read/close called WITH the GIL held (PyDLL), or None."""
    try:
        libc = ctypes.PyDLL(None, use_errno=True)
        libc.open.argtypes = [ctypes.c_char_p, ctypes.c_int]
        libc.open.restype = ctypes.c_int
        libc.read.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
        libc.read.restype = ctypes.c_ssize_t
        libc.close.argtypes = [ctypes.c_int]
        libc.close.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


def _getdents64(libc: ctypes.PyDLL | None) -> Any:
    """glibc's (2.30 on) and musl's ``getdents64``, with the GIL held, or None."""
    try:
        getdents = libc.getdents64 if libc is not None else None
    except AttributeError:
        return None
    if getdents is not None:
        getdents.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
        getdents.restype = ctypes.c_ssize_t
    return getdents


_LIBC = _libc()
_GETDENTS = _getdents64(_LIBC)
_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = _FLAGS | getattr(os, "O_DIRECTORY", 0)
# struct linux_dirent64: d_ino (8 bytes), d_off (8), d_reclen (2), d_type (1), d_name
_RECLEN = struct.Struct("=H")
_NAME_AT = 19


def _error(path: str) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, os.strerror(code), path)


def read_bytes(path: str) -> bytes:
    """The whole file; OSError as ``open()`` raises it (ENOENT, ESRCH, EACCES, ...),
    ValueError for a path with a NUL in it."""
    return _read(path, until_empty=True)


def read_single(path: str) -> bytes:
    """:func:`read_bytes` of a file the kernel makes whole at every read: one record
    (/proc/<pid>/stat, /proc/<pid>/statm: a seq_file whose buffer grows to fit it), or
    a regular file. A read shorter than the buffer then took all of it, and the read
    that would find the end is skipped: in a walk of /proc, 10.3 us a process instead of
    16.5 (bench/sampler_cost.py). Never for files of many records (/proc/vmstat,
    /proc/diskstats, /proc/net/dev): the kernel hands those over a page at a time, so a
    short read is not their end."""
    return _read(path, until_empty=False)


def _read(path: str, until_empty: bool) -> bytes:
    libc = _LIBC
    if libc is None:
        return _read_unheld(path)
    buf = _buffer()
    name = os.fsencode(path)
    if b"\0" in name:  # C would read another file: the path up to the NUL
        raise ValueError(f"embedded null byte in {path!r}")
    fd = libc.open(name, _FLAGS)
    if fd < 0:
        raise _error(path)
    try:
        parts = []
        while True:
            n = libc.read(fd, buf, CHUNK)
            if n < 0:
                raise _error(path)
            if n == 0:
                break
            parts.append(buf[:n])  # a slice of the array: cheaper than string_at
            if n < CHUNK and not until_empty:
                break
    finally:
        libc.close(fd)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def list_dir(path: str) -> list[str]:
    """The names in directory ``path`` but ``.`` and ``..``, as ``os.listdir`` gives
    them (any order, undecodable bytes as surrogates); OSError as it raises it."""
    libc, getdents = _LIBC, _GETDENTS
    if libc is None or getdents is None:
        return os.listdir(path)
    buf = _buffer()
    name = os.fsencode(path)
    if b"\0" in name:
        raise ValueError(f"embedded null byte in {path!r}")
    fd = libc.open(name, _DIR_FLAGS)
    if fd < 0:
        raise _error(path)
    names: list[str] = []
    try:
        while True:
            n = getdents(fd, buf, CHUNK)
            if n < 0:
                raise _error(path)
            if n == 0:
                return names
            data = ctypes.string_at(buf, n)
            at = 0
            while at < n:
                # An entry cut before its name, longer than what was read, or without a
                # NUL in it (a length of 0 among them) is not the kernel's layout: an
                # error, never a loop.
                size = _RECLEN.unpack_from(data, at + 16)[0] if at + _NAME_AT <= n else 0
                end = data.find(b"\0", at + _NAME_AT, at + size) if at + size <= n else -1
                if end < 0:
                    raise OSError(errno.EIO, "malformed directory entry", path)
                entry = data[at + _NAME_AT : end]
                if entry != b"." and entry != b"..":
                    names.append(os.fsdecode(entry))
                at += size
    finally:
        libc.close(fd)


def _buffer() -> Any:
    buf = getattr(_local, "buf", None)
    if buf is None:
        buf = _local.buf = ctypes.create_string_buffer(CHUNK)
    return buf


def read_text(path: str, *, single: bool = False) -> str:
    """The whole file as text (bytes that are not UTF-8 replaced: names are anyone's);
    ``single``: a file the kernel makes whole at every read (:func:`read_single`)."""
    return (read_single(path) if single else read_bytes(path)).decode(errors="replace")


def _read_unheld(path: str) -> bytes:
    fd = os.open(path, _FLAGS)
    try:
        parts = []
        while chunk := os.read(fd, CHUNK):
            parts.append(chunk)
    finally:
        os.close(fd)
    return b"".join(parts)
