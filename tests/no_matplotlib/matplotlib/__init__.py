"""Put in front of ``PYTHONPATH`` by tests/test_advise.py: matplotlib is not importable there, as
where the ``plot`` extra was never installed."""
raise ImportError("matplotlib is made unimportable for this test (tests/no_matplotlib)")
