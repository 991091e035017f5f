"""A bounded schemathesis run against a gateway's own OpenAPI schema, in a process of its own::

    python -m depthprune.testing.schema_fuzz URL --api-key KEY --admin-token TOKEN --served dense,exp

It prints one JSON line, ``{"statuses": [...], "failures": [...]}``, and exits 1 when any answer was 5xx.

Why a process of its own: schemathesis imports most of itself lazily, while the first cases are drawn. Under
pytest every module of a pytest-plugin distribution (schemathesis, hypothesis, anyio) is compiled through
the assertion rewriter, and CPython 3.11 tracks AST construction depth per interpreter, not per thread: a lazy
import in the test's thread while the gateway's server thread compiled another module failed CI with
``SystemError: AST constructor recursion depth mismatch`` (python/cpython#106905). Here nothing else runs.
"""

from __future__ import annotations

import argparse
import json
import sys

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def steer(value, data, served_names) -> None:
    """Point some ``model`` and ``variant`` fields at served names, so that generated requests get past
    routing to the backends (random names would all be 404s) and experiments get installed."""
    if isinstance(value, list):
        for item in value:
            steer(item, data, served_names)
    elif isinstance(value, dict):
        for key, item in value.items():
            if key in ("model", "variant") and data.draw(st.booleans()):
                value[key] = data.draw(served_names)
            else:
                steer(item, data, served_names)


def fuzz(url: str, api_key: str, admin_token: str, served: list[str], max_examples: int) -> dict:
    """Every operation of the schema, ``max_examples`` cases each: the statuses seen and every 5xx."""
    import schemathesis

    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    served_names = st.sampled_from(served)
    statuses: list[int] = []
    failures: list[str] = []
    for operation in operations:
        token = admin_token if operation.path.startswith("/admin") else api_key

        @settings(
            deadline=None,
            max_examples=max_examples,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        )
        @given(case=operation.as_strategy(), data=st.data())
        def no_server_error(case, data):
            steer(case.body, data, served_names)
            response = case.call(base_url=url, headers={"authorization": f"Bearer {token}"}, timeout=30)
            statuses.append(response.status_code)
            if response.status_code >= 500:
                where = f"{case.method} {case.formatted_path}"
                failures.append(f"{where}: {response.status_code} {response.text}")

        no_server_error()
    return {
        "paths": sorted({operation.path for operation in operations}),
        "statuses": statuses,
        "failures": failures,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--admin-token", required=True)
    parser.add_argument("--served", required=True, help="comma-separated names to steer model fields to")
    parser.add_argument("--max-examples", type=int, default=30)
    args = parser.parse_args(argv)
    result = fuzz(args.url, args.api_key, args.admin_token, args.served.split(","), args.max_examples)
    print(json.dumps(result))
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
