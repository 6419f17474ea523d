"""The Ray connection's fields and extras, whatever a user typed: an endpoint whose every field has
its type, or RayConnectionConfigError naming the connection; never another exception. A valid
extra comes back the same from its JSON text."""

from __future__ import annotations

import json
from collections.abc import Mapping

from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_horovod.exceptions import RayConnectionConfigError
from airflow_provider_horovod.hooks.ray_connection import EXTRAS, RayEndpoint, endpoint_from
from unit.properties.values import anything, json_values, scalars

extras_values = st.dictionaries(st.sampled_from([*EXTRAS, "token", ""]), anything | json_values, max_size=4) | (
    st.dictionaries(st.sampled_from(EXTRAS), scalars, max_size=2)
)
extras = extras_values | extras_values.map(lambda d: json.dumps(d, default=repr)) | anything | st.text(max_size=30)
hosts = (
    st.none()
    | st.sampled_from(["", "local", "ray-head", "https://ray:8443", "ray head", "ftp://x"])
    | st.text(max_size=12)
)


def endpoint(host, port, schema, password, extra) -> RayEndpoint | RayConnectionConfigError:
    try:
        return endpoint_from(
            "ray_x",
            host=host,
            port=port,
            schema=schema,
            password=password,
            extra=extra,
            local_url="http://127.0.0.1:8265",
        )
    except RayConnectionConfigError as err:
        assert "'ray_x'" in str(err)
        return err


def well_typed(found: RayEndpoint) -> bool:
    return (
        isinstance(found.url, str)
        and isinstance(found.verify, (bool, str))
        and all(isinstance(k, str) and isinstance(v, str) for k, v in found.headers.items())
        and isinstance(found.runtime_env, Mapping)
        and (found.prices is None or isinstance(found.prices, Mapping))
        and isinstance(found.shared_storage, bool)
    )


@given(
    host=hosts,
    port=st.none() | st.integers(-1, 70000) | anything,
    schema=st.none() | st.sampled_from(["http", "https", "postgres"]) | st.text(max_size=6),
    password=st.none() | st.text(max_size=12),
    extra=extras,
)
def test_any_connection_is_an_endpoint_or_refused_by_name(host, port, schema, password, extra):
    found = endpoint(host, port, schema, password, extra)
    if isinstance(found, RayEndpoint):
        assert well_typed(found), found


@given(
    extra=st.fixed_dictionaries(
        {},
        optional={
            "verify": st.booleans(),
            "headers": st.dictionaries(st.text("abcXY-", min_size=1, max_size=6), st.text("abc 123", max_size=6)),
            "shared_storage": st.booleans(),
            "prices": st.fixed_dictionaries({"cpu_hour": st.floats(0, 10), "gpu_hour": st.floats(0, 10)}),
        },
    )
)
def test_a_valid_extra_reads_the_same_from_its_json_text(extra):
    from_dict = endpoint("ray-head", 8265, "http", "tok", extra)
    from_text = endpoint("ray-head", 8265, "http", "tok", json.dumps(extra))
    assert isinstance(from_dict, RayEndpoint) and from_dict == from_text
    assert from_dict.verify is extra.get("verify", True)
    assert from_dict.shared_storage is extra.get("shared_storage", False)


def test_a_ca_bundle_that_is_not_a_path_is_refused_by_name():
    for bundle in (5, [1], {"a": 1}):
        found = endpoint("ray-head", 8265, "http", None, {"ca_bundle": bundle})
        assert isinstance(found, RayConnectionConfigError) and "'ca_bundle'" in str(found)
