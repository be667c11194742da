"""The coordinator's own Prometheus metrics: instruments, scrape-time cluster gauges, request latency."""
