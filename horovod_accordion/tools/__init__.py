"""Tools beside training: the patched-Horovod installer and the plots of a run's log."""
import os
import pathlib

__all__ = ["cache_folder"]


def cache_folder():
    """Where the package keeps what it built or generated once (Horovod's wheels, the examples'
    datasets): ``$HOROVOD_ACCORDION_CACHE``, else ``~/.cache/horovod_accordion``."""
    return pathlib.Path(os.environ.get("HOROVOD_ACCORDION_CACHE", pathlib.Path.home() / ".cache" / "horovod_accordion"))
