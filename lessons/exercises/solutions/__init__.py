"""Solutions to the exercises, one file per lesson, and plausible wrong answers (WRONG) the checks must catch."""
