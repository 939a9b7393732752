"""Not the course's subject: the instructor's side of the course.

    grade.py     the student edition of the lessons, and the grader for notebooks students hand back
                 (`python -m minwiola.grade`)
    probe.py     the grader's program inside a student's kernel (read as text and run there, never imported)
    sandbox.py   the walls around a submission's kernel on Linux (`python -m minwiola.classroom.sandbox --check`)
"""
