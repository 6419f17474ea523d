"""The Ray connection read into an endpoint: where the dashboard is, how to authenticate, and
what is wrong with a connection, said before any request and without showing secrets."""

import json

import pytest

from airflow_provider_horovod.exceptions import RayConnectionConfigError
from airflow_provider_horovod.hooks.ray_connection import (
    DEFAULT_PORT,
    RayEndpoint,
    endpoint_from,
    is_local_host,
    merge_runtime_env,
    unreadable_env_connection,
)

TOKEN = "tok-5f3c9a7e1b2d4c6e"
SECRET = "hdr-secret-81d2"


def endpoint(host="ray-head", port=None, schema=None, password=TOKEN, extra=None, **kwargs):
    return endpoint_from("my_ray", host=host, port=port, schema=schema, password=password, extra=extra, **kwargs)


def refused(*, hidden=(TOKEN, SECRET), **kwargs) -> str:
    with pytest.raises(RayConnectionConfigError) as err:
        endpoint(**kwargs)
    message = str(err.value)
    assert "Connection 'my_ray'" in message
    for secret in hidden:
        assert secret not in message
    return message


def test_a_remote_dashboard():
    ep = endpoint()
    assert ep == RayEndpoint("my_ray", f"http://ray-head:{DEFAULT_PORT}", {"Authorization": f"Bearer {TOKEN}"})
    assert not ep.embedded
    assert not ep.shared_storage
    assert ep.verify is True
    assert ep.runtime_env == {}
    assert ep.job_url("sid") == f"http://ray-head:{DEFAULT_PORT}/#/jobs/sid"
    assert TOKEN not in repr(ep)


@pytest.mark.parametrize(
    "host, port, schema, url",
    [
        ("ray-head", 443, "https", "https://ray-head:443"),
        ("  ray-head  ", 9000, "HTTP", "HTTP://ray-head:9000"),
        ("10.0.0.5", None, "https", "https://10.0.0.5:8265"),
        ("https://ray.example.com/", None, None, "https://ray.example.com"),
        ("http://ray-head:9000", 8265, None, "http://ray-head:9000"),
        ("http://ray-head", 9000, None, "http://ray-head:9000"),
        ("https://ray.example.com", None, "http", "https://ray.example.com"),
    ],
)
def test_dashboard_urls(host, port, schema, url):
    assert endpoint(host=host, port=port, schema=schema).url.lower() == url.lower()


@pytest.mark.parametrize("host", [None, "", "local", " LOCAL "])
def test_the_embedded_local_cluster(host):
    assert is_local_host(host)
    ep = endpoint(
        host=host,
        password=None,
        local_url="http://127.0.0.1:1234",
        local_token="local-token-xyz",
        extra={"headers": {"X-Team": "ml"}},
    )
    assert ep.embedded
    assert ep.shared_storage
    assert ep.url == "http://127.0.0.1:1234"
    assert ep.headers == {"X-Team": "ml", "Authorization": "Bearer local-token-xyz"}


def test_no_token_no_authorization_header():
    assert endpoint(password=None).headers == {}
    assert endpoint(password="").headers == {}


def test_the_token_loses_the_line_break_cat_leaves():
    assert endpoint(password=f"  {TOKEN}\n").headers["Authorization"] == f"Bearer {TOKEN}"


@pytest.mark.parametrize(
    "token", [f"{TOKEN[:6]}\n{TOKEN[6:]}", f"{TOKEN[:6]} {TOKEN[6:]}", f"{TOKEN[:6]}\x00{TOKEN[6:]}"]
)
def test_a_token_with_whitespace_inside_is_refused_without_showing_it(token):
    message = refused(password=token, hidden=(TOKEN[:6], TOKEN[6:]))
    assert "the password (the Ray auth token)" in message
    assert "not shown" in message


