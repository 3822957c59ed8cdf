"""`dtrain validate`'s check on the slowest job files that can be written: milliseconds per validation.

    .venv/bin/python -m bench.validation_speed            # the inputs at their limits (up to the 3 MiB file cap)
    .venv/bin/python -m bench.validation_speed --smoke    # the same shapes, small: seconds, for the tests

Each spec is a whole job file built from examples/quickstart.yaml (with shared storage, as on a
cluster) by one hostile or extreme part: the elastic gang whose sizes once took tens of seconds
to check, the free-form initArgs at their caps (values, depth) and past them, lists at and past
their caps (env, volumes), unknown and very long keys, thousands of credential-like names, a
YAML 1.1 boolean key at the end of a large map. For each, the CPU time of
`validate_text` (what `dtrain validate FILE` does once the file is read), of reading the YAML alone
(`load_documents`), and of `validate_object` on the parsed object (the operator's check of a stored
job, in every reconcile): the fastest of `--repetitions` runs. A check whose cost a number in the
input could raise shows as a large `validate_object` time on a small file; where the file is large,
reading it dominates, and the last column says which it is.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import REPO_ROOT, machine, markdown_table, write_results
from dtrain_operator.api.elastic import layout_at, wanted_layout
from dtrain_operator.api.safe_yaml import YamlRefused, load_documents
from dtrain_operator.api.validation import validate_object, validate_text

QUICKSTART = yaml.safe_load((REPO_ROOT / "examples" / "quickstart.yaml").read_text())
QUICKSTART["spec"]["storage"] = {"claimName": "shared"}


def job(**spec: Any) -> dict[str, Any]:
    document = copy.deepcopy(QUICKSTART)
    document["spec"].update(spec)
    return document


def with_init_args(init_args: dict[str, Any]) -> dict[str, Any]:
    return job(data={"classPath": "my_data.DataModule", "initArgs": init_args})


def nested(levels: int) -> Any:
    """Maps in maps, `levels` deep counting the innermost value (as api.free_form counts)."""
    value: Any = 1
    for level in range(levels - 1):
        value = {f"level{level}": value}
    return value


def volumes(count: int) -> dict[str, Any]:
    return job(
        volumes=[{"name": f"data-{i}", "persistentVolumeClaim": {"claimName": f"claim-{i}"}} for i in range(count)],
        volumeMounts=[{"name": f"data-{i}", "mountPath": f"/data/{i}"} for i in range(count)],
    )


def text_of(document: dict[str, Any]) -> str:
    return yaml.safe_dump(document, sort_keys=False, width=1_000_000)


# As many initArgs values as the spec's 112 KiB (api.record_room) hold beside the quick start's other fields: that
# cap comes before free_form's 10,000 values.
INIT_ARGS_AT_THE_CAP = 7_500

# What each spec is, by name: its job file's text, at full size and in smoke mode (smaller, but as far past a
# cap as the name says).
SPECS: dict[str, Callable[[bool], str]] = {
    "the quick start": lambda smoke: text_of(job()),
    "elastic: 4,093 nodes, minNodes 1, every size checked": lambda smoke: text_of(job(
        nodes=4093, trainer={"batchSize": 12 * 87359, "accumulateGradBatches": 65521}, elastic={"minNodes": 1},
    )),
    "initArgs: 7,500 values (the cap: the spec's 112 KiB)": lambda smoke: text_of(with_init_args(
        {f"arg{i}": i for i in range(INIT_ARGS_AT_THE_CAP)}
    )),
    "initArgs: 20,000 values (past both caps)": lambda smoke: text_of(with_init_args(
        {f"arg{i}": i for i in range(10_000 if smoke else 20_000)}
    )),
    "initArgs: 3,000 credential-like names": lambda smoke: text_of(with_init_args(
        {f"layer{i}_token": "x" for i in range(30 if smoke else 3_000)}
    )),
    "initArgs: nested 32 levels (the cap)": lambda smoke: text_of(with_init_args(nested(32))),
    "initArgs: nested 60 levels (past the cap)": lambda smoke: text_of(with_init_args(nested(60))),
    "initArgs: 10,000 values, the last an unquoted key n": lambda smoke: text_of(with_init_args(
        {**{f"arg{i}": i for i in range(9_998)}, "LAST": 96}
    )).replace("LAST:", "n:"),
    "env: 256 entries (the cap)": lambda smoke: text_of(job(env=[{"name": f"VAR_{i}", "value": "v"} for i in range(256)])),
    "env: 20,000 entries (past the cap)": lambda smoke: text_of(job(
        env=[{"name": f"VAR_{i}", "value": "v"} for i in range(257 if smoke else 20_000)]
    )),
    "volumes and mounts: 64 each (the cap)": lambda smoke: text_of(volumes(64)),
    "volumes and mounts: 5,000 each (past the cap)": lambda smoke: text_of(volumes(65 if smoke else 5_000)),
    "unknown keys under spec: 12,000": lambda smoke: text_of(job(**{f"unknownField{i}": i for i in range(120 if smoke else 12_000)})),
    "one unknown key of 400 KB": lambda smoke: text_of(job(**{"k" * (4_000 if smoke else 400_000): 1})),
    "unknown keys of 1,000 characters: 2,000": lambda smoke: text_of(job(
        **{f"{i:04d}" + "k" * 996: i for i in range(20 if smoke else 2_000)}
    )),
}


def cpu_ms(call: Callable[[], Any], repetitions: int) -> float:
    """The smallest CPU time of `repetitions` calls, in milliseconds."""
    best = float("inf")
    for _ in range(repetitions):
        started = time.process_time()
        call()
        best = min(best, time.process_time() - started)
    return best * 1000


def measure(name: str, text: str, repetitions: int) -> dict[str, Any]:
    result = validate_text(text, name)
    try:
        [document] = load_documents(text)
    except YamlRefused:  # a file refused while it is read has no object for the operator to check
        document = None
    validate_ms = cpu_ms(lambda: validate_text(text, name), repetitions)
    yaml_ms = cpu_ms(lambda: load_documents(text), repetitions) if document is not None else validate_ms
    object_ms = cpu_ms(lambda: validate_object(document), repetitions) if document is not None else float("nan")
    return {
        "spec": name,
        "bytes": len(text.encode()),
        "verdict": "accepted" if result.job is not None else "refused",
        "message_bytes": len("\n".join(result.errors).encode()),
        "validate_ms": validate_ms,
        "yaml_ms": yaml_ms,
        "object_ms": object_ms,
        "dominated_by": "reading the YAML" if yaml_ms > validate_ms / 2 else "the checks",
    }


def layout_ms(repetitions: int) -> dict[str, Any]:
    """The operator's resize and the trainer's start: one layout_at on a share with thousands of divisors."""
    wanted = wanted_layout(720720, 55440, 64, 2520)  # batchSize, accumulateGradBatches, devicesPerNode, nodes
    return {"call": "layout_at, 720720 x 55440 x 2520 on 7 nodes", "ms": cpu_ms(lambda: layout_at(wanted, 64, 7), repetitions)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.validation_speed", description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="small inputs of the same shapes: seconds, for the tests")
    parser.add_argument("--repetitions", type=int, default=5, help="runs per spec; the fastest counts")
    parser.add_argument("--out", default=None, help="results JSON (default bench/results/validation_speed.json)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cases = [measure(name, text_of_spec(args.smoke), args.repetitions) for name, text_of_spec in SPECS.items()]
    print(markdown_table(
        ["spec", "bytes", "verdict", "message bytes", "ms per validation", "of it reading the YAML",
         "ms per validate_object (a reconcile)", "dominated by"],
        [(c["spec"], f"{c['bytes']:,}", c["verdict"], f"{c['message_bytes']:,}", c["validate_ms"], c["yaml_ms"],
          c["object_ms"], c["dominated_by"]) for c in cases],
    ))
    layout = layout_ms(args.repetitions)
    print(f"\n{layout['call']}: {layout['ms']:.3g} ms")
    results = {"benchmark": "validation_speed", "machine": machine(), "smoke": args.smoke, "cases": cases, "layout": layout}
    print(f"\nresults: {write_results('validation_speed', results, args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
