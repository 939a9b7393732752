"""nbval settings for the lessons: stderr (progress bars, warnings) is never compared with the stored output, and
the kernels keep exercises in a fresh workspace (never the learner's lessons/mine/)."""
import os
import tempfile

os.environ.setdefault("MINWIOLA_MINE", tempfile.mkdtemp(prefix="minwiola-mine-"))


def pytest_collectstart(collector):
    if collector.path is not None and collector.path.suffix == ".ipynb":
        collector.skip_compare += ("stderr",)
