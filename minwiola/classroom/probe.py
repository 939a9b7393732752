"""The grader's side of a student's kernel: the program `python -m minwiola.grade` runs in it (never imported there).

The grader sends this file's text, with the lesson's checks as text, in a first cell that runs before any of the
student's code: `install(...)` keeps everything it needs in a closure, draws a secret key inside the kernel and
prints it (only the grader reads that output), and leaves one function, `_minwiola_probe`, in the notebook's
namespace. After the student's cells, the grader's last cell calls it: it builds the checks from the text it was
given (never from disk, which the notebook may have rewritten), calls each check on the student's function, and
writes one line to a file the grader named (not to stdout: the grader drops what a notebook floods it with): the
verdicts as JSON and their HMAC under the key. A notebook that rewrites the grader's last cell (an IPython input
transformer can) or writes or prints a verdict line of its own cannot sign it without digging the key out of this
closure, which the grader's static flags look for.
"""


def install(check_source: str, helpers_source: str, lesson: str, exercises: dict, limit: int, where: str) -> None:
    """Keep the checks' text and a fresh key in a closure; print the key; define `_minwiola_probe()`, which writes
    the signed verdicts to the file `where`."""
    import contextlib
    import hashlib
    import hmac
    import io
    import json
    import os
    import secrets
    import signal
    import sys
    import types

    key = secrets.token_hex(16)
    ns = get_ipython().user_ns  # noqa: F821 (IPython's, in the kernel)

    class OutOfTime(BaseException):   # not an Exception, so a student's `except Exception` cannot swallow it
        pass

    def ring(signum, frame):
        raise OutOfTime()

    def load_checks():
        """The helpers package and the lesson's checks, as modules built from the text the grader read."""
        for name in [m for m in sys.modules if m.split(".")[0] == "exercises"]:
            del sys.modules[name]
        helpers = types.ModuleType("exercises")
        helpers.__path__ = []          # nothing more is found on disk under this name
        exec(compile(helpers_source, "exercises/__init__.py", "exec"), helpers.__dict__)
        sys.modules["exercises"] = helpers
        checks = types.ModuleType(f"exercises.{lesson}")
        exec(compile(check_source, f"exercises/{lesson}.py", "exec"), checks.__dict__)
        sys.modules[checks.__name__] = checks
        return checks

    def verdict(checks, n, fn):
        said = io.StringIO()
        try:
            signal.alarm(limit)
            with contextlib.redirect_stdout(said):
                getattr(checks, f"check_{n}")(fn)
            signal.alarm(0)
            text = said.getvalue()
            if f"Exercise {n}: correct" in text:
                return "correct", ""
            if f"Exercise {n}: not attempted" in text:
                return "not attempted", ""
            return "error", text.strip()[:200]
        except OutOfTime:
            return "timeout", f"the check of {fn.__name__} ran past {limit} s"
        except AssertionError as e:
            return "wrong", str(e)
        except Exception as e:
            first = (str(e).strip().splitlines() or [""])[0]
            return "error", f"{type(e).__name__}: {first}"[:200]
        finally:
            signal.alarm(0)

    def probe():
        signal.signal(signal.SIGALRM, ring)
        out = []
        try:
            checks = load_checks()
        except BaseException as e:                    # noqa: BLE001 (reported, never raised in the kernel)
            out = [(n, "error", f"the checks could not be loaded: {type(e).__name__}: {e}"[:200])
                   for n in exercises]
            checks = None
        for n, name in exercises.items() if checks is not None else ():
            fn = ns.get(name)
            if not callable(fn):
                out.append((n, "not attempted", f"the notebook defines no function {name}"))
            else:
                out.append((n, *verdict(checks, n, fn)))
        said = json.dumps(out)
        sign = hmac.new(key.encode(), said.encode(), hashlib.sha256).hexdigest()
        # a file, not stdout: the grader may drop what the kernel prints (a notebook that floods it)
        if os.path.lexists(where):
            os.remove(where)                           # whatever the notebook put there, a link included
        with open(where, "x", encoding="utf-8") as f:
            f.write("MINWIOLA-VERDICTS " + sign + " " + said + "\n")

    ns["_minwiola_probe"] = probe
    print("MINWIOLA-KEY " + key)
