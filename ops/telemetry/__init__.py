"""Telemetry: GPU, host, inference-server, training and log collectors with histories."""
