"""Scheduling: the pass, the queue's order and plan, placement and the fit rules, fair share, reasons and start estimates."""
