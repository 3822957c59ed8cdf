"""Where a hang sits: the ranks that are not where the others are, from every rank's stacks (pure).

When runPolicy.progressDeadlineSeconds runs out (core.progress_deadline), the operator and `dtrain run`
read the stacks rank 0 collected a few seconds before (status.hangStacks; dtrain_trainer.hang_watch) and
name, in the Restarting (or Failed) condition, its Event and status.lastHang, the ranks that stand apart.

What a group of ranks waits in, from the innermost frames of its training thread up to the innermost
frame of the user's or dtrain's code (api.stacks.is_framework tells them apart):

- a collective: a torch.distributed frame (all_reduce, barrier, broadcast, ...) or one of DDP's own
  (torch.nn.parallel: its forward broadcasts buffers);
- the backward pass: a torch.autograd frame, where DDP's gradient all-reduce waits for every rank;
- the data loader: a torch.utils.data or torchdata frame among them or beyond (the user's dataset code may
  be innermost);
- its own code: anything else (a sleep, a lock, a loop, a call that does not return).

Ranks that wait in a collective or the backward pass wait for the others. So when some do, the ranks
elsewhere (in their own code or their data loader) and the silent ones (no stack: stopped, cut off from
rank 0, or holding the interpreter lock in native code) are the ones they wait for, and are named. When
every rank waits in one collective at one place, no rank differs: that is a collective none can finish (a
cut link, a broken NCCL communicator). Otherwise the places that fewer ranks stand at are named (all of them
on a tie): a collective some ranks skipped or called in another order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from dtrain_operator.api import HangStacks, Progress, StackFrame, StackGroup, contract
from dtrain_operator.api.records import status_patch
from dtrain_operator.api.stacks import format_ranks, is_framework, parse_ranks
from dtrain_operator.core.policy import FailureDecision

COLLECTIVE = "collective"
BACKWARD = "backward"
DATA_LOADER = "data loader"
OWN_CODE = "own code"
UNLISTED = "unlisted"
WAITING_FOR_PEERS = (COLLECTIVE, BACKWARD)
# Where a rank waits for its peers: torch.distributed's collectives, DDP's own (its forward synchronises buffers
# and, once, its buckets), and the backward pass, in which DDP's gradient all-reduce waits.
COLLECTIVE_PACKAGES = ((COLLECTIVE, "torch.distributed"), (COLLECTIVE, "torch.nn.parallel"), (BACKWARD, "torch.autograd"))
# torch's loaders, and torchdata's StatefulDataLoader that dtrain makes the training loader (dtrain_trainer.resumable).
DATA_LOADER_PACKAGES = ("torch.utils.data", "torchdata")
# Ranks named one by one (with pod and node) in a message; the rest are counted.
MAX_NAMED_RANKS = 8
SILENT = (
    "gave no stack: stopped (SIGSTOP), cut off from rank 0's node, or stuck in native code that holds "
    "Python's interpreter lock"
)


@dataclass(frozen=True)
class Place:
    """Where some ranks' training threads stand: what they wait in, and the innermost frame of their code."""

    kind: str
    blocking: StackFrame | None
    """The frame of torch (or the standard library) it waits in."""
    code: StackFrame | None
    """The innermost frame of the user's or dtrain's code."""
    ranks: tuple[int, ...] = ()

    @property
    def key(self) -> tuple[object, ...]:
        blocking = (self.blocking.module, self.blocking.function) if self.blocking else None
        code = (self.code.module, self.code.function, self.code.line) if self.code else None
        return self.kind, blocking, code

    def describe(self) -> str:
        at = f"{self.code.file}:{self.code.line} in {self.code.function}" if self.code else None
        if self.kind == COLLECTIVE and self.blocking is not None:
            what = self.blocking.function or "?"
            name = f"torch.distributed.{what}" if _under(self.blocking, "torch.distributed") else what
            return f"in a collective ({name})" + (f" called from {at}" if at else "")
        if self.kind == BACKWARD:
            return "in the backward pass (DDP's gradient all-reduce)" + (f" called from {at}" if at else "")
        if self.kind == DATA_LOADER:
            return "in the data loader" + (f" at {at}" if at else "")
        if self.kind == UNLISTED:
            return "at a place the summary does not list (see stacks.txt)"
        inner = f", waiting in {self.blocking.module}.{self.blocking.function}" if self.blocking else ""
        return f"in its own code at {at or '?'}{inner}"


def _under(frame: StackFrame, package: str) -> bool:
    module = frame.module or ""
    return module == package or module.startswith(package + ".")


def place_of(group: StackGroup, ranks: Sequence[int]) -> Place:
    """What a group of ranks waits in, from its training thread's innermost frames."""
    frames = group.frames or []
    code = group.code[0] if group.code else None
    if not frames:
        return Place(UNLISTED, None, code, tuple(ranks))
    machinery = []
    for frame in frames:
        if not is_framework(frame.module):
            break
        machinery.append(frame)
    for kind, package in COLLECTIVE_PACKAGES:
        blocking = next((f for f in machinery if _under(f, package)), None)
        if blocking is not None:
            return Place(kind, blocking, code, tuple(ranks))
    loader = next((f for f in frames if any(_under(f, package) for package in DATA_LOADER_PACKAGES)), None)
    if loader is not None:
        return Place(DATA_LOADER, loader, code, tuple(ranks))
    return Place(OWN_CODE, machinery[0] if machinery else None, code, tuple(ranks))