@pytest.mark.parametrize(
    "fields, fragment",
    [
        ({"schema": "ftp"}, "schema 'ftp'"),
        ({"schema": "public"}, "schema 'public'"),
        ({"host": "ftp://ray-head"}, "schema 'ftp'"),
        ({"host": "ray head"}, "host 'ray head' is not a host name"),
        ({"host": "ray-head/dashboard"}, "is not a host name"),
        ({"host": "http://"}, "is not a host name"),
        ({"port": 70000}, "port 70000 is not a TCP port"),
        ({"port": 0}, "port 0"),
        ({"port": -1}, "port -1"),
        ({"port": True}, "port True"),
        ({"port": "8265"}, "port '8265'"),
    ],
)
def test_a_bad_address(fields, fragment):
    message = refused(**fields)
    assert fragment in message
    if "schema" in fragment:
        assert "'http' or 'https'" in message


@pytest.mark.parametrize(
    "verify, expected",
    [
        (None, True),
        (True, True),
        (False, False),
        ("true", True),
        ("False", False),
        (" FALSE ", False),
        ("", True),
    ],
)
def test_verify_flags(verify, expected):
    extra = {} if verify is None else {"verify": verify}
    assert endpoint(extra=extra).verify is expected


def test_verify_a_ca_bundle_path(tmp_path):
    bundle = tmp_path / "ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    assert endpoint(extra={"verify": str(bundle)}).verify == str(bundle)
    assert endpoint(extra=json.dumps({"verify": str(tmp_path)})).verify == str(tmp_path)


@pytest.mark.parametrize(
    "verify, fragment",
    [
        ("/no/such/ca.pem", "'verify'='/no/such/ca.pem' is neither true, false nor an existing path"),
        ("yes", "'verify'='yes'"),
        (5, "'verify'=5 must be true, false or a CA bundle path"),
    ],
)
def test_bad_verify(verify, fragment):
    assert fragment in refused(extra={"verify": verify})


def test_headers_as_object_or_json_string():
    assert endpoint(extra={"headers": {"X-Team": "ml"}}).headers == {"X-Team": "ml", "Authorization": f"Bearer {TOKEN}"}
    assert endpoint(extra={"headers": '{"X-Team": "ml"}'}).headers["X-Team"] == "ml"
    assert "ml" not in repr(endpoint(extra={"headers": {"X-Team": "ml"}}))


@pytest.mark.parametrize(
    "headers, fragment",
    [
        ({"X-Proxy-Auth": f"{SECRET}\r\nX-Injected: 1"}, "header 'X-Proxy-Auth' has a line break"),
        ({"X-Proxy-Auth": f"{SECRET}\n"}, "(not shown); remove it"),
        ({"X-A\nB": "v"}, "has a line break"),
        ({"X-Team": 1}, "must map strings to strings; header 'X-Team' has a int value"),
        ("{not json", "'headers' is not valid JSON"),
        ('["X-Team"]', "'headers' must be a JSON object, got list"),
    ],
)
def test_bad_headers_never_show_their_values(headers, fragment):
    assert fragment in refused(extra={"headers": headers})


@pytest.mark.parametrize(
    "extra, fragment",
    [
        (
            {"verfy": False},
            "unknown extra ['verfy']; the Ray connection takes 'verify', 'ca_bundle', 'headers', "
            "'runtime_env', 'shared_storage'",
        ),
        ({"token": TOKEN}, "unknown extra ['token']"),
        ("{verify: true", "extra is not valid JSON"),
        ("[1, 2]", "extra must be a JSON object, got list"),
    ],
)
def test_bad_extras(extra, fragment):
    assert fragment in refused(extra=extra)


@pytest.mark.parametrize(
    "value, shared",
    [
        (None, False),
        ("", False),
        ("false", False),
        (False, False),
        ("true", True),
        (" TRUE ", True),
        (True, True),
    ],
)
def test_shared_storage_flag(value, shared):
    extra = {} if value is None else {"shared_storage": value}
    assert endpoint(extra=extra).shared_storage is shared


