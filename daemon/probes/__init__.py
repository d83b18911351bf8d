"""Memory probes: NVML, the host, a scripted fake GPU, and the timeline they fill."""
