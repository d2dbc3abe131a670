"""Tools beside training: the patched-Horovod installer and the plots of a run's log."""
import contextlib
import os
import pathlib
import shutil
import tempfile

__all__ = ["cache_folder", "published_folder"]


def cache_folder():
    """Where the package keeps what it built or generated once (Horovod's wheels, the examples'
    datasets): ``$HOROVOD_ACCORDION_CACHE``, else ``~/.cache/horovod_accordion``."""
    return pathlib.Path(os.environ.get("HOROVOD_ACCORDION_CACHE", pathlib.Path.home() / ".cache" / "horovod_accordion"))


@contextlib.contextmanager
def published_folder(destination, marker, replace=False):
    """An empty folder beside ``destination`` to fill, renamed to ``destination`` when the block
    ends without an error, so that a reader, or another process publishing the same at once, sees
    it whole or not at all; an error leaves nothing. With ``replace``, an entry already there is
    moved away first. One that another process publishes meanwhile (``marker`` in it) is as good,
    and kept."""
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{destination.name}.", dir=destination.parent))
    try:
        yield staging
        if replace and destination.exists():
            replaced = destination.with_name(f".{destination.name}.replaced.{os.getpid()}")
            os.rename(destination, replaced)
            shutil.rmtree(replaced, ignore_errors=True)
        try:
            os.rename(staging, destination)
        except OSError:
            if not (destination / marker).is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
