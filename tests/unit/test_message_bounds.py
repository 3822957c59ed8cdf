"""Every message bounded: whatever a job file holds, `dtrain validate` (and the operator's InvalidSpec) says
what is wrong in a few short lines, under 16 KiB for the whole job. An echoed key or value is its first
characters and its length; a list of names is its first few and how many more.

The inputs are built in code: they are too large for the wrong-jobs corpus (tests/corpus)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from dtrain_operator.api.validation import (
    EXIT_INVALID_JOB,
    MAX_LINE_CHARACTERS,
    MAX_MESSAGES_BYTES,
    bounded_messages,
    validate_object,
    validate_text,
)
from dtrain_operator.cli import main as cli
from tests.corpus import MAX_MESSAGE_BYTES
from tests.work_bound import at_most_lines

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART_TEXT = (ROOT / "examples" / "quickstart.yaml").read_text()
QUICKSTART = yaml.safe_load(QUICKSTART_TEXT)
HUGE_KEY = "k" * 400_000


def quickstart(**spec: object) -> dict:
    job = copy.deepcopy(QUICKSTART)
    job["spec"].update(spec)
    return job


def message_of(errors: list[str]) -> str:
    message = "\n".join(errors)
    assert len(message.encode()) < MAX_MESSAGE_BYTES
    return message


def test_a_400_kb_unknown_key_is_echoed_as_its_first_characters_and_its_length(tmp_path: Path, capsys) -> None:
    # A YAML key longer than 1,024 characters needs the explicit `? key` form; JSON from a client needs none.
    text = QUICKSTART_TEXT.replace("  nodes: 2\n", f"  nodes: 2\n  ? {HUGE_KEY}\n  : 1\n")
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with at_most_lines(100_000):  # "did you mean" does not read the key: no name is near it
        assert cli.main(["validate", str(path)]) == EXIT_INVALID_JOB
    err = capsys.readouterr().err
    assert f'spec["{"k" * 57}... (400000 characters)"]: unknown field' in err
    assert len(err) < 2000
    operator_view = message_of(validate_object(quickstart(**{HUGE_KEY: 1}), cluster=False).errors)
    assert "(400000 characters)" in operator_view and len(operator_view) < 1000


def test_thousands_of_credential_like_init_args_are_named_by_the_first_few() -> None:
    init_args = {f"layer{i}_token": "x" for i in range(3000)}
    errors = validate_object(quickstart(data={"classPath": "my.Data", "initArgs": init_args}), cluster=False).errors
    assert errors == [(
        "spec.data.initArgs: layer0_token, layer1000_token, layer1001_token, layer1002_token, layer1003_token and "
        "2,995 more look like credentials; initArgs are stored in the worker pods, which namespace viewers can read: pass "
        "it with spec.env[].valueFrom.secretKeyRef and read the variable in your class"
    )]


def test_a_credential_like_init_arg_of_400_kb_is_named_short() -> None:
    errors = validate_object(quickstart(data={"classPath": "my.Data", "initArgs": {HUGE_KEY + "_token": "x"}})).errors
    assert errors[0].startswith(f"spec.data.initArgs: {'k' * 57}... (400006 characters) looks like a credential")
    assert len(message_of(errors)) < 1000


def test_the_messages_of_a_job_stop_at_their_budget_and_count_the_rest() -> None:
    lines = bounded_messages(["\U0001f600" * 5000] * 40)  # 20 KB a line before it is cut, in 4-byte characters
    assert len("\n".join(lines).encode()) < MAX_MESSAGE_BYTES
    assert all(len(line) < MAX_LINE_CHARACTERS + 30 for line in lines)  # with the length said
    assert lines[-1].startswith(f"... and {40 - len(lines) + 1} more errors (left out: one job's messages stop at")
    assert bounded_messages(["a", "b"]) == ["a", "b"]


@pytest.mark.parametrize("key", ["\U0001f600" * 2000, "é" * 2000, "\x1b[2J" * 500])
def test_many_errors_with_long_keys_stay_under_the_budget(key: str) -> None:
    spec = {f"{key}{i}": i for i in range(50)}
    text = yaml.safe_dump(quickstart(**spec), allow_unicode=True)
    result = validate_text(text, "job.yaml", cluster=False)
    assert result.job is None
    message = message_of(result.errors)
    assert len(message.encode()) <= MAX_MESSAGES_BYTES + 200 and "\x1b" not in message
