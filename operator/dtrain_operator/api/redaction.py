"""Keep credentials out of what dtrain writes for others to read.

Conditions, Events, the operator's log and `dtrain validate`'s messages are read by
people who may not see the namespace's Secrets (the built-in `view` role reads
Events and status). A trainer's last log lines can hold a token, and a value echoed in
an error can be one. Everything dtrain echoes passes through `redact_text`, and every
mapping it copies through `redact_mapping`.
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "***"

# Words that name a credential when they end a key (`hf_token`, `dbPassword`,
# `AWS_SECRET_ACCESS_KEY`): split on `_`, `-`, `.` and camelCase before matching.
_CREDENTIAL_WORDS = frozenset(
    {"token", "password", "passwd", "pwd", "secret", "secrets", "credential", "credentials", "apikey", "authorization"}
)
# `key` alone is a credential only in these pairs (`sort_key` is not; `api_key` is).
_CREDENTIAL_KEY_PREFIXES = frozenset({"api", "access", "private", "secret", "auth", "signing", "encryption"})

_WORD_SPLIT = re.compile(r"[_\-.\s]+|(?<=[a-z0-9])(?=[A-Z])")
# A name that ends in a credential word: `HF_TOKEN`, `dbPassword` (not `tokenizer`, not `max_tokens`).
_CREDENTIAL_NAME = r"[\w.-]*?(?:token|password|passwd|secrets?|api[_-]?key|access[_-]?key|private[_-]?key|credentials?)"
_TEXT_PATTERNS = [
    # `password=hunter2`, `"token": "abc"`, `HF_TOKEN: hf_abc`
    (re.compile(rf"(?i)(\b{_CREDENTIAL_NAME}[\"']?\s*[:=]\s*)(\"[^\"]*\"|'[^']*'|[^\s,;}}]+)"), rf"\1{REDACTED}"),
    # HTTP authorisation headers
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"), rf"\1 {REDACTED}"),
    # credentials inside a URL: scheme://user:password@host (an AWS secret key may hold '/')
    (re.compile(r"(://[^\s/:@]+):[^\s@]+@"), rf"\1:{REDACTED}@"),
    # JSON Web Tokens (service-account tokens are JWTs)
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), REDACTED),
    # tokens with well-known prefixes: GitHub, Hugging Face, AWS access keys, Slack, OpenAI-style
    (re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|hf_[A-Za-z0-9]{20,}|AKIA[0-9A-Z]{16}|xox[abprs]-[A-Za-z0-9-]{10,}|sk-[A-Za-z0-9_-]{20,})"), REDACTED),
]


def _words(name: str) -> list[str]:
    return [word.lower() for word in _WORD_SPLIT.split(name) if word]


def is_credential_name(name: str) -> bool:
    """Whether a key or variable name looks like it holds a credential."""
    # The last word decides: `hf_token` holds a token, `secretRef` and `token_file` only point at one.
    words = _words(str(name))
    if not words:
        return False
    last = words[-1]
    return last in _CREDENTIAL_WORDS or (last == "key" and len(words) > 1 and words[-2] in _CREDENTIAL_KEY_PREFIXES)


def redact_text(text: str) -> str:
    """`text` with anything that looks like a credential replaced by ***."""
    for pattern, replacement in _TEXT_PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def holds_credential(text: str) -> bool:
    """Whether `text` holds something redact_text hides: `user:password@` in a URL, a bearer token, a JWT, ..."""
    return redact_text(text) != text


def redact_mapping(value: Any) -> Any:
    """A copy of `value` in which every value under a credential-like key is ***, and every
    string is passed through `redact_text`."""
    if isinstance(value, dict):
        return {k: REDACTED if is_credential_name(k) else redact_mapping(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_mapping(item) for item in value]
    if isinstance(value, str):
        return redact_text(value)
    return value
