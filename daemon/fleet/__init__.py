"""A farm of boxes: Prometheus metrics and rules, the dashboard, the bucket."""
