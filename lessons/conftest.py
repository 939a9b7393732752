"""nbval settings for the lessons: stderr (progress bars, warnings) is never compared with the stored output."""


def pytest_collectstart(collector):
    if collector.path is not None and collector.path.suffix == ".ipynb":
        collector.skip_compare += ("stderr",)
