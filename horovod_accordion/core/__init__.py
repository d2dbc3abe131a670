"""The framework-free core: the regime detector, the schedule and its policies, the level
descriptions, the reducers and the per-step exchange, written against the contracts of
``backends.py``. Nothing here imports torch, TensorFlow, Keras or Horovod
(``tests/test_layout.py`` checks it); the backends adapt their frameworks to it.
"""
