"""An elastic gang resized mid-epoch keeps its global batch and its epoch's order: each sample once per epoch,
each step the samples it has at the wanted size, and the weights of the gang that was never resized.

Each gang here is real torchrun nodes (one process each) on this machine, as `dtrain run` starts
them; a worker dies right after a step's checkpoint, as a lost node's does, or the gang is stopped
by SIGTERM, as the operator deletes a gang to grow it, and the next gang resumes at another size.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from dtrain_operator.api import contract
from dtrain_operator.core.render import TRAINER_COMMAND
from dtrain_trainer.stopping import STOPPED_EXIT_CODE

from ..ports import free_port
from .conftest import RUN_TIMEOUT_SECONDS, USER_MODEL, process_env, trainer_config, write_config
from .test_resume import assert_same_weights, saved_step
from .user_code.dtrain_test_user import CRASH_EXIT_CODE, trained_samples

pytestmark = pytest.mark.slow

# 36 samples, a global batch of 8 (4 per process on the wanted 2 nodes): epochs of 4 steps, 4 samples left over.
SAMPLES, WANTED_NODES, EPOCHS = 36, 2, 3
STEPS = EPOCHS * 4


def launch_gang(tmp_path: Path, config: dict[str, Any], nodes: int, name: str) -> list[subprocess.CompletedProcess[str]]:
    """`nodes` torchrun nodes of one process each, as a pod's command runs; every node's outcome."""
    config_file = str(write_config(tmp_path, config, f"{name}.yaml"))
    port = str(free_port())
    started = [
        subprocess.Popen(
            [sys.executable, *TRAINER_COMMAND[1:]],
            env=process_env(**{
                contract.ENV_CONFIG: config_file, contract.ENV_NNODES: str(nodes), contract.ENV_NPROC_PER_NODE: "1",
                contract.ENV_NODE_RANK: str(rank), contract.ENV_MASTER_ADDR: "127.0.0.1",
                contract.ENV_MASTER_PORT: port, contract.ENV_PROGRESS_SINK: "none",
            }),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for rank in range(nodes)
    ]
    outcomes = []
    for node in started:
        try:
            stdout, stderr = node.communicate(timeout=RUN_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            node.kill()
            stdout, stderr = node.communicate()
        outcomes.append(subprocess.CompletedProcess(node.args, node.returncode, stdout, stderr))
    return outcomes


# How the gang is stopped to be resized, its step checkpoints, and the steps its checkpoints then hold: two nodes
# until the first stop, one node (twice the accumulation) until the second, two nodes again to the end.
# - As on a cluster whose step checkpoints fall at epoch ends: a node lost after an epoch's last step (4), then the
#   gang deleted to grow back (a SIGTERM after step 5 stops it at step 6, with a checkpoint).
# - A node lost between step checkpoints (rank 1 after step 6, checkpoints every 4): the survivor saves step 6
#   (dtrain_trainer.survivor), mid-epoch; then the gang deleted to grow back (SIGTERM after 9: stopped at 10).
RESIZES = {
    "crash-at-epoch-end-then-sigterm": ({"crash_at_step": 4, "sigterm_at_step": 5}, 1, (4, 6)),
    "survivor-checkpoint-then-sigterm": ({"crash_at_step": 6, "crash_on_rank": 1, "sigterm_at_step": 9}, 4, (6, 10)),
}


@pytest.mark.parametrize(("stops", "checkpoint_every", "saved_steps"), RESIZES.values(), ids=RESIZES.keys())
def test_a_gang_resized_twice_trains_each_sample_once_and_ends_with_the_unresized_gangs_weights(
    tmp_path: Path, stops: dict[str, Any], checkpoint_every: int, saved_steps: tuple[int, int],
) -> None:
    def config(run: str, **model_args: Any) -> dict[str, Any]:
        return trainer_config(
            tmp_path / run,
            model={"classPath": USER_MODEL, "initArgs": {"sample_log": str(tmp_path / run / "samples"), **model_args}},
            data={"classPath": "dtrain_test_user.IndexedImageData", "initArgs": {"num_samples": SAMPLES}},
            # The run's end is its epochs': an epoch trained twice would show as steps more.
            trainer={"maxSteps": -1, "maxEpochs": EPOCHS, "batchSize": 4, "numWorkers": 0},
            checkpoint={"everyNSteps": checkpoint_every, "keepLast": 1},
            export={"onnx": {"enabled": False}},
            elasticNodes=WANTED_NODES,
        )

    (tmp_path / "whole").mkdir()
    whole = launch_gang(tmp_path, config("whole"), WANTED_NODES, "whole")
    assert [node.returncode for node in whole] == [0, 0], whole[0].stderr[-3000:]

    (tmp_path / "resized").mkdir()
    resized = config("resized", **stops, crash_marker=str(tmp_path / "stopped"))
    for nodes, step in zip((2, 1), saved_steps):
        stopped = launch_gang(tmp_path, resized, nodes, "resized")
        codes = {node.returncode for node in stopped}
        assert CRASH_EXIT_CODE in codes or codes == {STOPPED_EXIT_CODE}, stopped[0].stderr[-3000:]
        assert saved_step(tmp_path / "resized" / "checkpoints") == step
    finished = launch_gang(tmp_path, resized, WANTED_NODES, "resized")
    assert [node.returncode for node in finished] == [0, 0], finished[0].stderr[-3000:]
    assert "resumed from" in finished[0].stderr

    expected, trained = trained_samples(tmp_path / "whole" / "samples"), trained_samples(tmp_path / "resized" / "samples")
    assert list(trained) == list(expected) == [(step // 4, step) for step in range(STEPS)]
    assert trained == expected
    for epoch in range(EPOCHS):
        ids = [i for (e, _), step_ids in trained.items() if e == epoch for i in step_ids]
        assert len(ids) == len(set(ids)) == 8 * 4, f"epoch {epoch} trained {len(ids)} samples, {len(set(ids))} distinct"
    final = {run: torch.load(tmp_path / run / "checkpoints" / "last.ckpt", weights_only=False) for run in ("whole", "resized")}
    assert final["resized"]["global_step"] == final["whole"]["global_step"] == STEPS
    # Lightning's own counts (where a step ends, where validation runs) are those of the gang never resized.
    loops = {run: final[run]["loops"]["fit_loop"] for run in final}
    assert loops["resized"]["epoch_loop.batch_progress"]["current"] == loops["whole"]["epoch_loop.batch_progress"]["current"]
    assert loops["resized"]["epoch_loop.state_dict"] == loops["whole"]["epoch_loop.state_dict"]
    assert loops["resized"]["epoch_progress"] == loops["whole"]["epoch_progress"]
    assert_same_weights(final["resized"]["state_dict"], final["whole"]["state_dict"])
