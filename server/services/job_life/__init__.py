"""Jobs and their lifecycle: submit, transitions, attempts and their endings, restarts, hangs, the reconciler, what a task is started with."""
