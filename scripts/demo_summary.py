"""Print what `make demo` produced, from the summary line the retraining DAG's last task logs."""

import json
import sys


def main(dag_id: str, log_path: str) -> int:
    with open(log_path, encoding="utf-8", errors="replace") as f:
        lines = [line for line in f if "AHP_RETRAINING " in line]
    if not lines:
        print(f"{dag_id}: no summary line in {log_path}", file=sys.stderr)
        return 1
    # The task log may add its own fields after the JSON object.
    summary = json.JSONDecoder().raw_decode(lines[-1].split("AHP_RETRAINING ", 1)[1])[0]
    print(f"checkpoint:        {summary['checkpoint_uri']}")
    print(f"Ray job:           {summary['submission_id']}")
    print(
        f"holdout MSE:       baseline (untrained) {summary['baseline_mse']:.4f}, trained {summary['holdout_mse']:.4f}"
    )
    before = summary["champion_before"]
    was = "none" if before is None else f"{before['holdout_mse']:.4f} of {before['logical_date']}"
    print(f"promoted:          {'yes' if summary['promoted'] else 'no'} (champion before: {was})")
    if not summary["holdout_mse"] < 0.5 * summary["baseline_mse"]:
        print("the trained model does not clearly beat the baseline", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
