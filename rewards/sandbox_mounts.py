"""What the namespace sandboxes (bwrap, unshare) show of the host: only what the interpreter needs, read-only.

That is its binary, the directories on its `-I -S` sys.path (the stdlib and lib-dynload) and the
directories of the shared libraries it and its extension modules load (found with `ldd`; without `ldd`,
the standard lib dirs /lib* /usr/lib*), plus the root symlinks (/lib -> usr/lib, ...) the loader's paths
go through. Nothing else of /usr (no /usr/src, /usr/local, /usr/share, /usr/bin): a project checked out
under /usr/src/app is not visible.

`exposed()` is the backstop: the sandbox refuses to start if a protected path (the project, the task
file with the expected outputs) lies under anything it would mount.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent  # the checkout: its task files hold the expected outputs
ROOT_DIRS = ("/bin", "/lib", "/lib64", "/lib32", "/sbin")
FALLBACK_LIB_DIRS = ("/lib", "/lib64", "/lib32", "/usr/lib", "/usr/lib64", "/usr/lib32")
QUERY = "import json, sys; print(json.dumps([sys.executable, sys.path]))"


@dataclass(frozen=True)
class Mounts:
    executable: str  # the interpreter's real path: what runs inside
    paths: tuple[str, ...]  # host files and dirs bound read-only at the same place
    links: tuple[tuple[str, str], ...]  # (root symlink, its target), e.g. ("/lib", "usr/lib")


class MountError(RuntimeError):
    """The interpreter could not be inspected, or a protected path would be visible inside."""


@functools.lru_cache(maxsize=None)
def interpreter_mounts(python: str) -> Mounts:
    """The mounts `python -I -S` needs inside the sandbox (cached per interpreter)."""
    executable, path = query_interpreter(python)
    dirs = [p for p in path if os.path.isdir(p)]
    libs = shared_library_dirs([executable] + extension_modules(dirs))
    return Mounts(executable, minimal_cover([executable, *dirs, *libs]), tuple(sorted(root_links().items())))


def query_interpreter(python: str) -> tuple[str, list[str]]:
    """(real path of the binary, its sys.path under -I -S), asked from the interpreter itself."""
    try:
        out = subprocess.run([python, "-I", "-S", "-c", QUERY], env={}, capture_output=True, timeout=60,
                             check=True).stdout
        executable, path = json.loads(out)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        raise MountError(f"reward.sandbox.python={python!r} could not be run to find what to mount: {e}") from e
    return os.path.realpath(executable or python), [os.path.realpath(p) for p in path if p]


def extension_modules(dirs: list[str]) -> list[str]:
    """The compiled modules directly in `dirs` (lib-dynload): their libraries must be mounted too."""
    found = []
    for d in dirs:
        try:
            found += sorted(str(p) for p in Path(d).iterdir() if p.suffix == ".so" and p.is_file())
        except OSError:
            pass
    return found


def shared_library_dirs(binaries: list[str]) -> list[str]:
    """Real dirs of every library `ldd` resolves for `binaries`, and of the dirs it names them by (e.g.
    /lib64 for the loader, whose real dir is /usr/lib64). Without ldd: the standard lib dirs."""
    ldd = shutil.which("ldd")
    if not ldd:
        return [os.path.realpath(d) for d in FALLBACK_LIB_DIRS if os.path.isdir(d)]
    try:
        out = subprocess.run([ldd, *binaries], env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
                             capture_output=True, timeout=120).stdout.decode(errors="replace")
    except (OSError, subprocess.SubprocessError):
        return [os.path.realpath(d) for d in FALLBACK_LIB_DIRS if os.path.isdir(d)]
    dirs = set()
    for lib in parse_ldd(out):
        dirs.add(os.path.realpath(os.path.dirname(lib)))
        dirs.add(os.path.dirname(os.path.realpath(lib)))
    return sorted(dirs)


def parse_ldd(text: str) -> list[str]:
    """Absolute library paths in `ldd` output ("libc.so.6 => /lib/.../libc.so.6 (0x...)", "/lib64/ld...")."""
    libs = []
    for line in text.splitlines():
        if not line.startswith("\t"):
            continue  # "binary:" headers
        target = line.split("=>", 1)[1] if "=>" in line else line
        word = target.split("(", 1)[0].strip()
        if word.startswith("/"):
            libs.append(word)
    return libs


def minimal_cover(paths: list[str]) -> tuple[str, ...]:
    """The paths, deduplicated, without any that lies inside another (bind mounts must not nest)."""
    kept: list[str] = []
    for p in sorted(set(paths), key=lambda s: (s.count("/"), s)):
        if not any(is_within(p, k) for k in kept):
            kept.append(p)
    return tuple(sorted(kept))


def root_links() -> dict[str, str]:
    return {p: os.readlink(p) for p in ROOT_DIRS if os.path.islink(p)}


def is_within(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def exposed(protected: list[str], mounted: tuple[str, ...]) -> list[tuple[str, str]]:
    """(protected path, the mount that would show it) for each protected path visible inside."""
    hits = []
    for p in protected:
        real = os.path.realpath(p)
        hits += [(p, m) for m in mounted if is_within(real, m)]
    return hits


def refuse_if_exposed(protected: list[str], mounts: Mounts) -> None:
    hits = exposed(protected, mounts.paths)
    if hits:
        where = "; ".join(f"{p} lies under {m}" for p, m in hits)
        raise MountError(
            f"sandbox refused: {where}, which the sandbox mounts read-only for the interpreter, so model code "
            "could read it (e.g. the task's expected outputs). Move the project / task file elsewhere, or set "
            "reward.sandbox.python to an interpreter installed outside it.")
