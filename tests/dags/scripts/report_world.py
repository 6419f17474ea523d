"""A script that leaves no checkpoint: it joins Horovod, sums the ranks and prints its metrics."""

import argparse
import os

import horovod.torch as hvd
import psutil
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--date", required=True)
args = parser.parse_args()

hvd.init()
print(f"niceness {os.nice(0)}")
total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum).item()
if hvd.rank() == 0:
    print(f"date {args.date}")
    print(f"METRICS size={hvd.size()} rank_sum={total:g}")
    # Ray Train's controller of this job, on this node: at 0 with the whole job's workers (its imports, and the
    # synchronization actor's, done before the ranks' loop rather than in it). Ray gives each worker process its
    # job's id (RAY_JOB_ID); other jobs' controllers, on this cluster or another on the machine, are not this job's.

    def of_this_job(process):
        try:
            return process.environ().get("RAY_JOB_ID") == os.environ["RAY_JOB_ID"]
        except psutil.Error:  # gone meanwhile
            return False

    found = psutil.process_iter(["cmdline", "nice"])
    controllers = [p for p in found if "TrainController" in str(p.info["cmdline"]) and of_this_job(p)]
    print("controller niceness", sorted({p.info["nice"] for p in controllers}))
