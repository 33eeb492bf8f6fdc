"""Schemathesis hooks for server/schemathesis.toml (loaded through
SCHEMATHESIS_HOOKS by server/tests/http/schemathesis.rs).

A generated Idempotency-Key is given a fresh value before each call when it
is a valid key, kept bare or quoted as generated; an invalid one is sent as
generated, so the key's own validation is still tested. Without this the
tester sends one key (often the document's example) with many bodies, and
the server rightly answers 422 `idempotency_key_reused` before it reads the
body: the body's validation would never be reached, and a loosened bound
(say `parcel_no` 2^31 accepted again) would pass unseen.
"""

import re
import uuid

import schemathesis

KEY_HEADER = "idempotency-key"


def _key_pattern(case):
    """The header's pattern, as the served document states it."""
    for parameter in case.operation.definition.raw.get("parameters", []):
        if parameter.get("in") == "header" and parameter.get("name", "").lower() == KEY_HEADER:
            pattern = parameter.get("schema", {}).get("pattern")
            return re.compile(pattern) if pattern else None
    return None


@schemathesis.hook
def before_call(context, case, kwargs):
    headers = case.headers
    if not headers:
        return
    name = next((name for name in headers if name.lower() == KEY_HEADER), None)
    if name is None:
        return
    value = headers[name]
    pattern = _key_pattern(case)
    if pattern is None or not isinstance(value, str) or not pattern.fullmatch(value):
        return
    fresh = f"st-{uuid.uuid4().hex}"
    headers[name] = f'"{fresh}"' if value.startswith('"') else fresh
