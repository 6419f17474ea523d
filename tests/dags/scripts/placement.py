"""Where each rank is, as Horovod sees it: a script of the usual shape (``hvd.init()`` at module level, no
import of Ray) whose every rank prints a line ``PLACEMENT {...}`` with its rank, size, local and cross rank
and size, its host name and an allreduce of ``rank + 1`` over every rank; rank 0 then prints every rank's,
gathered through Horovod, as ``WORLD [...]``. The multi-host test runs it unchanged under ``horovodrun`` and
through the operator, and compares the two (tests/integration/test_multihost_scripts.py)."""

import json
import socket

import horovod.torch as hvd
import torch

hvd.init()
total = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum, name="placement").item()
placement = {
    "rank": hvd.rank(),
    "size": hvd.size(),
    "local_rank": hvd.local_rank(),
    "local_size": hvd.local_size(),
    "cross_rank": hvd.cross_rank(),
    "cross_size": hvd.cross_size(),
    "host": socket.gethostname(),
    "sum": total,
}
print(f"PLACEMENT {json.dumps(placement)}", flush=True)
world = hvd.allgather_object(placement)
if hvd.rank() == 0:
    print(f"WORLD {json.dumps(world)}", flush=True)
