"""Warnings shown at the user's line.

The package warns from deep stacks: inside `torch.compile` a warning of the pass is raised under
Dynamo, AOTAutograd and Inductor frames, so a fixed `stacklevel` points into torch. `warn` points
at the first frame outside torch, this package, the standard library and installed packages
(a Trainer's `train()` is not the user's line; the script that called it is).
"""

from __future__ import annotations

import os
import sys
import sysconfig
import warnings

import torch

_SKIPPED_DIRS = tuple(os.path.dirname(p) + os.sep for p in (torch.__file__, __file__)) + (
    sysconfig.get_paths()["stdlib"] + os.sep,
)
_INSTALLED = tuple(f"{os.sep}{d}-packages{os.sep}" for d in ("site", "dist"))


def _skipped(filename: str) -> bool:
    return (filename.startswith(_SKIPPED_DIRS) or filename.startswith(("<frozen ", "<eval_with_key>"))
            or any(d in filename for d in _INSTALLED))


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """`warnings.warn` at the first frame of the user's code (the outermost frame when every
    frame is skipped)."""
    frame, stacklevel = sys._getframe(1), 2  # warn's caller is warnings.warn's stacklevel 2
    while frame.f_back is not None and _skipped(frame.f_code.co_filename):
        frame, stacklevel = frame.f_back, stacklevel + 1
    warnings.warn(message, category, stacklevel=stacklevel)
