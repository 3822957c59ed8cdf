"""Hostile and malformed job files: `dtrain validate` answers each with one clean line.

The corpus is built from the quick-start example by single defects: a wrong type at
every field, out-of-range numbers, unknown fields at every level, unicode, deep
nesting, alias bombs, duplicate keys, binary junk, several documents. The rule for
each file: exit code 2 (as `dtrain submit` and `dtrain run` give), exactly one line, the line names the field (or the line and
column of the YAML defect), no traceback, well under a second of CPU.
"""

from __future__ import annotations

import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from dtrain_operator.api.validation import EXIT_INVALID_JOB
from dtrain_operator.cli import main as cli

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
# As on a cluster, where `dtrain validate` asks for shared storage (tests/unit/test_storage.py).
QUICKSTART["spec"]["storage"] = {"claimName": "quickstart-workspace"}
# The line of the quick start's learning rate, as _dump writes it (the cases below edit it).
LR = f"lr: {QUICKSTART['spec']['model']['initArgs']['lr']}"
# Free-form subtrees: any value type is allowed inside them.
FREE_FORM = {"initArgs"}


@dataclass(frozen=True)
class Case:
    name: str
    content: bytes
    needle: str  # what the one error line must contain


def _dump(document: dict) -> bytes:
    return yaml.safe_dump(document, sort_keys=False, allow_unicode=True).encode()


def _with(path: list[str], value) -> dict:
    job = yaml.safe_load(yaml.safe_dump(QUICKSTART))
    node = job
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    return job


def _leaves(node, path):
    if isinstance(node, dict):
        for key, child in node.items():
            if key not in FREE_FORM:
                yield from _leaves(child, [*path, key])
    else:
        yield path, node


def _mappings(node, path):
    if isinstance(node, dict):
        yield path, node
        for key, child in node.items():
            if key not in FREE_FORM:
                yield from _mappings(child, [*path, key])


def _wrong_types(value) -> list:
    """Values of another JSON type than `value` (an int stays acceptable for a float)."""
    if isinstance(value, bool):
        return ["no", 1, "true", [True]]
    if isinstance(value, int):
        return [str(value), True, value + 0.5, [value], {"value": value}]
    if isinstance(value, float):
        return [str(value), True, [value]]
    return [7, True, [value], {"value": value}]


def _type_cases() -> list[Case]:
    cases = []
    for path, value in _leaves(QUICKSTART["spec"], ["spec"]):
        for i, wrong in enumerate(_wrong_types(value)):
            cases.append(Case(f"type:{'.'.join(path)}:{i}", _dump(_with(path, wrong)), ".".join(path)))
    for path, _ in _mappings(QUICKSTART["spec"], ["spec"]):
        for i, wrong in enumerate(["a string", [1, 2]]):
            cases.append(Case(f"object:{'.'.join(path)}:{i}", _dump(_with(path, wrong)), ".".join(path)))
    return cases


def _unknown_field_cases() -> list[Case]:
    cases = []
    for path, mapping in _mappings(QUICKSTART["spec"], ["spec"]):
        key = next(iter(mapping))
        typo = key[:-1] + ("x" if key[-1] != "x" else "y")
        cases.append(Case(f"unknown:{'.'.join(path)}", _dump(_with([*path, typo], mapping[key])), ".".join([*path, typo])))
    return cases


def _bound_cases() -> list[Case]:
    cases = []
    for path, value in _leaves(QUICKSTART["spec"], ["spec"]):
        if isinstance(value, int) and not isinstance(value, bool) and path[-1] not in ("opset",):
            cases.append(Case(f"negative:{'.'.join(path)}", _dump(_with(path, -5)), ".".join(path)))
    return cases


def _name_cases() -> list[Case]:
    names = {
        "upper": "QuickStart", "underscore": "quick_start", "leading-digit": "1quick", "empty": "",
        "unicode": "quïckstart", "emoji": "job-\U0001f680", "long": "a" * 100, "huge": "b" * 100_000,
        "trailing-dash": "quick-", "space": "quick start", "newline": "quick\nstart", "rtl": "job\u202etxt",
    }
    return [Case(f"name:{k}", _dump(_with(["metadata", "name"], v)), "metadata.name") for k, v in names.items()]


