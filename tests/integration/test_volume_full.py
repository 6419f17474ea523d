"""A local volume that fills up under a training (issue 50's storage refusal, on the disk a local
``storage_path`` lies on): the attempt fails as storage, which Airflow retries, not as the user's bug,
and says what ran out; once space is freed, the retry trains, never resuming from the checkpoint the
full volume cut short, and keeps its checkpoint there. A real Ray head, real Horovod over Gloo, a real
filesystem of fixed size (tmpfs)."""

from __future__ import annotations

import errno
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from airflow_provider_horovod.exceptions import StorageError, UserCodeError
from harness.tasks import FakeTI, jobs_of

from .test_operator import make_operator

pytestmark = pytest.mark.integration

VOLUME_MB = 8
CHECKPOINT_BYTES = 2 * 1024 * 1024
# What is left free while the volume is full: room for the provider's small records (the attempt's
# result, Ray Train's own state files), none for a checkpoint.
LEFT_FREE = 256 * 1024


def train_with_large_checkpoints(config):
    """``epochs`` epochs on two Horovod ranks; rank 0 reports a checkpoint of ``CHECKPOINT_BYTES`` each."""
    import os
    import tempfile

    import horovod.torch as hvd
    import ray.train
    import torch
    from ray.train import Checkpoint

    hvd.init()
    resumed = ray.train.get_checkpoint()
    if resumed:  # a retry may resume only from a whole checkpoint
        with resumed.as_directory() as folder:
            size = os.path.getsize(os.path.join(folder, "weights.bin"))
        if size != config["checkpoint_bytes"]:
            raise ValueError(f"resumed from a checkpoint of {size} bytes")
    for epoch in range(config["epochs"]):
        loss = hvd.allreduce(torch.tensor(1.0 / (epoch + 1)), name=f"loss{epoch}").item()
        with tempfile.TemporaryDirectory() as folder:
            checkpoint = None
            if hvd.rank() == 0:
                with open(os.path.join(folder, "weights.bin"), "wb") as f:
                    f.write(os.urandom(config["checkpoint_bytes"]))
                checkpoint = Checkpoint.from_directory(folder)
            ray.train.report({"epoch": epoch, "loss": loss}, checkpoint=checkpoint)


@pytest.fixture
def volume(tmp_path):
    """A tmpfs of ``VOLUME_MB`` MB, mounted for the test and gone after it."""
    if os.geteuid() != 0:
        pytest.skip("mounting a filesystem of fixed size needs root")
    path = tmp_path / "volume"
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={VOLUME_MB}m", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "--lazy", str(path)], check=False)


def fill(volume: Path) -> Path:
    """Fill the volume up to ``LEFT_FREE`` bytes free; the file that takes the space."""
    filler = volume / "filler.bin"
    stat = os.statvfs(volume)
    size = stat.f_bavail * stat.f_frsize - LEFT_FREE
    with open(filler, "wb") as f:
        try:
            f.write(b"\0" * size)
        except OSError as err:  # the volume's own bookkeeping took a little of it
            assert err.errno == errno.ENOSPC, err
    return filler


@pytest.mark.timeout(900)
def test_a_full_volume_fails_the_attempt_as_storage_and_the_retry_trains_once_space_is_freed(ray_hook, volume):
    config = {"epochs": 2, "checkpoint_bytes": CHECKPOINT_BYTES}
    run_id = f"volume-{uuid.uuid4().hex[:6]}"
    filler = fill(volume)

    with pytest.raises(StorageError) as failed:
        make_operator(volume, train_fn=train_with_large_checkpoints, train_loop_config=config).execute(
            {"ti": FakeTI(run_id)}
        )
    message = str(failed.value)
    assert not isinstance(failed.value, UserCodeError)
    assert "No space left on device" in message, message[-3000:]
    assert "storage" in message, message[-3000:]
    assert len(jobs_of(ray_hook, run_id)) == 1
    # The checkpoint cut short is marked so (its folder holds part of its file): the retry must not resume from it.
    assert [p.name for p in volume.rglob("*.unfinished")], sorted(p.name for p in volume.rglob("*"))

    filler.unlink()
    result = make_operator(volume, train_fn=train_with_large_checkpoints, train_loop_config=config).execute(
        {"ti": FakeTI(run_id, try_number=2)}
    )
    assert result["attempt"] == 2
    assert result["metrics"]["epoch"] == 1
    assert result["checkpoint_uri"].startswith(str(volume))
    assert (Path(result["checkpoint_uri"]) / "weights.bin").stat().st_size == CHECKPOINT_BYTES
    assert len(jobs_of(ray_hook, run_id)) == 2
