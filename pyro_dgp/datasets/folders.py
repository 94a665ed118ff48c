"""Where the data live: the folders searched for a data set, in order ``data_dir``,
``$PYRO_DGP_DATA``, the user cache, and the message that lists them when a set is in none.

A relative ``$PYRO_DGP_DATA`` means a path from the directory the program started in (the
working directory when ``pyro_dgp`` is imported), as a shell user means it, whatever
directory the program changes to later; it is written back to the environment as that
absolute path, for child processes started from elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ENV_VAR", "cache_dir", "candidates", "env_data_dir", "find_folder", "labelled_dirs",
           "not_found", "search_dirs"]

ENV_VAR = "PYRO_DGP_DATA"
"""Environment variable naming a data folder (the one holding ``uci/``, or ``uci/`` itself)."""


def _start_dir() -> Path | None:
    try:
        return Path.cwd()
    except OSError:  # the working directory was deleted before the import
        return None


_START_DIR = _start_dir()
"""The working directory at import: where a relative ``$PYRO_DGP_DATA`` was meant from."""


def _absolute_env_in_environment() -> None:
    """Write a relative ``$PYRO_DGP_DATA`` back as the absolute path it means, so that a child
    process started from another directory (a test's subprocess, a ``torchrun`` or data-loader
    worker) reads the same folder."""
    value = os.environ.get(ENV_VAR)
    if value and _START_DIR is not None and not Path(value).expanduser().is_absolute():
        os.environ[ENV_VAR] = os.path.normpath(_START_DIR / value)


def env_data_dir() -> Path | None:
    """``$PYRO_DGP_DATA`` as an absolute path, or ``None`` where it is unset or empty.

    A relative value is read from the directory the program started in (the working directory
    when ``pyro_dgp`` was imported), not from wherever the program has changed directory since.
    """
    value = os.environ.get(ENV_VAR)
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_absolute() and _START_DIR is not None:
        path = Path(os.path.normpath(_START_DIR / path))
    return path


_absolute_env_in_environment()


def cache_dir() -> Path:
    """The user cache folder ``$XDG_CACHE_HOME/pyro_dgp`` (default ``~/.cache/pyro_dgp``)."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "pyro_dgp"


def search_dirs(data_dir: str | os.PathLike | None = None) -> list[Path]:
    """The folders searched for UCI sets, in order: ``data_dir``, ``$PYRO_DGP_DATA``, cache.

    Each entry may be a folder containing ``uci/`` or the ``uci/`` folder itself.
    """
    return [base for base, _ in labelled_dirs(data_dir)]


def labelled_dirs(data_dir: str | os.PathLike | None) -> list[tuple[Path, str]]:
    """:func:`search_dirs` with where each folder comes from."""
    dirs: list[tuple[Path, str]] = []
    if data_dir is not None:
        dirs.append((Path(data_dir).expanduser(), "data_dir"))
    env = env_data_dir()
    if env is not None:
        dirs.append((env, f"${ENV_VAR}"))
    dirs.append((cache_dir(), "user cache"))
    return dirs


def candidates(base: Path, folder: str) -> list[Path]:
    return [base / "uci" / folder, base / folder]


def find_folder(folder: str, data_dir: str | os.PathLike | None) -> tuple[Path | None, list[str]]:
    """The first folder holding ``<folder>/data.txt``, and every place that was looked at
    (each with where it came from)."""
    looked: list[str] = []
    for base, origin in labelled_dirs(data_dir):
        for cand in candidates(base, folder):
            looked.append(f"{cand}  ({origin})")
            if (cand / "data.txt").is_file():
                return cand, looked
    return None, looked


def not_found(folder: str, looked: list[str]) -> str:
    """The message for a UCI set found nowhere: where it looked and how to point there."""
    env = os.environ.get(ENV_VAR)
    state = f"{ENV_VAR} is set to {env!r}" if env else f"{ENV_VAR} is not set"
    return (f"UCI data set {folder!r} not found: no data.txt in any of\n  "
            + "\n  ".join(looked)
            + f"\n{state}. Set {ENV_VAR} (or pass data_dir=...) to a folder holding "
            f"uci/{folder}/data.txt with its split files (index_train_<k>.txt...), e.g. "
            f"export {ENV_VAR}=/path/to/data")