def _unicode_cases() -> list[Case]:
    values = {
        "classPath-accent": (["spec", "model", "classPath"], "módulo.Clase"),
        "classPath-fullwidth": (["spec", "model", "classPath"], "ｄｔｒａｉｎ.Model"),
        "classPath-zero-width": (["spec", "data", "classPath"], "dtrain\u200b.data.X"),
        "precision-homoglyph": (["spec", "trainer", "precision"], "32-truе"),
        "accelerator-cyrillic": (["spec", "accelerator"], "сpu"),
        "env-name-emoji": (["spec", "env"], [{"name": "\U0001f511", "value": "x"}]),
        "env-name-space": (["spec", "env"], [{"name": "MY VAR", "value": "x"}]),
        "nccl-key-unicode": (["spec", "nccl", "env"], {"NCCL_ÅLGO": "Ring"}),
    }
    return [Case(f"unicode:{k}", _dump(_with(path, v)), ".".join(path)) for k, (path, v) in values.items()]


def _nest(depth: int) -> dict:
    value: dict = {"leaf": 1}
    for _ in range(depth):
        value = {"a": value}
    return value


def _depth_cases() -> list[Case]:
    cases = [
        Case(f"depth:initArgs:{d}", _dump(_with(["spec", "model", "initArgs"], _nest(d))), "spec.model.initArgs")
        for d in (40, 50)
    ]
    for depth in (70, 300, 600, 2000, 20000):
        text = "a: " + "[" * depth + "]" * depth + "\n"
        cases.append(Case(f"depth:yaml:{depth}", text.encode(), "nested deeper than"))
    flow = "initArgs: " + "{a: " * 500 + "1" + "}" * 500
    cases.append(Case("depth:flow-map", flow.encode(), "nested deeper than"))
    return cases


