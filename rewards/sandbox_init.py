"""Sandbox set-up for the `unshare` backend (stdlib only): runs as uid 0 of a fresh user namespace and
PID 1 of fresh mount/pid/net/ipc/uts/cgroup namespaces made by `unshare(1)`; starts a new session (its own
process group, like bwrap --new-session), builds a minimal root, pivots into it, drops every capability
and execs the harness. What bubblewrap does, for hosts without bwrap.

    unshare --user --map-root-user --mount --pid --net --ipc --uts --cgroup --fork --kill-child -- \
        python3 -I -S sandbox_init.py '<json config>'

config: root (an empty host dir used as mount point), ro_binds (host dirs or files, mounted read-only at
the same place), links {"/bin": "usr/bin", ...}, code (host dir → /harness, read-only), tmpfs_bytes (size of
/tmp and /sandbox), argv (exec'd in /sandbox with an empty environment).
"""
import ctypes
import json
import os
import platform
import socket
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
MNT_DETACH = 2
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
# statvfs flag → mount flag: a read-only remount must keep the flags the kernel locked on the original
ST_TO_MS = [(os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
            (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME), (os.ST_RELATIME, MS_RELATIME)]

libc = ctypes.CDLL(None, use_errno=True)


def check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"sandbox_init: {what}: {os.strerror(err)}")


def mount(src, target, fstype, flags, data=None) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    check(libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
          f"mount {src} on {target}")


def bind_readonly(src: str, target: str) -> None:
    mount(src, target, None, MS_BIND | MS_REC)
    locked = sum(ms for st, ms in ST_TO_MS if os.statvfs(src).f_flag & st)
    mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | locked)


def build_root(cfg: dict) -> None:
    root = cfg["root"]
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we mount propagates to the host
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for path in cfg["ro_binds"]:  # dirs, or single files (the interpreter binary)
        if os.path.isdir(path):
            os.makedirs(root + path, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(root + path), exist_ok=True)
            open(root + path, "w").close()
        bind_readonly(path, root + path)
    for link, target in cfg["links"].items():
        os.symlink(target, root + link)
    os.makedirs(root + "/harness")
    bind_readonly(cfg["code"], root + "/harness")
    for path in ("/tmp", "/sandbox"):
        os.makedirs(root + path)
        mount("tmpfs", root + path, "tmpfs", MS_NOSUID | MS_NODEV, f"size={cfg['tmpfs_bytes']},mode=1777")
    os.makedirs(root + "/proc")
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    with open(root + "/proc/sys/user/max_user_namespaces", "w") as f:
        f.write("0")  # no nested user namespaces (bwrap's --disable-userns): less kernel surface
    os.makedirs(root + "/dev")
    for dev in ("null", "zero", "random", "urandom"):
        open(root + "/dev/" + dev, "w").close()
        mount("/dev/" + dev, root + "/dev/" + dev, None, MS_BIND)
    mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    os.chdir(root)  # pivot_root(".", ".") + detach: the host's root is gone from this namespace
    check(libc.syscall(SYS_PIVOT_ROOT[platform.machine()], b".", b"."), "pivot_root")
    check(libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")


def drop_privileges() -> None:
    """Empty the bounding set, then every capability set; no exec can gain privileges again."""
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break  # EINVAL: past the last capability this kernel knows
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable × 2 words, all zero
    check(libc.capset(header, data), "capset")
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def main() -> None:
    cfg = json.loads(sys.argv[1])
    os.setsid()  # a session and process group of the sandbox's own: kill(0, ...) inside cannot reach the
    # host-side launcher (unshare, in the trainer-made group), and no terminal is reachable
    socket.sethostname("sandbox")  # our own uts namespace: the host's name is not shown
    build_root(cfg)
    drop_privileges()
    os.chdir("/sandbox")
    os.execve(cfg["argv"][0], cfg["argv"], {})


if __name__ == "__main__":
    main()