@pytest.mark.parametrize("value", ["yes", 1, "on"])
def test_bad_shared_storage_flag(value):
    assert f"'shared_storage'={value!r} must be true or false" in refused(extra={"shared_storage": value})


def test_the_connections_runtime_env_is_checked_like_a_jobs():
    assert endpoint(extra={"runtime_env": '{"pip": ["pandas"]}'}).runtime_env == {"pip": ["pandas"]}
    message = refused(extra={"runtime_env": {"env_vars": {"AWS_SECRET_ACCESS_KEY": SECRET}}})
    assert "extra 'runtime_env'=" in message
    assert "'AWS_SECRET_ACCESS_KEY' looks like a secret" in message
    assert "unknown field 'pips'" in refused(extra={"runtime_env": {"pips": ["pandas"]}})
    assert "'runtime_env' must be a JSON object" in refused(extra={"runtime_env": "[1]"})


def test_the_connections_prices_are_checked_like_a_tasks():
    assert endpoint().prices is None
    assert endpoint(extra={"prices": '{"cpu_hour": 0.05, "currency": "USD"}'}).prices == {
        "cpu_hour": 0.05,
        "currency": "USD",
    }
    assert endpoint(host="local", extra={"prices": {"gpu_hour": 2}}).prices == {"gpu_hour": 2}
    assert "extra 'prices'=" in (message := refused(extra={"prices": {"cpu_hour": -1}}))
    assert "cpu_hour must be a number, 0 or more" in message
    assert "'prices' is not valid JSON" in refused(extra={"prices": "cpu_hour=1"})


# --- AIRFLOW_CONN_<ID> that Airflow cannot read -----------------------------------------------------


def test_an_unset_variable_is_not_an_error(monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_MY_RAY", raising=False)
    assert unreadable_env_connection("my_ray") is None


@pytest.mark.parametrize(
    "raw, reason",
    [
        ('{"conn_type": "ray", "host": "h", "password": "%s",' % TOKEN, "it is not valid JSON"),
        (
            '{"conn_type": "ray", "host": "h", "port": "http", "password": "%s"}' % TOKEN,
            "its port 'http' is not a number",
        ),
        ('{"conn_type": "ray", "host": ["h"], "password": "%s"}' % TOKEN, "a field has the wrong type"),
        ("ray-head:8265 %s" % TOKEN, "it is neither a JSON object nor a connection URI"),
    ],
)
def test_an_unreadable_variable_is_explained_without_its_value(monkeypatch, raw, reason):
    monkeypatch.setenv("AIRFLOW_CONN_MY_RAY", raw)
    err = unreadable_env_connection("my_ray")
    assert isinstance(err, RayConnectionConfigError)
    message = str(err)
    assert message.startswith(
        "Connection 'my_ray' is set in AIRFLOW_CONN_MY_RAY, but Airflow cannot read it: " + reason
    )
    assert '"conn_type": "ray"' in message
    assert TOKEN not in message


# --- runtime_env merging --------------------------------------------------------------------------


def test_merge_runtime_env_puts_the_connections_default_under_the_jobs():
    base = {"pip": ["a"], "env_vars": {"A": "1", "B": "1"}, "py_modules": ["/base"], "working_dir": "/wd"}
    job = {"pip": ["b"], "env_vars": {"B": "2"}, "py_modules": ["/job"]}
    assert merge_runtime_env(base, job) == {
        "pip": ["b"],
        "env_vars": {"A": "1", "B": "2"},
        "py_modules": ["/job", "/base"],
        "working_dir": "/wd",
    }
    assert base == {"pip": ["a"], "env_vars": {"A": "1", "B": "1"}, "py_modules": ["/base"], "working_dir": "/wd"}
    assert merge_runtime_env(None, None) == {}
    assert merge_runtime_env({"env_vars": {"A": "1"}}, {"env_vars": None, "py_modules": None}) == {
        "env_vars": {"A": "1"},
        "py_modules": [],
    }
    assert merge_runtime_env(None, {"pip": ["x"]}) == {"pip": ["x"]}
