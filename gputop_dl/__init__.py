"""gputop-dl: a top for deep-learning training runs.

Two subpackages, kept apart on purpose:

- ``gputop_dl.probe`` goes into the training process (needs pyzmq, msgspec, psutil);
- ``gputop_dl.tui`` is the ``gputop`` viewer (adds Textual).

The sources live in the repository's top-level ``probe/`` and ``tui/`` folders; this
package owns both so that neither takes a generic import name (``probe`` and ``tui`` are
other projects' names on the package index).
"""

from gputop_dl.probe.version import __version__

__all__ = ["__version__"]
