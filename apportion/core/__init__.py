"""What the client and the servers (scheduler, worker) both need, importing neither: the
running task's context (``get_worker``), the hooks a worker offers its tasks, key naming,
the event records a client reads, the task that takes a stored argument."""