def places(stacks: HangStacks, world_size: int) -> list[Place]:
    """The groups' places, groups that stand at the same place merged (their outer frames may differ)."""
    merged: dict[tuple[object, ...], Place] = {}
    for group in stacks.groups or []:
        ranks = parse_ranks(group.ranks, world_size)
        if not ranks:
            continue
        place = place_of(group, ranks)
        earlier = merged.get(place.key)
        merged[place.key] = place if earlier is None else Place(
            place.kind, place.blocking, place.code, tuple(sorted(earlier.ranks + place.ranks))
        )
    return list(merged.values())


def apart(answered: list[Place]) -> list[Place]:
    """The places of ranks that are not where the others are (the comparison, silent ranks aside)."""
    waiting = [p for p in answered if p.kind in WAITING_FOR_PEERS]
    elsewhere = [p for p in answered if p.kind in (OWN_CODE, DATA_LOADER)]
    if waiting and elsewhere:
        return elsewhere
    if len(answered) <= 1:
        return []
    most = max(len(p.ranks) for p in answered)
    fewer = [p for p in answered if len(p.ranks) < most]
    return fewer or answered


def current_stacks(stacks: HangStacks | None, progress: Progress | None, gang_generation: int | None) -> HangStacks | None:
    """The stacks if they were collected in this gang's current stall (not an earlier gang's, nor a stall that
    ended: rank 0's batch counter has moved past it since)."""
    if stacks is None:
        return None
    if gang_generation is not None and stacks.gang_generation is not None and stacks.gang_generation != gang_generation:
        return None
    if progress is not None and progress.batches is not None and (stacks.batches or 0) < progress.batches:
        return None
    return stacks


def stacks_of_record(record: Mapping[str, Any]) -> HangStacks | None:
    """A trainer's hang record as status.hangStacks holds it (for `dtrain run`, which reads the records itself)."""
    patch = status_patch(record)
    return HangStacks.model_validate(patch["hangStacks"]) if patch is not None and "hangStacks" in patch else None


@dataclass(frozen=True)
class Diagnosis:
    """What the condition, the Event, status.lastHang and `dtrain run` say about where the hang sits."""

    message: str
    named: tuple[int, ...] = ()
    """The ranks not where the others are, silent ones included."""
    dumps: str | None = None
    """The directory of the full stacks (stacks.txt)."""


def _ranks(ranks: Sequence[int], where: Callable[[int], str]) -> str:
    shown = [f"rank {r} ({where(r)})" for r in ranks[:MAX_NAMED_RANKS]]
    more = len(ranks) - MAX_NAMED_RANKS
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def _group(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}"


def diagnose(stacks: HangStacks | None, world_size: int, where: Callable[[int], str]) -> Diagnosis:
    """Which ranks stand apart and where, in words; `where(rank)` names a rank's pod and node."""
    if stacks is None:
        return Diagnosis(
            "Where it hangs: no rank's stacks arrived before the deadline (rank 0 collects them a few seconds before "
            "it runs out: it may itself be stopped, or the deadline may not exceed its report interval by 5 s)"
        )
    answered = places(stacks, world_size)
    heard = {r for p in answered for r in p.ranks}
    silent = [r for r in range(world_size) if r not in heard]
    dumps = stacks.dumps
    full = f" Every rank's stacks: {dumps}/{contract.STACKS_FILE_NAME}" if dumps else ""
    if not answered:
        return Diagnosis(f"Where it hangs: no rank answered with its stacks ({_ranks(silent, where)}).{full}", tuple(silent), dumps)
    named_places = apart(answered)
    named = sorted({r for p in named_places for r in p.ranks} | set(silent))
    if not named:
        return Diagnosis(
            f"Where it hangs: every rank ({format_ranks(heard)}) stands at the same place, {answered[0].describe()}: "
            "no rank differs, so no rank can finish it (a cut link, a broken NCCL communicator; the flight "
            f"recorder's dumps, where on, are beside the stacks).{full}",
            (),
            dumps,
        )
    parts = [f"{_ranks(list(p.ranks), where)} {'is' if len(p.ranks) == 1 else 'are'} {p.describe()}" for p in named_places]
    if silent:
        parts.append(f"{_ranks(silent, where)} {SILENT}")
    others = [p for p in answered if p not in named_places]
    waits = "; ".join(f"{_group(p.ranks)} {'is' if len(p.ranks) == 1 else 'are'} {p.describe()}" for p in others)
    apart_from = f"not where the others are: {waits}" if waits else "each at a place of its own"
    return Diagnosis(f"Where it hangs: {'; '.join(parts)} - {apart_from}.{full}", tuple(named), dumps)


def explained(decision: FailureDecision, diagnosis: Diagnosis) -> FailureDecision:
    """The progress deadline's decision, saying where the hang sits."""
    return replace(decision, message=f"{decision.message}. {diagnosis.message}")
