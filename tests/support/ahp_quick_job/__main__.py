import json
import sys
import time

from airflow_provider_horovod import failures
from airflow_provider_horovod.documents import ResultRecord, TrainingSpec
from airflow_provider_horovod.runtime.entrypoint import report_failure
from airflow_provider_horovod.runtime.payload import read_payload
from airflow_provider_horovod.runtime.records import filesystem, write_record


def main(payload: str) -> int:
    started = time.time()
    spec, _ = read_payload(payload, TrainingSpec)
    try:
        return run(spec, started)
    except Exception as err:  # says why as the runtime does: its verdict and the attempt's record
        report_failure(spec, failures.of_error(err, user_code=False), started)
        return 1


def run(spec: TrainingSpec, started: float) -> int:
    config = spec.train_loop_config
    print(f"quick job {spec.submission_id}, attempt {spec.attempt}, resume from {spec.resume_from}", flush=True)
    for i in range(int(config.get("quick_lines", 3))):
        print(f"quick-line-{i:04d}", flush=True)
        time.sleep(float(config.get("quick_line_s", 0)))
    if config.get("quick_stall_s") and spec.attempt == 1:
        time.sleep(float(config["quick_stall_s"]))  # quiet: no line, no report
    if config.get("quick_fail"):
        failure_class = failures.FailureClass(config.get("quick_fail_class", "user_code"))
        report_failure(spec, failures.Failure(failure_class, f"QuickJobError: {config['quick_fail']}"), started)
        return 1
    checkpoint = f"{spec.run_uri}/checkpoint_000000"
    fs, path = filesystem(checkpoint)
    fs.create_dir(path, recursive=True)
    with fs.open_output_stream(f"{path}/model.json") as out:
        out.write(json.dumps({"run": config.get("run"), "attempt": spec.attempt}).encode())
    metrics = {"run": config.get("run"), "size": spec.num_workers, "epoch": 0}
    record = ResultRecord(
        submission_id=spec.submission_id,
        attempt=spec.attempt,
        storage_uri=spec.storage_uri,
        run_uri=spec.run_uri,
        checkpoint_uri=checkpoint,
        best_checkpoint_uri=checkpoint,
        metrics=metrics,
        world_size=spec.num_workers,
        trainer_api=spec.trainer_api,
        resumed_from=(spec.resume_from or [None])[0],
        timings={"started_at": started, "finished_at": time.time(), "fit_s": 0.0},
    )
    write_record(spec.result_uri, record)
    print(f"checkpoint: {checkpoint}", flush=True)
    return 0


sys.exit(main(sys.argv[1]))
