"""Self-checks of the lessons' exercises: lessonNN.py holds check_N(fn) and EXERCISES; solutions/ the answers."""
