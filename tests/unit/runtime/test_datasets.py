"""A training's datasets on the cluster: one built by the user's function is that function's, a smoke run
reads its first rows, and the datasets are read whole before the workers start when asked."""

from airflow_provider_horovod.documents import TrainingSpec
from airflow_provider_horovod.runtime.datasets import load_datasets, materialized


class Rows:
    """What the runtime asks of a Ray dataset here: its first rows, and a read of all of it."""

    def __init__(self, rows):
        self.rows = rows

    def limit(self, count):
        return Rows(self.rows[:count])

    def materialize(self):
        return ("read", self.rows)


def ten_rows():
    return Rows(list(range(10)))


def spec(tmp_path, **kwargs) -> TrainingSpec:
    built = {"import": f"{__name__}:ten_rows"}
    return TrainingSpec(
        submission_id="ahp-x-a1",
        train_fn={"import": "m:f"},
        storage_uri=str(tmp_path),
        datasets={"train": built},
        **kwargs,
    )


def test_a_dataset_built_by_a_function_is_what_it_returns(tmp_path):
    assert load_datasets(spec(tmp_path), str(tmp_path))["train"].rows == list(range(10))


def test_a_smoke_run_reads_the_first_rows_of_each(tmp_path):
    smoke = spec(tmp_path, smoke_run=True, smoke_rows=3)
    assert load_datasets(smoke, str(tmp_path))["train"].rows == [0, 1, 2]


def test_materialized_reads_each_dataset_and_says_so(capsys):
    assert materialized({"train": Rows([1, 2])}) == {"train": ("read", [1, 2])}
    assert "Reading the datasets ['train'] before the workers start." in capsys.readouterr().out
    assert materialized({}) == {}
