"""What the planner models, for the flags and for plan files and configs alike (no imports: the CLI reads it at
start-up): a shape dimension or a sequence length, the GPUs of a job or a node, the sequences of a step, a
model's parameters."""
SHAPE_MAX = 10_000_000
GPUS_MAX = 1_000_000
BATCH_MAX = 100_000_000
PARAMS_MAX = 1e14
BOUNDS = (SHAPE_MAX, GPUS_MAX, BATCH_MAX, PARAMS_MAX)


def big_number(v) -> str:
    """A count for a message (3 significant digits); an integer beyond float's range (a config's 400-digit field)
    as its power of ten."""
    try:
        return f"{v:.3g}"
    except OverflowError:
        return f"~1e+{len(str(abs(int(v)))) - 1}"


def is_device(path) -> bool:
    """A character or block device (/dev/zero, /dev/urandom, a tty): reading one as a file never ends.  Pipes
    (`<(...)`, a FIFO) are read as files; a path that cannot be looked at is left to the caller's open."""
    import os
    import stat
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return False
    return stat.S_ISCHR(mode) or stat.S_ISBLK(mode)


def can_make_folder_in(folder) -> bool:
    """Whether a folder can be made in `folder`: permission bits (os.access) first, then a folder made and removed,
    since some places pass os.access and take no folder (/proc and /sys as root, a read-only mount)."""
    import os
    import tempfile
    if not os.access(folder, os.W_OK | os.X_OK):
        return False
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".parplan-", dir=folder))
    except OSError:
        return False
    return True
