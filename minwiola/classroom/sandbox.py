"""Run one command walled off from the machine: how the grader runs a student's kernel (Linux only).

    python -m minwiola.classroom.sandbox --scratch DIR [--hide PATH ...] [--keep PATH ...] -- COMMAND ...
    python -m minwiola.classroom.sandbox --check                  # can this machine do it? one line either way

Inside, the command sees the same files as outside, with these differences, all made by Linux namespaces that any
user may create (no root, no setuid helper, nothing installed):

- every file system is **read-only** except the folder DIR (and a private, empty /dev/shm), /sys and the host
  kernel's knobs in /proc (/proc/sys, sysrq-trigger...) included, which root could otherwise write even here;
- /dev is **fresh**: null, zero, full, random, urandom, tty (and a GPU's nvidia* devices), nothing to write;
- /tmp, /var/tmp and /run are **empty** (but for DIR, this Python and each `--keep PATH`): the Unix sockets that
  live there (ssh-agent, D-Bus, Docker, X11) cannot be reached; a socket kept elsewhere still can;
- each `--hide PATH` looks **empty** (a folder) or reads as empty (a file): the grader hides the lessons'
  solutions, the repository's git history, which holds them too, and the other students' submissions;
- there is **no network** (a network namespace of its own, its loopback down);
- the command is **process 1 of its own process namespace**: when it ends, or when this launcher is killed, the
  kernel kills every process it started, however it forked or detached (`setsid`, a double fork);
- with `--cgroup DIR` (made by make_cgroups: root, or a delegated cgroup v2 subtree) it runs in that cgroup, whose
  pids.max and memory.max cap it; `--max-processes N` sets RLIMIT_NPROC, counted within its own user namespace
  but ignored by the kernel for root. limit_problem() says whether either caps anything here.

The command runs without any capabilities (its bounding set is emptied and no_new_privs is set before exec), so it
cannot undo the mounts. It still runs as the same user, reads what that user may read (except the hidden paths),
and shares the kernel with the host: this keeps honest work honest and stops the cheap attacks; it is not a jail
against a determined attacker with a kernel exploit (use a VM for that).

What it cannot do everywhere: where user namespaces are switched off (some containers' seccomp profiles, Ubuntu's
AppArmor restriction on unprivileged user namespaces, not Linux at all), `--check` says why and the grader says
that it runs submissions without isolation.
"""
from __future__ import annotations

import argparse
import ctypes
import fnmatch
import os
import resource
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
KERNEL_FILES = ("/proc", "/dev")        # made afresh inside (a /proc of its own, a minimal /dev), not remounted
DEVICES = ("null", "zero", "full", "random", "urandom", "tty", "nvidia*")   # all the fresh /dev holds (and shm)
PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus", "fs")   # the host kernel's knobs, writable by root
COVERED = ("/run", "/var/run", "/tmp", "/var/tmp")   # where sockets live (docker, ssh-agent, D-Bus, X11): empty


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


def _fd_path(fd: int) -> str:
    """A path to what `fd` (opened with O_PATH) names, still reachable after something is mounted over it."""
    return f"/proc/self/fd/{fd}"


def _fresh_dev(libc) -> None:
    """Replace /dev by an empty tmpfs holding only DEVICES (bound from the real ones), the usual links and a
    private /dev/shm, then make it read-only: as root, the real /dev is writable (g21)."""
    real = os.open("/dev", os.O_PATH)
    _mount(libc, "tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=755")
    for name in sorted({n for pattern in DEVICES for n in fnmatch.filter(os.listdir(_fd_path(real)), pattern)}):
        source, target = os.path.join(_fd_path(real), name), Path(f"/dev/{name}")
        if os.path.isdir(source):
            target.mkdir()
        else:
            target.touch()
        _mount(libc, source, str(target), None, MS_BIND | MS_REC)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"/dev/{name}")
    os.mkdir("/dev/shm")
    _mount(libc, "tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")    # shared memory, private
    _mount(libc, None, "/dev", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NOEXEC)
    os.close(real)


def _cover(libc, folder: str, keep: list[str]) -> None:
    """An empty tmpfs over `folder`, with each path of `keep` that lies in it bound back at the same place."""
    inside = [path for path in keep if _inside(path, folder) and os.path.exists(path)]
    inside = [(path, os.open(path, os.O_PATH)) for path in inside   # a kept folder brings what it holds
              if not any(_inside(path, other) and path != other for other in inside)]
    _mount(libc, "tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, "size=16k,mode=755")
    for path, fd in inside:
        if os.path.isdir(_fd_path(fd)):
            Path(path).mkdir(parents=True, exist_ok=True)
        else:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).touch()
        _mount(libc, _fd_path(fd), path, None, MS_BIND | MS_REC)
        os.close(fd)


