"""The batch an elastic gang trains with at each size: the one place its arithmetic is decided.

A job's batch settings (trainer.batchSize per process, trainer.accumulateGradBatches) are for
the gang size it wants (`spec.nodes`). Its global batch, the samples behind each optimizer
step, is batchSize x devicesPerNode x nodes x accumulateGradBatches. On fewer nodes the same
global batch is kept exactly, so that what is optimised does not change with the gang's size:
each process trains global / processes samples per step, in as few accumulated micro-batches
as keep each one no larger than batchSize (no process ever holds more in memory than the
wanted size asks). A size whose process count does not divide the global batch cannot keep it.

Pure functions of integers, each bounded whatever the settings: the trainer
(`dtrain_trainer.elastic_data`), the spec's validation (in every reconcile) and the operator's
resize share them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Annotated

from pydantic import Field

from dtrain_operator.api.common import MAX_TIMEOUT_SECONDS, ApiModel
from dtrain_operator.api.safe_yaml import first_few

DEFAULT_WAIT_SECONDS = 120


class ElasticPolicy(ApiModel):
    """Train on fewer nodes, with the same global batch and data order, while some cannot be placed; grow back when they can."""

    min_nodes: Annotated[int, Field(ge=1, le=4096)]
    """The fewest nodes the gang trains on (at most nodes). Every count from minNodes to nodes must divide the global batch (trainer.batchSize x devicesPerNode x nodes x accumulateGradBatches) by its processes: a smaller gang trains each step's global batch in more accumulated micro-batches, of at most trainer.batchSize samples per process."""
    wait_seconds: Annotated[int, Field(ge=0, le=MAX_TIMEOUT_SECONDS)] = DEFAULT_WAIT_SECONDS
    """How long a worker pod may wait unplaced (unschedulable, or its node gone) before the gang restarts from its last checkpoint on the nodes that can be placed. Default 120."""


@dataclass(frozen=True)
class BatchLayout:
    """How one gang size trains the global batch: `accumulate_grad_batches` micro-batches of `batch_size` per process."""

    batch_size: int
    accumulate_grad_batches: int
    world_size: int

    @property
    def global_batch(self) -> int:
        """Samples behind each optimizer step, over every process."""
        return self.batch_size * self.accumulate_grad_batches * self.world_size

    @property
    def micro_batch(self) -> int:
        """Samples behind one micro-batch, over every process."""
        return self.batch_size * self.world_size


def wanted_layout(batch_size: int, accumulate_grad_batches: int, devices_per_node: int, nodes: int) -> BatchLayout:
    """The layout the settings give at the size they are for."""
    return BatchLayout(batch_size, accumulate_grad_batches, devices_per_node * nodes)


def keeps_the_batch(wanted: BatchLayout, devices_per_node: int, nodes: int) -> bool:
    """Whether `nodes` nodes can train `wanted`'s global batch: their processes divide it (then a layout always
    exists, at worst one sample per micro-batch)."""
    world = devices_per_node * nodes
    return world >= 1 and wanted.global_batch % world == 0


def layout_at(wanted: BatchLayout, devices_per_node: int, nodes: int) -> BatchLayout | None:
    """The layout that keeps `wanted`'s global batch on `nodes` nodes, or None when no layout can.

    The per-process batch stays `wanted.batch_size` where raising the accumulation is enough, and
    shrinks to the largest divisor of the process's share that fits where it is not.
    """
    if not keeps_the_batch(wanted, devices_per_node, nodes):
        return None
    world = devices_per_node * nodes
    share = wanted.global_batch // world
    # The share's factors from the settings' own, each far smaller than the share: searching the share's
    # divisors one by one took seconds for a share with no divisor near global / batchSize.
    factors = (
        _prime_factors(wanted.batch_size) + _prime_factors(wanted.accumulate_grad_batches)
        + _prime_factors(wanted.world_size) - _prime_factors(world)
    )
    batch = _largest_divisor_at_most(factors, wanted.batch_size)
    return BatchLayout(batch, share // batch, world)


def _prime_factors(number: int) -> Counter[int]:
    """`number`'s prime factors and their powers, by trial division: at most sqrt(number) steps (1,024 for the
    largest batchSize)."""
    factors: Counter[int] = Counter()
    divisor = 2
    while divisor * divisor <= number:
        while number % divisor == 0:
            factors[divisor] += 1
            number //= divisor
        divisor += 1
    if number > 1:
        factors[number] += 1
    return factors


def _largest_divisor_at_most(factors: Counter[int], bound: int) -> int:
    """The largest divisor of the number `factors` factor that is at most `bound`: its divisors up to `bound`, one
    prime at a time (a few thousand at most for a share the spec's limits allow)."""
    divisors = [1]
    for prime, power in factors.items():
        divisors = [
            divisor * prime**exponent
            for divisor in divisors
            for exponent in range(power + 1)
            if divisor * prime**exponent <= bound
        ]
    return max(divisors)


def sizes_that_cannot(wanted: BatchLayout, devices_per_node: int, min_nodes: int, nodes: int) -> list[int]:
    """The node counts from `min_nodes` to `nodes` on which the global batch cannot be kept."""
    return [size for size in range(min_nodes, nodes + 1) if not keeps_the_batch(wanted, devices_per_node, size)]


def sizes_problem(wanted: BatchLayout, devices_per_node: int, min_nodes: int, nodes: int) -> str | None:
    """Why the gang cannot shrink to every count from `min_nodes` to `nodes` (the first few named) and what to do,
    or None when it can."""
    cannot = sizes_that_cannot(wanted, devices_per_node, min_nodes, nodes)
    if not cannot:
        return None
    return (
        f"on {first_few(cannot)} node(s) the global batch of {wanted.global_batch} (trainer.batchSize x "
        "devicesPerNode x nodes x accumulateGradBatches) cannot be split evenly over the processes; raise "
        f"minNodes above {max(cannot)}, or choose a batchSize or accumulateGradBatches that every count divides"
    )
