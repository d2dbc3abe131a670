"""Both cross-job resume tests (``tests/test_fault_tolerance.py``) in one job per phase:
``python -m tests.workers.resume_jobs full DIR`` (or ``resume DIR``) runs that phase of the torch
job (``resume_job.py``) in ``DIR/torch``, then of the Keras job (``tf_resume_job.py``) in
``DIR/keras``, in the same order in both phases."""
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # noqa: E402
import torch  # noqa: E402

import horovod_accordion.keras as hvd_keras  # noqa: E402
import horovod_accordion.torch as hvd_torch  # noqa: E402
from tests.workers import resume_job, tf_resume_job  # noqa: E402

JOBS = {"torch": resume_job, "keras": tf_resume_job}

if __name__ == "__main__":
    hvd_torch.init()
    hvd_keras.init()
    torch.set_num_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    phase, directory = sys.argv[1:3]
    for framework, job in JOBS.items():
        os.makedirs(os.path.join(directory, framework), exist_ok=True)
        {"full": job.full, "resume": job.resume}[phase](os.path.join(directory, framework))
