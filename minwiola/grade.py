"""`python -m minwiola.grade`: the classroom's grader and student edition, which live in minwiola/classroom/."""
from .classroom.grade import main

if __name__ == "__main__":
    raise SystemExit(main())
