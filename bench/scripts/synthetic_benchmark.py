"""A Horovod benchmark script of the usual shape (as Horovod's own synthetic benchmark, with a model of its own:
PyPI's torchvision does not load beside the CPU torch), run unchanged by figure 9 both ways."""

import argparse
import socket
import timeit

import horovod.torch as hvd
import torch

parser = argparse.ArgumentParser(description="Synthetic Horovod benchmark")
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--image-size", type=int, default=32)
parser.add_argument("--num-warmup-batches", type=int, default=5)
parser.add_argument("--num-batches-per-iter", type=int, default=10)
parser.add_argument("--num-iters", type=int, default=5)
args = parser.parse_args()

hvd.init()
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 16, 3, padding=1),
    torch.nn.ReLU(),
    torch.nn.MaxPool2d(2),
    torch.nn.Conv2d(16, 32, 3, padding=1),
    torch.nn.ReLU(),
    torch.nn.AdaptiveAvgPool2d(4),
    torch.nn.Flatten(),
    torch.nn.Linear(32 * 16, 10),
)
optimizer = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size()), named_parameters=model.named_parameters()
)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
target = torch.randint(0, 10, (args.batch_size,))


def benchmark_step():
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(data), target).backward()
    optimizer.step()


def log(text):
    if hvd.rank() == 0:
        print(text, flush=True)


log(f"Batch size: {args.batch_size}, number of ranks: {hvd.size()}")
timeit.timeit(benchmark_step, number=args.num_warmup_batches)
img_secs = []
for x in range(args.num_iters):
    elapsed = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
    img_sec = args.batch_size * args.num_batches_per_iter / elapsed
    log(f"Iter #{x}: {img_sec:.1f} img/sec per rank")
    img_secs.append(img_sec)
mean = sum(img_secs) / len(img_secs)
hosts = hvd.allgather_object(socket.gethostname())
log(f"Img/sec per rank: {mean:.1f}")
log(f"Hosts: {','.join(hosts)}")
log(f"METRICS img_per_sec={mean:.3f}")
