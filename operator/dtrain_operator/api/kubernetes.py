"""The formats Kubernetes checks in what a job passes through to its pods: names, label keys and
values, resource quantities and image references.

Each is a port of the rule the API server (k8s.io/apimachinery/pkg/util/validation,
k8s.io/apimachinery/pkg/api/resource) or the kubelet (github.com/distribution/reference) applies,
so that `dtrain validate` refuses what a pod could never be created or started with. The
patterns are RE2's (the API server's) as much as Python's, so that the CRD carries them as they
are; those of names spell a dot `[.]`, which reads the same in a CEL rule on map keys.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, DecimalException

DNS1123_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
MAX_DNS1123_SUBDOMAIN_LENGTH = 253
# A label key or an annotation key: an optional DNS-subdomain prefix and a name of at most 63 characters.
_QUALIFIED_NAME_PART = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
QUALIFIED_NAME_PATTERN = rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_QUALIFIED_NAME_PART}$"
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
MAX_LABEL_VALUE_LENGTH = 63
# Annotations of one object, keys and values together (TotalAnnotationSizeLimitB).
MAX_ANNOTATIONS_BYTES = 256 * 1024

# An image reference as the kubelet parses it (distribution/reference's grammar): [host[:port]/]path[:tag][@digest].
_DOMAIN_COMPONENT = r"([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"({_DOMAIN_COMPONENT}([.]{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(:[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*([-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
IMAGE_PATTERN = rf"^({_DOMAIN}/)?{_PATH_COMPONENT}(/{_PATH_COMPONENT})*(:{_TAG})?(@{_DIGEST})?$"
# The repository name without tag and digest (distribution/reference's NameTotalLengthMax).
MAX_IMAGE_NAME_LENGTH = 255
# The digests the kubelet can check (go-digest's algorithms), and the lowercase hex length of each: the grammar
# above takes any algorithm and length, the parse that follows it only these.
DIGEST_HEX_LENGTHS = {"sha256": 64, "sha384": 96, "sha512": 128}

# A quantity: a signed decimal number and a suffix (binary Ki..Ei, decimal n..E, or an exponent).
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_SUFFIXES = {
    **{f"{prefix}i": Decimal(2) ** (10 * power) for power, prefix in enumerate("KMGTPE", start=1)},
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"), "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_NUMBER = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)")


def _fullmatch(pattern: str, text: str) -> bool:
    # Not re.match: its `$` also matches before a final newline ("16Gi\n"), which Go's (the API server's) does not.
    return re.fullmatch(pattern, text) is not None


def dns_subdomain_error(name: str) -> str | None:
    """Why `name` is not a DNS-1123 subdomain (a Secret, a PriorityClass, a service account), or None."""
    if len(name) > MAX_DNS1123_SUBDOMAIN_LENGTH:
        return f"must be at most {MAX_DNS1123_SUBDOMAIN_LENGTH} characters"
    if not _fullmatch(DNS1123_SUBDOMAIN_PATTERN, name):
        return "must be a DNS-1123 subdomain: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"
    return None


def qualified_name_error(key: str) -> str | None:
    """Why `key` is not a label or annotation key (`[prefix/]name`), or None."""
    prefix, _, name = key.rpartition("/")
    if "/" in key and (not prefix or dns_subdomain_error(prefix)):
        return "must have a DNS-1123 subdomain before its '/', e.g. example.com/my-key"
    if not _fullmatch(_QUALIFIED_NAME_PART, name):
        return (
            "must be a qualified name: at most 63 letters, digits, '-', '_' or '.', starting and ending with a "
            "letter or digit, with an optional DNS-subdomain prefix and '/'"
        )
    return None


def label_value_error(value: str) -> str | None:
    """Why `value` is not a label value (or a nodeSelector value), or None."""
    if len(value) > MAX_LABEL_VALUE_LENGTH:
        return f"must be at most {MAX_LABEL_VALUE_LENGTH} characters"
    if not _fullmatch(LABEL_VALUE_PATTERN, value):
        return "must be empty or letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
    return None


def annotations_bytes(annotations: Mapping[str, str | None]) -> int:
    """The size of annotations as the API server counts it against MAX_ANNOTATIONS_BYTES: keys and values in UTF-8."""
    return sum(len(key.encode()) + len((value or "").encode()) for key, value in annotations.items())


def _is_checkable_digest(digest: str) -> bool:
    algorithm, _, encoded = digest.partition(":")
    length = DIGEST_HEX_LENGTHS.get(algorithm)
    return length is not None and _fullmatch(f"[a-f0-9]{{{length}}}", encoded)


def image_error(image: str) -> str | None:
    """Why the kubelet could not pull `image` (InvalidImageName), or None."""
    if image != image.strip():
        return "must not have leading or trailing whitespace"
    if not _fullmatch(IMAGE_PATTERN, image):
        return "is not an image reference: [registry[:port]/]repository[:tag][@digest], the repository in lowercase"
    name, _, digest = image.partition("@")
    if digest and not _is_checkable_digest(digest):
        return (
            "has a digest the kubelet refuses (InvalidImageName): sha256 takes 64 lowercase hex digits, sha384 96 "
            "and sha512 128"
        )
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name = name[: len(name) - len(last) + last.index(":")]
    if len(name) > MAX_IMAGE_NAME_LENGTH:
        return f"has a repository name longer than {MAX_IMAGE_NAME_LENGTH} characters"
    return None


def parse_quantity(value: object) -> Decimal | None:
    """A Kubernetes quantity (4, "500m", "16Gi", "1e3") as a number, or None when it is not one.
    A JSON number is one only when it is an integer: the CRD declares quantities integer-or-string."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return None
    text = str(value)
    if not _fullmatch(QUANTITY_PATTERN, text):
        return None
    number = _NUMBER.match(text)
    assert number is not None  # the quantity pattern starts with one
    suffix = text[number.end() :]
    try:
        if suffix[:1] in ("e", "E"):
            return Decimal(number.group()) * Decimal(10) ** Decimal(suffix[1:])
        return Decimal(number.group()) * _SUFFIXES[suffix]
    except DecimalException:  # an exponent past what a Decimal holds
        return None
