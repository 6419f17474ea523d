"""What a user, a template or a hand can put where a value goes: anything JSON holds, and more
(tuples, sets, bytes, NaN, callables, objects), nested."""

from __future__ import annotations

from hypothesis import strategies as st

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-3, max_value=70000)
    | st.floats()
    | st.text(max_size=24)
    | st.sampled_from(["", " ", "0", "true", "false", "None", "s3://b/p", "/tmp/x", "a:b", "{{ ds }}", "-1", "nan"])
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
anything = st.recursive(
    scalars | st.binary(max_size=6) | st.just(object()) | st.just(print) | st.just(len),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.frozensets(st.integers() | st.text(max_size=4), max_size=3)
        | st.dictionaries(st.text(max_size=8) | st.integers(), inner, max_size=4)
    ),
    max_leaves=10,
)
