"""The daemon's service: ``wiring`` builds the sources and the stages and runs the main loop
(``run_service``, the entry of every front end). The stages, one room each, in the order data
flows: ``sources`` and ``instances`` → ``logrecords`` / ``prompts`` → the incident tracker →
``assembly`` + ``actions`` → alerts (``sinks``), chained by ``pipeline``; beside them
``recovery``, ``status``, ``reload``, ``scheduling``, ``logsetup``, and ``workers`` -- the one
lifecycle every daemon thread shares. No code here: import the module you need."""
