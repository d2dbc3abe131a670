"""Put in front of ``PYTHONPATH`` by the DDP tests: Horovod is not importable there, as on a
machine where it was never built."""
raise ImportError("horovod is made unimportable for this test (tests/no_horovod)")