BOMB = "\n".join(
    [f"    l0: &l0 [{', '.join(['lol'] * 9)}]"]
    + [f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
)


def _alias_cases() -> list[Case]:
    head = _dump(QUICKSTART).decode().split("  model:")[0]
    cases = []
    for levels in (6, 9):
        body = "\n".join(BOMB.splitlines()[:levels])
        text = head + "  model:\n    classPath: dtrain_trainer.models.ImageClassifier\n    initArgs:\n" + \
            "\n".join("  " + line for line in body.splitlines()) + "\n"
        cases.append(Case(f"alias:bomb:{levels}", text.encode(), "expands to more than"))
    cases.append(Case("alias:recursive", b"a: &a [*a]\n", "recursive alias"))
    cases.append(Case("alias:undefined", b"a: *nothing\n", "YAML syntax error"))
    return cases


def _duplicate_cases() -> list[Case]:
    base = _dump(QUICKSTART).decode()
    cases = [
        Case("dup:top", (base + "kind: DistributedTraining\n").encode(), "duplicate key 'kind'"),
        Case("dup:spec", base.replace("  nodes: 2\n", "  nodes: 2\n  nodes: 3\n").encode(), "duplicate key 'nodes'"),
        Case("dup:trainer", base.replace("    batchSize: 32\n", "    batchSize: 32\n    batchSize: 64\n").encode(),
             "duplicate key 'batchSize'"),
        Case("dup:initArgs", base.replace(f"      {LR}\n", f"      {LR}\n      lr: 0.1\n").encode(),
             "duplicate key 'lr'"),
        Case("dup:flow", b"a: {x: 1, x: 2}\n", "duplicate key 'x'"),
    ]
    return cases


def _number_cases() -> list[Case]:
    base = _dump(QUICKSTART).decode()
    return [
        Case("number:inf", base.replace("gradientClipVal: 1.0", "gradientClipVal: .inf").encode(), ".inf"),
        Case("number:-inf", base.replace("gradientClipVal: 1.0", "gradientClipVal: -.Inf").encode(), "-.Inf"),
        Case("number:nan", base.replace("gradientClipVal: 1.0", "gradientClipVal: .nan").encode(), ".nan"),
        Case("number:sexagesimal", base.replace("batchSize: 32", "batchSize: 1:30").encode(), "spec.trainer.batchSize"),
        Case("number:quoted-int", base.replace("batchSize: 32", "batchSize: '32'").encode(), "spec.trainer.batchSize"),
        Case("number:hex-string", base.replace("batchSize: 32", "batchSize: '0x20'").encode(), "spec.trainer.batchSize"),
        Case("number:initArgs-inf", base.replace(LR, "lr: .inf").encode(), ".inf"),
    ]


def _value_cases() -> list[Case]:
    """Scalars that PyYAML's constructors raise on (ValueError, KeyError, AttributeError) instead of a YAMLError."""
    base = _dump(QUICKSTART).decode()
    invalid, wide = "is not a valid !!", "beyond the 64-bit integers"
    values = {
        "tag-int": ("!!int abc", invalid), "tag-bool": ("!!bool maybe", invalid),
        "tag-timestamp": ("!!timestamp garbage", invalid), "tag-float": ("!!float abc", invalid),
        "tag-impossible-date": ("!!timestamp 2024-02-30", invalid), "hex-empty": ("0x_", invalid),
        "binary-empty": ("0b_", invalid), "decimal-5000-digits": ("1" * 5000, wide),
        "hex-5000-digits": ("0x" + "f" * 5000, wide), "beyond-int64": (str(2**63), wide),
        "below-int64": (str(-(2**63) - 1), wide),
    }
    return [
        Case(f"value:{name}", base.replace(LR, f"lr: {value}").encode(), needle)
        for name, (value, needle) in values.items()
    ]


def _junk_cases() -> list[Case]:
    rng = random.Random(7)
    cases = [Case(f"junk:random:{i}", bytes(rng.randrange(256) for _ in range(64 + 32 * i)), "") for i in range(6)]
    base = _dump(QUICKSTART)
    cases += [
        Case("junk:nul", base.replace(b"nodes: 2", b"nodes: 2\x00"), "YAML syntax error"),
        Case("junk:bell", base.replace(b"quickstart", b"quick\x07start", 1), "YAML syntax error"),
        Case("junk:latin1", "metadata: {name: caf\xe9}\n".encode("latin-1"), "not a text (UTF-8) file"),
        Case("junk:utf16", _dump(QUICKSTART).decode().encode("utf-16"), ""),
        Case("junk:tabs", b"spec:\n\tnodes: 2\n", "YAML syntax error"),
        Case("junk:unclosed", b"spec: {nodes: [2\n", "YAML syntax error"),
        Case("junk:bad-indent", b"spec:\n  nodes: 2\n bad: 1\n", "YAML syntax error"),
        Case("junk:only-comment", b"# nothing here\n", "no YAML document"),
        Case("junk:empty", b"", "no YAML document"),
        Case("junk:scalar", b"42\n", "expected a mapping"),
        Case("junk:list", b"- 1\n- 2\n", "expected a mapping"),
        Case("junk:python-tag", b"!!python/object/apply:os.system ['true']\n", "YAML syntax error"),
        Case("junk:unknown-tag", b"spec: !custom {nodes: 2}\n", "YAML syntax error"),
    ]
    return cases


def _document_cases() -> list[Case]:
    good = _dump(QUICKSTART)
    bad = _dump(_with(["spec", "nodes"], 0))
    return [
        Case("docs:good-then-bad", good + b"---\n" + bad, "holds 2 YAML documents"),
        Case("docs:kind", _dump({**QUICKSTART, "kind": "Deployment"}), "kind"),
        Case("docs:apiVersion", _dump({**QUICKSTART, "apiVersion": "dtrain.dev/v9"}), "apiVersion"),
        Case("docs:kind-huge", _dump({**QUICKSTART, "kind": "K" * 50_000}), "kind"),
        Case("docs:spec-string", _dump({**QUICKSTART, "spec": "nodes=2"}), "spec"),
        Case("docs:no-metadata", _dump({k: v for k, v in QUICKSTART.items() if k != "metadata"}), "metadata"),
    ]


def _secret_cases() -> list[Case]:
    return [
        Case(f"secret:{key}", _dump(_with(["spec", "model", "initArgs", key], "hf_abcdefghijklmnopqrstuvwxyz")),
             f"spec.model.initArgs: {key} looks like a credential")
        for key in ("hf_token", "password", "apiKey", "AWS_SECRET_ACCESS_KEY", "client_secret")
    ]


CORPUS = (
    _type_cases() + _unknown_field_cases() + _bound_cases() + _name_cases() + _unicode_cases() + _depth_cases()
    + _alias_cases() + _duplicate_cases() + _number_cases() + _value_cases() + _junk_cases() + _document_cases() + _secret_cases()
)


def test_the_corpus_is_large_and_distinct():
    assert len(CORPUS) >= 200
    assert len({case.content for case in CORPUS}) == len(CORPUS)
    assert len({case.name for case in CORPUS}) == len(CORPUS)


@pytest.mark.parametrize("case", CORPUS, ids=[case.name for case in CORPUS])
def test_malformed_file_gets_one_clean_line(case, tmp_path, capsys):
    path = tmp_path / "job.yaml"
    path.write_bytes(case.content)
    code = cli.main(["validate", str(path)])
    _, err = capsys.readouterr()
    lines = err.splitlines()
    assert code == EXIT_INVALID_JOB
    assert len(lines) == 1, err[:2000]
    assert "Traceback" not in err
    assert case.needle in lines[0], lines[0]
    # An echoed value is cut, so the line stays readable whatever the input held.
    assert len(lines[0]) < len(str(path)) + 400, lines[0][:500]


def test_credentials_are_never_echoed(tmp_path, capsys):
    secret = "hf_abcdefghijklmnopqrstuvwxyz0123"
    path = tmp_path / "job.yaml"
    path.write_bytes(_dump(_with(["spec", "model", "initArgs", "hf_token"], secret)))
    path2 = tmp_path / "job2.yaml"
    path2.write_bytes(_dump(_with(["spec", "env"], [{"name": "API_TOKEN", "value": 12345678}])))
    assert cli.main(["validate", str(path), str(path2)]) == EXIT_INVALID_JOB
    err = capsys.readouterr().err
    assert secret not in err and "12345678" not in err
    assert "spec.env[0].value" in err


@pytest.mark.parametrize("name", ["alias:bomb:9", "depth:yaml:20000", "name:huge"])
def test_worst_cases_as_a_process(name, tmp_path):
    """The same files through a fresh `dtrain validate` process: no hang, no traceback, no memory blow-up."""
    case = next(c for c in CORPUS if c.name == name)
    path = tmp_path / "job.yaml"
    path.write_bytes(case.content)
    proc = subprocess.run(
        [sys.executable, "-m", "dtrain_operator.cli", "validate", str(path)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == EXIT_INVALID_JOB
    assert "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1


def test_strict_types_as_the_api_server_reads_them():
    """Where the API server says no, so does `dtrain validate`; where it says yes, so do we."""
    from dtrain_operator.api.validation import validate_object

    accepted = [_with(["spec", "trainer", "gradientClipVal"], 1), _with(["spec", "trainer", "maxEpochs"], None)]
    refused = {
        "spec.nodes": _with(["spec", "nodes"], "2"),
        "spec.runPolicy.suspend": _with(["spec", "runPolicy", "suspend"], "no"),
        "spec.devicesPerNode": _with(["spec", "devicesPerNode"], True),
    }
    assert all(not validate_object(doc).errors for doc in accepted)
    for field, doc in refused.items():
        errors = validate_object(doc).errors
        assert errors and errors[0].startswith(field), errors