def enter(scratch: Path, hide: list[Path], keep: list[Path] = ()) -> None:
    """Move this (single-threaded) process into new user, mount, process, network and IPC namespaces and build
    the walls: `scratch` writable, `hide` empty, COVERED empty but for `scratch`, this Python and `keep`, a fresh
    minimal /dev, everything else read-only. Its next child is process 1."""
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
    _fresh_dev(libc)
    needed = [scratch, sys.prefix, sys.base_prefix, str(Path(__file__).resolve().parents[2]), *map(str, keep)]
    needed = [os.path.realpath(path) for path in needed]
    for folder in sorted({os.path.realpath(c) for c in COVERED if os.path.isdir(c)}):
        _cover(libc, folder, needed)
    for path in map(os.path.realpath, hide):                 # gone already when it lay in a covered folder
        if os.path.isdir(path):
            _mount(libc, "tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "size=16k,mode=755")
        elif os.path.exists(path):                           # a file: it reads as empty
            _mount(libc, "/dev/null", path, None, MS_BIND)
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


def _become_init_and_exec(command: list[str], max_processes: int = 0) -> None:
    """In the child (process 1 of the new namespace): a /proc of its own, die with the launcher, drop every
    capability (so the mounts cannot be undone), then become the command."""
    libc = _libc()
    try:
        _mount(libc, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except SandboxError:
        pass                     # some containers refuse it: /proc then lists the host's processes
    for name in PROC_READ_ONLY:  # sysctls and the like: root's to write even here (the same uid), so read-only
        if os.path.exists(f"/proc/{name}"):
            _mount(libc, f"/proc/{name}", f"/proc/{name}", None, MS_BIND | MS_REC)
            _mount(libc, None, f"/proc/{name}", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    if max_processes:            # counted in this user namespace; the kernel ignores it for root (a cgroup then)
        resource.setrlimit(resource.RLIMIT_NPROC, (max_processes, max_processes))
    _call("prctl(PDEATHSIG)", libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0))
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for cap in range(last + 1):
        _call("prctl(CAPBSET_DROP)", libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0))
    _call("prctl(NO_NEW_PRIVS)", libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
    os.execvp(command[0], command)


def run(scratch: Path, hide: list[Path], command: list[str], keep: list[Path] = (), cgroups: list[Path] = (),
        max_processes: int = 0) -> int:
    """Enter the sandbox (first joining `cgroups`, made by make_cgroups) and run `command` as its process 1, with
    at most `max_processes` processes where RLIMIT_NPROC applies; return its exit code (the launcher stays outside
    the new process namespace and waits, so killing the launcher kills the command and all it started). The
    launcher also ends the command when its own parent (the grader) goes away, killed or not: a kernel in the
    sandbox cannot see the grader, so it would otherwise wait for it for ever."""
    parent = os.getppid()
    for group in cgroups:                                    # before the namespaces: everything started inherits it
        (Path(group) / "cgroup.procs").write_text(str(os.getpid()))
    enter(scratch, hide, keep)
    child = os.fork()
    if child == 0:
        try:
            _become_init_and_exec(command, max_processes)
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


# Capping processes (and memory): a cgroup where one can be made here (root, or a delegated cgroup v2 subtree),
# with pids.max and memory.max (cgroup v1: memory.limit_in_bytes); RLIMIT_NPROC otherwise (not for root).
LIMIT_FILES = {"pids": ("pids.max", "pids.max"), "memory": ("memory.max", "memory.limit_in_bytes")}  # (v2, v1)


def _cgroup_parents(controller: str) -> list[Path]:
    """Folders in which a new cgroup gets `controller`: this process's own cgroup and the hierarchy's root, in
    cgroup v2 where `controller` is enabled for children, or in the cgroup v1 hierarchy of `controller`."""
    own = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        own.update({name: path for name in (names.split(",") if names else ["v2"])})
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        point, fstype, options = fields[4].encode().decode("unicode_escape"), fields[-3], fields[-1].split(",")
        if fstype == "cgroup2" or (fstype == "cgroup" and controller in options):
            name = "v2" if fstype == "cgroup2" else controller
            for folder in (Path(point + own.get(name, "/")), Path(point)):
                enabled = folder / "cgroup.subtree_control"
                if name == "v2" and not (enabled.exists() and controller in enabled.read_text().split()):
                    continue
                found.append(folder)
    return list(dict.fromkeys(found))


CGROUP_PREFIX = "minwiola-sandbox-"     # then the pid of the process that made it


def _remove_stale(parent: Path) -> None:
    """Remove the empty cgroups a killed grader left in `parent` (its pid is in their name; the kernel removes
    no cgroup by itself)."""
    for group in parent.glob(f"{CGROUP_PREFIX}*"):
        maker = group.name.removeprefix(CGROUP_PREFIX).split("-")[0]
        if maker.isdigit() and not Path(f"/proc/{maker}").exists():
            try:
                group.rmdir()
            except OSError:                                  # not empty yet: the next grading removes it
                pass


def make_cgroups(limits: dict[str, int]) -> list[Path]:
    """New cgroups (one in cgroup v2, one per controller in v1) with `limits` ({"pids": N, "memory": bytes}) set,
    for run(..., cgroups=) to join; [] where none can be made here. remove_cgroups undoes it."""
    name, made = f"{CGROUP_PREFIX}{os.getpid()}-{time.monotonic_ns()}", []
    for controller, value in limits.items():
        for parent in _cgroup_parents(controller) if value else []:
            _remove_stale(parent)
            group, new = parent / name, not (parent / name).exists()
            try:
                group.mkdir(exist_ok=True)
                v2 = (group / "cgroup.controllers").exists()
                (group / LIMIT_FILES[controller][0 if v2 else 1]).write_text(str(value))
            except OSError:
                if new and group.is_dir():
                    group.rmdir()
                continue
            made += [group] if new else []
            break
    return made


def remove_cgroups(groups: list[Path]) -> None:
    """Kill whatever is left in `groups` (the process namespace has usually done it) and remove them; one still
    busy after 10 s is left for the next grading to remove (_remove_stale)."""
    for group in groups:
        for _ in range(200):
            try:
                group.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:                                  # busy until its last process is gone
                try:
                    for pid in (group / "cgroup.procs").read_text().split():
                        os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, FileNotFoundError):
                    pass
                time.sleep(0.05)


# Run in the sandbox by limit_problem(): how many of 30 processes it may start (each sleeps till the end).
FORK_PROGRAM = """
import os, time
for started in range(30):
    try:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
    except OSError:
        break
else:
    started = 30
print(started)
"""


def limit_problem() -> str | None:
    """None when this machine can cap the processes a sandboxed command starts (tried for real: 30 asked for, 8
    allowed), else one line saying why not."""
    groups = make_cgroups({"pids": 8})
    with tempfile.TemporaryDirectory(prefix="minwiola-sandbox-") as tmp:
        command = [sys.executable, "-m", "minwiola.classroom.sandbox", "--scratch", tmp, "--max-processes", "8",
                   *[arg for group in groups for arg in ("--cgroup", str(group))], "--",
                   sys.executable, "-c", FORK_PROGRAM]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp)
        except subprocess.TimeoutExpired:
            return "the sandbox's process test did not finish within 60 s"
        finally:
            remove_cgroups(groups)
    if done.stdout.strip() not in [str(n) for n in range(1, 8)]:       # capped, yet a process could start
        return ("nothing caps the processes a submission starts here (no cgroup with a pids controller can be made, "
                "and RLIMIT_NPROC does not bind " + ("root)" if os.geteuid() == 0 else "here)"))
    return None


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
if os.path.isdir(hidden) and os.listdir(hidden):      # gone altogether where it lay in a covered folder
    sys.exit("a hidden folder is still visible")
try:
    open("/dev/minwiola-sandbox-leak", "w")
    sys.exit("/dev is writable")
except OSError:
    pass
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
    parser.add_argument("--hide", type=Path, action="append", default=[],
                        help="a folder that looks empty inside, or a file that reads as empty")
    parser.add_argument("--keep", type=Path, action="append", default=[],
                        help=f"a path in {', '.join(COVERED)} that stays visible (read-only) inside")
    parser.add_argument("--cgroup", type=Path, action="append", default=[],
                        help="a cgroup folder to run in (its pids.max and memory.max cap the command)")
    parser.add_argument("--max-processes", type=int, default=0, help="RLIMIT_NPROC inside (ignored for root)")
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
    for path in args.hide + args.keep + args.cgroup:
        if not path.exists():
            parser.error(f"{path}: no such file or folder")
    try:
        return run(args.scratch, args.hide, command, args.keep, args.cgroup, args.max_processes)
    except (SandboxError, OSError) as e:
        print(f"minwiola.classroom.sandbox: {e}", file=sys.stderr)
        return 126


if __name__ == "__main__":
    sys.exit(main())
