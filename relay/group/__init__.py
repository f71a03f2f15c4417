"""A group of replicas sharing the partitions of one outbox: the balancing rule and the runner
of one loop per partition."""
