"""Run one command walled off from the machine: how the grader runs a student's kernel (Linux only).

    python -m minwiola.classroom.sandbox --scratch DIR [--hide PATH ...] -- COMMAND ...
    python -m minwiola.classroom.sandbox --check                  # can this machine do it? one line either way

Inside, the command sees the same files as outside, with four differences, all made by Linux namespaces that any
user may create (no root, no setuid helper, nothing installed):

- every file system is **read-only** except the folder DIR (and a private, empty /dev/shm);
- each `--hide PATH` (a folder) looks **empty** (the grader hides the real lessons with their solutions, and the
  repository's git history, which holds them too);
- there is **no network** (a network namespace of its own, its loopback down);
- the command is **process 1 of its own process namespace**: when it ends, or when this launcher is killed, the
  kernel kills every process it started, however it forked or detached (`setsid`, a double fork).

The command runs without any capabilities (its bounding set is emptied and no_new_privs is set before exec), so it
cannot undo the mounts. It still runs as the same user, reads what that user may read (except the hidden folders),
uses the CPU and memory it likes, and shares the kernel with the host: this keeps honest work honest and stops the
cheap attacks; it is not a jail against a determined attacker with a kernel exploit (use a VM for that).

What it cannot do everywhere: where user namespaces are switched off (some containers' seccomp profiles, Ubuntu's
AppArmor restriction on unprivileged user namespaces, not Linux at all), `--check` says why and the grader says
that it runs submissions without isolation.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# from <sched.h>, <sys/mount.h> and <linux/prctl.h>: the calls the standard library does not wrap on Python 3.11
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWIPC = 0x20000, 0x10000000, 0x20000000, \
    0x40000000, 0x08000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 32, 4096, \
    16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 24, 38
# a remount may not clear a flag the mount already has (the kernel locks them in a user namespace): keep them
KEEP = {os.ST_NOSUID: MS_NOSUID, os.ST_NODEV: MS_NODEV, os.ST_NOEXEC: MS_NOEXEC, os.ST_NOATIME: MS_NOATIME,
        os.ST_NODIRATIME: MS_NODIRATIME, os.ST_RELATIME: MS_RELATIME} if hasattr(os, "ST_NOSUID") else {}
KERNEL_FILES = ("/proc", "/sys", "/dev")   # not files anybody keeps: left as they are (/dev/shm is made private)


class SandboxError(OSError):
    """The namespaces or mounts the sandbox needs could not be made here; the message says which and why."""


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    for name in ("unshare", "mount", "prctl"):
        getattr(libc, name).restype = ctypes.c_int
    return libc


def _call(what: str, result: int) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise SandboxError(err, f"{what}: {os.strerror(err)}")


def _mount(libc, source, target, fstype, flags, data=None) -> None:
    enc = (lambda s: None if s is None else os.fsencode(s))
    _call(f"mount {target}", libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)))


def mount_points() -> list[str]:
    """Every mount point this process sees, from /proc/self/mountinfo (spaces and the like come octal-escaped)."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if point not in points:
            points.append(point)
    return points


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def enter(scratch: Path, hide: list[Path]) -> None:
    """Move this (single-threaded) process into new user, mount, process, network and IPC namespaces and build
    the walls: `scratch` writable, `hide` empty, everything else read-only. Its next child is process 1."""
    libc = _libc()
    uid, gid = os.getuid(), os.getgid()
    _call("unshare (user namespaces may be switched off here)",
          libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC))
    Path("/proc/self/setgroups").write_text("deny")          # required before an unprivileged gid_map
    Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")  # the same user inside as outside
    Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)       # nothing done here leaks out to the host
    scratch = str(Path(scratch).resolve())
    _mount(libc, scratch, scratch, None, MS_BIND | MS_REC)   # its own mount, so it can stay writable
    for folder in hide:
        _mount(libc, "tmpfs", str(Path(folder).resolve()), "tmpfs", MS_NOSUID | MS_NODEV, "size=16k,mode=755")
    _mount(libc, "tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")    # shared memory, private
    for point in mount_points():
        if any(_inside(point, k) for k in KERNEL_FILES) or _inside(point, scratch):
            continue
        try:
            have = os.statvfs(point).f_flag
        except OSError:                                      # hidden under another mount: that one is done
            continue
        keep = sum(ms for st, ms in KEEP.items() if have & st)
        _mount(libc, None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | keep)
    os.chdir(os.getcwd())        # the working folder again, through the new mounts (else it is the old, read-only one)


