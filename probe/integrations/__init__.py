"""Framework callbacks: the same probe timings, for loops a framework drives itself.

Use them where ``probe.watch`` cannot reach the loader (Lightning re-creating it under
DDP): ``lightning.GputopCallback`` and ``transformers.GputopCallback``. Each module
imports its framework, so import the one you use.
"""
