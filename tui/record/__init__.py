"""Recordings (issue 13): ``gputop record``, replay in the viewer and headless, and the
Perfetto/CSV exports. The file format is in :mod:`.format`."""
