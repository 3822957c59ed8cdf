"""What the trainer and the hang diagnosis agree on about a Python stack: whose code a frame is, and rank lists.

Rank 0's trainer collects every rank's stacks when the gang stops completing batches
(dtrain_trainer.hang_watch) and sends a bounded summary (records.HangRecord, status.hangStacks);
the operator and `dtrain run` compare them when runPolicy.progressDeadlineSeconds runs out
(core.hang_diagnosis). Both ask `is_framework` which frames are torch's, Lightning's or the
standard library's, so that "the innermost frame of the user's or dtrain's code" means one thing.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

# Top-level packages whose frames are the machinery a rank waits in, not where the user's or dtrain's
# code stands: torch, Lightning (both distributions) and what they call into. The standard library counts too.
FRAMEWORK_PACKAGES = frozenset(
    {
        "torch",
        "torchvision",
        "torchmetrics",
        "torchdata",
        "lightning",
        "pytorch_lightning",
        "lightning_fabric",
        "lightning_utilities",
        "numpy",
        "typing_extensions",
    }
)
# What a group of the summary carries: the innermost frames of the training thread, and of the user's or
# dtrain's code on it. Enough to say what it waits in and from where; the full stacks are in stacks.txt.
MAX_FRAMES = 10
MAX_CODE_FRAMES = 3
# Distinct stacks listed in the summary; the ranks of any further ones form one last group without frames.
MAX_GROUPS = 6


def is_framework(module: str | None) -> bool:
    """Whether a frame of `module` is torch's, Lightning's or the standard library's (not the user's or dtrain's)."""
    if not module:
        return True
    top = module.split(".", 1)[0]
    return top in FRAMEWORK_PACKAGES or top in sys.stdlib_module_names


def format_ranks(ranks: Iterable[int]) -> str:
    """Ranks as ranges: 0-3,5,7-8."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    start = previous = None
    for rank in [*ordered, None]:
        if rank is not None and previous is not None and rank == previous + 1:
            previous = rank
            continue
        if start is not None:
            parts.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = rank
    return ",".join(parts)


def parse_ranks(text: str | None, world_size: int) -> list[int]:
    """The ranks of `format_ranks`'s text that exist in a gang of `world_size` (what a trainer sent is not
    trusted to be small); a part that is no rank or range is skipped."""
    ranks: set[int] = set()
    for part in (text or "").split(","):
        first, _, last = part.strip().partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            continue
        ranks.update(range(int(first), min(int(last or first), world_size - 1) + 1))
    return sorted(ranks)
