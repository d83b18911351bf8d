"""The daemon's service: ``wiring`` builds the stages and runs the loop (``run_service``, the
entry of every front end); each stage lives in a room of its own next to it (instances, log
records, prompts, snapshot assembly, incident actions, status, recovery, reload) and
``workers`` is the one lifecycle every worker thread shares. No code here: import the module
you need (``from oom_sentinel.daemon.service.wiring import run_service``)."""
