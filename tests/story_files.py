"""A data folder of generated stories for the tests (a module of its own: `conftest` is also the lessons' name,
so tests cannot import from it)."""


def write_small_stories(folder):
    """`folder` (made here) with train.txt and valid.txt: 360 and 40 generated stories."""
    from minwiola.corpus import builtin_stories
    folder.mkdir()
    stories = builtin_stories("train", 400)
    (folder / "train.txt").write_text("\n<|endoftext|>\n".join(stories[:360]))
    (folder / "valid.txt").write_text("\n<|endoftext|>\n".join(stories[360:]))
    return folder
