"""docs/client.md, generated from the Python client package (`dtrain client-docs`): every exported name has its
section, every public method its signature and a docstring, and the committed page is the generated one."""

from __future__ import annotations

import inspect
from pathlib import Path

from dtrain_operator import client
from dtrain_operator.cli.client_reference import client_reference

PAGE = Path(__file__).resolve().parents[2] / "docs" / "client.md"


def test_the_committed_page_is_the_generated_one():
    assert PAGE.read_text() == client_reference(client), "docs/client.md is stale: run `make manifests`"


def test_every_exported_name_and_public_method_is_on_the_page_with_its_docstring():
    page = client_reference(client)
    undocumented = []
    for name in client.__all__:
        value = getattr(client, name)
        assert f"\n## `{name}`" in page, name
        if not isinstance(value, type):
            continue
        undocumented += [name] if not value.__doc__ else []
        for member, attribute in vars(value).items():
            function = getattr(attribute, "__func__", attribute)
            if member.startswith("_") or not (inspect.isfunction(function) or isinstance(attribute, property)):
                continue
            assert f"\n### `{name}.{member}`" in page, (name, member)
            undocumented += [f"{name}.{member}"] if not inspect.getdoc(attribute) else []
    assert not undocumented, f"give these a docstring (docs/client.md shows it): {undocumented}"


def test_signatures_are_as_written():
    page = client_reference(client)
    assert "Client.submit(job: JobSource, namespace: str | None = None" in page
    assert "| `epoch` | `int \\| None` | `None` |" in page
