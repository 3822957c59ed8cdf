"""A user's model, named by classPath in the tests' job files (the runner puts this folder on PYTHONPATH)."""

from __future__ import annotations

from typing import Any

import torch

from dtrain_trainer.data import SyntheticImageDataModule
from dtrain_trainer.models import ImageClassifier


class FailingClassifier(ImageClassifier):
    """A model with a bug: from `fail_at_step` on, training_step raises on global rank `fail_on_rank`."""

    def __init__(self, fail_at_step: int = 2, fail_on_rank: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fail_at_step = fail_at_step
        self.fail_on_rank = fail_on_rank

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self.global_step >= self.fail_at_step and self.global_rank == self.fail_on_rank:
            raise RuntimeError(f"FailingClassifier fails on purpose at step {self.global_step}")
        return super().training_step(batch, batch_idx)


class HangingClassifier(ImageClassifier):
    """A rank that blocks: at `hang_at_step`, training_step sleeps on global rank `hang_on_rank`,
    so that every other rank waits for it in the gradient all-reduce, as behind a cut link. It
    hangs once: `marker` (a file it creates) tells the restarted gang to train on. `hang_in: save`
    hangs in on_save_checkpoint instead, so that rank 0 writes the checkpoint and then waits in
    Lightning's barrier after it (a gang stuck right after a save must not look like one saving)."""

    def __init__(
        self, marker: str, hang_at_step: int = 3, hang_on_rank: int = 1, hang_in: str = "step", **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.marker = marker
        self.hang_at_step = hang_at_step
        self.hang_on_rank = hang_on_rank
        self.hang_in = hang_in

    def _maybe_hang(self, where: str) -> None:
        import os
        import time

        hang_here = where == self.hang_in and self.global_step == self.hang_at_step and self.global_rank == self.hang_on_rank
        if hang_here and not os.path.exists(self.marker):
            with open(self.marker, "w") as file:
                file.write(f"hung at step {self.global_step} in {where}\n")
            time.sleep(3600)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        self._maybe_hang("step")
        return super().training_step(batch, batch_idx)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._maybe_hang("save")
        super().on_save_checkpoint(checkpoint)


class SlowClassifier(ImageClassifier):
    """A slow rank (a slower GPU, a throttled node): training_step takes `delay` seconds longer on `slow_rank`."""

    def __init__(self, delay: float = 0.2, slow_rank: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.delay = delay
        self.slow_rank = slow_rank

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        import time

        if self.global_rank == self.slow_rank:
            time.sleep(self.delay)
        return super().training_step(batch, batch_idx)


class SlowToExitClassifier(ImageClassifier):
    """Ranks that take `exit_seconds` to exit once training is over (a loaded node, a large model's teardown)."""

    def __init__(self, exit_seconds: float = 20.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.exit_seconds = exit_seconds

    def on_train_end(self) -> None:
        import atexit
        import time

        atexit.register(time.sleep, self.exit_seconds)


class CrossedCollectivesClassifier(ImageClassifier):
    """Every rank blocked in one all-reduce that none can finish: at `hang_at_step` the ranks open two process
    groups of the same members and each calls the all-reduce on a group of its own (rank 0 on the first, the
    others on the second), on one line, as behind a link that carries nothing. Once: `marker`."""

    def __init__(self, marker: str, hang_at_step: int = 3, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.marker = marker
        self.hang_at_step = hang_at_step

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        import os

        import torch.distributed as dist

        if self.global_step == self.hang_at_step and not os.path.exists(self.marker):
            groups = [dist.new_group(), dist.new_group()]
            if self.global_rank == 0:
                with open(self.marker, "w") as file:
                    file.write(f"crossed at step {self.global_step}\n")
            dist.all_reduce(torch.ones(1), group=groups[min(self.global_rank, 1)])
        return super().training_step(batch, batch_idx)


class _HangingSamples(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Samples of `inner`; on global rank `rank`, fetching the sample after the first `after` blocks (once: `marker`)."""

    def __init__(self, inner: Any, marker: str, after: int, rank: int) -> None:
        self.inner, self.marker, self.after, self.rank = inner, marker, after, rank
        self.fetched = 0

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> Any:
        import os
        import time

        import torch.distributed as dist

        self.fetched += 1
        if self.fetched > self.after and dist.get_rank() == self.rank and not os.path.exists(self.marker):
            with open(self.marker, "w") as file:
                file.write(f"hung fetching sample {self.fetched}\n")
            time.sleep(3600)
        return self.inner[index]


class HangingDataModule(SyntheticImageDataModule):
    """A data loader that blocks (a dead network filesystem, a deadlocked decoder): on `hang_on_rank`, the
    training loader's dataset never returns the sample after its first `hang_after_samples`."""

    def __init__(self, marker: str, hang_after_samples: int = 40, hang_on_rank: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.marker = marker
        self.hang_after_samples = hang_after_samples
        self.hang_on_rank = hang_on_rank

    def train_dataloader(self) -> Any:
        loader = super().train_dataloader()
        samples = _HangingSamples(loader.dataset, self.marker, self.hang_after_samples, self.hang_on_rank)
        return torch.utils.data.DataLoader(samples, batch_size=loader.batch_size, num_workers=0)


class _SlowSamples(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Samples of `inner`; on global rank `rank`, each takes `delay` seconds more to fetch."""

    def __init__(self, inner: Any, delay: float, rank: int) -> None:
        self.inner, self.delay, self.rank = inner, delay, rank

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> Any:
        import time

        import torch.distributed as dist

        if dist.get_rank() == self.rank:
            time.sleep(self.delay)
        return self.inner[index]


class SlowLoaderDataModule(SyntheticImageDataModule):
    """A data loader that cannot keep up on one rank (a slow disk, a heavy decoder, no loader workers): on
    `slow_rank`, each sample of the training loader takes `delay_per_sample` seconds more."""

    def __init__(self, delay_per_sample: float = 0.05, slow_rank: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.delay_per_sample = delay_per_sample
        self.slow_rank = slow_rank

    def train_dataloader(self) -> Any:
        loader = super().train_dataloader()
        samples = _SlowSamples(loader.dataset, self.delay_per_sample, self.slow_rank)
        return torch.utils.data.DataLoader(samples, batch_size=loader.batch_size, shuffle=True, num_workers=0)


class CrashingClassifier(ImageClassifier):
    """A rank that dies once as a faulted GPU would: at `crash_at_step`, global rank `crash_on_rank` prints
    `error` (its last log line, hence its termination message) and exits with `exit_code` at once. `marker` (a
    file it creates) tells the restarted gang to train on."""

    def __init__(
        self, marker: str, crash_at_step: int = 2, crash_on_rank: int = 1, exit_code: int = 3,
        error: str = "RuntimeError: CUDA error: an illegal memory access was encountered", **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.marker = marker
        self.crash_at_step = crash_at_step
        self.crash_on_rank = crash_on_rank
        self.exit_code = exit_code
        self.error = error

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        import os
        import sys

        crash = self.global_step == self.crash_at_step and self.global_rank == self.crash_on_rank
        if crash and not os.path.exists(self.marker):
            with open(self.marker, "w") as file:
                file.write(f"crashed at step {self.global_step}\n")
            print(self.error, file=sys.stderr, flush=True)
            os._exit(self.exit_code)
        return super().training_step(batch, batch_idx)


class KilledClassifier(ImageClassifier):
    """A rank that is SIGKILLed once, mid-epoch: once `kill_at_step` steps are done, global rank `kill_on_rank`
    kills itself at the start of its next training_step (no cleanup, no exception, as the OOM killer or a lost
    node would), while its peers go on into that step's gradient all-reduce. `marker` (a file it creates)
    tells the restarted gang to train on."""

    def __init__(self, marker: str, kill_at_step: int = 3, kill_on_rank: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.marker = marker
        self.kill_at_step = kill_at_step
        self.kill_on_rank = kill_on_rank

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        import os
        import signal

        kill = self.global_step == self.kill_at_step and self.global_rank == self.kill_on_rank
        if kill and not os.path.exists(self.marker):
            with open(self.marker, "w") as file:
                file.write(f"killed after step {self.global_step}\n")
            os.kill(os.getpid(), signal.SIGKILL)
        return super().training_step(batch, batch_idx)
