"""Print what `make demo` produced, from the summary line the retraining DAG's last task logs."""

import json
import sys


def main(dag_id: str, log_path: str) -> int:
    with open(log_path, encoding="utf-8", errors="replace") as f:
        lines = [line for line in f if "AHP_RETRAINING " in line]
    if not lines:
        print(f"{dag_id}: no summary line in {log_path}", file=sys.stderr)
        return 1
    summary = json.loads(lines[-1].split("AHP_RETRAINING ", 1)[1])
    print(f"checkpoint:        {summary['checkpoint_uri']}")
    print(f"Ray job:           {summary['submission_id']}")
    print(f"holdout MSE:       baseline (untrained) {summary['baseline_mse']:.4f}, "
          f"trained {summary['holdout_mse']:.4f}")
    before = summary["champion_mse_before"]
    print(f"promoted:          {'yes' if summary['promoted'] else 'no'}"
          f" (champion before: {'none' if before is None else f'{before:.4f}'})")
    if not summary["holdout_mse"] < 0.5 * summary["baseline_mse"]:
        print("the trained model does not clearly beat the baseline", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
