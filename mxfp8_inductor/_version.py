"""The package version and the torch releases it is tested with."""

from __future__ import annotations

import torch
from packaging.version import Version

from ._warn import warn

__version__ = "0.3.0"
# the oldest torch with the Inductor hooks the pass uses, and the newest it is tested on
OLDEST, NEWEST = (2, 11), (2, 13)


def check_torch(version: str = torch.__version__) -> None:
    """Raise ImportError on a torch older than the pass supports; warn on one newer than tested."""
    # compared by major.minor only: patch, pre-release, dev and local (+cu130) parts of a tested
    # minor release count as that release
    found = Version(version).release[:2]
    tested = f"{OLDEST[0]}.{OLDEST[1]} to {NEWEST[0]}.{NEWEST[1]}"
    if found < OLDEST:
        raise ImportError(f"mxfp8_inductor needs torch >= {OLDEST[0]}.{OLDEST[1]} (tested: {tested}), "
                          f"found {version}: upgrade torch")
    if found > NEWEST:
        warn(f"mxfp8_inductor is tested with torch {tested}, found {version}: the pass uses private "
             "Inductor hooks that may have changed; check your model with python -m mxfp8_inductor.check")
