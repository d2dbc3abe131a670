"""Will compression pay off on your cluster? ``python -m horovod_accordion.advise``.

Measure the model once on your own device (``profile``, the only part that imports torch),
then model the rest: each collective's wire time with a latency-bandwidth model (``wire``),
and the step with our overlap schedule (``schedule``, ``predict``). Not imported by
``horovod_accordion``: see ``docs/advise.md``.
"""