def _become_init_and_exec(command: list[str]) -> None:
    """In the child (process 1 of the new namespace): a /proc of its own, die with the launcher, drop every
    capability (so the mounts cannot be undone), then become the command."""
    libc = _libc()
    try:
        _mount(libc, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except SandboxError:
        pass                     # some containers refuse it: /proc then lists the host's processes, read-only
    _call("prctl(PDEATHSIG)", libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0))
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for cap in range(last + 1):
        _call("prctl(CAPBSET_DROP)", libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0))
    _call("prctl(NO_NEW_PRIVS)", libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
    os.execvp(command[0], command)


def run(scratch: Path, hide: list[Path], command: list[str]) -> int:
    """Enter the sandbox and run `command` as its process 1; return its exit code (the launcher stays outside the
    new process namespace and waits, so killing the launcher kills the command and all it started). The launcher
    also ends the command when its own parent (the grader) goes away, killed or not: a kernel in the sandbox cannot
    see the grader, so it would otherwise wait for it for ever."""
    parent = os.getppid()
    enter(scratch, hide)
    child = os.fork()
    if child == 0:
        try:
            _become_init_and_exec(command)
        except BaseException as e:                           # noqa: BLE001 (say why, never run unwalled)
            print(f"minwiola.classroom.sandbox: {e}", file=sys.stderr)
        os._exit(127)
    # an interrupt is sent to the whole process group: it is for the command (the kernel), not for us
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: os.kill(child, signal.SIGKILL))
    while True:
        try:
            done, status = os.waitpid(child, os.WNOHANG)
        except InterruptedError:
            continue
        if done:
            return os.waitstatus_to_exitcode(status)
        if os.getppid() != parent:                       # the grader is gone: so is everything it started
            os.kill(child, signal.SIGKILL)
        time.sleep(0.2)


PR_SET_CHILD_SUBREAPER = 36


def _children() -> set[int]:
    """This process's children, read from /proc (an empty set where there is no /proc)."""
    me, kids = str(os.getpid()), set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            after_name = stat.read_text().rsplit(")", 1)[1].split()   # the name may hold spaces and brackets
        except (OSError, IndexError):
            continue
        if after_name[1] == me:
            kids.add(int(stat.parent.name))
    return kids


def adopt_orphans() -> set[int]:
    """Make this process a child subreaper (Linux): a process its children start and abandon, even one that
    detached itself (a double fork, setsid), becomes its child instead of init's, so kill_new_children finds it.
    Return the children it has now, which are not the notebook's."""
    if sys.platform == "linux":
        _libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    return _children()


def kill_new_children(before: set[int]) -> None:
    """Kill (and reap) every child of this process that was not in `before`, until none is left: what a graded
    notebook left running once its kernel is gone."""
    for _ in range(100):
        stray = _children() - before
        if not stray:
            return
        for pid in stray:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


# Run inside the sandbox by check(): each line is one wall, tested from the inside.
CHECK_PROGRAM = """
import os, socket, sys
scratch, hidden, outside = sys.argv[1:4]
open("ok", "w").write("x")          # through the working folder, which is the scratch folder
try:
    open(os.path.join(outside, "minwiola-sandbox-leak"), "w")
    sys.exit("a folder outside the scratch folder is writable")
except OSError:
    pass
if os.listdir(hidden):
    sys.exit("a hidden folder is still visible")
try:
    socket.create_connection(("127.0.0.1", 9), timeout=1)
except OSError:
    pass
else:
    sys.exit("the network is reachable")
if os.getpid() != 1:
    sys.exit("not the first process of its own process namespace")
"""


def check() -> str | None:
    """None when this machine can run the sandbox (tried for real, each wall tested from inside), else one line
    saying why not."""
    if sys.platform != "linux":
        return f"needs Linux namespaces (this is {sys.platform})"
    with tempfile.TemporaryDirectory(prefix="minwiola-sandbox-") as tmp:
        scratch, hidden, outside = (Path(tmp) / name for name in ("scratch", "hidden", "outside"))
        for folder in (scratch, hidden, outside):
            folder.mkdir()
        (hidden / "secret").write_text("x")
        command = [sys.executable, "-m", "minwiola.classroom.sandbox", "--scratch", str(scratch), "--hide", str(hidden),
                   "--", sys.executable, "-c", CHECK_PROGRAM, str(scratch), str(hidden), str(outside)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=scratch)
        except subprocess.TimeoutExpired:
            return "the sandbox's self-test did not finish within 60 s"
        if done.returncode != 0 or not (scratch / "ok").exists() or any(outside.iterdir()):
            why = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
            return why.removeprefix("minwiola.classroom.sandbox: ")
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minwiola.classroom.sandbox", description=__doc__.split("\n")[0])
    parser.add_argument("--scratch", type=Path, help="the one folder the command may write")
    parser.add_argument("--hide", type=Path, action="append", default=[], help="a folder that looks empty inside")
    parser.add_argument("--check", action="store_true", help="say whether this machine can run the sandbox")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    args = parser.parse_args(argv)
    if args.check:
        why = check()
        print("the sandbox works here" if why is None else f"no sandbox here: {why}")
        return 0 if why is None else 1
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.scratch is None or not args.scratch.is_dir() or not command:
        parser.error("give --scratch DIR (an existing folder) and -- COMMAND")
    for folder in args.hide:
        if not folder.is_dir():
            parser.error(f"--hide {folder}: not a folder")
    try:
        return run(args.scratch, args.hide, command)
    except (SandboxError, OSError) as e:
        print(f"minwiola.classroom.sandbox: {e}", file=sys.stderr)
        return 126


if __name__ == "__main__":
    sys.exit(main())
