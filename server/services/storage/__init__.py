"""Files: bundles, artifacts and checkpoints, shared files, uploads, job environments."""
