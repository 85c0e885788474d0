"""The loader knob the user actually edits, in their framework's words.

Under Hugging Face ``Trainer`` the DataLoader is built from ``TrainingArguments``; under
Lightning it is the one returned by ``train_dataloader()``; everywhere else (a plain loop,
accelerate, which prepares the user's own loader) it is ``DataLoader(...)``.
"""

from __future__ import annotations

from gputop_dl.probe.messages import LoaderInfo

DATALOADER = "torch.DataLoader"  # LoaderInfo.kind of a torch DataLoader


def is_dataloader(loader: LoaderInfo) -> bool:
    """A loader with workers to set: a torch DataLoader, a subclass (torchdata's
    StatefulDataLoader), or one behind a wrapper (accelerate, Lightning)."""
    return loader.wrapper is not None or loader.kind.endswith("DataLoader")


# DataLoader argument -> TrainingArguments field
_TRANSFORMERS = {
    "num_workers": "dataloader_num_workers",
    "pin_memory": "dataloader_pin_memory",
    "prefetch_factor": "dataloader_prefetch_factor",
    "persistent_workers": "dataloader_persistent_workers",
}


def knob(framework: str | None, setting: str, value: str) -> str:
    """``setting=value`` where the user sets it: ``knob("transformers", "num_workers",
    "4")`` -> ``TrainingArguments(dataloader_num_workers=4)``."""
    if framework == "transformers" and setting in _TRANSFORMERS:
        return f"TrainingArguments({_TRANSFORMERS[setting]}={value})"
    if framework == "lightning":
        return f"DataLoader({setting}={value}) in train_dataloader()"
    return f"DataLoader({setting}={value})"


def setting(loader: LoaderInfo | None, name: str) -> str:
    """A loader setting as known: ``num_workers=2``, or said plainly to be unknown (never
    a guess): ``num_workers unknown (loader wrapped in accelerate.DataLoaderShard)``."""
    value = getattr(loader, name, None) if loader is not None else None
    if value is not None:
        return f"{name}={value}"
    if loader is None:
        return f"{name} unknown (no loader reported)"
    if loader.wrapper:
        return f"{name} unknown (loader wrapped in {loader.wrapper})"
    return f"{name} unknown ({loader.kind} does not report it)"
