"""`make chaos`: faults at random, under load, on a deployment as users run one, then the invariants
(chaos/README.md). A fault test, not a benchmark; its figure goes into bench/results.md."""
