"""RayHook's pure parts: connection fields and extras, runtime_env merging, log offsets."""

import pytest

from airflow_provider_horovod.exceptions import RayConnectionConfigError
from airflow_provider_horovod.hooks.ray import (
    RayEndpoint,
    RayHook,
    auth_headers,
    dashboard_url,
    job_url,
    merge_runtime_env,
    parse_extras,
    split_new_lines,
    ssl_context,
    total_resources,
)


def test_identity():
    assert (RayHook.conn_type, RayHook.default_conn_name, RayHook.hook_name, RayHook.conn_name_attr) == (
        "ray", "ray_default", "Ray", "ray_conn_id")


@pytest.mark.parametrize(
    "host, port, schema, url",
    [
        ("ray-head", None, None, "http://ray-head:8265"),
        ("ray-head", 443, "https", "https://ray-head:443"),
        ("https://ray.example.com/", None, None, "https://ray.example.com"),
        ("http://ray-head:9000", 8265, None, "http://ray-head:9000"),
    ],
)
def test_dashboard_url(host, port, schema, url):
    assert dashboard_url(host, port, schema) == url


def test_extras_defaults_and_strings():
    assert parse_extras("c", {}) == (True, {}, {})
    verify, headers, env = parse_extras("c", {"verify": "false", "headers": '{"X-A": "1"}',
                                              "runtime_env": {"pip": ["x"]}})
    assert verify is False and headers == {"X-A": "1"} and env == {"pip": ["x"]}
    assert parse_extras("c", {"verify": "/etc/ca.pem"})[0] == "/etc/ca.pem"


@pytest.mark.parametrize(
    "extra, needle",
    [
        ({"headers": "{not json"}, "'headers' is not valid JSON"),
        ({"headers": "[1]"}, "must be a JSON object"),
        ({"headers": {"X": 1}}, "strings to strings"),
        ({"runtime_env": "[]"}, "'runtime_env' must be a JSON object"),
        ({"verify": 3}, "true, false or a CA bundle path"),
        ({"token": "x"}, "unknown extra ['token']"),
    ],
)
def test_malformed_extras_name_the_connection_and_field(extra, needle):
    with pytest.raises(RayConnectionConfigError) as err:
        parse_extras("my_ray", extra)
    assert "'my_ray'" in str(err.value) and needle in str(err.value)


def test_token_goes_in_a_bearer_header_and_never_in_repr():
    headers = auth_headers("s3cret", {"X-A": "1"})
    assert headers == {"X-A": "1", "Authorization": "Bearer s3cret"}
    assert "s3cret" not in repr(RayEndpoint("c", "http://h:8265", headers))


def test_merge_runtime_env_puts_the_connection_default_under_the_job():
    base = {"pip": ["a"], "env_vars": {"A": "1", "B": "1"}, "py_modules": ["/base"]}
    job = {"pip": ["b"], "env_vars": {"B": "2"}, "py_modules": ["/job"]}
    assert merge_runtime_env(base, job) == {"pip": ["b"], "env_vars": {"A": "1", "B": "2"},
                                            "py_modules": ["/job", "/base"]}
    assert merge_runtime_env(None, None) == {}


def test_split_new_lines_loses_and_repeats_nothing():
    text = "a\nb\npartial"
    lines, offset = split_new_lines(text, 0)
    assert (lines, offset) == (["a", "b"], 2)
    lines, offset = split_new_lines(text + " line\nc\n", offset)
    assert (lines, offset) == (["partial line", "c"], 4)
    assert split_new_lines("a\nb\nc\nlast", 3, final=True) == (["last"], 4)
    assert split_new_lines("", 0, final=True) == ([], 0)


def test_job_url_and_resources():
    assert job_url("http://h:8265", "sid") == "http://h:8265/#/jobs/sid"
    nodes = [{"state": "ALIVE", "resources_total": {"CPU": 4.0, "node:1.2.3.4": 1.0}},
             {"state": "ALIVE", "resources_total": {"CPU": 2.0, "GPU": 1.0}},
             {"state": "DEAD", "resources_total": {"GPU": 8.0}}]
    assert total_resources(nodes) == {"CPU": 6.0, "GPU": 1.0}


def test_a_missing_named_connection_is_an_error_not_a_local_cluster(monkeypatch):
    hook = RayHook(ray_conn_id="does_not_exist")
    with pytest.raises(RayConnectionConfigError, match="'does_not_exist' does not exist"):
        hook.get_dashboard_url()


class ScriptedHook(RayHook):
    """A hook whose job info comes from a script of states (the Jobs API is mocked, not the waiting)."""

    def __init__(self, states):
        super().__init__()
        self.states = list(states)
        self.asked = 0

    def get_job_info(self, submission_id):
        self.asked += 1
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        return None if state is None else {"status": state, "message": f"msg-{state}"}

    def get_job_url(self, submission_id):
        return f"http://h:8265/#/jobs/{submission_id}"


def test_wait_for_job_polls_until_the_end():
    hook = ScriptedHook(["PENDING", "RUNNING", "SUCCEEDED"])
    assert hook.wait_for_job("sid", poll_interval=0)["status"] == "SUCCEEDED"
    assert hook.asked == 3


@pytest.mark.parametrize("states, timeout, needle", [(["RUNNING", "FAILED"], None, "ended FAILED: msg-FAILED"),
                                                     ([None], None, "does not exist"),
                                                     (["RUNNING"], 0.0, "still RUNNING after 0 s")])
def test_wait_for_job_fails_clearly(states, timeout, needle):
    from airflow_provider_horovod.exceptions import RayJobError

    with pytest.raises(RayJobError, match=needle):
        ScriptedHook(states).wait_for_job("sid", poll_interval=0, timeout=timeout)


def self_signed_ca(folder) -> str:
    """A CA certificate in PEM, written to ``folder``; its path."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ahp test CA")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(key, hashes.SHA256()))
    path = folder / "ca.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(path)


def test_tls_verification_for_the_async_requests(tmp_path):
    """The trigger's requests honour `verify` as the sync ones do: on by default, off, a CA bundle
    file, or a folder of CA files."""
    import ssl

    assert ssl_context(True) is None  # aiohttp's default: verify against the system's CAs
    assert ssl_context(False) is False
    bundle = self_signed_ca(tmp_path)
    trusted = ssl_context(bundle)
    assert isinstance(trusted, ssl.SSLContext) and trusted.verify_mode == ssl.CERT_REQUIRED
    assert [c["subject"] for c in trusted.get_ca_certs()] == [((("commonName", "ahp test CA"),),)]
    folder = ssl_context(str(tmp_path))  # a folder is a capath, as requests takes it
    assert isinstance(folder, ssl.SSLContext) and folder.verify_mode == ssl.CERT_REQUIRED
