"""Self-checks of the lessons\x27 exercises: lessonNN.py holds check_N(fn) and EXERCISES; solutions/ the answers."""
